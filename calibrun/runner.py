"""One job: prepare model -> calibrate (cached) -> quantise -> measure -> track.

Writes `int8.onnx`, `result.json` and `config_resolved.yaml` into the Hydra job folder and, with tracking
on, one MLflow run (a child of the sweep's parent run in a multirun).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import onnx
import onnxruntime
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from calibrun import config, engine
from calibrun.calibrate import CalibrationCache
from calibrun.errors import CalibrunError, one_line
from calibrun.files import write_json
from calibrun.model import write_lab_model
from calibrun.tracking import PARENT_FILE, Tracker, resolve_uri

log = logging.getLogger("calibrun")

RESULT_FILE = "result.json"
METRIC_KEYS = ("span", "input_scale", "input_zero_point", "observed_span", "max_abs_error", "mean_abs_error",
               "max_abs_output", "calibration_seconds", "quantization_seconds", "model_bytes", "cache_hit",
               "quantize_nodes", "dequantize_nodes")


def job_params(cfg: DictConfig) -> dict:
    params = {
        "calibration": cfg.calibration.name,
        "factor": cfg.calibration.factor,
        "seed": cfg.calibration.seed,
        "batches": cfg.batches,
        "format": cfg.format.name,
        "method": cfg.method.name,
        "model": cfg.model.name,
        "eval_seed": cfg.eval.seed,
        "eval_rows": cfg.eval.rows,
        "onnxruntime_version": onnxruntime.__version__,
        "onnx_version": onnx.__version__,
    }
    params.update({f"method.{k}": v for k, v in config.calibration_spec(cfg).calibrator_options().items()})
    return params


def compute(cfg: DictConfig, job_dir: Path) -> dict:
    """The measurement itself; returns the result record (without status)."""
    if cfg.model.name == "lab":
        fp32_path = write_lab_model(job_dir / "fp32.onnx")
    else:
        fp32_path = Path(cfg.model.path).expanduser().resolve()
    fp32 = engine.open_float_model(fp32_path)
    cache = CalibrationCache(cfg.cache.dir) if cfg.cache.enabled else None
    int8_path = job_dir / "int8.onnx"
    quant = engine.quantize_lab(
        fp32, int8_path, cfg.calibration.seed, cfg.calibration.factor, cfg.batches,
        spec=config.calibration_spec(cfg), options=config.quant_options(cfg), cache=cache,
    )
    errors = engine.error(fp32.path, int8_path, cfg.eval.seed, cfg.eval.rows, cfg.ort.intra_op_threads)
    metrics = {**quant, **errors, "model_bytes": quant["bytes"], "cache_hit": int(quant["cache_hit"])}
    return {
        "params": {**job_params(cfg), "model_file": str(fp32.path), "model_sha256": fp32.sha256},
        "metrics": {key: metrics[key] for key in METRIC_KEYS},
        "ops": quant["ops"],
        "cache_key": quant["cache_key"],
        "files": {"fp32": _relative(fp32.path, job_dir), "int8": int8_path.name},
    }


def _relative(path: Path, folder: Path) -> str:
    try:
        return str(path.relative_to(folder.resolve()))
    except ValueError:
        return str(path)


def _parent_run(sweep_dir: Path | None) -> str | None:
    if sweep_dir is None or not (sweep_dir / PARENT_FILE).is_file():
        return None
    return json.loads((sweep_dir / PARENT_FILE).read_text())["run_id"]


def _open_tracker(cfg: DictConfig) -> Tracker | None:
    if not config.tracking_enabled(cfg) or (cfg.tracking.name == "server" and not cfg.tracking.uri):
        return None
    return Tracker(resolve_uri(cfg.tracking.uri), cfg.tracking.experiment)


def run(cfg: DictConfig, job_dir: Path, sweep_dir: Path | None = None, job_num: int | None = None) -> dict:
    """Validate, compute, write result.json and track. A failure is recorded (result.json with status
    failed, a FAILED MLflow run when tracking works) and then raised."""
    job_dir = job_dir.resolve()
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "config_resolved.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    tracker, run_id = None, None
    try:
        invalid = _validation_error(cfg)
        tracker = _open_tracker(cfg)
        if tracker is not None:
            tags = {"calibrun.job_dir": str(job_dir)}
            if sweep_dir is not None:
                tags.update({"calibrun.sweep_dir": str(sweep_dir.resolve()), "calibrun.job_num": str(job_num)})
            name = f"{cfg.calibration.name}-b{cfg.batches}-{cfg.format.name}-{cfg.method.name}"
            run_id = tracker.start_run(name, tags, parent_id=_parent_run(sweep_dir))
        if invalid is not None:
            raise invalid
        result = {"status": "ok", **compute(cfg, job_dir)}
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
        for name in ("int8.onnx", RESULT_FILE, "config_resolved.yaml"):
            tracker.log_artifact(run_id, job_dir / name)
        tracker.finish(run_id)
    m = result["metrics"]
    log.info("%s factor=%s batches=%s %s: input_scale=%.6g max_abs_error=%.6g cache_hit=%s -> %s",
             cfg.calibration.name, cfg.calibration.factor, cfg.batches, cfg.format.name, m["input_scale"],
             m["max_abs_error"], bool(m["cache_hit"]), job_dir / RESULT_FILE)
    return result


def _validation_error(cfg: DictConfig) -> CalibrunError | None:
    try:
        config.validate(cfg)
    except CalibrunError as exc:
        return exc
    return None


def _plain_params(cfg: DictConfig) -> dict:
    """The job's identity as configured (safe to build from an invalid config)."""
    return {"calibration": cfg.calibration.name, "factor": cfg.calibration.factor, "seed": cfg.calibration.seed,
            "batches": cfg.batches, "format": cfg.format.name, "method": cfg.method.name, "model": cfg.model.name,
            "model_path": cfg.model.path}


def main(cfg: DictConfig) -> dict | None:
    """The Hydra task. A failing job in a multirun is recorded and reported, and the sweep goes on; the
    sweep callback makes the exit code non-zero. A failing single run exits 1 with one line."""
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    job_dir = Path(hydra_cfg.runtime.output_dir)
    sweep_dir = Path(hydra_cfg.sweep.dir) if multirun else None
    job_num = hydra_cfg.job.num if multirun else None
    try:
        return run(cfg, job_dir, sweep_dir, job_num)
    except Exception as exc:
        message = one_line(exc)
        if not isinstance(exc, CalibrunError):
            log.debug("job failed", exc_info=True)
        if multirun:
            log.error("job %s failed: %s", job_num, message)
            return {"status": "failed", "error": message}
        print(f"calibrun: error: {message}", file=sys.stderr)
        sys.exit(1)
