"""Quantisation from calibrated ranges: onnxruntime's `quantize_static` fed through `calibration_cache_path`.

Everything here is post-calibration: changing any of these options reuses the calibration cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

from calibrun.core import patches
from calibrun.core.bounds import STAND_IN, inside_stand_in
from calibrun.core.errors import CalibrunError, first_few, one_line
from calibrun.core.files import atomic_path, check_not_source, check_writable, temp_dir
from calibrun.core.overrides import key_name
from calibrun.lab.data import lab_batches
from calibrun.model import FloatModel, external_files, private_model_copy
from calibrun.model.graph import input_quant, input_stays_float, op_counts, scales_summary
from calibrun.model.prepare import default_opset
from calibrun.model.row_axis import added_nodes
from calibrun.quant.calibrate import METHODS, Calibration, CalibrationCache, CalibrationSpec, calibrated

FORMATS = {"qdq": QuantFormat.QDQ, "qoperator": QuantFormat.QOperator}
log = logging.getLogger(__name__)

QUANT_TYPES = {name: QuantType[name] for name in ("QInt8", "QUInt8", "QInt16", "QUInt16")}
SIXTEEN_BIT = {"QInt8": "QInt16", "QUInt8": "QUInt16"}  # an 8-bit type -> the 16-bit type of the same signedness
BIASED = ("Conv", "ConvTranspose", "Gemm")  # ops whose input 2 onnxruntime quantises as a bias (int32)


@dataclass(frozen=True)
class QuantOptions:
    format: str = "qdq"
    activation_type: str = "QInt8"
    weight_type: str = "QInt8"
    per_channel: bool = False
    reduce_range: bool = False
    activation_symmetric: bool = False
    # onnxruntime's WeightSymmetric (null: its default, symmetric for signed weight types); false spends the int8
    # levels on each weight's own [min, max] (docs/models.md: PaddlePaddle's text detector, IoU 0.344 -> 0.642)
    weight_symmetric: bool | None = None
    nodes_to_exclude: tuple[str, ...] = ()
    op_types_to_quantize: tuple[str, ...] | None = None
    # tensor -> its own quantisation type (onnxruntime's TensorQuantOverrides `quant_type`), e.g. {conv1_out: QInt16}:
    # mixed precision in one QDQ model, onnxruntime converting the type at the region's edges
    # (keys as the config gives them: Hydra reads a tensor named 142, as older PyTorch exports name them, as the
    # number 142, and a character its dict keys have no place for is a %XX escape; calibrun.core.overrides.key_name)
    tensor_types: dict[Any, str] = field(default_factory=dict)
    # tensor -> its own range [low, high] in place of the calibrated one (onnxruntime's TensorQuantOverrides `rmin`,
    # `rmax`), e.g. {conv5_out:[-12,12]}: headroom for a tensor the calibration data clipped (a recommendation
    # candidate: calibrun.analysis.recommend)
    tensor_ranges: dict[Any, list] = field(default_factory=dict)

    def __post_init__(self):
        if self.format not in FORMATS:
            raise CalibrunError(f"format must be one of {sorted(FORMATS)}, got {self.format!r}")
        object.__setattr__(self, "tensor_types", {key_name(k): str(v)
                                                  for k, v in dict(self.tensor_types or {}).items()})
        for tensor, kind in self.tensor_types.items():
            if kind not in QUANT_TYPES:
                raise CalibrunError(f"tensor_types: {tensor!r}: must be one of {sorted(QUANT_TYPES)}, got {kind!r}")
        if self.tensor_types and self.format != "qdq":
            raise CalibrunError("tensor_types needs format=qdq (onnxruntime's TensorQuantOverrides are QDQ's)")
        object.__setattr__(self, "tensor_ranges", {key_name(k): _range_of(key_name(k), v)
                                                   for k, v in dict(self.tensor_ranges or {}).items()})
        if self.tensor_ranges and self.format != "qdq":
            raise CalibrunError("tensor_ranges needs format=qdq (onnxruntime's TensorQuantOverrides are QDQ's)")
        for key in ("activation_type", "weight_type"):
            if getattr(self, key) not in QUANT_TYPES:
                raise CalibrunError(f"{key} must be one of {sorted(QUANT_TYPES)}, got {getattr(self, key)!r}")
        sixteen = {"QInt16", "QUInt16"}
        if self.format == "qoperator" and {self.activation_type, self.weight_type} & sixteen:
            raise CalibrunError("16-bit types need format=qdq (onnxruntime has no 16-bit QOperator ops)")
        if self.activation_type == "QInt8" and self.weight_type == "QUInt8":
            raise CalibrunError("onnxruntime does not support QInt8 activations with QUInt8 weights")



def _range_of(tensor, value) -> tuple[float, float]:
    """A quant.tensor_ranges value as (low, high): two finite numbers, low < high."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        low = high = math.nan
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise CalibrunError(f"tensor_ranges: {str(tensor)!r}: must be [low, high], two finite numbers with low < high, "
                            f"got {value!r}")
    return low, high


class _AdviceOnce(logging.Filter):
    """onnxruntime logs the same advice on the root logger for every QOperator model it writes ("Please use
    QuantFormat.QDQ for activation type QInt8 ...") and every 16-bit model of an older opset ("The original model
    opset version is 17, which does not support 16-bit ..."): shown once per process (a sweep's jobs run in its
    process, or in a few workers), not once per model. Its INFO lines, one per tensor ("Quantizing bias tensor
    'conv2d_96.b_0' as a weight due to the presence of user-specified overrides": 400 per model a repair trial
    writes), are dropped; its warnings stay, but for one kind written once per weight: with per-channel weights,
    "Axis 1 is out-of-range for weight 'batch_norm2d_0.w_0' with rank 1" for every rank-1 weight (a
    BatchNormalization's scale: 94 lines on a PP-PicoDet), which onnxruntime then quantises per tensor; the first
    is shown, saying so, and the rest dropped. Likewise a QOperator model's "Inference failed or unsupported type to
    quantize for tensor 'Cast@1', type is tensor_type {" and the type's protobuf text on eight more lines, for every
    tensor of a type onnxruntime does not quantise (an int64 shape; 36 of them, 300 lines, on NudeNet): the first in
    one line naming the type, the rest dropped."""

    PREFIX = ("Please use QuantFormat.QDQ", "The original model opset version is")
    QUIET = f"{os.sep}onnxruntime{os.sep}quantization{os.sep}"
    PER_WEIGHT = re.compile(r"Axis -?\d+ is out-of-range for weight '.*' with rank \d+")
    PER_WEIGHT_NOTE = ": onnxruntime quantises it per tensor (further weights like it are not named)"
    PER_TENSOR = re.compile(r"Inference failed or unsupported type to quantize for tensor (?P<name>'.*'), type is "
                            r"(?P<type>.*)\.", re.DOTALL)

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.QUIET in record.pathname:
            if record.levelno <= logging.INFO:
                return False
            record.name = "onnxruntime.quantization"  # whose line it is, not "root" (onnxruntime logs on the root)
        message = record.getMessage()
        if self.PER_WEIGHT.fullmatch(message):
            if "per weight" in self.seen:
                return False
            self.seen.add("per weight")
            record.msg, record.args = message + self.PER_WEIGHT_NOTE, None
            return True
        if (found := self.PER_TENSOR.fullmatch(message)) is not None:
            if "per tensor" in self.seen:
                return False
            self.seen.add("per tensor")
            kind = re.search(r"elem_type: (\d+)", found["type"])
            kind = onnx.TensorProto.DataType.Name(int(kind[1])) if kind else "its type unknown"
            record.msg, record.args = (f"onnxruntime does not quantise tensor {found['name']} ({kind}): not a float "
                                       "type, or no type known (further tensors like it are not named)"), None
            return True
        if not message.startswith(self.PREFIX):
            return True
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


ADVICE_ONCE = _AdviceOnce()


def advice_once() -> None:
    """Install the filter on the root logger (idempotent: Hydra's logging set-up may run again per job)."""
    root = logging.getLogger()
    if ADVICE_ONCE not in root.filters:
        root.addFilter(ADVICE_ONCE)

def quantize(
    model_path: str | Path,
    out_path: str | Path,
    calibration: Calibration,
    options: QuantOptions,
    check: Callable[[Path], None] | None = None,
) -> float:
    """Write the quantised model to `out_path` atomically; return the seconds quantize_static took.

    `check(tmp_path)` may inspect the written model before it is renamed into place; if it raises,
    nothing is left at `out_path`.
    """
    out_path = Path(out_path)
    advice_once()
    patches.rewire_by_membership()
    patches.index_initializer_lookups()
    start = time.perf_counter()
    with atomic_path(out_path, suffix=".onnx") as tmp, temp_dir("q") as private, patches.indexed_lookups():
        copy = _private_copy(model_path, Path(private), _sixteen_bit(options))
        graph = onnx.load(str(copy), load_external_data=False).graph  # read once for both
        nan_ranges(graph, calibration.ranges_path)
        unbounded = unbounded_nodes(graph, calibration.ranges_path)
        kept = [*unbounded, *size_nodes(graph), *double_nodes(graph), *added_nodes(graph)]  # (added: a row axis')
        said = options  # errors name the options as given, not the nodes calibrun keeps in float itself
        for attempt in range(DANGLING_TRIES + 1):
            if kept:
                options = dataclasses.replace(options, nodes_to_exclude=tuple(
                    dict.fromkeys([*options.nodes_to_exclude, *kept])))
            try:
                # onnxruntime still computes a scale for each unbounded tensor (inf / inf: numpy's RuntimeWarnings on
                # stderr, trueocr's reading-order model and its -inf mask); calibrun said them once and keeps their
                # nodes in float
                with np.errstate(invalid="ignore", divide="ignore", over="ignore") if unbounded \
                        else contextlib.nullcontext(), _said_as_onnxruntimes(said):
                    _quantize_static(copy, tmp, calibration, options)
                break
            except CalibrunError as exc:
                kept = dangling_producers(graph, exc.__cause__, options.nodes_to_exclude)
                if not kept or attempt == DANGLING_TRIES:
                    raise
                if "\0".join(kept) not in _SAID_DANGLING:  # once a process: every candidate quantises again
                    _SAID_DANGLING.add("\0".join(kept))
                    logging.getLogger("calibrun").warning(
                        "onnxruntime's quantize_static wrote a model that reads tensors no node writes any more "
                        "(%s): quantising again with their producers kept in float (%s)", first_few(sorted(
                            _dangling(exc.__cause__))), first_few(kept))
        seconds = time.perf_counter() - start
        if check is not None:
            check(tmp)
    return seconds


def _quantize_static(copy: Path, out: Path, calibration: Calibration, options: QuantOptions) -> None:
    quantize_static(
        str(copy),
        str(out),
        calibration_data_reader=None,  # the ranges come from the cache file: no calibration here
        quant_format=FORMATS[options.format],
        op_types_to_quantize=_op_types_to_quantize(options, calibration),
        per_channel=options.per_channel,
        reduce_range=options.reduce_range,
        activation_type=QUANT_TYPES[options.activation_type],
        weight_type=QUANT_TYPES[options.weight_type],
        nodes_to_exclude=list(options.nodes_to_exclude),
        calibrate_method=METHODS[calibration.method],
        extra_options={"ActivationSymmetric": options.activation_symmetric,
                       **({"WeightSymmetric": options.weight_symmetric}
                          if options.weight_symmetric is not None else {}),
                       **({"TensorQuantOverrides": overrides(options)}
                          if options.tensor_types or options.tensor_ranges else {})},
        calibration_cache_path=calibration.ranges_path,
    )


_SAID_DANGLING: set[str] = set()
DANGLING_TRIES = 3  # quantisations again with more producers kept in float, at most
_DANGLING = re.compile(r"unknown initializers/tensors\.?\s*\{([^}]*)\}")


def _dangling(error: BaseException | None) -> set[str]:
    """The tensors onnxruntime's own check of the model it wrote found read and never written, from its error."""
    found = _DANGLING.search(str(error)) if error is not None else None
    return {name.strip().strip("'\"") for name in found[1].split(",")} - {""} if found else set()


def dangling_producers(graph: onnx.GraphProto, error: BaseException | None, excluded) -> list[str]:
    """The nodes (not yet excluded) that write the tensors quantize_static's model left unwritten: its QOperator
    form of an 8-bit data-movement op removed the float tensor another reader still needed (swift-f0's Transpose and
    Sigmoid read by a Where and an ArgMax: `Invalid model with unknown initializers/tensors`). Kept in float, those
    tensors stay float and the model is whole; none: the error stands."""
    tensors = _dangling(error)
    return [n.name for n in graph.node if n.name and n.name not in excluded and not tensors.isdisjoint(n.output)]


@contextlib.contextmanager
def _said_as_onnxruntimes(options: QuantOptions):
    """An error quantize_static raises (a numpy ValueError deep in its quantizer: GTCRN's grouped ConvTranspose
    under per-channel weights, `operands could not be broadcast together with shapes (16,) (8,)`) as one line that
    says it is onnxruntime's, with the options that differ from the defaults, the node it was quantising (a `node`
    in its frames) and the function that failed."""
    try:
        yield
    except (CalibrunError, MemoryError, OSError):  # calibrun's own, and a full disk or a missing file: said elsewhere
        raise
    except Exception as exc:
        frames, tb = [], exc.__traceback__
        while tb is not None:
            if "onnxruntime" in tb.tb_frame.f_code.co_filename:
                frames.append(tb.tb_frame)
            tb = tb.tb_next
        where = frames[-1].f_code.co_name if frames else None
        at = ""
        for frame in reversed(frames):  # the innermost frame that names what it quantised (an outer loop's `node`
            local = frame.f_locals      # may be a later node than the one that failed: GTCRN's ScatterND)
            node = local.get("node") if isinstance(local.get("node"), onnx.NodeProto) else None
            tensor = next((local[k] for k in ("bias_name", "weight_name", "tensor_name")
                           if isinstance(local.get(k), str)), None)
            if node is None and tensor is not None:
                node = _reader(local.get("self"), tensor)
            if node is not None and node.name:
                at = f" at node {node.name!r} ({node.op_type})"
            elif tensor is not None:
                at = f" on tensor {tensor!r}"
            if at:
                break
        default = QuantOptions(format=options.format)
        changed = [_shown(f.name, getattr(options, f.name)) for f in dataclasses.fields(options)
                   if getattr(options, f.name) != getattr(default, f.name)]
        raise CalibrunError(f"onnxruntime's quantize_static failed{at}"
                            f"{' with ' + ' '.join(changed) if changed else ''}"
                            f"{f' in {where}' if where else ''}: {one_line(exc)}") from exc


def _reader(quantizer, tensor: str) -> onnx.NodeProto | None:
    """The first node of the model `quantizer` (onnxruntime's, its `model` an ONNXModel) reads `tensor` in."""
    try:
        return next((n for n in quantizer.model.nodes() if tensor in n.input), None)
    except AttributeError:
        return None


def _shown(name: str, value) -> str:
    """An option as the override that sets it, short: `quant.per_channel=true`, `quant.tensor_types` (3 tensors)."""
    if isinstance(value, dict):
        return f"quant.{name} ({len(value)} tensor{'s' if len(value) != 1 else ''})"
    if isinstance(value, bool):
        value = str(value).lower()
    elif isinstance(value, tuple):
        value = f"[{','.join(value[:3])}{',...' if len(value) > 3 else ''}]"
    return f"quant.{name}={value}"


_COPIES: dict | None = None  # within `reusing_copies`: (model, its version, 16-bit) -> its private copy


@contextlib.contextmanager
def reusing_copies():
    """Within it, quantize() makes its private copy of a model (private_model_copy, and the opset raised for 16-bit
    types) once and reuses it: the measured recommendations, the repair and the fallback quantise one model
    again and again, one quantisation at a time (quantize_static only reads the copy; the file it writes beside it
    is its own and gone when it returns). A copy took 0.1-0.2 s a candidate on the MiniLMs."""
    global _COPIES
    with temp_dir("copies") as folder:
        outer, _COPIES = _COPIES, {"folder": Path(folder)}
        try:
            yield
        finally:
            _COPIES = outer


def _private_copy(model_path: str | Path, private: Path, sixteen_bit: bool) -> Path:
    """The private copy quantize_static reads (see private_model_copy; the opset raised for 16-bit types), made in
    `private` or, within reusing_copies, the one made before for the same file version and type width."""
    if _COPIES is None:
        return _fresh_copy(model_path, private, sixteen_bit)
    stat = Path(model_path).stat()
    key = (str(Path(model_path).resolve()), stat.st_mtime_ns, stat.st_size, sixteen_bit)
    if key not in _COPIES:
        folder = _COPIES["folder"] / str(len(_COPIES))
        folder.mkdir()
        _COPIES[key] = _fresh_copy(model_path, folder, sixteen_bit)
    return _COPIES[key]


def _fresh_copy(model_path: str | Path, folder: Path, sixteen_bit: bool) -> Path:
    copy = private_model_copy(model_path, folder)
    if sixteen_bit:
        _opset_for_sixteen_bit(copy)
    return copy


_SAID_UNBOUNDED: set[str] = set()  # the sets of non-finite tensors already logged


_RANGES: dict[tuple, tuple[dict, dict, set]] = {}  # (ranges file, its mtime and size) -> (_read_ranges)


def _read_ranges(path: Path) -> tuple[dict[str, bool | None], dict[str, tuple[float, float]], set[str]]:
    """What calibrun reads of a ranges file (onnxruntime's TensorsData JSON, parsed as quantize_static parses it),
    read once per file version (a histogram method's file holds every histogram: parsing it for each
    recommendation candidate would cost more than the answer): its unbounded tensors (`_unbounded_tensors`),
    each other tensor's finite range (`calibrated_ranges`) and the tensors whose range is NaN (`nan_ranges`)."""
    import json

    from onnxruntime.quantization.calibrate import TensorsData

    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _RANGES:
        ranges = TensorsData.from_dict(json.loads(path.read_text()))
        if len(_RANGES) > 64:
            _RANGES.clear()
        unbounded, finite, nan = {}, {}, set()
        for name, data in ranges.items():
            low, high = (np.asarray(end, np.float64) for end in data.range_value)
            if np.any(np.isnan(low)) or np.any(np.isnan(high)):  # fp32 computed NaN there: nan_ranges refuses it
                nan.add(name)
            elif not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
                unbounded[name] = bool(np.all(low > high))
            elif not inside_stand_in(float(np.min(low)), float(np.max(high))):
                unbounded[name] = None
            elif float(np.min(low)) <= float(np.max(high)):
                finite[name] = (float(np.min(low)), float(np.max(high)))
        _RANGES[key] = unbounded, finite, nan
    return _RANGES[key]


def _unbounded_tensors(path: Path) -> dict[str, bool | None]:
    """The tensors of a ranges file whose range is not finite or reaches infinity's stand-in (STAND_IN), each with
    True where it held no value at all (an empty tensor's range stays lowest +inf, highest -inf: a pad of length 0),
    False where its range is infinite, None where it is finite but reaches STAND_IN."""
    return _read_ranges(path)[0]


def calibrated_ranges(path: str | Path) -> dict[str, tuple[float, float]]:
    """Each tensor's calibrated range in a ranges file where it is finite, holds values and stays inside infinity's
    stand-in (a tensor outside it keeps its nodes in float: unbounded_nodes)."""
    return _read_ranges(Path(path))[1]


def nan_ranges(graph: onnx.GraphProto, ranges_path: str | Path) -> None:
    """Refuse, in one line, ranges onnxruntime calibrated as NaN: fp32 computed NaN in the tensor on the calibration
    rows (onnxruntime's MinMax merges its batches with numpy's nanmin and nanmax, and a batch's ReduceMin is NaN where
    a NaN comes first), and no scale holds NaN: quantize_static stopped with "compute_scale_zp: scale issue" on an
    unseen protein classifier calibrated on rows of padding only (its masked mean 0 / 0). Named: the first such
    tensor in the graph's order, the node and op that write it, and how many follow."""
    nan = _read_ranges(Path(ranges_path))[2]
    if not nan:
        return
    order = [o for node in graph.node for o in node.output if o in nan]
    order += sorted(nan - set(order))
    writer = next((n for n in graph.node if order[0] in n.output), None)
    made = f" (written by {writer.op_type} node {writer.name!r})" if writer is not None else ""
    after = f", and so is that of {len(order) - 1} tensor(s) after it ({first_few(order[1:])})" if len(order) > 1 \
        else ""
    raise CalibrunError(
        f"the calibrated range of tensor {order[0]!r}{made} is NaN{after}: the fp32 model computes NaN there on the "
        "calibration rows, and no int8 scale holds NaN; calibrate on rows the model computes numbers for (rows of "
        "padding only? a 0 / 0?)")


def unbounded_nodes(graph: onnx.GraphProto, ranges_path: str | Path) -> list[str]:
    """The nodes that read or write a tensor whose calibrated range is not finite (a transformer's additive
    attention mask is -inf where it masks) or reaches infinity's stand-in (STAND_IN: its -3.4e38): no scale
    represents it with the values beside it, and onnxruntime would quantise it with an infinite or astronomic one,
    which wrecks every row that passes the mask, masked or not. Those nodes stay in float (one warning line); the
    int8 model keeps the mask exact."""
    tensors = _unbounded_tensors(Path(ranges_path))
    if not tensors:
        return []
    nodes = [n.name for n in graph.node if n.name and not tensors.keys().isdisjoint([*n.input, *n.output])]
    key = "\0".join(sorted(tensors))
    if key not in _SAID_UNBOUNDED:  # once a process per set of tensors: the job's copy of the ranges is the same
        _SAID_UNBOUNDED.add(key)
        empty = sorted(name for name, none in tensors.items() if none)
        infinite = sorted(name for name, none in tensors.items() if none is False)
        filled = sorted(name for name, none in tensors.items() if none is None)
        known = calibrated_ranges(ranges_path)  # (read once per file version)
        # each input's reach: past infinity's stand-in, or astronomic for data (no trained model's holds 1e30)
        reach = {i.name: STAND_IN if i.name in filled else max(map(abs, known.get(i.name, (0.0, 0.0))))
                 for i in graph.input}
        given = sorted(name for name, value in reach.items() if value >= 1e30)  # an outlier in the data, not a mask
        said = [f"{len(infinite)} tensor(s) have a calibrated range that is not finite ({first_few(infinite)}: a "
                "mask's -inf? attention, a masked pooling)"] if infinite else []
        said += [f"{len(filled)} tensor(s) have a calibrated range that reaches {STAND_IN:.2g} or beyond, infinity's "
                 f"stand-in ({first_few(filled)}: " + (
                     f"the calibration data of input(s) {first_few(given)} reaches "
                     f"{max(reach[n] for n in given):.2g}: an outlier in the data?)" if given
                     else "a mask filled with float32's lowest, -3.4e38? attention, a masked pooling)")] \
            if filled else []
        said += [f"{len(empty)} tensor(s) held no value in calibration ({first_few(empty)}: empty, as a pad of length "
                 "0 is)"] if empty else []
        logging.getLogger("calibrun").warning("%s: the %d node(s) that read or write them stay in float",
                                              "; ".join(said), len(nodes))
    return nodes


_SAID_DOUBLES: set[str] = set()


def double_nodes(graph: onnx.GraphProto) -> list[str]:
    """The nodes that read or write a float64 tensor: calibration ranges float32 tensors only, so onnxruntime has no
    range for them, and quantising them failed in quantize_static (swift-f0's pitch decode, a Softmax over float64:
    onnxruntime sets every Softmax output's range to [0, 1], and a tensor with no range cannot be set). They stay in
    float (one line), as computing in float64 is what the model asks of them."""
    doubles = {v.name for v in (*graph.value_info, *graph.input, *graph.output)
               if v.type.tensor_type.elem_type == onnx.TensorProto.DOUBLE}
    doubles |= {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.DOUBLE}
    if not doubles:
        return []
    names = [n.name for n in graph.node if n.name and not doubles.isdisjoint([*n.input, *n.output])]
    key = "\0".join(names)
    if names and key not in _SAID_DOUBLES:
        _SAID_DOUBLES.add(key)
        logging.getLogger("calibrun").info("kept in float: %d node(s) computing in float64 (%s): calibration ranges "
                                           "float32 tensors", len(names), first_few(names))
    return names


# float inputs that set the size of an op's output, not values it computes with: Resize's roi and scales, Upsample's
# scales (its sizes, and every other op's shape inputs, are integers, which quantize_static leaves alone)
SIZE_INPUTS = {"Resize": (1, 2), "Upsample": (1,)}
SIZE_NODES_LIMIT = 16  # nodes followed back from one such input (beyond: its producer alone)
_SAID_SIZES: set[str] = set()


def size_nodes(graph: onnx.GraphProto) -> list[str]:
    """The nodes that compute a float input setting an output's size (a Resize's scales, from a Concat of [1, 1] and
    the model's `downsample_ratio` in Robust Video Matting): on an int8 grid 0.5 became 127/255, the frame 127 pixels
    where fp32's is 128, a resize to another size rather than a rounding error. Followed back from the input through
    its float producers to constants, graph inputs and integer tensors (a Shape cast to float), and kept in float
    (one line); at most SIZE_NODES_LIMIT nodes, else the input's producer alone."""
    producers = {out: node for node in graph.node for out in node.output if out}
    known = {info.name: info.type.tensor_type.elem_type for info in (*graph.value_info, *graph.input, *graph.output)}
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, 0}  # 0: type not inferred
    constants = {node.name for node in graph.node if node.op_type == "Constant"}  # a value, never quantised
    kept: dict[str, None] = {}
    for node in graph.node:
        for index in SIZE_INPUTS.get(node.op_type, ()):
            if index >= len(node.input) or node.input[index] not in producers:
                continue
            cone, todo = {}, [node.input[index]]
            while todo and len(cone) <= SIZE_NODES_LIMIT:
                producer = producers.get(todo.pop())
                if producer is None or producer.name in cone:
                    continue
                cone[producer.name] = None
                todo.extend(i for i in producer.input if i in producers and known.get(i, 0) in floats
                            and producers[i].op_type not in ("Shape", "Size"))
            chosen = cone if len(cone) <= SIZE_NODES_LIMIT else {producers[node.input[index]].name: None}
            kept.update((name, None) for name in chosen if name and name not in constants)
    names = [node.name for node in graph.node if node.name in kept]  # in the graph's order
    key = "\0".join(names)
    if names and key not in _SAID_SIZES:
        _SAID_SIZES.add(key)
        logging.getLogger("calibrun").info(
            "kept in float: %d node(s) computing a Resize's scales (%s): they set its output's size, which rounding "
            "to the int8 grid would change", len(names), first_few(names))
    return names


def _sixteen_bit(options: QuantOptions) -> bool:
    """Whether onnxruntime quantises some tensor to 16 bits with `options` (it then needs opset 21)."""
    wide = set(SIXTEEN_BIT.values())
    kinds = {options.activation_type, options.weight_type, *options.tensor_types.values()}
    return bool(wide & kinds)


def _opset_for_sixteen_bit(path: Path) -> None:
    """Raise the private copy at `path` (weights in its external data file) to opset 21, in place, as
    quantize_static would for 16-bit types (onnxruntime.quantization.quant_utils.update_opset_version, the same
    onnx version converter), but on the graph alone: quantize_static converts the whole model with its weights, a
    C++ copy and a shape-inference round trip of every weight (ResNet-50's job: 880 MB at a 16-bit candidate, 520 MB
    at the others). The converted file refers to the same external data; quantize_static then finds opset 21 and
    converts nothing."""
    model = onnx.load(str(path), load_external_data=False)
    opset = default_opset(model)
    if opset is None or opset >= 21:
        return
    try:
        converted = onnx.version_converter.convert_version(model, 21)
    except Exception as exc:  # noqa: BLE001 (an adapter that needs the weights' values: onnxruntime converts it all)
        log.debug("opset 21 on the graph alone failed (%s); quantize_static converts the whole model", exc)
        return
    with atomic_path(path, suffix=".onnx") as tmp:
        onnx.save(converted, str(tmp))


def overrides(options: QuantOptions) -> dict:
    """quant.tensor_types and quant.tensor_ranges as onnxruntime's TensorQuantOverrides (`quant_type`; `rmin`,
    `rmax` as float32, as the calibrated ranges are), in name order."""
    found: dict[str, dict] = {}
    for tensor, kind in options.tensor_types.items():
        found.setdefault(tensor, {})["quant_type"] = QUANT_TYPES[kind]
    for tensor, (low, high) in options.tensor_ranges.items():
        found.setdefault(tensor, {}).update(rmin=np.array(low, np.float32), rmax=np.array(high, np.float32))
    return {tensor: [found[tensor]] for tensor in sorted(found)}


def _op_types_to_quantize(options: QuantOptions, calibration: Calibration) -> list[str]:
    """quantize_static needs ranges for every op it quantises: never ask for op types that were not calibrated.

    (quantize_static's own calibration calibrates exactly `op_types_to_quantize`; this keeps that invariant.)
    """
    wanted = list(options.op_types_to_quantize or [])
    if calibration.op_types is None:  # every op type was calibrated
        return wanted
    if not wanted:
        return sorted(calibration.op_types)
    missing = sorted(set(wanted) - set(calibration.op_types))
    if missing:
        raise CalibrunError(f"op types {missing} are to be quantised but were not calibrated "
                            f"(calibration op_types: {sorted(calibration.op_types)})")
    return wanted


@dataclass(frozen=True)
class Exclusions:
    """`quant.nodes_to_exclude` resolved against a model: node names only, and which given names were tensors."""

    nodes: tuple[str, ...]
    mapped: dict[str, str]  # a tensor name given -> the node that produces it


def check_exclusions(model, options: QuantOptions) -> Exclusions:
    """Fail before any work when `nodes_to_exclude` or `op_types_to_quantize` would silently match nothing.

    quantize_static ignores node names that match no node (the int8 model is the same as without them) and op
    types that no node has. Here: a node name must name a node of `model` (the prepared model, the one that is
    quantised); a tensor name is mapped to the node that produces it (and logged); anything else is an error
    naming the closest node names. Raises CalibrunError; returns the resolved node names.
    """
    import difflib
    import logging

    nodes = list(model.graph.node)
    names = {n.name for n in nodes if n.name}
    producer = {out: n for n in nodes for out in n.output if out}
    graph_tensors = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    resolved: list[str] = []
    mapped: dict[str, str] = {}
    for given in options.nodes_to_exclude:
        if not given or not given.strip():
            raise CalibrunError("quant.nodes_to_exclude: an empty node name matches no node; give node names "
                                "(a model's unnamed nodes cannot be excluded by name)")
        if given in names:
            resolved.append(given)
            continue
        if given in producer:
            node = producer[given]
            if not node.name:
                raise CalibrunError(f"quant.nodes_to_exclude: {given!r} is a tensor produced by an unnamed "
                                    f"{node.op_type} node, which cannot be excluded by name")
            logging.getLogger("calibrun").info("quant.nodes_to_exclude: %r is a tensor; excluding the node that "
                                               "produces it, %r (%s)", given, node.name, node.op_type)
            mapped[given] = node.name
            resolved.append(node.name)
            continue
        if given in graph_tensors:
            readers = sorted({n.name or f"<unnamed {n.op_type}>" for n in nodes if given in n.input})
            raise CalibrunError(f"quant.nodes_to_exclude: {given!r} is a graph input or initializer, not a node; "
                                f"the nodes that read it: {readers[:8]}")
        close = difflib.get_close_matches(given, sorted(names), n=3, cutoff=0.5)
        hint = f"closest node names: {close}" if close else f"the model has {len(names)} named nodes, e.g. " \
            f"{sorted(names)[:3]}"
        raise CalibrunError(f"quant.nodes_to_exclude: no node named {given!r} in the model ({hint})")
    values = set(producer) | graph_tensors
    for key, tensors in (("tensor_types", options.tensor_types), ("tensor_ranges", options.tensor_ranges)):
        for tensor in tensors:
            if tensor not in values:
                close = difflib.get_close_matches(tensor, sorted(values), n=3, cutoff=0.5)
                hint = f"closest: {close}" if close else f"the model has {len(values)} tensors"
                raise CalibrunError(f"quant.{key}: no tensor named {tensor!r} in the model ({hint})")
    biases = bias_nodes(nodes)
    for tensor in sorted(set(options.tensor_types) & set(biases)):
        logging.getLogger("calibrun").warning(
            "quant.tensor_types: %r is the bias of node %r; onnxruntime keeps biases in int32 (scale input x "
            "weight) and with a type of its own quantises it as a weight, on a coarser grid", tensor, biases[tensor])
    if options.op_types_to_quantize:
        present = sorted({n.op_type for n in nodes})
        for op_type in options.op_types_to_quantize:
            if op_type not in present:
                close = difflib.get_close_matches(op_type, present, n=3, cutoff=0.5)
                hint = f"closest: {close}" if close else f"op types of the model: {present}"
                raise CalibrunError(f"quant.op_types_to_quantize: no {op_type!r} node in the model ({hint})")
    return Exclusions(tuple(dict.fromkeys(resolved)), mapped)


def bias_nodes(nodes) -> dict[str, str]:
    """{bias tensor: its node's name}: the inputs onnxruntime quantises as biases, int32 at the scale input x
    weight (input 2 of the BIASED ops)."""
    return {n.input[2]: n.name for n in nodes if n.op_type in BIASED and len(n.input) > 2 and n.input[2]}


def resolve_exclusions(model_path: str | Path, options: QuantOptions) -> tuple[QuantOptions, dict]:
    """`options` with `nodes_to_exclude` checked and resolved against the model file (check_exclusions), and
    what to record in result.json: {"exclusions": {"nodes_to_exclude": [...], "mapped": {tensor: node}}}, or {}."""
    if not (options.nodes_to_exclude or options.op_types_to_quantize or options.tensor_types
            or options.tensor_ranges):
        return options, {}
    import dataclasses

    import onnx

    resolved = check_exclusions(onnx.load(str(model_path), load_external_data=False), options)
    if not options.nodes_to_exclude and not options.op_types_to_quantize:
        return options, {}  # tensor types or ranges only: checked, nothing to resolve
    record = {"exclusions": {"nodes_to_exclude": list(resolved.nodes), "mapped": resolved.mapped}}
    return dataclasses.replace(options, nodes_to_exclude=resolved.nodes), record


def quantize_with(
    fp32: FloatModel,
    out: str | Path,
    data,
    spec: CalibrationSpec | None = None,
    options: QuantOptions | None = None,
    cache: CalibrationCache | None = None,
    ranges_copy: str | Path | None = None,
    threads: int = 0,
    input_may_stay_float: bool = False,
    log_float_input: bool = False,
    budget: int | None = None,
    used: dict | None = None,
    calibrated_said: Callable[[Path], object] | None = None,
) -> dict:
    """Calibrate (cached) on `data` (a sized, re-iterable source with identity()), quantise, describe the model.

    `ranges_copy`: also keep the calibration ranges there (onnxruntime's cache format).
    `input_may_stay_float`: the graph input may stay float (excluded nodes, a first op onnxruntime does not quantise:
    its scale fields are then None, with a warning line when `log_float_input`); else that is an error.
    `budget`, `used`: memory.budget in bytes (None: auto) and a dict for what the calibration pass used
    (calibrun.quant.calibrate.run_calibration). `calibrated_said(ranges_path)`: called with the calibrated ranges
    before quantising (the job's warnings about its calibration data, said also where quantisation then fails).
    """
    spec = spec or CalibrationSpec()
    options = options or QuantOptions()
    out = check_writable(out)  # before calibrating, not after
    check_not_source(fp32.path, out, external_files(fp32.path))

    def check(tmp: Path) -> None:
        if not input_may_stay_float:
            input_quant(onnx.load(str(tmp)), where=f"quantised {fp32.path.name}")

    with calibrated(fp32.path, fp32.sha256, data, fp32.info.name, spec, cache, threads, budget, used) as cal:
        if calibrated_said is not None:
            calibrated_said(Path(cal.ranges_path))
        quant_seconds = quantize(fp32.path, out, cal, options, check=check)
        if ranges_copy is not None:
            with atomic_path(ranges_copy) as tmp:
                shutil.copyfile(cal.ranges_path, tmp)
    written = onnx.load(str(out))
    # input fields None where the graph input stays float, or where nothing is quantised (foreign ops): said below
    summary = scales_summary(written, str(out))
    if summary["input_scale"] is None and log_float_input:
        log.warning(input_stays_float(written, str(out)))
    return {
        "out": str(out),
        "bytes": out.stat().st_size,
        "batches": cal.batches,
        "span": cal.span,
        "format": options.format,
        "ops": op_counts(written),
        **summary,
        "cache_hit": cal.hit,
        "cache_key": cal.key,
        "calibration_seconds": cal.seconds,
        "calibration_wait_seconds": cal.waited,
        "quantization_seconds": quant_seconds,
    }


def quantize_lab(fp32: FloatModel, out: str | Path, seed: int, factor: float, batches: int, spec=None,
                 options=None, cache=None, ranges_copy=None, input_may_stay_float: bool = False) -> dict:
    """Calibrate on the lab rule (docs/lab.md), quantise, and describe the written model."""
    data = lab_batches(fp32.lab_input(), seed, factor, batches)
    return quantize_with(fp32, out, data, spec, options, cache, ranges_copy, input_may_stay_float=input_may_stay_float,
                         log_float_input=input_may_stay_float)

def quantize_lab_file(src: str | Path, out: str | Path, seed: int, factor: float, batches: int,
                      options: QuantOptions | None = None, cache: CalibrationCache | None = None) -> dict:
    """calibtool's `quantize`: a float model file as the user gives it, prepared as the Hydra runner prepares one
    (calibrun.model.prepared: float16 widened to float32, an unsorted graph sorted, old opsets converted, ...; kept
    in the cache's `models` folder), then calibrated on the lab rule and quantised. The file is checked (readable,
    float, one input the lab rule can feed) before any work, so that a problem is named as the user gave it, not as
    the prepared copy; what onnxruntime cannot run is found by the preparation, as the runner finds it (an opset
    onnxruntime no longer runs is converted there, not refused), and named by the source file."""
    from calibrun.model import open_float_model
    from calibrun.model.prepared import prepared_source

    fp32 = open_float_model(src)
    out = check_writable(out)
    check_not_source(fp32.path, out, external_files(fp32.path))
    fp32.lab_input()
    with prepared_source(fp32, cache) as prepared:
        return quantize_lab(prepared, out, seed, factor, batches, options=options, cache=cache,
                            input_may_stay_float=True)

# --- config: this concept's options (the `format` node; calibrun.config assembles the schema) ---

@dataclass
class FormatConf:
    name: str = "qdq"
