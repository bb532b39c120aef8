"""The calibration stage: a chunked calibration pass -> ranges, and a content-addressed cache of them.

What is reused from onnxruntime (quantization/calibrate.py): `create_calibrator` (graph augmentation and the
calibrators themselves), `collect_data`/`compute_data`, `TensorsData` (to_dict/from_dict) and the
`CalibrationCacheEncoder` that `save_tensors_data` uses, so the cache file is exactly the format that
`quantize_static(calibration_cache_path=...)` loads (with onnxruntime's `load_tensors_data`). What is written
here: the chunk loop (bounded memory, progress), the key (onnxruntime's own cache only checks method and
SmoothQuant), validation of a cache file before it is trusted (key record, a sha256 over the ranges, finite ordered
ranges), and the atomic write with the key record beside the ranges. The cache is calibrun.quant.cache's `ranges` kind
(one key scheme for every cached thing).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import onnxruntime
from onnxruntime.quantization.calibrate import (
    CalibrationCacheEncoder,
    CalibrationMethod,
    TensorsData,
    create_calibrator,
)
from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

from calibrun.core import interrupts, memory
from calibrun.core.errors import CalibrunError, one_line
from calibrun.core.errors import need as check
from calibrun.core.files import atomic_path, temp_dir, write_json
from calibrun.core.progress import Progress
from calibrun.data import rows as feed_rows
from calibrun.model import private_model_copy
from calibrun.model.sessions import ReusedOutputs, session
from calibrun.quant import cache as cache_store
from calibrun.quant.cache import key_of
from calibrun.quant.histogram import ALGORITHM as HISTOGRAM_ALGORITHM
from calibrun.quant.histogram import FastHistogramCollector
from calibrun.quant.histogram_runs import HistogramPieces
from calibrun.quant.histogram_worker import HistogramWorker
from calibrun.quant.reader import make_reader

_ORT = onnxruntime.capi.onnxruntime_pybind11_state
ORT_RUN_ERRORS = (_ORT.Fail, _ORT.InvalidArgument, _ORT.RuntimeException, _ORT.NotImplemented)  # a run's failures

log = logging.getLogger(__name__)

METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
    "distribution": CalibrationMethod.Distribution,
}
CACHE_FORMAT = 2  # 2: the file carries `ranges_sha256`, a checksum of everything onnxruntime reads from it
# The methods' defaults where an option is None (symmetric, num_bins). onnxruntime's create_calibrator gives
# entropy 128 bins, which with its 128 quantized bins leaves the KL search one candidate (the whole range:
# byte-identical to minmax); calibrun uses TensorRT's 2048 bins (and 128 quantized bins), so that entropy is a search.
HISTOGRAM_METHODS = ("entropy", "percentile", "distribution")
_METHOD_DEFAULTS = {"symmetric": {"minmax": False, "entropy": False, "percentile": True},
                    "num_bins": {method: 2048 for method in HISTOGRAM_METHODS}}


def _option(default, methods: tuple[str, ...], when: str | None = None):
    """A field that is one of onnxruntime's calibrator options, for `methods` (and only while the field `when`
    is true)."""
    return field(default=default, metadata={"methods": methods, "when": when})


MAX_BINS = 65536  # 2**16 histogram bins: far finer than int8 or int16 steps need
SCENARIOS = ("same", "p3")  # onnxruntime's DistributionCalibrater
MIN_DISTRIBUTION_BINS = 512  # onnxruntime's compute_distribution refuses fewer, after the whole pass


@dataclass(frozen=True)
class CalibrationSpec:
    """Everything about the calibration pass that decides the ranges (besides model and data).

    Options that do not apply to `method` are left out of the key, so e.g. `percentile` under minmax
    cannot cause a miss. `chunk` (batches per collect_data call) is in the key: histogram methods merge
    per chunk, so their ranges depend on it. onnxruntime's histogram calibrators hold every activation of a
    chunk until the chunk ends (1.7 GB per 16-image batch on ResNet-50), so they default to one batch a
    chunk; MinMax keeps only reduced values and defaults to 16.
    """

    method: str = "minmax"
    # onnxruntime's `extra_options` of create_calibrator: `_option(default, methods)` names the methods an option
    # applies to, and `calibrator_options` passes exactly those (a new option: its field here and its yaml line)
    symmetric: bool | None = _option(None, ("minmax", "entropy", "percentile"))  # None: the method's default
    moving_average: bool = _option(False, ("minmax",))
    averaging_constant: float = _option(0.01, ("minmax",), when="moving_average")
    per_channel: bool = _option(False, ("minmax",))
    num_bins: int | None = _option(None, HISTOGRAM_METHODS)  # None: the method's default (2048 for every one)
    num_quantized_bins: int = _option(128, ("entropy",))
    percentile: float = _option(99.999, ("percentile",))
    scenario: str = _option("same", ("distribution",))
    # calibrun's own
    op_types: tuple[str, ...] | None = None  # None: every op type onnxruntime can quantise
    chunk: int | None = None  # None: 16 for minmax, 1 for the histogram methods

    def __post_init__(self):
        """Refuse settings onnxruntime would fail on after the whole calibration pass, or that would make a
        method silently degenerate; each message names the config key (`method.<option>`)."""

        def need(ok: bool, key: str, rule: str, value) -> None:
            check(ok, f"method.{key}", rule, value)

        need(self.method in METHODS, "name", f"must be one of {sorted(METHODS)}", self.method)
        need(self.chunk is None or self.chunk >= 1, "chunk", "must be >= 1", self.chunk)
        need(self.num_bins is None or self.num_bins >= 1, "num_bins", "must be >= 1", self.num_bins)
        need(not self.per_channel, "per_channel",
             "per-channel activation ranges make onnxruntime's quantize_static fail; per-channel weights are "
             "quant.per_channel=true", self.per_channel)
        need(self.scenario in SCENARIOS, "scenario", f"must be one of {list(SCENARIOS)}", self.scenario)
        if self.moving_average:
            need(0 <= self.averaging_constant <= 1, "averaging_constant", "must be in [0, 1]",
                 self.averaging_constant)
        if self.method == "minmax":
            return
        need(self.num_bins is None or 1 <= self.num_bins <= MAX_BINS, "num_bins", f"must be in 1..{MAX_BINS}",
             self.num_bins)
        bins = self.bins
        if self.method == "percentile":
            need(0 < self.percentile <= 100, "percentile", "must be in (0, 100]", self.percentile)
        if self.method == "distribution":
            need(bins >= MIN_DISTRIBUTION_BINS, "num_bins",
                 f"must be >= {MIN_DISTRIBUTION_BINS} for distribution (onnxruntime's minimum)", bins)
        if self.method == "entropy":
            # candidates are the symmetric windows of num_quantized_bins..num_bins bins around zero: with
            # num_quantized_bins == num_bins there is one (the whole range, i.e. minmax)
            need(2 <= self.num_quantized_bins < bins, "num_quantized_bins",
                 f"must be in 2..method.num_bins-1 ({bins - 1}) so that entropy has thresholds to choose from",
                 self.num_quantized_bins)

    @property
    def bins(self) -> int | None:
        """The histogram size this spec uses (None for minmax)."""
        if self.method not in HISTOGRAM_METHODS:
            return None
        return _METHOD_DEFAULTS["num_bins"][self.method] if self.num_bins is None else self.num_bins

    @property
    def batches_per_collect(self) -> int:
        if self.chunk is not None:
            return self.chunk
        return 16 if self.method == "minmax" else 1

    @property
    def calibrate_method(self) -> CalibrationMethod:
        return METHODS[self.method]

    def calibrator_options(self) -> dict:
        """The `extra_options` of onnxruntime's `create_calibrator` that apply to this method (each field's
        `_option` metadata), with the method's defaults written out, so that leaving an option unset and setting
        it to its default give the same cache key."""
        options: dict = {}
        for item in fields(self):
            applies = item.metadata.get("methods")
            when = item.metadata.get("when")
            if applies is None or self.method not in applies or (when and not getattr(self, when)):
                continue
            value = getattr(self, item.name)
            if value is None:
                value = _METHOD_DEFAULTS.get(item.name, {}).get(self.method)
            if value is not None:  # still None: onnxruntime's own default, left out
                options[item.name] = value
        return options

    def op_types_calibrated(self) -> list[str]:
        if self.op_types:
            return sorted(self.op_types)
        return sorted(set(QLinearOpsRegistry) | set(QDQRegistry))

    def key_fields(self) -> dict:
        record = {
            "method": self.method,
            "options": self.calibrator_options(),
            "op_types": self.op_types_calibrated(),
            "chunk": self.batches_per_collect,
        }
        if self.method != "minmax":
            record["histogram"] = HISTOGRAM_ALGORITHM  # calibrun computes histograms and thresholds itself
        return record


def method_options(method: str) -> set[str]:
    """The method.<option> keys `method` reads: its calibrator options (the fields' `_option` metadata), `name` and
    `chunk`, and symmetric and per_channel, which any method's config may carry (`per_channel=true` is refused
    with its own message, pointing at quant.per_channel)."""
    if method not in METHODS:
        return set()
    own = {f.name for f in fields(CalibrationSpec) if method in f.metadata.get("methods", ())}
    return {"name", "chunk", "per_channel", "symmetric", *own}


@dataclass
class Calibration:
    """The result of the calibration stage: a ranges file onnxruntime can load, and how it was obtained."""

    ranges_path: Path
    method: str
    key: str
    hit: bool
    seconds: float
    span: float
    batches: int
    op_types: tuple[str, ...] | None = None  # the op types calibration was restricted to (None: all)
    waited: float = 0.0  # seconds spent waiting for another process calibrating the same key (CalibrationCache.claim)


def cache_record(model_sha256: str, data_identity: dict, input_name: str, spec: CalibrationSpec) -> dict:
    """Everything that decides the ranges, and nothing else."""
    return {
        "cache_format": CACHE_FORMAT,
        "model_sha256": model_sha256,
        "data": {**data_identity, "input": input_name},
        "calibration": spec.key_fields(),
        "onnxruntime": onnxruntime.__version__,
    }


class CalibrationCache:
    """The cache's `ranges` folder (calibrun.quant.cache): `<key>.json` (onnxruntime's cache format plus a `calibrun`
    record) and `<key>.key.json`, under the cache root `root`; `<key>.lock` while a process calibrates that key.

    `wait`: seconds a process waits for another one calibrating the same key (`claim`) before it calibrates
    itself."""

    def __init__(self, root: str | Path, wait: float = cache_store.WAIT_SECONDS):
        self.root = Path(root)
        self.folder = cache_store.folder(root, "ranges")
        self.wait = wait

    def claim(self, key: str) -> contextlib.AbstractContextManager[float]:
        """Hold `<key>.lock` while calibrating (calibrun.quant.cache.claim): a second process that misses the same key
        waits for the first one's ranges, then finds them in the cache. Yields the seconds waited."""
        cache_store.folder(self.root, "ranges", create=True)
        return cache_store.claim(self.folder / f"{key}.lock", self.wait, f"calibrating {key}")

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def stamp(self, key: str) -> tuple[int, int, int] | None:
        """Which file `<key>.json` is now (inode, size, mtime; None when there is none): every write renames a new
        file into place, so a changed stamp means another process wrote it."""
        try:
            st = self.path(key).stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def load(self, key: str, record: dict, method: str) -> float | None:
        """The cached span if `<key>.json` is present and valid; None on a miss. Bad files warn and miss."""
        path = self.path(key)
        if not path.is_file():
            old = self.root / path.name
            if old.is_file():
                log.info("calibration cache: %s is of the earlier layout (ranges at the top of the cache) and is "
                         "not read; computing the ranges again into %s", old, self.folder)
            return None
        try:
            return _validate(path, record, method)
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
            log.warning("calibration cache %s is unusable (%s); recomputing", path, exc)
            return None

    def store(self, key: str, record: dict, tensors: TensorsData, span: float) -> Path:
        cache_store.folder(self.root, "ranges", create=True)
        return write_ranges(self.path(key), tensors, record, span, key_file=self.folder / f"{key}.key.json")


def _ranges_sha256(payload: dict) -> str:
    """sha256 of everything in a cache file except calibrun's own block (what quantize_static reads)."""
    body = {k: v for k, v in payload.items() if k != "calibrun"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_ranges(path: Path, tensors: TensorsData, record: dict, span: float, key_file: Path | None = None) -> Path:
    payload = tensors.to_dict()
    payload["smooth_quant"] = False  # what quantize_static compares on a hit
    payload = json.loads(json.dumps(payload, cls=CalibrationCacheEncoder))  # plain JSON, as a reader sees it
    payload["calibrun"] = {"record": record, "span": span, "ranges_sha256": _ranges_sha256(payload)}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(payload, sort_keys=True))  # the same bytes for the same ranges
    if key_file is not None:
        write_json(key_file, {"key": path.stem, **record, "span": span})
    return path


def _validate(path: Path, record: dict, method: str) -> float:
    raw = json.loads(path.read_text())
    mine = raw["calibrun"]
    if mine["record"] != record:
        raise ValueError("its key record does not match")
    # A file that parses and looks plausible can still be damaged or edited (a missing tensor, a changed
    # number, smooth_quant flipped): quantize_static would crash on it or pin wrong ranges.
    if mine.get("ranges_sha256") != _ranges_sha256(raw):
        raise ValueError("its ranges do not match their checksum")
    tensors = TensorsData.from_dict(raw)
    if tensors.calibration_method != METHODS[method]:
        raise ValueError(f"it holds {tensors.calibration_method.name} ranges, not {method}")
    if not tensors.data:
        raise ValueError("it holds no ranges")
    for name, data in tensors.items():
        lo, hi = data.range_value
        # an infinite end is what calibration measured (an attention mask's -inf: calibrun.quant.quantize keeps its
        # nodes in float), and so is +inf to -inf, a tensor that held no value (an empty pad), and NaN, a tensor fp32
        # computed NaN in (calibrun.quant.quantize refuses it in one line); another lo > hi no calibration gives
        empty = (lo == np.inf) & (hi == -np.inf)
        nan = np.isnan(lo) | np.isnan(hi)
        if not np.all((lo <= hi) | empty | nan):
            raise ValueError(f"range of {name!r} is not ordered")
    span = float(mine["span"])
    if not math.isfinite(span) or span < 0:
        raise ValueError("its data span is invalid")
    return span


class _SpanTracker:
    """Wraps a sized iterable of arrays (or feeds); records min and max of `input_name` as it is served."""

    def __init__(self, source, input_name: str):
        self.source, self.input_name, self.lo, self.hi = source, input_name, math.inf, -math.inf

    def __len__(self):
        return len(self.source)

    def __iter__(self):
        for item in self.source:
            arrays = item if isinstance(item, Mapping) else {self.input_name: item}
            for name, array in arrays.items():
                if np.asarray(array).dtype.kind == "f" and not np.all(np.isfinite(array)):
                    raise CalibrunError(f"calibration data for input {name!r} contains NaN or Inf")
            array = arrays[self.input_name]
            self.lo = min(self.lo, np.min(array))
            self.hi = max(self.hi, np.max(array))
            yield item

    @property
    def span(self) -> float:
        """max - min in the data's own dtype (float32), as `float(data.max() - data.min())` computes it."""
        return float(self.hi - self.lo)


def run_calibration(model_path: str | Path, data, input_name: str, spec: CalibrationSpec,
                    threads: int = 0, budget: int | None = None,
                    used: dict | None = None) -> tuple[TensorsData, float]:
    """One calibration pass, fed `spec.batches_per_collect` batches at a time so peak memory does not grow with
    the number of batches.

    `threads`: onnxruntime intra-op threads of the calibration session (0: onnxruntime's default, every core);
    parallel jobs set 1 so that workers do not fight over the cores. It does not change the ranges.
    `budget`: memory.budget in bytes (None: auto, calibrun.core.memory): MinMax runs a batch in runs of as many rows as
    keep twice one run's live activations (calibrun.core.memory.live_bytes, plus kernels' workspace) under it; a batch
    that fits runs whole. The histogram methods run a chunk whose tensors exceed it in groups of tensors and runs of
    rows, in two passes, with the histograms of the whole chunk (calibrun.quant.histogram_runs). `used` (a dict)
    receives `calibration_rows_per_run`, `budget_bytes` and, for the histogram methods, `calibration_groups`."""
    tracked = _SpanTracker(data, input_name)
    reader = make_reader(tracked, input_name)
    total = len(reader)
    if total == 0:
        raise CalibrunError("calibration data is empty")
    progress = Progress("calibrating", total)
    with temp_dir("calib") as tmp:
        copy = private_model_copy(model_path, tmp)
        with _without_its_session():
            calibrator = create_calibrator(
                copy,
                spec.op_types_calibrated(),
                augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                calibrate_method=spec.calibrate_method,
                extra_options=spec.calibrator_options(),
            )
        if spec.method == "minmax":
            # onnxruntime's MinMax calibrator needs its model only to augment it: the augmented copy is on disk
            # and in the session, so the proto (weights included) need not stay in memory through the pass
            calibrator.model = None
        _lean_session(calibrator, threads)
        if spec.method == "minmax" and not spec.moving_average:
            calibrator.infer_session = RowRuns(calibrator.infer_session, copy, budget, used,
                                               getattr(data, "axes", None))
        chunk = spec.batches_per_collect
        outputs = None
        if spec.method != "minmax":
            _fast_collector(calibrator, threads, budget)
            outputs = calibrator.infer_session = ReusedOutputs(calibrator.infer_session, sets=chunk)
        # onnxruntime's MinMax merges the batches with numpy's nanmin and nanmax: a tensor NaN in every batch warns
        # there (twice a batch); it is refused in one line before quantising (calibrun.quant.quantize.nan_ranges)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "All-NaN", RuntimeWarning)
            try:
                _calibrate_chunks(calibrator, reader, spec, data, copy, budget, threads, used, outputs, progress, total,
                                  input_name)
                if spec.method != "minmax" and not calibrator.tensors_to_calibrate:
                    # nothing at the graph's top level to calibrate (a network inside an If): no range, as MinMax finds
                    # none (onnxruntime's histogram collector would refuse: "Histogram has not been collected")
                    tensors = TensorsData(spec.calibrate_method, {})
                else:
                    if spec.method != "minmax":
                        search = Progress(f"choosing {spec.method} ranges", len(calibrator.collector.histogram_dict),
                                          unit="tensors")
                        calibrator.collector.progress = search.update
                    tensors = calibrator.compute_data()
            finally:
                worker = getattr(getattr(calibrator, "collector", None), "worker", None)
                if worker is not None:  # however the pass ended (an interrupt, an error)
                    worker.close()
                    calibrator.collector.worker = None
        del calibrator
    return tensors, tracked.span


def _calibrate_chunks(calibrator, reader, spec: CalibrationSpec, data, copy, budget, threads: int, used, outputs,
                      progress, total: int, input_name: str) -> None:
    """The pass over the calibration data, `spec.batches_per_collect` batches at a time (run_calibration)."""
    chunk = spec.batches_per_collect
    pieces: HistogramPieces | None | bool = False  # histogram methods: planned on the first chunk
    for start in range(0, total, chunk):
        end = min(start + chunk, total)
        try:
            reader.set_range(start, end)
            if spec.method == "minmax":
                calibrator.collect_data(reader)
            else:
                batches = list(iter(reader.get_next, None))
                if pieces is False:  # the first chunk decides (calibrun.quant.histogram_runs)
                    record = used if used is not None else {}
                    pieces = HistogramPieces.plan(copy, sorted(calibrator.tensors_to_calibrate), batches, budget,
                                                  threads, getattr(data, "axes", None), outputs, record)
                    worker = getattr(calibrator.collector, "worker", None)
                    if worker is not None and record.get("budget_bytes"):
                        worker.limit = record["budget_bytes"] // 4
                    if pieces is not None and pieces.segments is not None:  # the pieces' sessions run it all
                        outputs.release()
                        calibrator.infer_session = outputs = pieces.fallback = None
                if pieces is not None:
                    pieces.collect(calibrator.collector, batches)
                else:
                    outputs.rewind()
                    calibrator.collect_data(make_reader(batches, input_name))
                del batches
        except ORT_RUN_ERRORS as exc:  # onnxruntime's own text, with what it was doing when it failed
            where = f"batch {start}" if end == start + 1 else f"batches {start}..{end - 1}"
            raise CalibrunError(f"calibration: onnxruntime fails to run the model on calibration {where}: "
                                f"{one_line(exc)}") from exc
        interrupts.check()
        progress.update(end)
    if outputs is not None:
        outputs.release()


def _fast_collector(calibrator, threads: int, budget: int | None = None) -> None:
    """Give onnxruntime's histogram calibrator calibrun's collector (same histograms and ranges, computed in a
    fraction of the time: calibrun/quant/histogram.py), built from the calibrator's own settings. onnxruntime's
    `collect_data` creates its collector only when it has none, and `compute_data` asks it for the ranges."""
    calibrator.collector = FastHistogramCollector(
        method=calibrator.method, symmetric=calibrator.symmetric, num_bins=calibrator.num_bins,
        num_quantized_bins=calibrator.num_quantized_bins, percentile=calibrator.percentile,
        scenario=calibrator.scenario, threads=threads,
    )
    # forked now, before the first batch fills onnxruntime's arenas (calibrun.quant.histogram_worker); its mapping
    # holds a quarter of memory.budget (auto: of its floor, before the first chunk tells the budget)
    calibrator.collector.worker = HistogramWorker.start(calibrator.collector, calibrator.collector.threads,
                                                        (budget or memory.AUTO_FLOOR) // 4)


@contextlib.contextmanager
def _without_its_session() -> Iterator[None]:
    """create_calibrator ends by opening onnxruntime's own session of the augmented model, with the calibrator's
    model proto (every weight) still in memory beside it; calibrun replaces that session at once (`_lean_session`).
    Within this block the calibrator opens none: the weights are in memory once less at the peak (ResNet-50: 528 ->
    465 MB peak RSS of the calibration, bench/real_models.py --memory resnet) and one session load less."""
    from onnxruntime.quantization.calibrate import CalibraterBase

    original = CalibraterBase.create_inference_session
    CalibraterBase.create_inference_session = lambda self: None
    try:
        yield
    finally:
        CalibraterBase.create_inference_session = original


def _lean_session(calibrator, threads: int) -> None:
    """Re-create the calibrator's session as onnxruntime's create_inference_session does (no graph
    optimisation), with priority-based execution order, `threads` intra-op threads and no spinning
    (calibrun.model.sessions.no_spinning).

    onnxruntime's default order keeps every activation alive until its late ReduceMin/ReduceMax runs: on
    ResNet-50 the MinMax session peaks at 3.9 GB for 16 images, against 0.9 GB priority-based, with
    bit-identical ranges (bench/calibration.py)."""
    calibrator.infer_session = None  # (none: `_without_its_session`; were there one, it would go first)
    calibrator.infer_session = session(calibrator.augmented_model_path, threads, optimize=False, mem_pattern=True,
                                       priority_order=True, providers=calibrator.execution_providers,
                                       shown="the calibration copy of the model")


class RowRuns:
    """The MinMax calibrator's session, running a batch in runs of at most `rows` rows (calibrun.core.memory): the
    outputs of onnxruntime's ReduceMin/ReduceMax nodes (`<tensor>_ReduceMin`, `<tensor>_ReduceMax`, one value
    each) are combined with minimum/maximum, which is exact, so the ranges are bit-identical to one run of the
    whole batch's minima and maxima (onnxruntime's kernels may round a row differently in a smaller batch: then
    within float32 rounding); of the model's own outputs (which the calibrator drops) the first run's are returned.
    Rows are split along each input's batch axis (`axes`, calibrun.data.rows; constants are fed whole to every
    run). The rows per run come from the first batch: one row's live activations (calibrun.core.memory.live_bytes)
    against the budget, so a batch that fits runs whole, as before."""

    def __init__(self, session, model_path, budget: int | None, used: dict | None = None, axes=None):
        """`model_path`: the fp32 model (its activations are sized with shape inference)."""
        self.session, self.model_path, self.setting, self.axes = session, model_path, budget, axes
        self.used = used if used is not None else {}
        self.output_names = [node.name for node in session.get_outputs()]
        self.rows: int | None = None
        shapes = {node.name: node.shape for node in session.get_inputs()}
        self.fixed = feed_rows.pinned_rows(shapes, axes) is not None

    def get_inputs(self):
        return self.session.get_inputs()

    def get_outputs(self):
        return self.session.get_outputs()

    def _plan(self, feeds, total: int) -> int:
        sizes = memory.row_bytes(self.model_path, feeds, self.axes)
        budget = memory.resolve(self.setting, sizes)
        per_row = 2 * memory.live_bytes(self.model_path, feeds, self.axes, sizes)  # activations, kernels' workspace
        rows = total if self.fixed else memory.rows_for(budget, per_row, total)
        self.used.update(budget_bytes=budget, calibration_rows_per_run=rows)
        if rows < total:
            log.info("calibration: %d of %d rows per run (%.0f MB of live activations per row, memory.budget %.0f MB)",
                     rows, total, per_row / 1e6, budget / 1e6)
        return rows

    def run(self, output_names, input_feed, run_options=None):
        total = feed_rows.count(input_feed, self.axes)
        if self.rows is None:
            self.rows = self._plan(input_feed, total)
        if output_names is not None or self.rows >= total:
            return self.session.run(output_names, input_feed, run_options)
        merged = None
        for _, _, part in feed_rows.runs(input_feed, self.axes, self.rows):
            outputs = self.session.run(None, part, run_options)
            if merged is None:
                merged = list(outputs)
                continue
            for index, (name, array) in enumerate(zip(self.output_names, outputs, strict=True)):
                if name.endswith("_ReduceMin"):
                    merged[index] = np.minimum(merged[index], array)
                elif name.endswith("_ReduceMax"):
                    merged[index] = np.maximum(merged[index], array)
        return merged


@contextlib.contextmanager
def calibrated(
    model_path: str | Path,
    model_sha256: str,
    data,
    input_name: str,
    spec: CalibrationSpec,
    cache: CalibrationCache | None,
    threads: int = 0,
    budget: int | None = None,
    used: dict | None = None,
) -> Iterator[Calibration]:
    """Ranges for (model, data, spec): from the cache on a hit, else a calibration pass (stored in the cache).

    With `cache=None` the ranges live in a temp folder for the duration of the block.
    """
    record = cache_record(model_sha256, data.identity(), input_name, spec)
    key = key_of(record)
    start = time.perf_counter()
    seen = cache.stamp(key) if cache is not None else None
    span = cache.load(key, record, spec.method) if cache is not None else None
    if cache is not None and span is None and not _writable(cache.folder):
        # a read-only cache (a shared, mounted one): its hits serve, a miss is calibrated and not stored (it had
        # calibrated, then failed writing the ranges)
        log.warning("calibration cache %s is not writable: calibrating without storing these ranges",
                    cache.folder)
        cache = None
    if cache is None:
        tensors, span = run_calibration(model_path, data, input_name, spec, threads, budget, used)
        with temp_dir("ranges") as tmp:
            path = write_ranges(Path(tmp) / f"{key}.json", tensors, record, span)
            yield Calibration(path, spec.method, key, False, time.perf_counter() - start, span, len(data),
                              spec.op_types or None)
        return
    hit, waited = span is not None, 0.0
    if not hit:
        with cache.claim(key) as waited:  # another process calibrating this key: its ranges, once they are there
            if cache.stamp(key) != seen:  # written (renamed into place) since: read again
                span = cache.load(key, record, spec.method)
            hit = span is not None
            if not hit:
                tensors, span = run_calibration(model_path, data, input_name, spec, threads, budget, used)
                cache.store(key, record, tensors, span)
    # the key's lock is released here: a job waiting for these ranges does not wait for this one's quantisation
    yield Calibration(cache.path(key), spec.method, key, hit, time.perf_counter() - start, span, len(data),
                      spec.op_types or None, waited)


def _writable(folder: Path) -> bool:
    """Whether `folder`, or where it would be created (its nearest existing parent), takes new files."""
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return os.access(folder, os.W_OK)


def cache_from_env() -> CalibrationCache | None:
    """calibtool's cache: `CALIBRUN_CACHE` names the folder (default .calibrun-cache), `off` disables it."""
    folder = os.environ.get("CALIBRUN_CACHE", cache_store.DEFAULT_DIR)
    return None if folder.strip().lower() in {"off", "0", "false", ""} else CalibrationCache(folder)
