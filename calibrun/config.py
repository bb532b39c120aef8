"""The typed config: a structured schema (types checked by OmegaConf at compose time) and value checks
(run before any work) that name the key at fault.

The yaml files in conf/ fill this schema; a key that is not in it, or a value of the wrong type, fails
when Hydra composes the config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from calibrun.calibrate import METHODS, CalibrationSpec
from calibrun.data.images import IMAGENET_MEAN, IMAGENET_STD, MAX_IMAGE_SIDE, ImageTransform
from calibrun.data.lab import MAX_BATCHES, MAX_FACTOR, MAX_ROWS, MAX_SEED, MIN_FACTOR
from calibrun.errors import CalibrunError
from calibrun.measure import tasks
from calibrun.measure.tasks import TASKS
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
    chunk: int | None = None  # batches per histogram update; None: 16 for minmax, 1 for histogram methods


@dataclass
class ModelConf:
    name: str = "lab"
    path: str | None = None
    classifier: bool | None = None  # None: a classifier when the first output comes from Softmax or labels exist


DATA_SOURCES = ("lab", "npy", "images")
MODELS = ("lab", "file", "digits")


@dataclass
class DataConf:
    """A data source: `lab` (the rule of DESIGN.md), `npy` (.npy/.npz file or folder), `images` (folder)."""

    name: str = "lab"
    path: str | None = None
    resize: int = 256  # images: the shorter side after resizing (not used with letterbox)
    crop: Any = 224  # images: an int (square) or [height, width]; checked by validate()
    mean: list[float] = field(default_factory=lambda: list(IMAGENET_MEAN))
    std: list[float] = field(default_factory=lambda: list(IMAGENET_STD))
    grayscale: bool = False
    letterbox: bool = False  # images: fit inside crop keeping the aspect ratio, pad with pad_value
    pad_value: float = 0.0  # images with letterbox: the padding, in 0..1 pixel scale (before mean/std)


@dataclass
class QuantConf:
    """Post-calibration options: changing any of them reuses the calibration cache."""

    activation_type: str = "QInt8"
    weight_type: str = "QInt8"
    per_channel: bool = False
    reduce_range: bool = False
    activation_symmetric: bool = False
    nodes_to_exclude: list[str] = field(default_factory=list)
    op_types_to_quantize: list[str] | None = None


@dataclass
class EvalConf:
    seed: int = 777
    rows: int = 256
    batch_size: int | None = None  # rows per evaluation run; None: 16 (a model that pins its first axis: its size)


@dataclass
class TaskConf:
    """Task metrics (calibrun.measure.tasks): auto | none | classification | dense | custom."""

    name: str = "auto"
    output: str | None = None  # the output judged (default: the first)
    axis: int | None = None  # classification: class axis (None: from the Softmax, else -1)
    threshold: float = 0.5  # dense: value > threshold is positive
    top_k: int = 5
    fn: str | None = None  # custom: module:function


@dataclass
class DiagnosticsConf:
    enabled: bool = True  # per-tensor diagnostics of QDQ runs (diagnostics=on|off)
    rows: int | None = 256  # diagnose the first `rows` evaluation rows (null: all); errors and tasks use every row


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
    register: str | None = None  # a registered model name: each job's int8 model becomes a version of it
    log_model: bool = True  # the int8 model as an MLflow LoggedModel (False: no model logged)
    http_timeout: float | None = None  # seconds per request to a server (None: $MLFLOW_HTTP_REQUEST_TIMEOUT or 10)
    http_retries: int | None = None  # retries per request (None: $MLFLOW_HTTP_REQUEST_MAX_RETRIES or 1)


@dataclass
class ReportConf:
    dir: str | None = None  # None: SWEEP_DIR/report


@dataclass
class OrtConf:
    intra_op_threads: int = 0


@dataclass
class AnalysisConf:
    """Sensitivity analysis / fp32 fallback (calibrun.analysis) and the metric a search optimises."""

    name: str = "none"  # none | sensitivity
    metric: str = "max_abs_error"  # any metric of the run: max_abs_error, out.<output>.sqnr_db, task.<name>
    goal: str = "min"  # min | max
    target: float | None = None  # with sensitivity: keep nodes in fp32 until the metric reaches this value
    strategy: str = "switch"  # switch (one session, a run-time switch per pair) | edit (one model per pair)
    kinds: list[str] = field(default_factory=lambda: ["activation", "weight"])
    tensors: list[str] | None = None  # analyse only the pairs on these tensors (None: every pair of `kinds`)
    max_steps: int = 20  # fallback steps at most
    batch_rows: int = 16  # evaluation rows per batch (a model that pins its first axis: that many)
    objective: bool = False  # the task returns analysis.metric (hydra/sweeper=optuna)


@dataclass
class Config:
    calibration: CalibrationConf = field(default_factory=CalibrationConf)
    format: FormatConf = field(default_factory=FormatConf)
    method: MethodConf = field(default_factory=MethodConf)
    model: ModelConf = field(default_factory=ModelConf)
    data: DataConf = field(default_factory=DataConf)
    eval_data: DataConf = field(default_factory=DataConf)
    quant: QuantConf = field(default_factory=QuantConf)
    eval: EvalConf = field(default_factory=EvalConf)
    cache: CacheConf = field(default_factory=CacheConf)
    tracking: TrackingConf = field(default_factory=TrackingConf)
    report: ReportConf = field(default_factory=ReportConf)
    ort: OrtConf = field(default_factory=OrtConf)
    task: TaskConf = field(default_factory=TaskConf)
    diagnostics: DiagnosticsConf = field(default_factory=DiagnosticsConf)
    analysis: AnalysisConf = field(default_factory=AnalysisConf)
    batches: int = 64
    resume: bool = False  # skip jobs whose result.json is complete and valid (same sweep folder)


MAX_THREADS = 256  # onnxruntime intra-op threads: far more than any machine's cores (100000 hangs)


def register() -> None:
    ConfigStore.instance().store(name="calibrun_schema", node=Config)
    from calibrun.sweep import register_resolvers  # ${calibrun.sweep_id:}, the sweep folder's unique suffix

    register_resolvers()


def _need(ok: bool, key: str, rule: str, value) -> None:
    if not ok:
        raise CalibrunError(f"config {key}: {rule}, got {value!r}")


def _unknown_keys(node: DictConfig, schema: dict, prefix: str = "") -> list[str]:
    unknown = []
    for key in node:
        if key == "hydra" and not prefix:  # compose(return_hydra_config=True) keeps Hydra's own node
            continue
        if key not in schema:
            unknown.append(prefix + str(key))
        elif isinstance(schema[key], dict):
            unknown += _unknown_keys(node[key], schema[key], f"{prefix}{key}.")
    return unknown


_SCHEMA_KEYS = OmegaConf.to_container(OmegaConf.structured(Config))


def validate(cfg: DictConfig) -> None:
    """Value checks the schema's types cannot express. Raises CalibrunError naming the key."""
    unknown = _unknown_keys(cfg, _SCHEMA_KEYS)  # `+key=...` slips past Hydra's struct mode
    if unknown:
        raise CalibrunError(f"config {unknown[0]}: is not a calibrun setting (a typo?)")
    _need(1 <= cfg.batches <= MAX_BATCHES, "batches", f"must be in 1..{MAX_BATCHES}", cfg.batches)
    factor = cfg.calibration.factor
    _need(math.isfinite(factor) and MIN_FACTOR <= factor <= MAX_FACTOR, "calibration.factor",
          f"must be a finite number in {MIN_FACTOR:g}..{MAX_FACTOR:g} (N(0, 1) * factor is cast to float32)", factor)
    for key in ("calibration.seed", "eval.seed"):
        seed = OmegaConf.select(cfg, key)
        _need(0 <= seed <= MAX_SEED, key, f"must be in 0..{MAX_SEED} (2**32 - 1)", seed)
    _need(1 <= cfg.eval.rows <= MAX_ROWS, "eval.rows", f"must be in 1..{MAX_ROWS}", cfg.eval.rows)
    if cfg.eval.batch_size is not None:
        _need(1 <= cfg.eval.batch_size <= MAX_ROWS, "eval.batch_size", f"must be in 1..{MAX_ROWS}", cfg.eval.batch_size)
    if cfg.diagnostics.rows is not None:
        _need(1 <= cfg.diagnostics.rows <= MAX_ROWS, "diagnostics.rows",
              f"must be in 1..{MAX_ROWS} (or null: every row)", cfg.diagnostics.rows)
    _need(cfg.task.name in TASKS, "task.name", f"must be one of {list(TASKS)}", cfg.task.name)
    _need(cfg.task.top_k >= 1, "task.top_k", "must be >= 1", cfg.task.top_k)
    _need(math.isfinite(cfg.task.threshold), "task.threshold", "must be a finite number", cfg.task.threshold)
    if cfg.task.name == "custom":
        _need(bool(cfg.task.fn) and ":" in cfg.task.fn, "task.fn",
              "is required with task=custom as module:function", cfg.task.fn)
        try:
            tasks.load_function(cfg.task.fn)  # an import error before any work
        except CalibrunError as exc:
            raise CalibrunError(f"config {exc}") from None
    _need(cfg.format.name in FORMATS, "format.name", f"must be one of {sorted(FORMATS)}", cfg.format.name)
    _need(cfg.method.name in METHODS, "method.name", f"must be one of {sorted(METHODS)}", cfg.method.name)
    if cfg.method.chunk is not None:
        _need(cfg.method.chunk >= 1, "method.chunk", "must be >= 1", cfg.method.chunk)
    if cfg.method.name == "percentile":
        _need(0 < cfg.method.percentile <= 100, "method.percentile", "must be in (0, 100]", cfg.method.percentile)
    if cfg.method.num_bins is not None:
        _need(cfg.method.num_bins >= 1, "method.num_bins", "must be >= 1", cfg.method.num_bins)
    if cfg.method.moving_average:
        _need(0 <= cfg.method.averaging_constant <= 1, "method.averaging_constant", "must be in [0, 1]",
              cfg.method.averaging_constant)
    _need(cfg.model.name in MODELS, "model.name", f"must be one of {list(MODELS)}", cfg.model.name)
    if cfg.model.name == "file":
        _need(bool(cfg.model.path), "model.path", "is required with model=file (model.path=/path/to/model.onnx)",
              cfg.model.path)
    for key in ("data", "eval_data"):
        source = cfg[key]
        _need(source.name in DATA_SOURCES, f"{key}.name", f"must be one of {list(DATA_SOURCES)}", source.name)
        if source.name != "lab":
            _need(bool(source.path), f"{key}.path", f"is required with {key}={source.name}", source.path)
        if source.name == "images":
            _check_image_source(source, key)
    _need(cfg.tracking.name in TRACKING, "tracking.name", f"must be one of {list(TRACKING)}", cfg.tracking.name)
    if cfg.tracking.name == "server":
        _need(bool(cfg.tracking.uri), "tracking.uri", "is required with tracking=server (tracking.uri=http://HOST:PORT)",
              cfg.tracking.uri)
    _need(0 <= cfg.ort.intra_op_threads <= MAX_THREADS, "ort.intra_op_threads",
          f"must be in 0..{MAX_THREADS} (0: onnxruntime's choice, one per core)", cfg.ort.intra_op_threads)
    calibration_spec(cfg)
    quant_options(cfg)
    from calibrun.analysis import validate as validate_analysis

    validate_analysis(cfg.analysis, cfg.format.name)


def _check_image_source(source: DictConfig, key: str) -> None:
    crop = OmegaConf.to_container(source.crop) if isinstance(source.crop, ListConfig) else source.crop
    pair = isinstance(crop, list)
    sides = crop if pair else [crop]
    _need((len(sides) == 2 if pair else True) and all(isinstance(v, int) and not isinstance(v, bool) for v in sides),
          f"{key}.crop", "must be an integer or [height, width] (e.g. [48,192])", crop)
    _need(all(1 <= v <= MAX_IMAGE_SIDE for v in sides), f"{key}.crop", f"sides must be in 1..{MAX_IMAGE_SIDE}", crop)
    _need(1 <= source.resize <= MAX_IMAGE_SIDE, f"{key}.resize", f"must be in 1..{MAX_IMAGE_SIDE}", source.resize)
    if not source.letterbox:
        _need(min(sides) <= source.resize, f"{key}.crop",
              f"must fit inside {key}.resize={source.resize} (the shorter side after resizing; "
              f"or {key}.letterbox=true)",
              crop)
    _need(math.isfinite(source.pad_value) and 0 <= source.pad_value <= 1, f"{key}.pad_value",
          "must be in 0..1 (pixel scale, before mean/std)", source.pad_value)
    _need(len(source.mean) == len(source.std) == (1 if source.grayscale else 3), f"{key}.mean",
          "mean and std need one value per channel", list(source.mean))
    _need(all(math.isfinite(v) for v in [*source.mean, *source.std]), f"{key}.mean", "mean and std must be finite",
          [*source.mean, *source.std])
    _need(all(v > 0 for v in source.std), f"{key}.std", "must be > 0", list(source.std))
    try:
        ImageTransform.from_config(source)
    except CalibrunError as exc:
        raise CalibrunError(f"config {key}: {exc}") from None


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
    q = cfg.quant
    return QuantOptions(
        format=cfg.format.name, activation_type=q.activation_type, weight_type=q.weight_type,
        per_channel=q.per_channel, reduce_range=q.reduce_range, activation_symmetric=q.activation_symmetric,
        nodes_to_exclude=tuple(q.nodes_to_exclude),
        op_types_to_quantize=tuple(q.op_types_to_quantize) if q.op_types_to_quantize else None,
    )
