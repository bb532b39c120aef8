"""Per-tensor quantisation diagnostics of a QDQ model: which activation was clipped, which got a coarse grid.

For every activation that carries a QuantizeLinear -> DequantizeLinear pair in the QDQ model (weights and other
initializers excluded), on the evaluation feeds:

- `calib_min`, `calib_max`: its range in the calibration ranges file (onnxruntime TensorsData JSON, the
  calibration cache file), null when the file has no range for it;
- `eval_min`, `eval_max`: the range of the same tensor in the fp32 model on the evaluation data;
- `scale`, `zero_point`, `qtype`, `qmin`, `qmax` of its QuantizeLinear (the integer type from the zero point's
  type), and the float range the grid can represent, `repr_min, repr_max = scale*(qmin-zp), scale*(qmax-zp)`;
- `clipped_fraction`: the fraction of fp32 values outside `[repr_min, repr_max]`;
- `levels`, `grid_used`: the distinct integer levels the int8 model really produced on this tensor, and that
  count / (qmax - qmin + 1). The integers are read back exactly from the DequantizeLinear output
  (`rint(dq / scale) + zp`). `elements`: the number of evaluation values of the tensor; `distinct_values`:
  how many of them differ in fp32, which bounds `levels` (see `classify`);
- `sqnr_db`: 20*log10(|fp32| / |fp32 - dequantised|) between the fp32 model's activation and the int8 model's
  DequantizeLinear output: onnxruntime's `xmodel_err` (qdq_loss_debug.compute_activation_error). It includes
  the error the int8 model carries in from upstream, which is what the model's output sees. +inf when the
  two are identical (onnxruntime's function would floor the noise at float eps and return ~300 dB);
- `qdq_sqnr_db`: onnxruntime's `qdq_err`, the same between the int8 model's own tensor before and after the
  QDQ pair: the local rounding/clipping of this one pair. Beware: where quantize_static fused a Relu into
  the pair (the Relu is removed and the pair's range starts at 0), "before" is the pre-Relu value, so this
  number counts the Relu itself as noise; `sqnr_db` does not have that problem.

What is reused from onnxruntime (quantization/qdq_loss_debug.py): `modify_model_output_intermediate_tensors`
(graph augmentation), `collect_activations` (one session per model, one run per feed, graph optimisation off
so the QDQ pairs are not fused away), `create_activation_matching` (pre-/post-QDQ/float matching by
onnxruntime's tensor naming) and `compute_activation_error` / `compute_signal_to_quantization_noice_ratio`.
Written here: the QDQ pair scan that reads scale/zero point, keeping only the tensors needed (the augmented
models would otherwise return every float tensor of the graph for every feed), and the range statistics.

QOperator models have no QDQ pairs and are refused (qdq_loss_debug cannot match their activations).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, numpy_helper
from onnxruntime.quantization.calibrate import load_tensors_data
from onnxruntime.quantization.qdq_loss_debug import (
    _TENSOR_SAVE_POSTFIX,
    collect_activations,
    compute_activation_error,
    create_activation_matching,
    modify_model_output_intermediate_tensors,
)
from onnxruntime.quantization.quant_utils import QUANT_INPUT_SUFFIX

from calibrun.calibrate import private_model_copy
from calibrun.errors import CalibrunError, one_line
from calibrun.files import temp_dir
from calibrun.graph import constant_tensors
from calibrun.model import load_model

log = logging.getLogger(__name__)

# A tensor is "clipping" when more than 0.1% of its fp32 evaluation values fall outside the representable range.
# Saturation error is unbounded (it grows with the distance beyond the range) while rounding error is at most
# scale/2, so clipping is judged first and strictly. A minmax range calibrated on the real distribution misses
# only the far tail: about 2/(calibration values) of new data (0.012% for the lab's 16384; match clips 0 of 4096);
# 0.1% is the two-sided tail of a normal beyond 3.3 sigma, so more means calibration saw a narrower range.
CLIP_THRESHOLD = 0.001
# A tensor is "coarse" when it uses less than 25% of its integer grid: fewer than 64 of int8's 256 levels, under
# 6 effective bits, i.e. the calibrated range is more than 4x wider than the data and the rounding noise is
# more than 4x (12 dB) above what a matched range gives. Lab int8: match uses 66-77%, 10x too wide ~9%.
# The 25% is of the levels the evaluation data could reach at most, min(grid size, distinct fp32 values): 4096
# values cannot fill a 65536-level int16 grid, nor 100 values int8's 256 levels (and a Relu output's zeros are one
# value); without that cap every 16-bit tensor would read as coarse.
COARSE_THRESHOLD = 0.25

VERDICTS = ("clipping", "coarse", "sound")

# Integer types of QuantizeLinear outputs: (name, qmin, qmax), keyed by the zero point's ONNX element type.
_INT_TYPES = {
    TensorProto.INT8: ("int8", -128, 127),
    TensorProto.UINT8: ("uint8", 0, 255),
    TensorProto.INT16: ("int16", -32768, 32767),
    TensorProto.UINT16: ("uint16", 0, 65535),
    TensorProto.INT4: ("int4", -8, 7),
    TensorProto.UINT4: ("uint4", 0, 15),
}

# The columns of a diagnostics row, in table order (as_table adds `verdict`).
COLUMNS = ("tensor", "role", "calib_min", "calib_max", "eval_min", "eval_max", "scale", "zero_point", "qtype",
           "qmin", "qmax", "repr_min", "repr_max", "clipped_fraction", "levels", "grid_used", "sqnr_db",
           "qdq_sqnr_db", "elements", "distinct_values")


@dataclass(frozen=True)
class QDQPair:
    """One quantised activation: its QuantizeLinear's input (pre) and DequantizeLinear's output (post)."""

    tensor: str  # the activation's name as create_activation_matching and the fp32 model know it
    pre: str
    post: str
    scale: float
    zero_point: int
    qtype: str
    qmin: int
    qmax: int


def qdq_pairs(model: onnx.ModelProto) -> list[QDQPair]:
    """The activations with a QuantizeLinear -> DequantizeLinear pair, in graph order.

    Naming follows onnxruntime's QDQ quantiser, as create_activation_matching expects: the pair sits on tensor
    `t` (Q reads `t`), or on a graph output `t` (Q reads `t_QuantizeLinear_Input`, DQ writes `t`). Pairs on
    initializers (weights, biases) are not activations and are left out; per-channel activation pairs and
    pairs whose scale is not a constant are skipped with a warning.
    """
    constants = constant_tensors(model)
    dequantizers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input:
            dequantizers.setdefault(node.input[0], []).append(node)
    pairs: dict[str, QDQPair] = {}
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or not node.input or node.input[0] in constants:
            continue
        consumers = dequantizers.get(node.output[0], [])
        if not consumers:
            continue  # a Q feeding QOperator ops, not a pair
        pre, post = node.input[0], consumers[0].output[0]
        tensor = pre
        if pre.endswith(QUANT_INPUT_SUFFIX) and post == pre[: -len(QUANT_INPUT_SUFFIX)]:
            tensor = post  # a quantised graph output: the DQ writes the output's own name
        if tensor in pairs:
            continue  # a second pair on the same tensor (requantisation): the first one is reported
        quant = _quant_params(node, constants)
        if quant is None:
            continue
        pairs[tensor] = QDQPair(tensor, pre, post, *quant)
    return list(pairs.values())


def _quant_params(node: onnx.NodeProto, constants: Mapping[str, onnx.TensorProto]):
    scale_name = node.input[1] if len(node.input) > 1 else ""
    zp_name = node.input[2] if len(node.input) > 2 else ""
    if scale_name not in constants or (zp_name and zp_name not in constants):
        log.warning("diagnostics: skipping %r: its scale or zero point is not a constant", node.input[0])
        return None
    scale = numpy_helper.to_array(constants[scale_name])
    if scale.size != 1:
        log.warning("diagnostics: skipping %r: per-channel activation quantisation (%d scales)", node.input[0],
                    scale.size)
        return None
    if zp_name:
        zp_proto = constants[zp_name]
        elem_type = zp_proto.data_type
        zero_point = int(np.asarray(numpy_helper.to_array(zp_proto)).astype(np.int64).reshape(-1)[0])
    else:  # no zero point: 0, and the output type is `output_dtype` (opset 21) or uint8
        elem_type = next((a.i for a in node.attribute if a.name == "output_dtype" and a.i), TensorProto.UINT8)
        zero_point = 0
    if elem_type not in _INT_TYPES:
        name = TensorProto.DataType.Name(elem_type) if elem_type else "unknown"
        log.warning("diagnostics: skipping %r: quantised to %s, not an integer type", node.input[0], name)
        return None
    qtype, qmin, qmax = _INT_TYPES[elem_type]
    return float(scale.reshape(-1)[0]), zero_point, qtype, qmin, qmax


def _graph_roles(model: onnx.ModelProto) -> tuple[set[str], set[str]]:
    initializers = {init.name for init in model.graph.initializer}
    return ({i.name for i in model.graph.input if i.name not in initializers}, {o.name for o in model.graph.output})


def _ranges(path: str | Path) -> dict[str, tuple]:
    """tensor -> (lowest, highest) from an onnxruntime TensorsData JSON file (the calibration cache file)."""
    try:
        tensors = load_tensors_data(path)
        return {name: data.range_value for name, data in tensors.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CalibrunError(f"cannot read calibration ranges {path}: {one_line(exc)}") from exc


def _plain(value) -> float | list[float] | None:
    """A range value as JSON: a float, or a list of floats for per-channel ranges."""
    if value is None:
        return None
    array = np.asarray(value, dtype=np.float64).reshape(-1)
    return float(array[0]) if array.size == 1 else [float(v) for v in array]


def _activations(model_path: Path, folder: Path, keep: set[str], feeds: Sequence[dict],
                 threads: int = 0) -> dict[str, list]:
    """qdq_loss_debug's augmentation + collection, on a private copy, returning only the tensors in `keep`."""
    folder.mkdir()
    # onnxruntime's shape inference writes `<model>-inferred.onnx` beside the file it is given: give it a copy.
    copy = private_model_copy(model_path, folder)
    augmented = folder / "augmented.onnx"
    modify_model_output_intermediate_tensors(copy, augmented, save_as_external_data=True)
    model = onnx.load(str(augmented))
    # The augmentation saves every float tensor of the graph; drop the ones not needed, so that one run over
    # the feeds holds only the activations diagnosed (not every tensor, nor the dequantised weights per feed).
    dropped = {o.name for o in model.graph.output
               if o.name.endswith(_TENSOR_SAVE_POSTFIX) and o.name[: -len(_TENSOR_SAVE_POSTFIX)] not in keep}
    outputs = [o for o in model.graph.output if o.name not in dropped]
    nodes = [n for n in model.graph.node if not (n.op_type == "Reshape" and n.output and n.output[0] in dropped)]
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    trimmed = folder / "trimmed.onnx"
    onnx.save_model(model, str(trimmed), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="trimmed.onnx.data")
    del model
    try:
        options = onnxruntime.SessionOptions()  # collect_activations' default, plus the thread count
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = threads
        return collect_activations(str(trimmed), feeds, session_options=options)
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidArgument types on bad feeds
        raise CalibrunError(f"running {model_path} on the evaluation feeds failed: {one_line(exc)}") from exc


def _sqnr(reference: Sequence[np.ndarray], test: Sequence[np.ndarray], value: float) -> float:
    """onnxruntime's SQNR, but +inf where the two are identical (no noise at all)."""
    if all(np.array_equal(a, b) for a, b in zip(reference, test, strict=True)):
        return math.inf
    return float(value)


def tensor_diagnostics(
    fp32_path: str | Path,
    int8_qdq_path: str | Path,
    ranges_path: str | Path,
    feeds: Iterable[dict[str, np.ndarray]],
    threads: int = 0,
) -> list[dict]:
    """One row per quantised activation of the QDQ model (graph order); see the module docstring for the fields.

    `feeds`: input dicts for both models (one dict with every evaluation row, or several batches); each model
    is run once per dict. Temp files (model copies, augmented models) live in a TemporaryDirectory.
    `threads`: onnxruntime intra-op threads of those sessions (0: onnxruntime's default, every core).
    """
    feeds = list(feeds)
    if not feeds:
        raise CalibrunError("diagnostics need at least one evaluation feed")
    int8_model = load_model(int8_qdq_path)
    pairs = qdq_pairs(int8_model)
    if not pairs:
        raise CalibrunError(f"{int8_qdq_path} has no QuantizeLinear -> DequantizeLinear pair on an activation: "
                            "per-tensor diagnostics need a QDQ-format model (QOperator is not supported)")
    inputs, outputs = _graph_roles(int8_model)
    del int8_model
    load_model(fp32_path)  # a clear error for a missing or broken file
    ranges = _ranges(ranges_path)

    with temp_dir("diag") as tmp:
        fp32_acts = _activations(Path(fp32_path), Path(tmp) / "fp32", {p.tensor for p in pairs}, feeds, threads)
        qdq_acts = _activations(Path(int8_qdq_path), Path(tmp) / "int8", {n for p in pairs for n in (p.pre, p.post)},
                                feeds, threads)

    matching = create_activation_matching(qdq_acts, fp32_acts)
    for pair in pairs:  # pairs whose names do not follow onnxruntime's convention: match them by the graph
        if pair.tensor not in matching and pair.pre in qdq_acts and pair.post in qdq_acts:
            matching[pair.tensor] = {"pre_qdq": qdq_acts[pair.pre], "post_qdq": qdq_acts[pair.post]}
            if pair.tensor in fp32_acts:
                matching[pair.tensor]["float"] = fp32_acts[pair.tensor]
    # xmodel_err (fp32 vs dequantised) where the fp32 model has the tensor, qdq_err (pre vs post QDQ) for all
    errors = compute_activation_error({name: {"float": None, **match} for name, match in matching.items()})

    rows = []
    for pair in pairs:
        match = matching.get(pair.tensor)
        if match is None:
            log.warning("diagnostics: no activations collected for %r (no float type known to shape inference?)",
                        pair.tensor)
            continue
        reference = match.get("float")
        post = match["post_qdq"]
        range_value = ranges.get(pair.tensor)
        row = {
            "tensor": pair.tensor,
            "role": "input" if pair.tensor in inputs else "output" if pair.tensor in outputs else "activation",
            "calib_min": _plain(range_value[0]) if range_value is not None else None,
            "calib_max": _plain(range_value[1]) if range_value is not None else None,
            **_range_stats(pair, reference),
            **_grid(pair, post),
            "sqnr_db": _sqnr(reference, post, errors[pair.tensor]["xmodel_err"]) if reference else None,
            "qdq_sqnr_db": _sqnr(match["pre_qdq"], post, errors[pair.tensor]["qdq_err"]),
        }
        rows.append({column: row[column] for column in COLUMNS})
    return rows


def _range_stats(pair: QDQPair, reference: Sequence[np.ndarray] | None) -> dict:
    lo = pair.scale * (pair.qmin - pair.zero_point)
    hi = pair.scale * (pair.qmax - pair.zero_point)
    stats = {"scale": pair.scale, "zero_point": pair.zero_point, "qtype": pair.qtype, "qmin": pair.qmin,
             "qmax": pair.qmax, "repr_min": lo, "repr_max": hi}
    if not reference:  # no fp32 counterpart (a tensor the quantiser created): fp32 statistics are unknown
        return {"eval_min": None, "eval_max": None, **stats, "clipped_fraction": None, "distinct_values": None}
    values = np.concatenate([np.asarray(a).reshape(-1) for a in reference])
    clipped = np.count_nonzero((values < lo) | (values > hi))
    return {"eval_min": float(values.min()), "eval_max": float(values.max()), **stats,
            "clipped_fraction": float(clipped / values.size), "distinct_values": int(np.unique(values).size)}


def _grid(pair: QDQPair, post: Sequence[np.ndarray]) -> dict:
    """Distinct integer levels in the DequantizeLinear output, and / grid size. DQ computes (q - zp) * scale in
    float32, so rint(dq / scale) gives q - zp back exactly."""
    values = np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in post])
    levels = np.rint(values / pair.scale).astype(np.int64) + pair.zero_point
    levels = np.clip(levels, pair.qmin, pair.qmax) - pair.qmin
    hit = np.count_nonzero(np.bincount(levels, minlength=pair.qmax - pair.qmin + 1))
    return {"levels": int(hit), "grid_used": float(hit / (pair.qmax - pair.qmin + 1)), "elements": int(values.size)}


def _sort_key(row: Mapping) -> tuple:
    value = row.get("sqnr_db")
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return (missing, 0.0 if missing else value, str(row.get("tensor")))


def worst(diags: Sequence[Mapping], n: int = 5) -> list[Mapping]:
    """The `n` rows with the lowest `sqnr_db`, lowest first.

    -inf comes first, +inf (no noise) after every finite value, rows without an SQNR (None/NaN) last; ties are
    broken by tensor name so the order is deterministic.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise CalibrunError(f"n must be an integer >= 0, got {n!r}")
    return sorted(diags, key=_sort_key)[:n]


def classify(diag_row: Mapping) -> str:
    """"clipping" if clipped_fraction > CLIP_THRESHOLD; else "coarse" if the tensor used fewer than
    COARSE_THRESHOLD of the levels it could reach, `levels < COARSE_THRESHOLD * min(qmax - qmin + 1, distinct)`
    with `distinct` the distinct fp32 values (`elements` without an fp32 counterpart); for int8 tensors with
    >= 256 distinct values that is exactly `grid_used < COARSE_THRESHOLD`; else "sound".

    Clipping wins over coarse (its error is unbounded). A missing clipped_fraction (no fp32 counterpart) is
    judged on the grid alone; a row without levels/qmin/qmax on `grid_used < COARSE_THRESHOLD`.
    """
    clipped = diag_row.get("clipped_fraction")
    if clipped is not None and clipped > CLIP_THRESHOLD:
        return "clipping"
    levels, qmin, qmax = diag_row.get("levels"), diag_row.get("qmin"), diag_row.get("qmax")
    reachable = diag_row.get("distinct_values")
    if reachable is None:
        reachable = diag_row.get("elements")
    if None not in (levels, qmin, qmax, reachable):
        coarse = levels < COARSE_THRESHOLD * min(qmax - qmin + 1, reachable)
    else:
        grid = diag_row.get("grid_used")
        coarse = grid is not None and grid < COARSE_THRESHOLD
    return "coarse" if coarse else "sound"


def classify_model(diags: Sequence[Mapping]) -> dict:
    """The verdict for the model's input tensor, counts over all diagnosed tensors, and the overall verdict
    (the worst one present: clipping, then coarse, then sound).

    `input_tensor`/`input` are None when the graph input carries no QDQ pair.
    """
    verdicts = {row["tensor"]: classify(row) for row in diags}
    counts = {verdict: 0 for verdict in VERDICTS}
    for verdict in verdicts.values():
        counts[verdict] += 1
    first_input = next((row["tensor"] for row in diags if row.get("role") == "input"), None)
    overall = next((v for v in VERDICTS if counts[v]), None)
    return {
        "input_tensor": first_input,
        "input": verdicts.get(first_input) if first_input is not None else None,
        "counts": counts,
        "tensors": len(verdicts),
        "overall": overall,
        "clipping_tensors": [name for name, v in verdicts.items() if v == "clipping"],
        "coarse_tensors": [name for name, v in verdicts.items() if v == "coarse"],
    }


def _json_value(value):
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no inf/NaN (a +inf SQNR means no noise; see the row itself)
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    return value


def as_table(diags: Sequence[Mapping]) -> dict[str, list]:
    """Column-oriented rows plus a `verdict` column, strict JSON (non-finite floats become null), ready for
    `mlflow.log_table(data=..., artifact_file="diagnostics.json")`."""
    columns = list(COLUMNS)
    for row in diags:
        columns.extend(key for key in row if key not in columns)
    table: dict[str, list] = {column: [_json_value(row.get(column)) for row in diags] for column in columns}
    table["verdict"] = [classify(row) for row in diags]
    return table
