"""One job: prepare model -> calibrate (cached) -> quantise -> measure -> track.

Writes `int8.onnx`, `result.json` and `config_resolved.yaml` into the Hydra job folder and, with tracking
on, one MLflow run (a child of the sweep's parent run in a multirun).
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path

import onnx
import onnxruntime
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from calibrun import analysis, config, datasets, engine
from calibrun.calibrate import CalibrationCache
from calibrun.data import fixed_rows
from calibrun.diagnostics import as_table, classify_model, tensor_diagnostics
from calibrun.digits import ensure_digits
from calibrun.errors import CalibrunError, one_line
from calibrun.files import atomic_path, remove_orphans, write_json
from calibrun.measure import split_feeds
from calibrun.model import check_model_file, file_sha256, write_lab_model
from calibrun.prepare import PREPARE_VERSION, prepare_model
from calibrun.quantize import resolve_exclusions
from calibrun.tracking import PARENT_FILE, Tracker, resolve_uri

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
    of many jobs shares one prepared copy; without a cache, into the job folder.
    """
    with tempfile.TemporaryDirectory(prefix="calibrun.src.") as tmp:
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
                folder.mkdir(parents=True, exist_ok=True)
                name = f"{file_sha256(source)[:32]}-prep{PREPARE_VERSION}-ort{onnxruntime.__version__}"
                target = folder / f"{name}.onnx"
        steps_file = target.with_suffix(".steps.json")
        if target.parent != job_dir and target.is_file() and steps_file.is_file():
            log.info("prepared model %s (reused)", target)
            return engine.open_float_model(target), json.loads(steps_file.read_text())
        prepared = prepare_model(source, target)
        write_json(steps_file, list(prepared.steps))
    return engine.open_float_model(prepared.path), list(prepared.steps)


def is_classifier(cfg: DictConfig, fp32: engine.FloatModel, labels) -> bool:
    if cfg.model.classifier is not None:
        return bool(cfg.model.classifier)
    if labels is not None:
        return True
    model = onnx.load(str(fp32.path), load_external_data=False)
    first_output = model.graph.output[0].name
    return any(n.op_type in {"Softmax", "LogSoftmax"} and first_output in n.output for n in model.graph.node)


def compute(cfg: DictConfig, job_dir: Path) -> dict:
    """The measurement itself; returns the result record (without status)."""
    fp32, steps = prepare(cfg, job_dir)
    options, exclusions = resolve_exclusions(fp32.path, config.quant_options(cfg))  # names checked before any work
    cache = CalibrationCache(cfg.cache.dir) if cfg.cache.enabled else None
    int8_path = job_dir / "int8.onnx"
    data = datasets.calibration_data(cfg.data, fp32, cfg.calibration.seed, cfg.calibration.factor, cfg.batches)
    source = eval_source(cfg)
    evaluation = datasets.evaluation_data(source, fp32, source["seed"], source["rows"])  # bad data: before any work
    quant = engine.quantize_with(fp32, int8_path, data, spec=config.calibration_spec(cfg),
                                 options=options, cache=cache, ranges_copy=job_dir / RANGES_FILE,
                                 threads=cfg.ort.intra_op_threads,
                                 input_may_stay_float=bool(exclusions) or cfg.model.name != "lab")
    classifier = is_classifier(cfg, fp32, evaluation.labels)
    errors = engine.evaluate(fp32, int8_path, evaluation.feeds, cfg.ort.intra_op_threads, classifier,
                             evaluation.labels)
    metrics = {**quant, **errors, "model_bytes": quant["bytes"], "cache_hit": int(quant["cache_hit"])}
    result = {
        "params": {**job_params(cfg), "model_file": str(fp32.path), "model_sha256": fp32.sha256,
                   "rows_per_batch": data.identity()["rows_per_batch"]},
        "metrics": {key: metrics[key] for key in (*METRIC_KEYS, *TASK_KEYS) if key in metrics},
        "ops": quant["ops"],
        "cache_key": quant["cache_key"],
        "preparation": steps,
        **exclusions,
        "eval_source": source,
        "files": {"fp32": _relative(fp32.path, job_dir), "int8": int8_path.name, "ranges": RANGES_FILE,
                  "int8_sha256": file_sha256(int8_path), "ranges_sha256": file_sha256(job_dir / RANGES_FILE)},
    }
    if cfg.format.name == "qdq":
        feeds = split_feeds(evaluation.feeds, fixed_rows(fp32.info))
        rows = tensor_diagnostics(fp32.path, int8_path, job_dir / RANGES_FILE, feeds, cfg.ort.intra_op_threads)
        write_json(job_dir / DIAGNOSTICS_FILE, as_table(rows))  # column-oriented, strict JSON
        result["files"]["diagnostics"] = DIAGNOSTICS_FILE
        result["diagnosis"] = classify_model(rows)
    return result


def _relative(path: Path, folder: Path) -> str:
    try:
        return str(path.relative_to(folder.resolve()))
    except ValueError:
        return str(path)


def _parent(sweep_dir: Path | None) -> dict:
    """The sweep's parent run as the sweep callback recorded it ({} outside a tracked sweep)."""
    if sweep_dir is None or not (sweep_dir / PARENT_FILE).is_file():
        return {}
    return json.loads((sweep_dir / PARENT_FILE).read_text())


def _start_run(tracker: Tracker, cfg: DictConfig, job_dir: Path, sweep_dir: Path | None, job_num: int | None) -> str:
    """The job's MLflow run: a child of the sweep's parent run in a multirun."""
    tags = {"calibrun.job_dir": str(job_dir)}
    if sweep_dir is not None:
        tags.update({"calibrun.sweep_dir": str(sweep_dir.resolve()), "calibrun.job_num": str(job_num)})
    name = f"{cfg.calibration.name}-b{cfg.batches}-{cfg.format.name}-{cfg.method.name}"
    return tracker.start_run(name, tags, parent_id=_parent(sweep_dir).get("run_id"))


def _open_tracker(cfg: DictConfig, sweep_dir: Path | None) -> Tracker | None:
    """The job's tracking store: in a sweep, the one its parent run lives in (so workers on other machines or
    in other folders reach the same store); else the configured one."""
    if not config.tracking_enabled(cfg) or (cfg.tracking.name == "server" and not cfg.tracking.uri):
        return None
    uri = _parent(sweep_dir).get("tracking_uri") or resolve_uri(cfg.tracking.uri)
    return Tracker(uri, cfg.tracking.experiment)


def run(cfg: DictConfig, job_dir: Path, sweep_dir: Path | None = None, job_num: int | None = None) -> dict:
    """Validate, compute, write result.json and track. A failure is recorded (result.json with status
    failed, a FAILED MLflow run when tracking works) and then raised; an invalid config of a single run
    fails before anything is written."""
    invalid = _validation_error(cfg)
    if invalid is not None and sweep_dir is None:
        raise invalid  # a single run fails fast: nothing ran, nothing to track
    job_dir = job_dir.resolve()
    if cfg.resume:
        done = completed_result(cfg, job_dir)
        if done is not None:
            return _resumed(cfg, done, job_dir, sweep_dir, job_num)
    job_dir.mkdir(parents=True, exist_ok=True)
    _clear_orphans(cfg, job_dir)
    with atomic_path(job_dir / "config_resolved.yaml") as tmp:
        tmp.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    tracker, run_id = None, None
    try:
        tracker = _open_tracker(cfg, sweep_dir)
        if tracker is not None:
            run_id = _start_run(tracker, cfg, job_dir, sweep_dir, job_num)
        if invalid is not None:
            raise invalid
        result = {"status": "ok", **compute(cfg, job_dir)}
        analysis.attach(cfg, job_dir, result)
    except Exception as exc:
        message = one_line(exc)
        write_json(job_dir / RESULT_FILE, {"status": "failed", "error": message, "params": _plain_params(cfg)})
        if run_id is not None:
            tracker.log(run_id, params=_plain_params(cfg), tags={"calibrun.error": message})
            tracker.log_artifact(run_id, job_dir / RESULT_FILE)
            tracker.finish(run_id, failed=True)
        raise
    write_json(job_dir / RESULT_FILE, result)
    if run_id is not None:
        tracker.log(run_id, params=result["params"], metrics=result["metrics"],
                    tags={"calibrun.cache_key": result["cache_key"]})
        for name in ("int8.onnx", RESULT_FILE, RANGES_FILE, "config_resolved.yaml"):
            tracker.log_artifact(run_id, job_dir / name)
        if "diagnostics" in result["files"]:
            tracker.log_table(run_id, json.loads((job_dir / DIAGNOSTICS_FILE).read_text()), DIAGNOSTICS_FILE)
        analysis.log_to(tracker, run_id, job_dir, result)
        tracker.finish(run_id)
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


def _resumed(cfg: DictConfig, result: dict, job_dir: Path, sweep_dir: Path | None, job_num: int | None) -> dict:
    """Record a reused result as a run of this sweep (tagged resumed) so the parent still has every job."""
    tracker = _open_tracker(cfg, sweep_dir)
    if tracker is not None:
        run_id = _start_run(tracker, cfg, job_dir, sweep_dir, job_num)
        tracker.log(run_id, params=result["params"], metrics=result["metrics"],
                    tags={"calibrun.resumed": "true", "calibrun.cache_key": result["cache_key"]})
        tracker.log_artifact(run_id, job_dir / RESULT_FILE)
        tracker.finish(run_id)
    log.info("job %s: complete and valid, skipped (resume=true) -> %s", job_num, job_dir / RESULT_FILE)
    return result


def _validation_error(cfg: DictConfig) -> CalibrunError | None:
    try:
        config.validate(cfg)
    except CalibrunError as exc:
        return exc
    return None


def _plain_params(cfg: DictConfig) -> dict:
    """What a failed job records: its identity and the model it was given."""
    return {**_identity(cfg), "model_path": cfg.model.path}


def main(cfg: DictConfig) -> dict | None:
    """The Hydra task. A failing job in a multirun is recorded and reported, and the sweep goes on; the
    sweep callback makes the exit code non-zero. A failing single run exits 1 with one line."""
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    job_dir = Path(hydra_cfg.runtime.output_dir)
    sweep_dir = Path(hydra_cfg.sweep.dir) if multirun else None
    job_num = hydra_cfg.job.num if multirun else None
    try:
        return analysis.objective(cfg, run(cfg, job_dir, sweep_dir, job_num))  # a float for a search
    except Exception as exc:
        message = one_line(exc)
        if not isinstance(exc, CalibrunError):
            log.debug("job failed", exc_info=True)
        if multirun:
            log.error("job %s failed: %s", job_num, message)
            return analysis.objective(cfg, {"status": "failed", "error": message})
        print(f"calibrun: error: {message}", file=sys.stderr)
        sys.exit(1)
