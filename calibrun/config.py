"""The typed config: a structured schema (types checked by OmegaConf at compose time) and value checks
(run before any work) that name the key at fault.

The yaml files in conf/ fill this schema; a key that is not in it, or a value of the wrong type, fails
when Hydra composes the config. The `method`, `quant` and image `data` nodes are not written here: their schema
is made from the classes the code uses (CalibrationSpec, QuantOptions, ImageTransform), field by field, and
`calibration_spec` / `quant_options` / ImageTransform.from_config build those classes back from the nodes. A new
calibration option is a field of CalibrationSpec (checked in its __post_init__) and a line in conf/method/*.yaml.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from calibrun.bounds import MAX_BATCHES, MAX_FACTOR, MAX_ROWS, MAX_SEED, MIN_FACTOR
from calibrun.cache import DEFAULT_DIR as DEFAULT_CACHE_DIR
from calibrun.calibrate import CalibrationSpec
from calibrun.data import SOURCES
from calibrun.data.images import ImageTransform, TransformError
from calibrun.errors import CalibrunError
from calibrun.fields import build_from, schema_of
from calibrun.lab import CALIB_SEED, EVAL_ROWS, EVAL_SEED, MAIN_BATCHES
from calibrun.measure import tasks
from calibrun.measure.tasks import TASKS
from calibrun.quantize import FORMATS, QuantOptions


@dataclass
class CalibrationConf:
    name: str = MISSING
    factor: float = MISSING
    seed: int = CALIB_SEED


@dataclass
class FormatConf:
    name: str = "qdq"


# method.<option>: CalibrationSpec's fields (its `method` is method.name; op_types is not a config key)
METHOD_KEYS = {"method": "name"}
MethodConf = schema_of("MethodConf", CalibrationSpec, skip=("op_types",), rename=METHOD_KEYS,
                       doc="The calibration method: calibrun.calibrate.CalibrationSpec, field by field.")
# quant.<option>: QuantOptions' fields (its `format` is the format group)
QuantConf = schema_of("QuantConf", QuantOptions, skip=("format",),
                      doc="Post-calibration options (QuantOptions): changing any of them reuses the calibration cache.")


@dataclass
class ModelConf:
    name: str = "lab"
    path: str | None = None
    classifier: bool | None = None  # None: a classifier when the first output comes from Softmax or labels exist


DATA_SOURCES = tuple(SOURCES)
MODELS = ("lab", "file", "digits")


# A data source: `lab` (the rule of docs/lab.md), `npy` (.npy/.npz file or folder), `images` (folder; the pipeline's
# options are calibrun.data.images.ImageTransform's fields).
DataConf = schema_of("DataConf", ImageTransform, first=(("name", str, field(default="lab")),
                                                        ("path", str | None, field(default=None))),
                     doc="A data source: lab, npy or images (with ImageTransform's fields).")


@dataclass
class EvalConf:
    seed: int = EVAL_SEED
    rows: int = EVAL_ROWS
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
    dir: str = DEFAULT_CACHE_DIR


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
class MemoryConf:
    """How many bytes of activations may leave onnxruntime at a time (calibrun.memory, docs/memory.md)."""

    budget: str = "auto"  # auto, or a size: 512MB, 1GiB, or a number of MiB


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
    groups: int = 0  # > 1: a coarse pre-pass over that many groups of pairs first (switch strategy), 0: none
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
    memory: MemoryConf = field(default_factory=MemoryConf)
    batches: int = MAIN_BATCHES
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
    memory_budget(cfg)  # memory.budget: auto or a size
    calibration_spec(cfg)  # method.<option>: CalibrationSpec.__post_init__ checks each, naming the key
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
    quant_options(cfg)
    from calibrun.analysis import validate as validate_analysis

    validate_analysis(cfg.analysis, cfg.format.name)


def _check_image_source(source: DictConfig, key: str) -> None:
    """The image options' checks are ImageTransform's own (data/images.py); here they name the config key."""
    try:
        ImageTransform.from_config(source)
    except TransformError as exc:
        raise CalibrunError(exc.in_config(key)) from None
    except CalibrunError as exc:
        raise CalibrunError(f"config {key}: {exc}") from None


def tracking_enabled(cfg: DictConfig) -> bool:
    return cfg.tracking.name != "off"


def calibration_spec(cfg: DictConfig) -> CalibrationSpec:
    return build_from(CalibrationSpec, cfg.method, rename={v: k for k, v in METHOD_KEYS.items()})


def quant_options(cfg: DictConfig) -> QuantOptions:
    return build_from(QuantOptions, cfg.quant, format=cfg.format.name)


def memory_budget(cfg: DictConfig) -> int | None:
    """memory.budget in bytes (None: auto), calibrun.memory.parse_budget; a bad value names the key."""
    from calibrun.memory import parse_budget

    return parse_budget(cfg.memory.budget)
