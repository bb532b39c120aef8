"""One job: prepare model -> calibrate (cached) -> quantise -> measure -> track.

Writes `int8.onnx`, `result.json` and `config_resolved.yaml` into the Hydra job folder and, with tracking
on, one MLflow run (a child of the sweep's parent run in a multirun).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import signal
import sys
from pathlib import Path

import onnx
import onnxruntime
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from calibrun import analysis, config, datasets, engine, measure, tasks
from calibrun.calibrate import CalibrationCache
from calibrun.diagnostics import StreamingDiagnostics, as_table, classify_model
from calibrun.digits import ensure_digits
from calibrun.errors import CalibrunError, one_line
from calibrun.files import atomic_path, remove_orphans, remove_temp_orphans, temp_dir, write_json
from calibrun.model import check_model_file, file_sha256, write_lab_model
from calibrun.prepare import PREPARE_VERSION, external_data_path, prepare_model
from calibrun.quantize import resolve_exclusions
from calibrun.sweep import die_of, install_signal_handlers  # also registers the sweep folder resolver
from calibrun.tracking import PARENT_FILE, Tracker, open_tracker, resolve_uri

log = logging.getLogger("calibrun")

RESULT_FILE = "result.json"
RANGES_FILE = "ranges.json"
DIAGNOSTICS_FILE = "diagnostics.json"
TASK_KEYS = ("top1_agreement", "fp32_accuracy", "int8_accuracy")
METRIC_KEYS = ("span", "input_scale", "input_zero_point", "observed_span", "max_abs_error", "mean_abs_error",
               "max_abs_output", "calibration_seconds", "quantization_seconds", "model_bytes", "cache_hit",
               "quantize_nodes", "dequantize_nodes")


def _identity(cfg: DictConfig) -> dict:
    """Which job this is, as configured (safe to build from an invalid config)."""
    return {"calibration": cfg.calibration.name, "factor": cfg.calibration.factor, "seed": cfg.calibration.seed,
            "batches": cfg.batches, "format": cfg.format.name, "method": cfg.method.name, "model": cfg.model.name}


def job_params(cfg: DictConfig) -> dict:
    params = {
        **_identity(cfg),
        "data": cfg.data.name,
        "eval_data": cfg.eval_data.name,
        "eval_seed": cfg.eval.seed,
        "eval_rows": cfg.eval.rows,
        "onnxruntime_version": onnxruntime.__version__,
        "onnx_version": onnx.__version__,
    }
    params.update({f"method.{k}": v for k, v in config.calibration_spec(cfg).calibrator_options().items()})
    params.update({f"quant.{k}": v for k, v in OmegaConf.to_container(cfg.quant).items()})
    for key in ("data", "eval_data"):
        if cfg[key].path:
            params[f"{key}.path"] = cfg[key].path
    return params


def eval_source(cfg: DictConfig) -> dict:
    """Everything that rebuilds the evaluation rows (kept in result.json for the aggregator)."""
    return {**OmegaConf.to_container(cfg.eval_data, resolve=True), "seed": cfg.eval.seed, "rows": cfg.eval.rows}


def prepare(cfg: DictConfig, job_dir: Path) -> tuple[engine.FloatModel, list[str]]:
    """The prepared float model: the lab model or the user's file made quantisable (calibrun.prepare).

    A user's model is prepared once per source file into the cache folder (content-addressed), so a sweep
    of many jobs shares one prepared copy; without a cache, into the job folder. A cached copy is used only
    when its bytes (and its external data file's) still have the sha256 recorded beside it when it was made;
    a truncated or replaced one is reported in one warning line and prepared again.
    """
    with temp_dir("src") as tmp:
        if cfg.model.name == "lab":
            source = write_lab_model(Path(tmp) / "lab.onnx")
            target = job_dir / "fp32.onnx"
        else:
            if cfg.model.name == "digits":
                source = ensure_digits(Path(cfg.cache.dir) / "digits") / "digits.onnx"
            else:
                source = check_model_file(Path(cfg.model.path).expanduser().resolve())
            target = job_dir / "fp32.onnx"
            if cfg.cache.enabled:
                folder = Path(cfg.cache.dir) / "models"
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise CalibrunError(f"cannot create cache folder {folder}: {exc.strerror or exc}") from exc
                name = f"{file_sha256(source)[:32]}-prep{PREPARE_VERSION}-ort{onnxruntime.__version__}"
                target = folder / f"{name}.onnx"
        record_file = target.with_suffix(".steps.json")
        if target.parent != job_dir and target.is_file():
            reused = _verified_prepared(target, record_file)
            if reused is not None:
                log.info("prepared model %s (reused, sha256 verified)", target)
                return engine.open_float_model(target, sha256=reused["model_sha256"]), list(reused["steps"])
        prepared = prepare_model(source, target)
        record = {"steps": list(prepared.steps), "model_sha256": file_sha256(prepared.path),
                  "data_sha256": file_sha256(prepared.data_path) if prepared.data_path else None}
        write_json(record_file, record)
    return engine.open_float_model(prepared.path, sha256=record["model_sha256"]), list(prepared.steps)


def _verified_prepared(target: Path, record_file: Path) -> dict | None:
    """The record of a cached prepared model whose files still match it; None (with one warning line when
    something is wrong rather than merely missing) when it must be prepared again."""
    problem = None
    try:
        record = json.loads(record_file.read_text())
        if not isinstance(record, dict) or not isinstance(record.get("model_sha256"), str):
            problem = "it has no recorded sha256"
        elif file_sha256(target) != record["model_sha256"]:
            problem = "its bytes do not match the sha256 recorded when it was made (truncated or replaced?)"
        else:
            data = external_data_path(target)
            want = record.get("data_sha256")
            if want is not None and (not data.is_file() or file_sha256(data) != want):
                problem = f"its data file {data.name} is missing or does not match its recorded sha256"
            elif not isinstance(record.get("steps"), list):
                problem = "its record has no preparation steps"
    except FileNotFoundError:
        # No record yet: another job may have just placed the model and be hashing it (a parallel sweep on a
        # fresh cache). Preparing again gives the same bytes; nothing is wrong, so no warning.
        log.info("prepared model %s has no sha256 record beside it (yet); preparing it again", target)
        return None
    except (OSError, ValueError) as exc:
        problem = f"its record is unreadable ({one_line(exc)})"
    if problem is None:
        return record
    log.warning("prepared model cache %s is unusable: %s; preparing it again", target, problem)
    return None


def _used(cfg: DictConfig, data, evaluation, errors: dict) -> dict:
    """What the job really used (result.json `used`), warning where it differs from what was asked."""
    identity = data.identity()
    batches = int(identity.get("batches", len(data)))
    rows_per_batch = int(identity.get("rows_per_batch", 0))
    used = {
        "calibration_batches": batches,
        "calibration_rows": int(identity.get("rows", batches * rows_per_batch)),
        "calibration_rows_per_batch": rows_per_batch,
        "eval_rows": int(errors["rows"]),
        "eval_batches": int(errors["eval_batches"]),
        "eval_batch_size": int(errors["eval_batch_size"]),
        "calibration_source": {k: v for k, v in identity.items() if k != "files"},
        "calibration_files": len(identity.get("files", [])),
        "eval_source": {k: v for k, v in evaluation.identity.items() if k != "files"},
        "eval_files": len(evaluation.identity.get("files", [])),
    }
    if batches != cfg.batches:
        log.warning("calibration used %d batches, %d were requested", batches, cfg.batches)
    if used["eval_rows"] != cfg.eval.rows:
        log.warning("evaluation used %d rows, %d were requested", used["eval_rows"], cfg.eval.rows)
    return used


def _source_model(cfg: DictConfig) -> dict:
    """The user's model file as given (path and sha256), beside the prepared copy the job measured."""
    if cfg.model.name != "file" or not cfg.model.path:
        return {}
    path = Path(cfg.model.path).expanduser().resolve()
    return {"source_model_path": str(path), "source_model_sha256": file_sha256(path)}


def compute(cfg: DictConfig, job_dir: Path) -> dict:
    """The measurement itself; returns the result record (without status)."""
    fp32, steps = prepare(cfg, job_dir)
    options, exclusions = resolve_exclusions(fp32.path, config.quant_options(cfg))  # names checked before any work
    cache = CalibrationCache(cfg.cache.dir) if cfg.cache.enabled else None
    int8_path = job_dir / "int8.onnx"
    data = datasets.calibration_data(cfg.data, fp32, cfg.calibration.seed, cfg.calibration.factor, cfg.batches)
    source = eval_source(cfg)
    # bad evaluation data (missing files, wrong shapes, unknown task output) fails before any work
    evaluation = datasets.evaluation_data(source, fp32, source["seed"], source["rows"])
    task = tasks.resolve(tasks.spec_of(cfg.task), fp32.path, labels=evaluation.labels is not None,
                         classifier=cfg.model.classifier)
    quant = engine.quantize_with(fp32, int8_path, data, spec=config.calibration_spec(cfg),
                                 options=options, cache=cache, ranges_copy=job_dir / RANGES_FILE,
                                 threads=cfg.ort.intra_op_threads,
                                 input_may_stay_float=bool(exclusions) or cfg.model.name != "lab")
    diag = None
    if cfg.format.name == "qdq" and cfg.diagnostics.enabled:
        diag = StreamingDiagnostics(fp32.path, int8_path, job_dir / RANGES_FILE, cfg.ort.intra_op_threads,
                                    max_rows=cfg.diagnostics.rows)
    try:
        errors = measure.evaluate(fp32.path, int8_path, evaluation, task, cfg.ort.intra_op_threads,
                                  cfg.eval.batch_size, observers=[diag] if diag is not None else (),
                                  progress="evaluation" + (" and diagnostics" if diag is not None else ""))
        rows = diag.rows() if diag is not None else None
    finally:
        if diag is not None:
            diag.close()
    metrics = {**quant, **errors, **tasks.legacy(errors), "model_bytes": quant["bytes"],
               "cache_hit": int(quant["cache_hit"])}
    extra = [k for k in errors if k.startswith(("out.", "task.")) or k in ("eval_min", "eval_max", "eval_span")]
    result = {
        "params": {**job_params(cfg), "model_file": str(fp32.path), "model_sha256": fp32.sha256,
                   "rows_per_batch": data.identity()["rows_per_batch"], **_source_model(cfg)},
        "metrics": {key: metrics[key] for key in (*METRIC_KEYS, *TASK_KEYS, *extra) if key in metrics},
        "ops": quant["ops"],
        "cache_key": quant["cache_key"],
        "preparation": steps,
        **exclusions,
        "eval_source": source,
        "used": {**_used(cfg, data, evaluation, errors),
                 "diagnostics_rows": diag.rows_seen if diag is not None else 0},
        "task": task.describe(),
        "files": {"fp32": _relative(fp32.path, job_dir), "int8": int8_path.name, "ranges": RANGES_FILE,
                  "int8_sha256": file_sha256(int8_path), "ranges_sha256": file_sha256(job_dir / RANGES_FILE)},
    }
    if rows is not None:
        write_json(job_dir / DIAGNOSTICS_FILE, as_table(rows))  # column-oriented, strict JSON
        result["files"]["diagnostics"] = DIAGNOSTICS_FILE
        outputs = {k[len("out."):-len(".sqnr_db")]: v for k, v in errors.items()
                   if k.startswith("out.") and k.endswith(".sqnr_db") and not re.search(r"\.ch\d+\.sqnr_db$", k)}
        result["diagnosis"] = _strict(classify_model(rows, diag.weights, output_sqnr_db=outputs))
        culprits = result["diagnosis"]["culprits"]
        if culprits:
            top = culprits[0]
            log.info("diagnosis: %s; top culprit %s (node %s, %s, %.0f%% of the added error)",
                     result["diagnosis"]["overall"], top["tensor"], top["node"], top["verdict"],
                     100 * (top["noise_share"] or 0))
    return result


def _strict(value):
    """JSON without inf/NaN (they become null)."""
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _relative(path: Path, folder: Path) -> str:
    """`path` relative to the job folder when inside it, else absolute (a relative cache path starts from the
    working directory, which the aggregator may not share)."""
    path = path.resolve()
    try:
        return str(path.relative_to(folder.resolve()))
    except ValueError:
        return str(path)


def _parent(sweep_dir: Path | None) -> dict:
    """The sweep's parent run as the sweep callback recorded it ({} outside a tracked sweep)."""
    if sweep_dir is None or not (sweep_dir / PARENT_FILE).is_file():
        return {}
    return json.loads((sweep_dir / PARENT_FILE).read_text())


GROUPS = ("calibration", "format", "method", "model", "data", "eval_data", "cache", "tracking", "experiment")


def run_name(cfg: DictConfig, overrides: list[str] | None, swept: list[str] | None) -> str:
    """A readable run name from the job's swept overrides (`narrow batches=8 qdq`; config groups by their
    choice, paths by their file name); outside a sweep, from what the job is."""
    values = {}
    for override in overrides or []:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if key in (swept or []):
            values[key] = value
    if not values:
        return (f"{cfg.calibration.name} batches={cfg.batches} {cfg.format.name} {cfg.method.name}"
                + ("" if cfg.model.name == "lab" else f" {Path(str(cfg.model.path or cfg.model.name)).name}"))
    parts = []
    for key, value in values.items():
        if "/" in value:
            value = Path(value).name
        parts.append(value if key in GROUPS else f"{key.rsplit('.', 1)[-1] if key.endswith('.path') else key}={value}")
    return " ".join(parts)


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
        flat["model.sha256"] = result["params"].get("model_sha256")
    return flat


def job_metrics(result: dict) -> dict:
    """Every number of result.json's metrics, and the diagnosis: its numbers, and each verdict as a metric
    `diagnosis.<key>.<verdict>` = 1 (tags carry the words)."""
    metrics = {k: v for k, v in result.get("metrics", {}).items() if isinstance(v, (int, float))}
    for key, value in (result.get("diagnosis") or {}).items():
        if isinstance(value, bool):
            metrics[f"diagnosis.{key}"] = int(value)
        elif isinstance(value, (int, float)):
            metrics[f"diagnosis.{key}"] = value
        elif isinstance(value, str) and key != "input_tensor":
            metrics[f"diagnosis.{key}.{value}"] = 1
        elif isinstance(value, dict):
            metrics.update({f"diagnosis.{key}.{k}": v for k, v in value.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return metrics


def _diagnosis_tags(result: dict) -> dict:
    return {f"diagnosis.{k}": v for k, v in (result.get("diagnosis") or {}).items()
            if isinstance(v, str) and k != "input_tensor"}


def _datasets(cfg: DictConfig, result: dict) -> dict[str, dict]:
    """The calibration and evaluation data by their identity dicts (what decides the arrays; no arrays loaded
    for the lab rule, file hashes for user files)."""
    fp32 = engine.open_float_model(Path(result["params"]["model_file"]))
    calibration = datasets.calibration_data(cfg.data, fp32, cfg.calibration.seed, cfg.calibration.factor,
                                            cfg.batches).identity()
    evaluation = dict(result.get("eval_source") or eval_source(cfg))
    evaluation.setdefault("source", evaluation.get("name"))
    if evaluation.get("name") != "images":
        evaluation = {k: v for k, v in evaluation.items() if k not in ("resize", "crop", "mean", "std", "grayscale")}
    path = Path(str(evaluation.get("path") or ""))
    if evaluation.get("path") and path.is_file():
        evaluation["sha256"] = file_sha256(path)  # the rows' content, not only where they were
    return {"calibration": calibration, "evaluation": evaluation}


class Job:
    """Where a job's run lives and what it is called (built once per job by main)."""

    def __init__(self, sweep_dir: Path | None = None, job_num: int | None = None,
                 overrides: list[str] | None = None):
        self.sweep_dir, self.job_num, self.overrides = sweep_dir, job_num, list(overrides or [])
        self.parent = _parent(sweep_dir)

    def tags(self, cfg: DictConfig, job_dir: Path) -> dict:
        tags = {"calibrun.job_dir": str(job_dir)}
        if self.sweep_dir is not None:
            tags.update({"calibrun.sweep_dir": str(self.sweep_dir.resolve()), "calibrun.job_num": str(self.job_num)})
        swept = self.parent.get("swept", [])
        for override in self.overrides:
            key, _, value = override.partition("=")
            if key.lstrip("+~") in swept:
                tags[f"calibrun.swept.{key.lstrip('+~')}"] = value
        return tags

    def name(self, cfg: DictConfig) -> str:
        return run_name(cfg, self.overrides, self.parent.get("swept"))


def _start_run(tracker: Tracker, cfg: DictConfig, job_dir: Path, job: Job) -> str:
    """The job's MLflow run: a child of the sweep's parent run in a multirun."""
    return tracker.start_run(job.name(cfg), job.tags(cfg, job_dir), parent_id=job.parent.get("run_id"))


def _open_tracker(cfg: DictConfig, job: Job, check: bool = False) -> Tracker | None:
    """The job's tracking store: in a sweep, the one its parent run lives in (so workers on other machines or
    in other folders reach the same store); else the configured one."""
    if not config.tracking_enabled(cfg) or (cfg.tracking.name == "server" and not cfg.tracking.uri):
        return None
    uri = job.parent.get("tracking_uri") or resolve_uri(cfg.tracking.uri)
    return open_tracker(uri, cfg.tracking.experiment, check=check, http_timeout=cfg.tracking.get("http_timeout"),
                   http_retries=cfg.tracking.get("http_retries"))


def _track(tracker: Tracker, run_id: str, cfg: DictConfig, result: dict, job_dir: Path, job: Job) -> None:
    """Everything but result.json onto the job's run: params, datasets, the int8 model as a LoggedModel (the
    run's metrics linked to it), metrics, tags, files. Records the ids in result["mlflow"]."""
    tracker.log(run_id, params=mlflow_params(cfg, result),
                tags={"calibrun.cache_key": result["cache_key"], "calibrun.model_file": result["params"]["model_file"],
                      **_diagnosis_tags(result)})
    tracker.log_datasets(run_id, _datasets(cfg, result))
    model_id = None
    if cfg.tracking.get("log_model", True):
        model_id = tracker.log_model(run_id, job_dir / "int8.onnx", f"int8 {job.name(cfg)}",
                                     register=cfg.tracking.get("register"))
    tracker.log(run_id, metrics=job_metrics(result), model_id=model_id)
    for name in (RANGES_FILE, "config_resolved.yaml"):
        tracker.log_artifact(run_id, job_dir / name)
    if "diagnostics" in result["files"]:
        tracker.log_table(run_id, json.loads((job_dir / DIAGNOSTICS_FILE).read_text()), DIAGNOSTICS_FILE)
    result["mlflow"] = {"run_id": run_id, "experiment_id": tracker.experiment_id, "model_id": model_id}


def run(cfg: DictConfig, job_dir: Path, sweep_dir: Path | None = None, job_num: int | None = None,
        overrides: list[str] | None = None) -> dict:
    """Validate, compute, track, write result.json. A failure is recorded (result.json with status failed, a
    FAILED MLflow run when tracking works) and then raised; an interrupt (SIGINT, SIGTERM) ends the run KILLED
    and writes no result. result.json says ok only once tracking succeeded. An invalid config or an unusable
    tracking store of a single run fails before anything is written."""
    job = Job(sweep_dir, job_num, overrides)
    invalid = _validation_error(cfg)
    if invalid is not None and sweep_dir is None:
        raise invalid  # a single run fails fast: nothing ran, nothing to track
    job_dir = job_dir.resolve()
    tracker = None
    if sweep_dir is None:
        tracker = _open_tracker(cfg, job, check=True)  # the sweep callback checked the store of a sweep
    if cfg.resume:
        done = completed_result(cfg, job_dir)
        if done is not None:
            return _resumed(cfg, done, job_dir, job, tracker)
    job_dir.mkdir(parents=True, exist_ok=True)
    _clear_orphans(cfg, job_dir)
    with atomic_path(job_dir / "config_resolved.yaml") as tmp:
        tmp.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    run_id = None
    try:
        if sweep_dir is not None:
            tracker = _open_tracker(cfg, job)
        if tracker is not None:
            run_id = _start_run(tracker, cfg, job_dir, job)
        if invalid is not None:
            raise invalid
        result = {"status": "ok", **compute(cfg, job_dir)}
        analysis.attach(cfg, job_dir, result)
        if run_id is not None:
            _track(tracker, run_id, cfg, result, job_dir, job)
            analysis.log_to(tracker, run_id, job_dir, result)
        write_json(job_dir / RESULT_FILE, result)
        if run_id is not None:
            tracker.log_artifact(run_id, job_dir / RESULT_FILE)
            tracker.finish(run_id)
    except KeyboardInterrupt:
        if run_id is not None:
            with contextlib.suppress(Exception):
                tracker.finish(run_id, "KILLED")
        raise
    except Exception as exc:
        message = one_line(exc)
        record = {"status": "failed", "error": message, "params": _plain_params(cfg)}
        if run_id is not None:
            record["mlflow"] = {"run_id": run_id, "experiment_id": tracker.experiment_id}
        try:
            write_json(job_dir / RESULT_FILE, record)
        except Exception:  # a full disk: the record cannot be written, the run is closed all the same
            if run_id is not None:
                with contextlib.suppress(Exception):
                    tracker.finish(run_id, "FAILED")
            raise
        if run_id is not None:
            try:
                tracker.log(run_id, params=_failed_params(cfg), tags={"calibrun.error": message[:5000]})
                tracker.log_artifact(run_id, job_dir / RESULT_FILE)
            except Exception as error:
                log.warning("job %s: the error could not be logged to MLflow: %s", job_num, one_line(error))
            finally:
                with contextlib.suppress(Exception):
                    tracker.finish(run_id, "FAILED")
        raise
    m = result["metrics"]
    scale = "fp32 (not quantised)" if m.get("input_scale") is None else f"{m['input_scale']:.6g}"
    log.info("%s factor=%s batches=%s %s: input_scale=%s max_abs_error=%.6g cache_hit=%s -> %s",
             cfg.calibration.name, cfg.calibration.factor, cfg.batches, cfg.format.name, scale,
             m["max_abs_error"], bool(m["cache_hit"]), job_dir / RESULT_FILE)
    return result


def _clear_orphans(cfg: DictConfig, job_dir: Path) -> None:
    """Temp files a killed run left in the folders this job writes (its own, the cache's)."""
    cache = Path(cfg.cache.dir)
    removed = [p for folder in (job_dir, cache, cache / "models") for p in remove_orphans(folder)]
    removed += remove_temp_orphans()  # private temp folders (calibrun.calib.*, .q.*, ...) in the system temp dir
    if removed:
        log.info("removed %d temp file(s) left by killed runs: %s", len(removed), ", ".join(map(str, removed)))


def completed_result(cfg: DictConfig, job_dir: Path) -> dict | None:
    """The job's earlier result when it is complete and valid for this config, else None.

    Complete: result.json says ok, was made with the same params (this config, these library versions), and the
    int8 model and ranges it names are there with the bytes it recorded. Anything else is recomputed."""
    try:
        result = json.loads((job_dir / RESULT_FILE).read_text())
        files = result["files"]
        same = all(result["params"].get(k) == v for k, v in job_params(cfg).items())
        intact = all(file_sha256(job_dir / files[name]) == files[f"{name}_sha256"] for name in ("int8", "ranges"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return result if result.get("status") == "ok" and same and intact else None


def _resumed(cfg: DictConfig, result: dict, job_dir: Path, job: Job, tracker: Tracker | None) -> dict:
    """A reused result: already tracked as a FINISHED run of this sweep's parent, nothing is logged again; else
    (its run was killed, or is in another store or sweep) it is logged as a new run tagged resumed, and
    result.json records that run."""
    if job.sweep_dir is not None:
        tracker = _open_tracker(cfg, job)
    if tracker is not None:
        previous = (result.get("mlflow") or {}).get("run_id")
        tracked = False
        if previous:
            try:
                earlier = tracker.client.get_run(previous)
                tracked = earlier.info.status == "FINISHED" and \
                    earlier.data.tags.get("mlflow.parentRunId") == job.parent.get("run_id")
            except Exception:
                tracked = False
        if not tracked:
            run_id = _start_run(tracker, cfg, job_dir, job)
            try:
                tracker.log(run_id, tags={"calibrun.resumed": "true"})
                _track(tracker, run_id, cfg, result, job_dir, job)
                write_json(job_dir / RESULT_FILE, result)
                tracker.log_artifact(run_id, job_dir / RESULT_FILE)
                tracker.finish(run_id)
            except KeyboardInterrupt:
                with contextlib.suppress(Exception):
                    tracker.finish(run_id, "KILLED")
                raise
            except Exception:
                with contextlib.suppress(Exception):
                    tracker.finish(run_id, "FAILED")
                raise
    log.info("job %s: complete and valid, skipped (resume=true) -> %s", job.job_num, job_dir / RESULT_FILE)
    return result


def _validation_error(cfg: DictConfig) -> CalibrunError | None:
    try:
        config.validate(cfg)
    except CalibrunError as exc:
        return exc
    return None


def _failed_params(cfg: DictConfig) -> dict:
    """A failed job's MLflow params: the config keys when the config allows building them."""
    try:
        return mlflow_params(cfg)
    except Exception:
        return {f"{k}.name" if k in GROUPS else k: v for k, v in _identity(cfg).items()}


def _plain_params(cfg: DictConfig) -> dict:
    """What a failed job records: its identity and the model it was given."""
    return {**_identity(cfg), "model_path": cfg.model.path}


def main(cfg: DictConfig) -> dict | None:
    """The Hydra task. A failing job in a multirun is recorded and reported, and the sweep goes on; the
    sweep callback makes the exit code non-zero. A failing single run exits 1 with one line. SIGINT/SIGTERM
    end the job's run KILLED: a single run prints one line and dies of the signal; in a sweep the interrupt
    goes on up to the sweep callback, which closes the parent run."""
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    job_dir = Path(hydra_cfg.runtime.output_dir)
    sweep_dir = Path(hydra_cfg.sweep.dir) if multirun else None
    job_num = hydra_cfg.job.num if multirun else None
    install_signal_handlers()
    try:
        # a float for a search (analysis.objective), else the result record
        return analysis.objective(cfg, run(cfg, job_dir, sweep_dir, job_num, list(hydra_cfg.overrides.task)))
    except KeyboardInterrupt as exc:
        if multirun:
            raise
        name = signal.Signals(getattr(exc, "signum", signal.SIGINT)).name
        print(f"calibrun: interrupted by {name}: nothing written for this run"
              + ("" if not config.tracking_enabled(cfg) else ", its MLflow run (if started) KILLED"), file=sys.stderr)
        die_of(exc)
    except Exception as exc:
        message = one_line(exc)
        if not isinstance(exc, CalibrunError):
            log.debug("job failed", exc_info=True)
        if multirun:
            log.error("job %s failed: %s", job_num, message)
            return analysis.objective(cfg, {"status": "failed", "error": message})
        print(f"calibrun: error: {message}", file=sys.stderr)
        sys.exit(1)
