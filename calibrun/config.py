"""The typed config: a structured schema (types checked by OmegaConf at compose time) and value checks
(run before any work) that name the key at fault.

The yaml files in conf/ fill this schema; a key that is not in it, or a value of the wrong type, fails
when Hydra composes the config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from calibrun.calibrate import METHODS, CalibrationSpec
from calibrun.errors import CalibrunError
from calibrun.quantize import FORMATS, QuantOptions


@dataclass
class CalibrationConf:
    name: str = MISSING
    factor: float = MISSING
    seed: int = 4242


@dataclass
class FormatConf:
    name: str = "qdq"


@dataclass
class MethodConf:
    name: str = "minmax"
    symmetric: bool | None = None
    moving_average: bool = False
    averaging_constant: float = 0.01
    percentile: float = 99.999
    num_bins: int | None = None
    num_quantized_bins: int = 128
    scenario: str = "same"
    per_channel: bool = False
    chunk: int = 16


@dataclass
class ModelConf:
    name: str = "lab"
    path: str | None = None


@dataclass
class DataConf:
    name: str = "lab"


@dataclass
class EvalConf:
    seed: int = 777
    rows: int = 256


@dataclass
class CacheConf:
    enabled: bool = True
    dir: str = ".calibrun-cache"


TRACKING = ("local", "server", "off")


@dataclass
class TrackingConf:
    name: str = "local"  # local | server | off
    uri: str | None = None  # local: None means $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working dir
    experiment: str = "calibrun"



@dataclass
class ReportConf:
    dir: str | None = None  # None: SWEEP_DIR/report


@dataclass
class OrtConf:
    intra_op_threads: int = 0


@dataclass
class Config:
    calibration: CalibrationConf = field(default_factory=CalibrationConf)
    format: FormatConf = field(default_factory=FormatConf)
    method: MethodConf = field(default_factory=MethodConf)
    model: ModelConf = field(default_factory=ModelConf)
    data: DataConf = field(default_factory=DataConf)
    eval: EvalConf = field(default_factory=EvalConf)
    cache: CacheConf = field(default_factory=CacheConf)
    tracking: TrackingConf = field(default_factory=TrackingConf)
    report: ReportConf = field(default_factory=ReportConf)
    ort: OrtConf = field(default_factory=OrtConf)
    batches: int = 64


def register() -> None:
    ConfigStore.instance().store(name="calibrun_schema", node=Config)


def _need(ok: bool, key: str, rule: str, value) -> None:
    if not ok:
        raise CalibrunError(f"config {key}: {rule}, got {value!r}")


def validate(cfg: DictConfig) -> None:
    """Value checks the schema's types cannot express. Raises CalibrunError naming the key."""
    _need(cfg.batches >= 1, "batches", "must be >= 1", cfg.batches)
    _need(math.isfinite(cfg.calibration.factor) and cfg.calibration.factor > 0, "calibration.factor",
          "must be a finite number > 0", cfg.calibration.factor)
    _need(cfg.calibration.seed >= 0, "calibration.seed", "must be >= 0", cfg.calibration.seed)
    _need(cfg.eval.seed >= 0, "eval.seed", "must be >= 0", cfg.eval.seed)
    _need(cfg.eval.rows >= 1, "eval.rows", "must be >= 1", cfg.eval.rows)
    _need(cfg.format.name in FORMATS, "format.name", f"must be one of {sorted(FORMATS)}", cfg.format.name)
    _need(cfg.method.name in METHODS, "method.name", f"must be one of {sorted(METHODS)}", cfg.method.name)
    _need(cfg.method.chunk >= 1, "method.chunk", "must be >= 1", cfg.method.chunk)
    _need(cfg.model.name in {"lab", "file"}, "model.name", "must be lab or file", cfg.model.name)
    if cfg.model.name == "file":
        _need(bool(cfg.model.path), "model.path", "is required with model=file (model.path=/path/to/model.onnx)",
              cfg.model.path)
    _need(cfg.data.name == "lab", "data.name", "must be lab", cfg.data.name)
    _need(cfg.tracking.name in TRACKING, "tracking.name", f"must be one of {list(TRACKING)}", cfg.tracking.name)
    if cfg.tracking.name == "server":
        _need(bool(cfg.tracking.uri), "tracking.uri", "is required with tracking=server (tracking.uri=http://HOST:PORT)",
              cfg.tracking.uri)
    _need(cfg.ort.intra_op_threads >= 0, "ort.intra_op_threads", "must be >= 0", cfg.ort.intra_op_threads)
    calibration_spec(cfg)
    quant_options(cfg)


def tracking_enabled(cfg: DictConfig) -> bool:
    return cfg.tracking.name != "off"


def calibration_spec(cfg: DictConfig) -> CalibrationSpec:
    m = cfg.method
    return CalibrationSpec(
        method=m.name, symmetric=m.symmetric, moving_average=m.moving_average,
        averaging_constant=m.averaging_constant, percentile=m.percentile, num_bins=m.num_bins,
        num_quantized_bins=m.num_quantized_bins, scenario=m.scenario, per_channel=m.per_channel, chunk=m.chunk,
    )


def quant_options(cfg: DictConfig) -> QuantOptions:
    return QuantOptions(format=cfg.format.name)
