"""The Hydra callback around a multirun: the sweep folder and MLflow parent run before the jobs, the report after.

on_multirun_start claims the sweep folder (an exclusive lock: two sweeps never share one; a folder holding an
earlier sweep is refused unless resume=true), opens the tracking store for real once (a store that cannot be used
stops the sweep with one line before any job), creates the experiment before parallel jobs could race on it,
opens the parent run (or, with resume=true, continues the sweep's earlier parent and closes its stale RUNNING
children) and writes its id into SWEEP_DIR/mlflow_parent.json for the jobs. SIGINT and SIGTERM end the in-flight
job's run and the parent run as KILLED with one line on stderr.
on_multirun_end aggregates the sweep into the report folder, logs it and a summary (params common to all jobs,
best run, best error per swept value) on the parent run, prints the MLflow UI link, and exits non-zero when a job
failed.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import math
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from calibrun.config import PATH_KEYS, check_readable, register_resolvers, tracking_enabled, validate
from calibrun.core import interrupts, patches
from calibrun.core.errors import CalibrunError, one_line
from calibrun.core.files import full_error, is_full, write_json
from calibrun.core.progress import SweepProgress
from calibrun.sweep_order import spread, sweeper_lines
from calibrun.tracking import (
    MAX_RUN_NAME,
    PARENT_FILE,
    PARENTS_HERE,
    Tracker,
    faithful,
    link_line,
    open_tracker,
    resolve_uri,
    sweep_filter,
)

log = logging.getLogger("calibrun")

LOCK_FILE = ".calibrun.lock"
HEADLINE = "max_abs_error"


register_resolvers()  # ${calibrun.sweep_id:} in the sweep folder, for launchers that import this callback first


def swept_keys(config: DictConfig) -> list[str]:
    """The keys a multirun sweeps over: overrides with several values (`a=1,2`, ranges, choices) and the
    sweeper's own params (a preset's hydra.sweeper.params)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = []
    try:
        parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
        keys += [o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()]
    except Exception:  # Hydra parsed them already; a failure here only costs the names
        pass
    params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    keys += [str(k) for k in params if str(k) not in keys]
    return keys


def sweep_values(config: DictConfig) -> dict[str, list[str]]:
    """Each swept key's values as the command line and the preset's hydra.sweeper.params list them (choice
    sweeps: `data.path=a.npy,b.npy`; ranges and intervals are left out: they hold no paths)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep

    lines = sweeper_lines(OmegaConf.select(config, "hydra.sweeper.params", default=None), config.hydra.overrides.task)
    values: dict[str, list[str]] = {}
    try:
        parsed = OverridesParser.create().parse_overrides(lines)
    except Exception:  # Hydra reports a bad override itself
        return values
    for override in parsed:
        if override.is_sweep_override() and isinstance(override.value(), ChoiceSweep):
            key = override.get_key_element().lstrip("+~")
            values[key] = [str(v) for v in override.sweep_string_iterator()]
    return values


def sweep_total(config: DictConfig) -> int | None:
    """How many jobs the sweep runs: the product of the choice lists (Hydra's basic sweeper, presets' params
    included), a search's n_trials, else None (unknown)."""
    sweeper = str(OmegaConf.select(config, "hydra.sweeper._target_", default="") or "")
    if not sweeper.endswith("BasicSweeper"):
        trials = OmegaConf.select(config, "hydra.sweeper.n_trials", default=None)
        return int(trials) if isinstance(trials, int) else None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = sweeper_lines(OmegaConf.select(config, "hydra.sweeper.params", default=None), config.hydra.overrides.task)
    try:
        batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(lines), None)
    except Exception:  # Hydra reports a bad override itself
        return None
    return sum(len(batch) for batch in batches)


# launcher class -> the commands it runs on this machine (submitit's SLURM executor refuses to start without srun,
# and submits with sbatch)
LAUNCHER_COMMANDS = {"SlurmLauncher": ("srun", "sbatch")}


def check_launcher(config: DictConfig) -> None:
    """The commands the sweep's launcher needs are here, before any job and any MLflow run: a SLURM sweep started
    where there is no SLURM stops with one line instead of submitit's traceback after the parent run opened."""
    target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
    missing = [c for c in LAUNCHER_COMMANDS.get(target.rsplit(".", 1)[-1], ()) if shutil.which(c) is None]
    if missing:
        choice = OmegaConf.select(config, "hydra.runtime.choices", default={}).get("hydra/launcher", target)
        raise CalibrunError(f"hydra/launcher={choice}: {' and '.join(missing)} not found on PATH: run the sweep on a "
                            "SLURM login node, or use +cluster=submitit_local to run its jobs on this machine")


def check_swept_paths(config: DictConfig) -> None:
    """Every model and data path a sweep lists exists and is readable, before any job (calibrun.config)."""
    for key, values in sweep_values(config).items():
        if key in PATH_KEYS:
            for value in values:
                check_readable(value, key, folder_ok=key != "model.path")


def _task_overrides(overrides) -> list[str]:
    return sorted(o for o in overrides if not o.split("=", 1)[0].lstrip("+~").startswith("resume"))


def _folder_order(path: Path) -> tuple:
    """Newest first: by the folder's date/time, then by when its multirun.yaml was written (same second)."""
    folder = path.parent
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        mtime = 0
    return folder.parent.name, folder.name[:8], mtime


def previous_sweep(sweep_root: Path, overrides: list[str]) -> Path | None:
    """The newest sweep folder under `sweep_root` (multirun/<date>/<time>[-<id>]) run with the same task
    overrides."""
    wanted = _task_overrides(overrides)
    candidates = sorted(sweep_root.glob("*/*/multirun.yaml"), key=_folder_order, reverse=True)
    for path in candidates:
        try:
            previous = OmegaConf.load(path).hydra.overrides.task
        except Exception:  # an unreadable multirun.yaml is not a match
            continue
        if _task_overrides(previous) == wanted:
            return path.parent
    return None


# keys a resume may change: how runs are recorded and where calibrations are kept, not what a job computes
_NOT_THE_JOBS = ("tracking", "cache")


def _job_overrides(overrides) -> list[str]:
    """The task overrides that decide what the sweep's jobs compute (_task_overrides less _NOT_THE_JOBS's keys)."""
    return [o for o in _task_overrides(overrides) if o.split("=", 1)[0].lstrip("+~").split(".")[0] not in _NOT_THE_JOBS]


def _same_command(sweep_dir: Path, overrides: list[str]) -> None:
    """resume=true continues a sweep as it was started: other task overrides (another format, other batches; the
    tracking and cache keys aside, which change no job's numbers) are refused in one line (a probe's resume with
    other settings rewrote every finished job's folder and closed their FINISHED runs FAILED). A folder without its
    multirun.yaml (killed before Hydra wrote it) is not checked."""
    try:
        previous = _job_overrides(OmegaConf.load(sweep_dir / "multirun.yaml").hydra.overrides.task)
    except Exception:  # none, or unreadable: nothing to compare with
        return
    now = _job_overrides(overrides)
    if previous != now:
        gone, added = [o for o in previous if o not in now], [o for o in now if o not in previous]
        said = "; ".join(part for part in (f"it had {' '.join(gone)}" if gone else "",
                                           f"this command adds {' '.join(added)}" if added else "") if part)
        _fail(f"resume=true continues the sweep in {sweep_dir} with the overrides it was started with, and this "
              f"command's differ ({said}): give the same overrides with resume=true, or start another sweep")


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


def _fail(message: str) -> None:
    print(f"calibrun: error: {message}", file=sys.stderr)
    sys.exit(1)


def _folder_of(config: DictConfig, key: str) -> Path:
    """The output folder `key` (hydra.run.dir, hydra.sweep.dir) resolved: an interpolation that fails (a resolver
    given a wrong argument, a missing variable) is one line naming the key, not OmegaConf's traceback."""
    try:
        return Path(str(OmegaConf.select(config, key, throw_on_resolution_failure=True)))
    except Exception as exc:
        text = str(exc).strip()
        _fail(f"config {key}: {text.splitlines()[0] if text else type(exc).__name__}")


def _make_folder(folder: Path, key: str) -> None:
    """Create Hydra's output folder now, so that a bad one is one line, not Hydra's traceback later."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"config {key}: cannot create {folder}: {exc.strerror or exc}")


_LOCKS: list = []  # the open lock files: held (flock) while this process lives, released by the kernel at exit


def claim(sweep_dir: Path, key: str = "hydra.sweep.dir") -> None:
    """An exclusive lock on the sweep folder (or a single run's, `key` hydra.run.dir) for as long as this process
    lives (any death releases it): a second sweep or run started on the same folder stops with one line instead of
    mixing its jobs in (two runs given one hydra.run.dir had written one result.json beside the other's config, and
    an MLflow run had logged the other job's int8 model)."""
    path = sweep_dir / LOCK_FILE
    what = "sweep" if key == "hydra.sweep.dir" else "run"
    try:
        handle = open(path, "a+")  # noqa: SIM115 (kept open on purpose)
    except OSError as exc:
        _fail(f"config {key}: cannot write {sweep_dir}: {exc.strerror or exc}")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        _fail(f"{what} folder {sweep_dir} is in use by another {what} ({holder}); wait for it or choose another "
              f"{key}")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    _LOCKS.append(handle)


def earlier_jobs(sweep_dir: Path) -> list[str]:
    """What an earlier sweep left in the folder (its config, parent run, job folders)."""
    found = [p.name for p in (sweep_dir / "multirun.yaml", sweep_dir / PARENT_FILE) if p.exists()]
    found += sorted(p.parent.name for p in sweep_dir.glob("*/result.json"))
    found += sorted(p.parent.name for p in sweep_dir.glob("*/.hydra") if p.parent.name not in found)
    return found


# --- each job composed once -----------------------------------------------------------------------------------

# --- signals: every run ends FINISHED, FAILED or KILLED ----------------------------------------------------------

_previous_hook = sys.excepthook
_SWEEP: dict = {}  # the sweep this process runs: folder, and the open parent run (tracker, run id)


def _excepthook(kind, exc, tb) -> None:
    if not issubclass(kind, KeyboardInterrupt) or not _SWEEP:
        return _previous_hook(kind, exc, tb)
    interrupts.acknowledge()
    interrupts.release(exc)
    name = getattr(exc, "signum", None)
    name = signal.Signals(name).name if name else "SIGINT"
    _close_in_flight()
    closed = _close_parent("KILLED")
    print(f"calibrun: interrupted by {name}: sweep {_SWEEP['dir']} stopped{closed and ', ' + closed}; the same "
          f"command with resume=true continues it", file=sys.stderr)
    interrupts.die_of(exc)


def in_sweep_process() -> bool:
    """Whether this is the sweep's own process (not a launcher's worker, which runs jobs without the callbacks)."""
    return bool(_SWEEP)


def _close_in_flight() -> None:
    """The runs of jobs still in flight in a launcher's workers (joblib: the workers end with the sweep's process,
    their runs left RUNNING) closed KILLED, as the basic launcher's job in flight closes its own (then none is left
    and this finds nothing)."""
    tracker, run_id = _SWEEP.get("tracker"), _SWEEP.get("run_id")
    if tracker is None:
        return
    try:
        tracker.close_stale(run_id)
    except Exception as exc:  # the store gone too: resume=true closes them
        log.debug("runs in flight not closed: %s", one_line(exc))


def _close_parent(status: str) -> str:
    """End the sweep's open parent run with `status`; what happened, for the one line ('' without tracking)."""
    tracker, run_id = _SWEEP.get("tracker"), _SWEEP.get("run_id")
    if tracker is None:
        return ""
    error = tracker.close(run_id, status)
    return f"MLflow parent run {status}" if error is None else f"MLflow parent run not closed: {one_line(error)}"


def _closed_before_jobs() -> str:
    """A sweep stopped before any job (its parent run opened, then logging to it failed, e.g. a server answering
    500): the parent run is closed FAILED while the store still accepts that; what happened, for the one line."""
    if _SWEEP.get("tracker") is None:
        return ""
    closed = _close_parent("FAILED")
    _SWEEP.pop("tracker", None)
    return f" ({closed})"


def _close_if_open() -> None:
    """At exit: a sweep whose end callback never ran (Hydra failed outside the jobs, e.g. writing a job's .hydra/
    config on a full disk, and exited through its own error report) leaves no parent run RUNNING: it is closed
    FAILED. Interrupts close it KILLED in _excepthook and never get here (the process dies of the signal). One line,
    with the reason when calibrun knows it (a full disk, `report_full_disk`)."""
    reason = _SWEEP.pop("stop", None)
    if _SWEEP.get("tracker") is None and reason is None:
        return
    closed = _close_parent("FAILED") if _SWEEP.get("tracker") is not None else ""
    print(f"calibrun: {f'error: {reason}; ' if reason else ''}sweep {_SWEEP['dir']} stopped before its end"
          f"{f': {closed}' if closed else ''}; the same command with resume=true continues it", file=sys.stderr)
    _SWEEP.clear()


def report_full_disk(exc: OSError, output_dir, filename: str) -> None:
    """A full disk outside calibrun's code, in one line naming the folder (calibrun.core.patches.on_full_disk hands it
    here: Hydra writing a job's .hydra/ files): the run or sweep stops with calibrun's line (a sweep's through
    `_close_if_open`, which also closes its parent run)."""
    reason = str(full_error(output_dir, f"cannot write {filename}"))
    if _SWEEP.get("dir") is not None:
        _SWEEP["stop"] = reason
    else:
        print(f"calibrun: error: {reason}", file=sys.stderr)
    raise SystemExit(1)


# --- the callback ------------------------------------------------------------------------------------------------

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def _jobs_need_not_wait(config: DictConfig, tracker: Tracker) -> bool:
    """Whether the first job may start before the tracking writer has imported MLflow and started the parent run
    (~1.5-2.5 s of a fresh process, the lab sweep's whole start before): the jobs run in this process (Hydra's basic
    launcher: they take the parent run's pending id from here, PARENTS_HERE), through the writer (its requests are
    served in order: the parent run exists before a job's run names it), in an SQLite store this process has
    checked itself (calibrun.tracking.check_sqlite: a file it may write, an MLflow store, the experiment not deleted),
    and not resumed (which reads the store first). Else the first job waits for the parent run (`_parent_ready`):
    a server is asked for only once MLflow is there, and a launcher's workers read the parent from the folder."""
    return (OmegaConf.select(config, "hydra.launcher._target_", default="") == BASIC_LAUNCHER
            and tracker.pipelined and tracker.uri.startswith("sqlite:///") and not config.resume)


def _parent_ready() -> None:
    """The parent run's id in the sweep folder, for the jobs (PARENT_FILE). With the tracking writer
    (calibrun.tracking.writer) the store is opened and the parent run started while Hydra validates the jobs'
    configs (calibrun.core.patches.before_launch): this waits for them right before the first job is launched. An
    error of the store stops the sweep here as it would have before: one line, no job launched, no folder left."""
    config, sweep_dir, run_id, parent = _SWEEP.pop("parent")
    tracker = _SWEEP["tracker"]
    try:
        run_id = tracker.resolve(run_id)
        tracker.flush()  # the parent run's params: an error of the store is raised here, before any job
        _SWEEP["run_id"] = run_id
        write_json(sweep_dir / PARENT_FILE, {"run_id": run_id, "tracking_uri": tracker.uri,
                                             "experiment_id": tracker.experiment_id, **parent})
    except Exception as exc:
        line = (str(exc) if isinstance(exc, CalibrunError) else
                f"MLflow tracking store {resolve_uri(config.tracking.uri)}: {one_line(exc)}") + _closed_before_jobs()
        if _SWEEP.get("created"):  # stopped before any job: leave no sweep folder behind
            for name in ("multirun.yaml", LOCK_FILE):
                with contextlib.suppress(OSError):
                    (sweep_dir / name).unlink()
            with contextlib.suppress(OSError):
                sweep_dir.rmdir()
        _SWEEP.clear()
        _fail(line)
    log.info("MLflow parent run %s in %s", run_id, tracker.uri)


def _tracker(config: DictConfig, check: bool = False) -> Tracker | None:
    if not tracking_enabled(config):
        return None
    t = config.tracking
    return open_tracker(resolve_uri(t.uri), t.experiment, check=check, http_timeout=t.get("http_timeout"),
                   http_retries=t.get("http_retries"))


def _earlier_parent(sweep_dir: Path, tracker: Tracker, experiment: str) -> str | None:
    """The parent run of this folder's earlier sweep, when it is in this store (resume continues it)."""
    try:
        parent = json.loads((sweep_dir / PARENT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if parent.get("tracking_uri") != tracker.uri:
        return None
    if parent.get("run_id") is None:  # recorded before the tracking writer had started the run (`_start`)
        if parent.get("experiment") != experiment:
            return None
        from calibrun.tracking import record

        return tracker.run(record.parent_by_folder, sweep_dir, int(parent.get("since_ms", 0)))
    if parent.get("experiment_id") != tracker.experiment_id:
        return None
    run_id = parent.get("run_id")
    return run_id if run_id and tracker.status(run_id) is not None else None


def sweep_name(config: DictConfig) -> str:
    """The parent run's name: `sweep ` and the overrides (folders left out), then a preset's swept params, each
    value as a job's run name shows it (`faithful`: a long path is shortened in the middle of what the swept values
    share). Past MLflow's 250 characters the swept ones come first and the end is cut (`…`). The overrides in full
    are the run's `overrides` param."""
    overrides = _task_overrides(config.hydra.overrides.task)
    params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    lines = [o for o in overrides if not o.split("=", 1)[0].endswith(".dir")]
    lines += [f"{k}={v}" for k, v in params.items() if not any(o.startswith(f"{k}=") for o in lines)]
    if not lines:
        return "sweep (defaults)"
    values = sweep_values(config)
    shown = []
    for line in lines:
        key, _, value = line.partition("=")
        listed = values.get(key.lstrip("+~"))
        value = ",".join(faithful(v, listed) for v in listed) if listed else faithful(value)
        shown.append((bool(listed), f"{key}={value}"))
    name = "sweep " + " ".join(text for _, text in shown)
    if len(name) <= MAX_RUN_NAME:
        return name
    name = "sweep " + " ".join(text for _, text in sorted(shown, key=lambda item: not item[0]))
    return name[:MAX_RUN_NAME - 1] + "…"


def _parent_run(config: DictConfig, tracker: Tracker, sweep_dir: Path, swept: list[str]) -> str:
    run_id = _earlier_parent(sweep_dir, tracker, config.tracking.experiment) if config.resume else None
    if run_id is not None:
        tracker.reopen(run_id)
        _SWEEP.update(tracker=tracker, run_id=run_id)
        stale = tracker.close_stale(run_id)
        log.info("resume=true: continuing MLflow parent run %s%s", run_id,
                 f" (closed {len(stale)} run(s) a killed sweep left RUNNING)" if stale else "")
        return run_id
    overrides = _task_overrides(config.hydra.overrides.task)
    run_id = tracker.start_run(sweep_name(config), {"calibrun.sweep_dir": str(sweep_dir.resolve()),
                                                     "calibrun.swept": " ".join(swept)})
    _SWEEP.update(tracker=tracker, run_id=run_id)  # open from here on: any failure before the jobs closes it
    params = {"overrides": " ".join(overrides) or "(none)"}
    sweeper = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    params.update({f"sweep.{k}": v for k, v in sweeper.items()})
    params.update({f"sweep.{o.split('=', 1)[0].lstrip('+~')}": o.split("=", 1)[1] for o in overrides
                   if "=" in o and o.split("=", 1)[0].lstrip("+~") in swept})
    tracker.log(run_id, params=params)
    return run_id


class SweepCallback(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        try:  # before Hydra makes the run's folder: a bad setting or a missing file leaves nothing behind
            validate(config)
        except CalibrunError as exc:
            _fail(str(exc))
        run_dir = _folder_of(config, "hydra.run.dir")
        _make_folder(run_dir, "hydra.run.dir")
        claim(run_dir, "hydra.run.dir")  # before Hydra writes the run's config into it

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        progress = _SWEEP.get("progress")
        if progress is not None:
            progress.job_started()

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        progress = _SWEEP.get("progress")  # in the sweep's process (a launcher's workers have none)
        if progress is not None:
            progress.job_done()

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if config.resume:
            _resume_into_previous_sweep(config)
        sweep_dir = _folder_of(config, "hydra.sweep.dir")
        created = not sweep_dir.exists()
        _make_folder(sweep_dir, "hydra.sweep.dir")
        claim(sweep_dir)
        try:
            self._start(config, sweep_dir, created)
        except SystemExit:
            if created:  # stopped before any job: leave no empty sweep folder behind
                with contextlib.suppress(OSError):
                    (sweep_dir / LOCK_FILE).unlink()
                    sweep_dir.rmdir()
            raise

    def _start(self, config: DictConfig, sweep_dir: Path, created: bool) -> None:
        earlier = earlier_jobs(sweep_dir)
        if earlier and not config.resume:
            _fail(f"sweep folder {sweep_dir} holds an earlier sweep ({', '.join(earlier[:4])}"
                  f"{', ...' if len(earlier) > 4 else ''}): add resume=true to continue it, or choose another "
                  f"hydra.sweep.dir")
        if earlier and config.resume:
            _same_command(sweep_dir, list(config.hydra.overrides.task))
        interrupts.install_signal_handlers()
        patches.compose_each_job_once()
        patches.compose_by_group_choice()
        patches.order_jobs(spread)  # jobs sharing a calibration apart: parallel workers calibrate different keys
        sys.excepthook = _excepthook  # an interrupt that reaches the top closes the parent run, in one line
        atexit.unregister(_close_if_open)
        atexit.register(_close_if_open)  # any other way out before the end callback closes it FAILED
        _SWEEP.update(dir=sweep_dir, progress=SweepProgress(sweep_total(config)), created=created)
        try:
            swept = swept_keys(config)
            # the settings every job shares, and every path the sweep names: a wrong one stops it before any job
            validate(config, swept)
            check_swept_paths(config)
            check_launcher(config)
            tracker = _tracker(config, check=True)  # the store opened for real, once: a bad one stops here
            if tracker is None:
                return
            run_id = _parent_run(config, tracker, sweep_dir, swept)
        except CalibrunError as exc:
            _fail(str(exc) + _closed_before_jobs())
        except Exception as exc:  # the store failed past its check
            _fail(f"MLflow tracking store {resolve_uri(config.tracking.uri)}: {one_line(exc)}"
                  + _closed_before_jobs())
        info = {"swept": swept, "values": sweep_values(config)}
        basic = OmegaConf.select(config, "hydra.sweeper._target_", default="") == BASIC_SWEEPER
        if basic and _jobs_need_not_wait(config, tracker):
            _SWEEP["run_id"] = run_id  # a Pending answer: the writer puts the id in its place
            from calibrun.tracking import record

            try:  # what a resumed sweep finds the parent run by if the writer cannot record its id (a full disk)
                write_json(sweep_dir / PARENT_FILE, {"run_id": None, "tracking_uri": tracker.uri,
                                                     "experiment": config.tracking.experiment,
                                                     "since_ms": int(time.time() * 1000), **info})
            except OSError as exc:
                line = (str(full_error(sweep_dir, f"cannot write {PARENT_FILE}")) if is_full(exc) else
                        f"cannot write {sweep_dir / PARENT_FILE}: {exc.strerror or exc}")
                _fail(line + _closed_before_jobs())
            PARENTS_HERE[sweep_dir.resolve()] = {"run_id": run_id, "tracking_uri": tracker.uri, **info}
            tracker.later(record.record_parent, sweep_dir, run_id, info)
            return
        _SWEEP["parent"] = (config, sweep_dir, run_id, info)
        if not (basic and patches.before_launch(_parent_ready)):
            _parent_ready()


    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """Report, close the parent run, and exit 1 when a job failed or the report could not be built.

        Hydra turns an exception raised here into a warning, so this method handles its own errors."""
        sweep_dir = Path(config.hydra.sweep.dir)
        report_dir = Path(config.report.dir) if config.report.dir else None
        problems: list[str] = []
        files: list[Path] = []
        counts = {}
        if _SWEEP.get("tracker") is not None:  # the tracking writer ends the last jobs' records (result.json) first
            try:
                _SWEEP["tracker"].flush()
            except Exception as exc:
                problems.append(f"MLflow parent run not complete: {one_line(exc)}")
        try:
            from calibrun.report.aggregate import build  # inside the try: any failure here must still close the parent

            summary = build(sweep_dir, report_dir)
            files = summary.files
            problems += summary.failed
            counts = {"jobs_ok": summary.ok, "jobs_failed": len(summary.failed)}
            if not summary.ok:
                problems.append("no job completed")
        except Exception as exc:
            problems.append(f"report not built: {one_line(exc)}")
        parent_file = sweep_dir / PARENT_FILE
        link = None
        headline = None
        here = PARENTS_HERE.get(sweep_dir.resolve())  # (`_jobs_need_not_wait`)
        if tracking_enabled(config) and (here is not None or parent_file.is_file()):
            tracker = None
            try:
                parent = dict(here) if here is not None else json.loads(parent_file.read_text())
                tracker = _SWEEP.get("tracker") or open_tracker(parent["tracking_uri"], config.tracking.experiment)
                parent["run_id"] = tracker.resolve(parent["run_id"])
                for path in files:  # the report files and plots; the model bundle stays on disk
                    tracker.log_artifact(parent["run_id"], path, "report")
                tracker.log(parent["run_id"], metrics=counts, tags={"calibrun.problems": str(len(problems))})
                headline = tracker.run(summarise, parent["run_id"], sweep_dir, parent.get("swept", []), counts,
                                       problems)
            except Exception as exc:
                problems.append(f"MLflow parent run not complete: {one_line(exc)}")
            if tracker is not None:
                error = tracker.close(parent["run_id"], "FAILED" if problems else "FINISHED")
                if error is None:
                    metric, better = headline or (HEADLINE, "lower")
                    link = link_line(tracker.uri, tracker.experiment_id,
                                     sweep_filter(str(sweep_dir.resolve()), parent["run_id"]), metric,
                                     ascending=better == "lower")
                else:
                    problems.append(f"MLflow parent run not closed: {one_line(error)}")
        _SWEEP.clear()
        PARENTS_HERE.pop(sweep_dir.resolve(), None)
        if link:
            print(link, file=sys.stderr)
        if problems:
            print(f"calibrun: sweep {sweep_dir} had {len(problems)} problem(s): " + "; ".join(problems),
                  file=sys.stderr)
            sys.exit(1)


def _metric_part(text: str, values: list[str] | None = None) -> str:
    """A key or value as part of a metric key: as a run name shows it (`faithful`), in the characters MLflow
    allows."""
    return re.sub(r"[^A-Za-z0-9_.\- ]", "_", faithful(str(text), values))


def summarise(tracker: Tracker, parent_id: str, sweep_dir: Path, swept: list[str], counts: dict | None = None,
              problems: list[str] | None = None) -> tuple[str, str] | None:
    """On the parent run: the params every finished child shares, the best run (the report's headline metric and
    tie-break: calibrun.report.aggregate.best_of) and the best value per value of each swept key, and a description
    (`mlflow.note.content`, shown on the run's page) that sums the sweep up in Markdown. Returns the headline
    (metric, 'lower'|'higher'), or None without a finished child. Run where the store is (`Tracker.run`)."""
    from calibrun.report.aggregate import best_of, headline_of

    children = [r for r in tracker.client.search_runs(
        [tracker.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}' and attributes.status = 'FINISHED'",
        max_results=10000) if HEADLINE in r.data.metrics]
    counts = counts or {}
    if not children:
        tracker.log(parent_id, tags={"mlflow.note.content": _note(None, [], swept, {}, counts, problems)})
        return None
    metric, better = headline_of([c.data.metrics for c in children], [
        None if c.data.params.get("model.name") == "lab" or "calibrun.verdict.headline" not in c.data.tags
        else (c.data.tags["calibrun.verdict.headline"], c.data.tags.get("calibrun.verdict.better")) for c in children])
    first = children[0].data.params
    common = {k: v for k, v in first.items() if all(c.data.params.get(k) == v for c in children)}
    existing = tracker.client.get_run(parent_id).data.params
    common = {k: v for k, v in common.items() if k not in existing or existing[k] == v}
    best = best_of([(c.data.metrics.get(metric), c.data.tags.get("calibrun.job_num", ""), c) for c in children],
                   better)
    metrics = {f"best_{metric}": best.data.metrics[metric]}
    per_value: dict[str, dict[str, float]] = {}
    pick = max if better == "higher" else min
    for key in swept:
        values: dict[str, float] = {}
        for child in children:
            value = child.data.tags.get(f"calibrun.swept.{key}")
            if value is not None and metric in child.data.metrics:
                seen = values.get(value)
                values[value] = child.data.metrics[metric] if seen is None else pick(seen, child.data.metrics[metric])
        per_value[key] = values
        metrics.update({f"best_{metric}/{_metric_part(key)}:{_metric_part(v, list(values))}": e
                        for v, e in values.items()})
    from mlflow.entities import Param

    params = [Param(k, v) for k, v in common.items() if k not in existing]
    for start in range(0, len(params), 100):
        tracker.client.log_batch(parent_id, params=params[start:start + 100])
    tracker.log(parent_id, metrics=metrics, tags={
        "calibrun.best_run": best.info.run_name, "calibrun.best_run_id": best.info.run_id,
        "calibrun.headline": f"{metric} ({better} is better)",
        "mlflow.note.content": _note((metric, better, best), children, swept, per_value, counts, problems)})
    return metric, better


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _note(best, children: list, swept: list[str], per_value: dict, counts: dict,
          problems: list[str] | None) -> str:
    """The parent run's description in Markdown: the jobs, the headline metric and best run, the best value per
    swept value, and the runs ranked."""
    ok, failed = counts.get("jobs_ok", len(children)), counts.get("jobs_failed", 0)
    lines = ["## calibrun sweep", "", f"{ok} job(s) finished, {failed} failed."
             + (f" Swept: {', '.join(f'`{k}`' for k in swept)}." if swept else "")]
    if problems:
        lines += ["", "**Problems:** " + _cell("; ".join(problems))]
    if best is None:
        return "\n".join(lines)
    metric, better, run = best
    lines += ["", f"Headline metric: **{metric}** ({better} is better). Best run: **{_cell(run.info.run_name)}** "
              f"(job {run.data.tags.get('calibrun.job_num', '?')}), {metric} = {run.data.metrics[metric]:.6g}; "
              "on a tie, the first job of the sweep."]
    for key, values in per_value.items():
        if values:
            lines += ["", f"| `{_cell(key)}` | best {metric} |", "|---|---|"]
            lines += [f"| {_cell(v)} | {e:.6g} |" for v, e in values.items()]
    from calibrun.report.aggregate import job_key

    ranked = sorted(children, key=lambda c: ((-1 if better == "higher" else 1) * c.data.metrics.get(metric, math.inf),
                                             job_key(c.data.tags.get("calibrun.job_num", ""))))
    lines += ["", f"| rank | run | job | {metric} |", "|---|---|---|---|"]
    lines += [f"| {i} | {_cell(c.info.run_name)} | {c.data.tags.get('calibrun.job_num', '?')} | "
              f"{c.data.metrics.get(metric, math.nan):.6g} |" for i, c in enumerate(ranked[:50], 1)]
    if len(ranked) > 50:
        lines.append(f"\n... and {len(ranked) - 50} more: sort the runs table by {metric}.")
    return "\n".join(lines)
