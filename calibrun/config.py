"""The typed config: a structured schema (types checked by OmegaConf at compose time) and value checks
(run before any work) that name the key at fault.

The yaml files in conf/ fill this schema; a key that is not in it, or a value of the wrong type, fails
when Hydra composes the config. The `method`, `quant` and image `data` nodes are not written here: their schema
is made from the classes the code uses (CalibrationSpec, QuantOptions, ImageTransform), field by field, and
`calibration_spec` / `quant_options` / ImageTransform.from_config build those classes back from the nodes. A new
calibration option is a field of CalibrationSpec (checked in its __post_init__) and a line in conf/method/*.yaml.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from calibrun.analysis import AnalysisConf
from calibrun.analysis import validate as validate_analysis
from calibrun.analysis.recommend import RecommendConf
from calibrun.analysis.recommend import validate as validate_recommend
from calibrun.core.bounds import MAX_BATCHES, MAX_FACTOR, MAX_ROWS, MAX_SEED, MIN_FACTOR
from calibrun.core.errors import CalibrunError
from calibrun.core.errors import need as _need
from calibrun.core.fields import build_from, schema_of
from calibrun.core.memory import MemoryConf, parse_budget
from calibrun.data import SOURCES
from calibrun.data.images import ImageTransform, TransformError
from calibrun.data.inputs import InputConf
from calibrun.lab import MAIN_BATCHES
from calibrun.lab.data import CalibrationConf
from calibrun.measure import tasks
from calibrun.measure.errors import EvalConf, OrtConf
from calibrun.measure.tasks import TASKS, TaskConf
from calibrun.measure.tensor_stats import DiagnosticsConf
from calibrun.measure.verdict import VerdictConf
from calibrun.measure.verdict import validate as validate_verdict
from calibrun.model import MODELS, ModelConf
from calibrun.quant.cache import MAX_WAIT, CacheConf
from calibrun.quant.calibrate import METHODS, CalibrationSpec, method_options
from calibrun.quant.quantize import FORMATS, FormatConf, QuantOptions
from calibrun.report.aggregate import ReportConf
from calibrun.tracking import TRACKING, TrackingConf

# method.<option>: CalibrationSpec's fields (its `method` is method.name; op_types is not a config key)
METHOD_KEYS = {"method": "name"}
MethodConf = schema_of("MethodConf", CalibrationSpec, skip=("op_types",), rename=METHOD_KEYS,
                       doc="The calibration method: calibrun.quant.calibrate.CalibrationSpec, field by field.")
# quant.<option>: QuantOptions' fields (its `format` is the format group)
QuantConf = schema_of("QuantConf", QuantOptions, skip=("format",),
                      doc="Post-calibration options (QuantOptions): changing any of them reuses the calibration cache.")


DATA_SOURCES = tuple(SOURCES)


# A data source: `lab` (the rule of docs/lab.md), `npy` (.npy/.npz file or folder), `images` (folder; the pipeline's
# options are calibrun.data.images.ImageTransform's fields); `inputs`: each model input's constant value and batch
# axis (calibrun.data.inputs.InputConf, docs/data.md). Its values are untyped in the schema (Hydra's `++` builds a
# new input's node as a plain dict, which a typed dict refuses); InputConf checks them when the model is open.
DataConf = schema_of("DataConf", ImageTransform, first=(("name", str, field(default="lab")),
                                                        ("path", str | None, field(default=None)),
                                                        ("inputs", dict[str, Any], field(default_factory=dict))),
                     doc="A data source: lab, npy or images (with ImageTransform's fields), and its inputs.")
# keys under a `<data>.inputs.<input name>` node (the names are the model's, checked when the model is open)
INPUT_KEYS = tuple(f.name for f in dataclasses.fields(InputConf))



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
    verdict: VerdictConf = field(default_factory=VerdictConf)
    recommend: RecommendConf = field(default_factory=RecommendConf)
    memory: MemoryConf = field(default_factory=MemoryConf)
    batches: int = MAIN_BATCHES
    resume: bool = False  # skip jobs whose result.json is complete and valid (same sweep folder)


MAX_THREADS = 256  # onnxruntime intra-op threads: far more than any machine's cores (100000 hangs)


def register() -> None:
    """The schema (`calibrun_schema` in Hydra's ConfigStore) and the resolvers conf/config.yaml uses."""
    schema = OmegaConf.structured(Config)
    for key in OPEN_NODES:  # `quant.tensor_types={t:QInt16}` sets keys the schema cannot know
        OmegaConf.set_struct(OmegaConf.select(schema, key), False)
    ConfigStore.instance().store(name="calibrun_schema", node=schema)
    register_resolvers()


def _sweep_id(*args) -> str:
    """A short random suffix for run and sweep folders (`multirun/<date>/<time>-<id>`): two sweeps started in the
    same second get different folders. Cached per config (use_cache), and Hydra copies that cache into every job's
    config, so the sweep, its launcher and its jobs see one value. It takes no argument (`${calibrun.sweep_id:}`);
    one given is refused in words (the folder callbacks make that one line)."""
    if args:
        raise ValueError(f"${{calibrun.sweep_id:}} takes no argument, got {', '.join(map(repr, args))}")
    return secrets.token_hex(3)


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("calibrun.sweep_id"):
        OmegaConf.register_new_resolver("calibrun.sweep_id", _sweep_id, use_cache=True)


# nodes whose keys are the user's (tensor names), not settings
OPEN_NODES = ("quant.tensor_types", "quant.tensor_ranges")


def _unknown_keys(node: DictConfig, schema: dict, prefix: str = "") -> list[str]:
    unknown = []
    for key in node:
        if key == "hydra" and not prefix:  # compose(return_hydra_config=True) keeps Hydra's own node
            continue
        if key not in schema:
            unknown.append(prefix + str(key))
        elif isinstance(schema[key], dict) and f"{prefix}{key}" not in OPEN_NODES and not _is_inputs(prefix + str(key)):
            unknown += _unknown_keys(node[key], schema[key], f"{prefix}{key}.")
    return unknown


_SCHEMA_KEYS = OmegaConf.to_container(OmegaConf.structured(Config))


def _dotted(schema: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in schema.items():
        keys.append(prefix + key)
        if isinstance(value, dict):
            keys += _dotted(value, f"{prefix}{key}.")
    return keys


SETTINGS = tuple(_dotted(_SCHEMA_KEYS))  # every config key, nodes included (`data`, `data.path`, ...)
# config groups that are not schema nodes (conf/experiment, conf/cluster): `experiment=lab` is a setting too
GROUPS_ONLY = ("experiment", "cluster")


def close_keys(key: str) -> list[str]:
    """The valid config keys closest to a mistyped one (difflib), best first: `batchs` -> [batches]."""
    parent, _, last = key.rpartition(".")
    found = []
    if parent:  # the same node first: `data.pth` -> data.path
        siblings = [k.rpartition(".")[2] for k in SETTINGS if k.rpartition(".")[0] == parent]
        found += [f"{parent}.{k}" for k in difflib.get_close_matches(last, siblings, n=3, cutoff=0.6)]
    found += [k for k in difflib.get_close_matches(key, SETTINGS + GROUPS_ONLY, n=3, cutoff=0.6) if k not in found]
    if not found:  # a right name under the wrong node: `factor` -> calibration.factor
        found = [k for k in SETTINGS if k.rpartition(".")[2] == last]
    return found[:3]


def unknown_key_message(key: str) -> str:
    """The one line for a key that is not a calibrun setting, with the closest valid keys."""
    close = close_keys(key)
    hint = f"did you mean {' or '.join(close)}?" if close else "see `python -m calibrun --help` for the settings"
    return f"config {key}: is not a calibrun setting; {hint}"


def _is_inputs(key: str) -> bool:
    return key in ("data.inputs", "eval_data.inputs")


def is_input_key(key: str) -> bool:
    """`data.inputs.<name>.<value|batch_axis>` (or eval_data's): a key under an input's node (any input name)."""
    node, _, rest = key.partition(".inputs.")
    name, _, option = rest.rpartition(".")
    return node in ("data", "eval_data") and bool(name) and option in INPUT_KEYS


def is_setting(key: str) -> bool:
    """Whether an override's key (`+`, `++`, `~` already stripped) names a calibrun setting or config group."""
    return key in SETTINGS or is_input_key(key) or key.split(".")[0].split("/")[0] in ("hydra", *GROUPS_ONLY)


def _swept_group(key: str, swept: Iterable[str]) -> bool:
    """A check of `key` waits for the jobs when the sweep varies anything under the key's top-level node (the
    sweep's own config holds the node's defaults there: `data.path=a.npy,b.npy` leaves data.path unset)."""
    top = key.split(".")[0]
    return any(s.split(".")[0].split("/")[0] == top for s in swept)


_SPEC_DEFAULTS = {f.name: f.default for f in dataclasses.fields(CalibrationSpec)}


def _check_method_options(cfg: DictConfig, swept: Iterable[str]) -> None:
    """An option of another method (`method=entropy method.percentile=200`) is refused: it would be ignored."""
    swept = list(swept)
    if "method" in swept or cfg.method.name not in METHODS:
        return
    applies = method_options(cfg.method.name)
    given = [k for k in cfg.method if k in _SPEC_DEFAULTS and cfg.method[k] != _SPEC_DEFAULTS[k]]
    given += [k.split(".", 1)[1] for k in swept if k.startswith("method.")]
    for key in given:
        if key not in applies:
            users = [m for m in METHODS if key in method_options(m)]
            raise CalibrunError(f"config method.{key}: is not an option of method={cfg.method.name} (only of "
                                f"method={' or method='.join(users)}): drop it or choose that method")


PATH_KEYS = ("model.path", "data.path", "eval_data.path")


def check_readable(path: str, key: str, folder_ok: bool = True) -> None:
    """A data source or model exists and can be read, before any work (no folder, model or run is made for a path
    that cannot be used). Named as the config key and the path."""
    p = Path(str(path)).expanduser()
    if not p.exists():
        raise CalibrunError(f"config {key}: {p} not found")
    if p.is_dir():
        if not folder_ok:
            raise CalibrunError(f"config {key}: {p} is not a file (a folder)")
        if not os.access(p, os.R_OK | os.X_OK):
            raise CalibrunError(f"config {key}: folder {p} is not readable (permission denied)")
    elif not os.access(p, os.R_OK):
        raise CalibrunError(f"config {key}: {p} is not readable (permission denied)")


def _made_by_calibrun(cfg: DictConfig, path: str) -> bool:
    """model=digits exports its model and data into the cache's digits folder on first use (calibrun.model.digits):
    those files need not be there before the job."""
    if cfg.model.name != "digits":
        return False
    from calibrun.quant.cache import folder

    made = Path(folder(cfg.cache.dir, "digits")).expanduser().resolve()
    return Path(str(path)).expanduser().resolve().parent == made


def _check_sources(cfg: DictConfig, swept: Iterable[str]) -> None:
    if cfg.model.name == "file" and cfg.model.path and not _swept_group("model.path", swept):
        check_readable(cfg.model.path, "model.path", folder_ok=False)
    for key in ("data", "eval_data"):
        path = cfg[key].path
        if cfg[key].name != "lab" and path and not _swept_group(f"{key}.path", swept) \
                and not _made_by_calibrun(cfg, path):
            check_readable(path, f"{key}.path")


def validate(cfg: DictConfig, swept: Iterable[str] = (), sweep_job: bool = False) -> None:
    """Value checks the schema's types cannot express, and that every data source and model file is there and
    readable. Raises CalibrunError naming the key.

    `swept`: the keys a sweep varies, when `cfg` is the sweep's own config (each job's value is not applied
    there): the checks of their nodes wait for the jobs. `sweep_job`: `cfg` is one job of a sweep (the sweep's
    config was checked: an option of a method that is not selected is the sweep's choice, `method=a,b
    method.percentile=90`)."""
    swept = list(swept)
    unknown = _unknown_keys(cfg, _SCHEMA_KEYS)  # `+key=...` slips past Hydra's struct mode
    if unknown:
        raise CalibrunError(unknown_key_message(unknown[0]))

    def need(ok: bool, key: str, rule: str, value) -> None:
        if not _swept_group(key, swept):
            _need(ok, key, rule, value)

    need(1 <= cfg.batches <= MAX_BATCHES, "batches", f"must be in 1..{MAX_BATCHES}", cfg.batches)
    factor = cfg.calibration.factor
    need(math.isfinite(factor) and MIN_FACTOR <= factor <= MAX_FACTOR, "calibration.factor",
         f"must be a finite number in {MIN_FACTOR:g}..{MAX_FACTOR:g} (N(0, 1) * factor is cast to float32)", factor)
    for key in ("calibration.seed", "eval.seed"):
        seed = OmegaConf.select(cfg, key)
        need(0 <= seed <= MAX_SEED, key, f"must be in 0..{MAX_SEED} (2**32 - 1)", seed)
    need(1 <= cfg.eval.rows <= MAX_ROWS, "eval.rows", f"must be in 1..{MAX_ROWS}", cfg.eval.rows)
    need(math.isfinite(cfg.cache.wait) and 0 <= cfg.cache.wait <= MAX_WAIT, "cache.wait",
         f"must be a number of seconds in 0..{MAX_WAIT:g}", cfg.cache.wait)
    if cfg.eval.batch_size is not None:
        need(1 <= cfg.eval.batch_size <= MAX_ROWS, "eval.batch_size", f"must be in 1..{MAX_ROWS}", cfg.eval.batch_size)
    if cfg.diagnostics.rows is not None:
        need(1 <= cfg.diagnostics.rows <= MAX_ROWS, "diagnostics.rows",
             f"must be in 1..{MAX_ROWS} (or null: every row)", cfg.diagnostics.rows)
    if not _swept_group("task", swept):
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
    need(cfg.format.name in FORMATS, "format.name", f"must be one of {sorted(FORMATS)}", cfg.format.name)
    memory_budget(cfg)  # memory.budget: auto or a size
    if not _swept_group("method", swept):
        calibration_spec(cfg)  # method.<option>: CalibrationSpec.__post_init__ checks each, naming the key
    if not sweep_job:
        _check_method_options(cfg, swept)
    need(cfg.model.name in MODELS, "model.name", f"must be one of {list(MODELS)}", cfg.model.name)
    if cfg.model.name == "file":
        need(bool(cfg.model.path), "model.path", "is required with model=file (model.path=/path/to/model.onnx)",
             cfg.model.path)
    else:  # a path beside the built-in model would be ignored: the job would quantise the lab's model instead
        need(not cfg.model.path, "model.path", f"is read only with model=file (model={cfg.model.name} is calibrun's "
             "built-in model); add model=file", cfg.model.path)
    for key in ("data", "eval_data"):
        if _swept_group(key, swept):
            continue
        source = cfg[key]
        need(source.name in DATA_SOURCES, f"{key}.name", f"must be one of {list(DATA_SOURCES)}", source.name)
        if source.name != "lab":
            need(bool(source.path), f"{key}.path", f"is required with {key}={source.name}", source.path)
        else:  # the lab's rows would be used, the path ignored
            need(not source.path, f"{key}.path", f"is read only with {key}=npy or {key}=images ({key}=lab draws "
                 "the lab's rows); add one", source.path)
        if source.name == "images":
            _check_image_source(source, key)
    need(cfg.tracking.name in TRACKING, "tracking.name", f"must be one of {list(TRACKING)}", cfg.tracking.name)
    if cfg.tracking.name == "server":
        need(bool(cfg.tracking.uri), "tracking.uri", "is required with tracking=server (tracking.uri=http://HOST:PORT)",
             cfg.tracking.uri)
    need(0 <= cfg.ort.intra_op_threads <= MAX_THREADS, "ort.intra_op_threads",
         f"must be in 0..{MAX_THREADS} (0: onnxruntime's choice, one per core)", cfg.ort.intra_op_threads)
    if not _swept_group("quant", swept) and not _swept_group("format", swept):
        quant_options(cfg)
    if not _swept_group("analysis", swept):
        validate_analysis(cfg.analysis, cfg.format.name)
    if not _swept_group("verdict", swept):
        validate_verdict(cfg.verdict)
    if not _swept_group("recommend", swept):
        validate_recommend(cfg.recommend)
    _check_sources(cfg, swept)


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
    """memory.budget in bytes (None: auto), calibrun.core.memory.parse_budget; a bad value names the key."""
    return parse_budget(cfg.memory.budget)
