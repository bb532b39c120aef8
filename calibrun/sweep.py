"""The Hydra callback around a multirun: MLflow parent run before the jobs, report after them.

on_multirun_start creates the experiment (and a fresh SQLite schema) once, before parallel jobs could race
on it, opens the parent run and writes its id into SWEEP_DIR/mlflow_parent.json for the jobs.
on_multirun_end aggregates the sweep into the report folder, logs it on the parent run, and exits non-zero
when a job failed.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from calibrun.config import tracking_enabled, validate
from calibrun.errors import CalibrunError, one_line
from calibrun.files import write_json
from calibrun.tracking import PARENT_FILE, Tracker, resolve_uri

log = logging.getLogger("calibrun")


def _tracker(config: DictConfig) -> Tracker | None:
    if not tracking_enabled(config):
        return None
    return Tracker(resolve_uri(config.tracking.uri), config.tracking.experiment)


def _task_overrides(overrides) -> list[str]:
    return sorted(o for o in overrides if not o.split("=", 1)[0].lstrip("+~").startswith("resume"))


def previous_sweep(sweep_root: Path, overrides: list[str]) -> Path | None:
    """The newest sweep folder under `sweep_root` (multirun/<date>/<time>) run with the same task overrides."""
    wanted = _task_overrides(overrides)
    candidates = sorted(sweep_root.glob("*/*/multirun.yaml"), key=lambda p: p.parent.as_posix(), reverse=True)
    for path in candidates:
        try:
            previous = OmegaConf.load(path).hydra.overrides.task
        except Exception:  # an unreadable multirun.yaml is not a match
            continue
        if _task_overrides(previous) == wanted:
            return path.parent
    return None


def _resume_into_previous_sweep(config: DictConfig) -> None:
    """`resume=true` with the default time-stamped sweep folder: continue the newest earlier sweep of the same
    command instead of starting an empty one. An explicit hydra.sweep.dir is used as it is."""
    explicit = any(o.startswith("hydra.sweep.dir=") for o in config.hydra.overrides.hydra)
    if explicit:
        return
    found = previous_sweep(Path(config.hydra.sweep.dir).parent.parent, list(config.hydra.overrides.task))
    if found is None:
        log.warning("resume=true: no earlier sweep of this command, starting a new one")
        return
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.sweep.dir = str(found)
        # jobs are composed from these overrides (ConfigLoader.load_sweep_config): they must see the folder too
        config.hydra.overrides.hydra.append(f"hydra.sweep.dir={found}")
    log.info("resume=true: continuing sweep %s", found)


def _make_folder(folder: Path, key: str) -> None:
    """Create Hydra's output folder now, so that a bad one is one line, not Hydra's traceback later."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"calibrun: error: config {key}: cannot create {folder}: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(1)


class SweepCallback(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        _make_folder(Path(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if config.resume:
            _resume_into_previous_sweep(config)
        sweep_dir = Path(config.hydra.sweep.dir)
        _make_folder(sweep_dir, "hydra.sweep.dir")
        try:
            validate(config)  # the settings every job shares: a wrong one stops the sweep before any job
            tracker = _tracker(config)
        except CalibrunError as exc:  # e.g. the tracking server does not answer: stop before any job
            print(f"calibrun: error: {exc}", file=sys.stderr)
            sys.exit(1)
        if tracker is None:
            return
        name = "sweep " + "/".join(sweep_dir.resolve().parts[-2:])
        run_id = tracker.start_run(name, {"calibrun.sweep_dir": str(sweep_dir.resolve())})
        write_json(sweep_dir / PARENT_FILE, {"run_id": run_id, "tracking_uri": tracker.uri,
                                             "experiment_id": tracker.experiment_id})
        log.info("MLflow parent run %s in %s", run_id, tracker.uri)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """Report, close the parent run, and exit 1 when a job failed or the report could not be built.

        Hydra turns an exception raised here into a warning, so this method handles its own errors."""
        sweep_dir = Path(config.hydra.sweep.dir)
        report_dir = Path(config.report.dir) if config.report.dir else None
        problems: list[str] = []
        files: list[Path] = []
        counts = {}
        try:
            from calibrun.aggregate import build  # inside the try: any failure here must still close the parent

            summary = build(sweep_dir, report_dir)
            files = summary.files
            problems += summary.failed
            counts = {"jobs_ok": summary.ok, "jobs_failed": len(summary.failed)}
            if not summary.ok:
                problems.append("no job completed")
        except Exception as exc:
            problems.append(f"report not built: {one_line(exc)}")
        parent_file = sweep_dir / PARENT_FILE
        if tracking_enabled(config) and parent_file.is_file():
            try:
                parent = json.loads(parent_file.read_text())
                tracker = Tracker(parent["tracking_uri"], config.tracking.experiment)
                for path in files:  # the report files and plots; the model bundle stays on disk
                    tracker.log_artifact(parent["run_id"], path, "report")
                tracker.log(parent["run_id"], metrics=counts, tags={"calibrun.problems": str(len(problems))})
                tracker.finish(parent["run_id"], failed=bool(problems))
            except Exception as exc:
                problems.append(f"MLflow parent run not closed: {one_line(exc)}")
        if problems:
            print(f"calibrun: sweep {sweep_dir} had {len(problems)} problem(s): " + "; ".join(problems),
                  file=sys.stderr)
            sys.exit(1)
