"""A job's MLflow record: what a job's run is named, and which params, metrics, tags, datasets, model and files
it holds (docs/tracking.md), its place under the sweep's parent run, and how it is closed. The runner
(calibrun.runner) decides when; this module decides what. The store itself is calibrun.tracking.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

import onnx
import onnxruntime
from omegaconf import DictConfig, OmegaConf

from calibrun import config
from calibrun.core.errors import one_line
from calibrun.core.files import DIAGNOSTICS_FILE, RANGES_FILE, write_json
from calibrun.data import source_record
from calibrun.job import job_identity
from calibrun.measure import verdict
from calibrun.model import file_sha256
from calibrun.result import JobResult
from calibrun.tracking import (
    MAX_RUN_NAME,
    PARENT_FILE,
    PARENTS_HERE,
    Tracker,
    faithful,
    latest_run,
    open_tracker,
    resolve_uri,
    shorten_middle,
)

log = logging.getLogger("calibrun")


def parent_of(sweep_dir: Path | None) -> dict:
    """The sweep's parent run as the sweep callback recorded it ({} outside a tracked sweep): in this process, as
    the callback keeps it (PARENTS_HERE: its run id may be a Pending answer of the tracking writer), else from the
    sweep folder's PARENT_FILE."""
    if sweep_dir is None:
        return {}
    if (kept := PARENTS_HERE.get(sweep_dir.resolve())) is not None:
        return dict(kept)
    if not (sweep_dir / PARENT_FILE).is_file():
        return {}
    return json.loads((sweep_dir / PARENT_FILE).read_text())


def record_parent(tracker: Tracker, sweep_dir: Path, run_id: str, info: dict) -> None:
    """The parent run's id in the sweep folder's PARENT_FILE, where a resumed sweep finds it. Run by the tracking
    writer right after it started the run, when the sweep's first jobs did not wait for it (calibrun.sweep). A file
    that cannot be written is one warning line: the sweep wrote the file before its jobs without the id, and a
    resumed sweep then finds the run by its sweep folder (`parent_by_folder`)."""
    try:
        write_json(sweep_dir / PARENT_FILE, {"run_id": run_id, "tracking_uri": tracker.uri,
                                             "experiment_id": tracker.experiment_id, **info})
    except OSError as exc:
        log.warning("MLflow parent run %s: its id not recorded in %s (%s); resume=true finds it by the sweep "
                    "folder", run_id, sweep_dir / PARENT_FILE, exc.strerror or exc)
        return
    log.info("MLflow parent run %s in %s", run_id, tracker.uri)


def parent_by_folder(tracker: Tracker, sweep_dir: Path, since_ms: int) -> str | None:
    """The latest parent run (no parent of its own) this store holds for the sweep folder, started at `since_ms`
    (epoch milliseconds) or later: not the run of an earlier sweep in a folder of the same name. Or None."""
    return latest_run(tracker, "calibrun.sweep_dir", str(sweep_dir.resolve()), f"attributes.start_time >= {since_ms}",
                      parentless=True)


GROUPS = ("calibration", "format", "method", "model", "data", "eval_data", "cache", "tracking", "experiment")


def run_name(cfg: DictConfig, overrides: list[str] | None, swept: list[str] | None,
             values: dict[str, list[str]] | None = None) -> str:
    """A readable run name from the job's swept overrides (`narrow batches=8 qdq`: config groups by their choice,
    every other key by its full name), each value whole or shortened in the middle (faithful: `values`, the
    sweep's values per key, tell which part distinguishes it); outside a sweep, from what the job is. At most
    MLflow's 250 characters."""
    chosen = {}
    for override in overrides or []:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if key in (swept or []):
            chosen[key] = value
    if not chosen:
        name = f"{cfg.calibration.name} batches={cfg.batches} {cfg.format.name} {cfg.method.name}"
        if cfg.model.name != "lab":
            name += f" {faithful(str(cfg.model.path or cfg.model.name))}"
        return shorten_middle(name, MAX_RUN_NAME)
    parts = []
    for key, value in chosen.items():
        shown = faithful(value, (values or {}).get(key))
        parts.append(shown if key in GROUPS else f"{key}={shown}")
    return shorten_middle(" ".join(parts), MAX_RUN_NAME)


def mlflow_params(cfg: DictConfig, result: dict | None = None) -> dict:
    """The job's params named as config keys (`calibration.factor`, `eval.seed`, `quant.per_channel`, ...) with the
    values the config has (Tracker writes them YAML-style), the library versions and the model's hash. Keys that
    do not apply are left out (image options of a non-image source, the options of other methods)."""
    tree = OmegaConf.to_container(cfg, resolve=True)
    for key in ("hydra", "report", "resume", "tracking"):
        tree.pop(key, None)
    for key in ("data", "eval_data"):
        if tree[key]["name"] != "images":
            tree[key] = {k: v for k, v in tree[key].items() if k in ("name", "path")}
    method = tree["method"]
    used = set(config.calibration_spec(cfg).calibrator_options())
    tree["method"] = {k: v for k, v in method.items()
                      if k in ("name", "chunk", "per_channel", "symmetric") or k in used}
    flat: dict = {}

    def walk(node, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v

    walk(tree, "")
    flat.update({"onnxruntime_version": onnxruntime.__version__, "onnx_version": onnx.__version__})
    if result is not None:
        flat["model.sha256"] = result.params.get("model_sha256")
    return flat


# result.json's names -> the MLflow metric's: the three spans of the input told apart (the calibrated range, the
# range the int8 grid covers, the evaluation data's)
MLFLOW_METRIC_NAMES = {"span": "input.calibrated_span", "observed_span": "input.int8_grid_span",
                       "eval_span": "input.eval_span"}


def job_metrics(result: JobResult) -> dict:
    """Every number of result.json's metrics, the first of HEADLINES it has first (task accuracy or agreement when
    the run has it, else max_abs_error), the spans by unambiguous names (MLFLOW_METRIC_NAMES), and the diagnosis'
    numbers: the count of tensors of every verdict, 0 included (so that runs compare). The verdicts themselves
    are words: tags (`diagnosis.input`, `diagnosis.overall`), not one-hot metrics that are NaN in every other
    run."""
    from calibrun.measure.diagnosis import VERDICTS
    from calibrun.report.aggregate import HEADLINES

    numbers = {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
    first = next((m for m, _ in HEADLINES if m in numbers), None)
    order = ([first] if first else []) + [k for k in numbers if k != first]
    metrics = {MLFLOW_METRIC_NAMES.get(k, k): numbers[k] for k in order}
    for key, value in (result.diagnosis or {}).items():
        if isinstance(value, bool):
            metrics[f"diagnosis.{key}"] = int(value)
        elif isinstance(value, (int, float)):
            metrics[f"diagnosis.{key}"] = value
        elif isinstance(value, dict):
            counts = {k: v for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if key == "counts":
                counts = {name: counts.get(name, 0) for name in (*VERDICTS, *counts)}
            metrics.update({f"diagnosis.{key}.{k}": v for k, v in counts.items()})
    return metrics


def output_tags(model: Path) -> dict:
    """The model's output names that its metric keys do not spell as they are (characters or paths MLflow
    rejects in a key, calibrun.measure.errors.output_keys): `calibrun.output.<key>` = the original name."""
    from calibrun.measure.errors import output_keys

    names = [o.name for o in onnx.load(str(model), load_external_data=False).graph.output]
    return {f"calibrun.output.{key}": name for key, name in output_keys(names).items()}


def diagnosis_tags(result: JobResult) -> dict:
    return {f"diagnosis.{k}": v for k, v in (result.diagnosis or {}).items()
            if isinstance(v, str) and k != "input_tensor"}


def verdict_tags(result: JobResult) -> dict:
    """The headline as tags: `calibrun.verdict` (ok|degraded|broken), why, the metric that ranks the run among a
    sweep's and which way is better (`calibrun.verdict.headline`, `calibrun.verdict.better`: the parent run's
    summary reads them, calibrun.sweep.summarise), and the best measured change."""
    tags = {}
    if result.verdict:
        tags = {"calibrun.verdict": result.verdict["status"], "calibrun.verdict.because": result.verdict["because"]}
        ranked = verdict.headline(result.verdict, result.metrics or {})
        if ranked is not None:
            tags.update({"calibrun.verdict.headline": ranked[0], "calibrun.verdict.better": ranked[1]})
    if result.recommendations:
        best = result.recommendations[0]  # as a user pastes it from the UI after the command (recommend.typed)
        tags["calibrun.recommendation"] = best.get("shell", best["change"])
    return tags


def calibration_identity(result: JobResult, job_dir: Path) -> dict:
    """The calibration data's identity as the job's ranges file records it (calibrun.quant.calibrate.cache_record:
    the identity and the input's name)."""
    ranges = json.loads((job_dir / result.files["ranges"]).read_text())
    return {k: v for k, v in ranges["calibrun"]["record"]["data"].items() if k != "input"}


def datasets(result: JobResult, job_dir: Path) -> dict[str, dict]:
    """The calibration and evaluation data by their identity dicts (what decides the arrays; no arrays loaded
    for the lab rule, file hashes for user files), as the job recorded them: the calibration data's in the
    record of its ranges file (calibrun.quant.calibrate.cache_record: the identity and the input's name), the
    evaluation data's in result.json `eval_source`; a resumed job logs what its result was computed from."""
    calibration = calibration_identity(result, job_dir)
    evaluation = source_record(result.eval_source)  # (a result.json of before session 30 lists every option)
    evaluation.setdefault("source", evaluation.get("name"))
    path = Path(str(evaluation.get("path") or ""))
    if evaluation.get("path") and path.is_file():
        evaluation["sha256"] = file_sha256(path)  # the rows' content, not only where they were
    return {"calibration": calibration, "evaluation": evaluation}


class Job:
    """Where a job's run lives and what it is called (built once per job by main)."""

    def __init__(self, sweep_dir: Path | None = None, job_num: int | None = None,
                 overrides: list[str] | None = None):
        self.sweep_dir, self.job_num, self.overrides = sweep_dir, job_num, list(overrides or [])
        self.parent = parent_of(sweep_dir)

    def tags(self, cfg: DictConfig, job_dir: Path) -> dict:
        tags = {"calibrun.job_dir": str(job_dir)}
        if self.sweep_dir is not None:
            tags.update({"calibrun.sweep_dir": str(self.sweep_dir.resolve()), "calibrun.job_num": str(self.job_num),
                         "calibrun.worker": f"{socket.gethostname()}:{os.getpid()}"})  # which worker ran the job
        swept = self.parent.get("swept", [])
        for override in self.overrides:
            key, _, value = override.partition("=")
            if key.lstrip("+~") in swept:
                tags[f"calibrun.swept.{key.lstrip('+~')}"] = value
        return tags

    def name(self, cfg: DictConfig) -> str:
        return run_name(cfg, self.overrides, self.parent.get("swept"), self.parent.get("values"))


def start_run(tracker: Tracker, cfg: DictConfig, job_dir: Path, job: Job) -> str:
    """The job's MLflow run: a child of the sweep's parent run in a multirun."""
    return tracker.start_run(job.name(cfg), job.tags(cfg, job_dir), parent_id=job.parent.get("run_id"))


def open_job_tracker(cfg: DictConfig, job: Job, check: bool = False) -> Tracker | None:
    """The job's tracking store: in a sweep, the one its parent run lives in (so workers on other machines or
    in other folders reach the same store); else the configured one."""
    if not config.tracking_enabled(cfg) or (cfg.tracking.name == "server" and not cfg.tracking.uri):
        return None
    uri = job.parent.get("tracking_uri") or resolve_uri(cfg.tracking.uri)
    return open_tracker(uri, cfg.tracking.experiment, check=check, http_timeout=cfg.tracking.get("http_timeout"),
                   http_retries=cfg.tracking.get("http_retries"))


def track(tracker: Tracker, run_id: str, cfg: DictConfig, result: JobResult, job_dir: Path, job: Job,
          resolve: bool = True):
    """Everything but result.json onto the job's run: params, datasets, the int8 model as a LoggedModel (the
    run's metrics linked to it), metrics, tags, files. Records the ids in result.mlflow (with `resolve`: else the
    writer records them, `complete_job`); returns the model id."""
    tracker.log(run_id, params=mlflow_params(cfg, result),
                tags={"calibrun.cache_key": result.cache_key, "calibrun.model_file": result.params["model_file"],
                      **diagnosis_tags(result), **verdict_tags(result), **output_tags(job_dir / "int8.onnx")})
    tracker.log_datasets(run_id, datasets(result, job_dir))
    model_id = None
    if cfg.tracking.get("log_model", True):
        model_id = tracker.log_model(run_id, job_dir / "int8.onnx", f"int8 {job.name(cfg)}",
                                     register=cfg.tracking.get("register"))
    tracker.log(run_id, metrics=job_metrics(result), model_id=model_id)
    for name in (RANGES_FILE, "config_resolved.yaml", result.files.get("int8_declared")):
        if name is not None:  # (int8_declared: the int8 model in the interface of a model given a row axis)
            tracker.log_artifact(run_id, job_dir / name)
    if "diagnostics" in result.files:
        tracker.log_table(run_id, json.loads((job_dir / DIAGNOSTICS_FILE).read_text()), DIAGNOSTICS_FILE)
    if "recommendations" in result.files:
        tracker.log_artifact(run_id, job_dir / result.files["recommendations"])
    if resolve:
        result.mlflow = {"run_id": tracker.resolve(run_id), "experiment_id": tracker.experiment_id,
                         "model_id": tracker.resolve(model_id)}
    return model_id


def close_earlier_runs(tracker: Tracker, job: Job) -> None:
    """Before a resumed sweep computes a job again: the job's earlier runs under this parent run, found by the job's
    identity (parent run, job number) and not by what result.json recorded, that are still FINISHED or RUNNING are
    closed FAILED (tagged calibrun.superseded). A tracking server dropped while marking a run FINISHED leaves it
    FINISHED on the server while the job counts as failed: without this, the job had two FINISHED runs."""
    parent = job.parent.get("run_id")
    if not parent or job.job_num is None:
        return
    for run_id, status in tracker.run(_close_earlier, parent, job.job_num):
        log.info("resume=true: job %s's earlier MLflow run %s (%s, its job not complete) closed FAILED",
                 job.job_num, run_id, status)


def _close_earlier(tracker: Tracker, parent: str, job_num: int) -> list[tuple[str, str]]:
    found = tracker.client.search_runs(
        [tracker.experiment_id], f"tags.mlflow.parentRunId = '{parent}' and tags.calibrun.job_num = '{job_num}'",
        max_results=1000)
    closed = []
    for earlier in found:
        if earlier.info.status in ("FINISHED", "RUNNING"):
            tracker.log(earlier.info.run_id, tags={"calibrun.superseded": "true"})
            tracker.finish(earlier.info.run_id, "FAILED")
            closed.append((earlier.info.run_id, earlier.info.status))
    return closed


def finished_under(tracker: Tracker, run_id: str, parent_id: str | None) -> bool:
    """Whether the store holds run `run_id` FINISHED under the parent run `parent_id` (a resumed job's earlier run)."""
    try:
        earlier = tracker.client.get_run(run_id)
    except Exception:
        return False
    return earlier.info.status == "FINISHED" and earlier.data.tags.get("mlflow.parentRunId") == parent_id


def complete_job(tracker: Tracker, run: tuple[bool, object], model: tuple[bool, object], result: JobResult,
                 path: Path, failure: tuple[str | None, dict, dict], died: Exception | None = None) -> str | None:
    """The end of a sweep job's record, in the tracking writer while the sweep's next job computes
    (calibrun.runner): when every call of the run succeeded, result.json (ok, with the run's ids) and the run
    FINISHED; else what the runner does for a failed job: result.json failed, the error on the run, the run FAILED,
    and the job's error line. `run` and `model` are (ok, id or error) as the writer resolved them. With `died` (the
    writer died before saying it had ended this record; calibrun's process does it instead): a record that is
    complete (result.json ok, its run FINISHED) is kept, any other fails with `died`. The error, or None."""
    from calibrun.tracking import writer

    (run_ok, run_id), (model_ok, model_id) = run, model
    if died is not None:
        try:
            written = (JobResult.read(path).mlflow or {}).get("run_id") if JobResult.read(path).ok else None
        except (OSError, ValueError, KeyError, TypeError):
            written = None
        if written and tracker.status(written) == "FINISHED":
            return None
        if written and not run_ok:
            run_ok, run_id = True, written
        error = died
    else:
        error = run_id if not run_ok else model_id if not model_ok else writer.run_failed(run_id)
    if error is None:
        try:
            result.mlflow = {"run_id": run_id, "experiment_id": tracker.experiment_id, "model_id": model_id}
            result.write(path)
            tracker.log_artifact(run_id, path)
            tracker.finish(run_id)
            return None
        except Exception as exc:
            error = exc
    job_num, plain, params = failure
    message = one_line(error)
    try:
        JobResult.failed(message, plain, mlflow={"run_id": run_id, "experiment_id": tracker.experiment_id}
                         if run_ok else None).write(path)
        written = True
    except Exception as exc:  # its folder full too: the run still ends FAILED (a probe's were left RUNNING)
        log.warning("%sits failed result.json could not be written: %s", _job(job_num), one_line(exc))
        written = False
    if run_ok:
        try:
            tracker.log(run_id, params=params, tags={"calibrun.error": message[:5000]})
            if written:
                tracker.log_artifact(run_id, path)
        except Exception as exc:
            log.warning("%sthe error could not be logged to MLflow: %s", _job(job_num), one_line(exc))
        finally:
            end_run(tracker, run_id, "FAILED")
    log.error("job %s failed: %s", job_num, message)
    return message


def _job(job_num) -> str:
    """A warning's subject: a sweep's job by its number; a single run's (no number) says nothing."""
    return "" if job_num is None else f"job {job_num}: "


def run_record(tracker: Tracker, run_id) -> dict | None:
    """result.json's `mlflow` of a failed job: its run's ids, or None when the store never gave them."""
    try:
        return {"run_id": tracker.resolve(run_id), "experiment_id": tracker.experiment_id}
    except Exception:
        return None


def failed_params(cfg: DictConfig) -> dict:
    """A failed job's MLflow params: the config keys when the config allows building them."""
    try:
        return mlflow_params(cfg)
    except Exception:
        return {f"{k}.name" if k in GROUPS else k: v for k, v in job_identity(cfg).items()}


def end_run(tracker: Tracker, run_id: str, status: str) -> None:
    """End the job's run KILLED or FAILED while an interrupt or an error goes on up (Tracker.close); a store that
    refuses twice is named in a warning."""
    error = tracker.close(run_id, status)
    if error is not None:
        shown = run_id if isinstance(run_id, str) else "of the job"  # (a run the writer never started)
        log.warning("MLflow run %s could not be marked %s: %s", shown, status, one_line(error))
