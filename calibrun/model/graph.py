"""Reading a graph: a quantised graph's input scale and zero point, node counts, op histogram; the Concat blocks of a
float graph's outputs."""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from calibrun.core.errors import CalibrunError
from calibrun.model import graph_inputs, load_model, node_subgraphs
from calibrun.model.structure import structure

log = logging.getLogger("calibrun")

QUANTIZER = "onnx.quantize"  # the producer_name onnxruntime's quantisers (quantize_static, QDQ and QOperator) write
# QOperator ops whose inputs are (x, x_scale, x_zero_point, ...): where the input scale sits when no
# QuantizeLinear reads the graph input directly.
_QLINEAR_X_SCALE = {"QLinearMatMul", "QLinearConv", "QLinearAdd", "QLinearMul", "QGemm", "QLinearSigmoid",
                    "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearSoftmax",
                    "QLinearConcat", "QLinearReduceMean", "QLinearWhere"}


@dataclass(frozen=True)
class InputQuant:
    scale: float
    zero_point: int

    @property
    def observed_span(self) -> float:
        """The range width the graph pinned for the input: scale * 255."""
        return self.scale * 255


def constant_tensors(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Every constant of the graph by name: initializers and the outputs of Constant nodes."""
    values = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = attr.t
    return values


def input_quant(model: onnx.ModelProto, where: str = "model") -> InputQuant:
    """Scale and zero point pinned for the graph input.

    QDQ and QOperator: the QuantizeLinear whose first input is the graph input; otherwise the QLinear*/QGemm
    op that takes the graph input directly (its x_scale, x_zero_point inputs).
    """
    inputs = graph_inputs(model)
    if not inputs:
        raise CalibrunError(f"{where} has no graph input")
    name = inputs[0].name
    constants = constant_tensors(model)
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input and node.input[0] == name:
            return _read(constants, node.input[1], node.input[2] if len(node.input) > 2 else "", where)
    for node in model.graph.node:
        if node.op_type in _QLINEAR_X_SCALE and node.input and node.input[0] == name:
            return _read(constants, node.input[1], node.input[2], where)
    moved = _through_data_movement(model, name)
    if moved is not None:  # e.g. YOLOX's Focus: Slice x4 -> Concat, whose output carries the input's values
        return _read(constants, moved.input[1], moved.input[2] if len(moved.input) > 2 else "", where)
    raise CalibrunError(f"{where}: graph input {name!r} is not quantised (no QuantizeLinear or QLinear op reads it)")


# Ops that only move or select values: a QuantizeLinear after a chain of them quantises the input's own values.
_DATA_MOVEMENT = {"Slice", "Concat", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Split",
                  "SpaceToDepth", "DepthToSpace"}


def _through_data_movement(model: onnx.ModelProto, name: str) -> onnx.NodeProto | None:
    """The first QuantizeLinear reached from graph input `name` through data-movement ops only, when every
    consumer on the way is one (breadth first); else None."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for tensor in node.input:
            consumers.setdefault(tensor, []).append(node)
    frontier, seen = [name], {name}
    while frontier:
        tensor = frontier.pop(0)
        for node in consumers.get(tensor, []):
            if node.op_type == "QuantizeLinear" and node.input[0] == tensor:
                return node
            if node.op_type not in _DATA_MOVEMENT and (node.op_type != "Gather" or node.input[0] != tensor):
                return None  # (a Gather selects values of its data input; of its indices it makes other values)
            for out in node.output:
                if out not in seen:
                    seen.add(out)
                    frontier.append(out)
    return None


def output_blocks(model: onnx.ModelProto) -> dict[str, tuple[int, list[tuple[int, int]]]]:
    """The outputs that a Concat joins, directly or through Identity/Transpose: output name -> (the output's axis
    the Concat joined on, the index range (start, end) each Concat input fills along it). A detector's boxes and
    scores, computed by different branches on ranges of their own, are told apart this way. Outputs whose Concat
    inputs have no static size along the axis are left out, as are Concats of one input."""
    inferred = onnx.shape_inference.infer_shapes(model)
    dims = {}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        shape = info.type.tensor_type.shape
        dims[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in shape.dim]
    producer = {out: node for node in model.graph.node for out in node.output}
    blocks = {}
    for output in model.graph.output:
        node, transposes, _ = _under_moves(producer, output.name)
        perms = []
        for transpose in transposes:
            perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)
            rank = len(dims.get(transpose.input[0]) or [])
            perms.append(perm if perm is not None else list(range(rank))[::-1])
        if node is None or node.op_type != "Concat" or len(node.input) < 2:
            continue
        shapes = [dims.get(name) for name in node.input]
        if any(not shape for shape in shapes):
            continue
        axis = next(a.i for a in node.attribute if a.name == "axis")
        axis = axis + len(shapes[0]) if axis < 0 else axis
        sizes = [shape[axis] if axis < len(shape) else None for shape in shapes]
        if any(not size for size in sizes):
            continue
        for perm in reversed(perms):  # the innermost Transpose first: input axis a lands at perm.index(a)
            if axis not in perm:
                break
            axis = perm.index(axis)
        else:
            ends = np.cumsum(sizes).tolist()
            blocks[output.name] = (axis, [(int(e - s), int(e)) for s, e in zip(sizes, ends, strict=True)])
    return blocks


def _under_moves(producer: dict[str, onnx.NodeProto], tensor: str) -> tuple[onnx.NodeProto | None, list, list]:
    """The node that computes `tensor` below any Identity and Transpose nodes (None for a graph input), the
    Transposes passed on the way down, the outermost first, and the tensors passed (`tensor` first, the computing
    node's output last)."""
    transposes, passed, node = [], [tensor], producer.get(tensor)
    while node is not None and node.op_type in ("Identity", "Transpose"):
        if node.op_type == "Transpose":
            transposes.append(node)
        passed.append(node.input[0])
        node = producer.get(node.input[0])
    return node, transposes, passed


def blocks_of(path: str | Path) -> dict[str, tuple[int, list[tuple[int, int]]]]:
    """output_blocks of the model file at `path` (its weights are not read); {} when shape inference cannot run on
    it (the per-Concat-input metrics are then left out, nothing else changes)."""
    try:
        return output_blocks(structure(path))
    except Exception:  # onnx's shape inference refuses some graphs: no blocks, the whole outputs are still measured
        return {}


def _read(constants: dict[str, onnx.TensorProto], scale_name: str, zp_name: str, where: str) -> InputQuant:
    if scale_name not in constants:
        raise CalibrunError(f"{where}: input scale {scale_name!r} is not a constant")
    scale = numpy_helper.to_array(constants[scale_name])
    if scale.size != 1:
        raise CalibrunError(f"{where}: input scale {scale_name!r} is per-channel ({scale.size} values)")
    zero_point = numpy_helper.to_array(constants[zp_name]) if zp_name in constants else np.zeros(1, np.int32)
    return InputQuant(float(scale.reshape(-1)[0]), int(zero_point.reshape(-1)[0]))


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """op type -> node count, sorted by op type."""
    return dict(sorted(Counter(node.op_type for node in model.graph.node).items()))


def scales_summary(model: onnx.ModelProto, where: str = "model") -> dict:
    """The `scales` contract: input_scale, input_zero_point, observed_span, quantize/dequantize node counts.

    A statically quantised model whose graph input stays float (its first op is one onnxruntime does not quantise:
    a Cos, a Resize, a float16 model's input Cast; or nodes kept in float) has no input scale: the three input
    fields are None (`input_stays_float` says why in one line). So are they for a model onnxruntime's quantiser wrote
    and quantised nothing in (its producer `onnx.quantize`, no quantised op: a tree ensemble, foreign ops), which is
    what `calibtool.py quantize` writes for such a model, with a warning. Any other model with no QuantizeLinear and
    no QLinear op is not a quantised model (an error)."""
    ops = op_counts(model)
    quant = None
    if not ops.get("QuantizeLinear") and not any(op.startswith("QLinear") or op in _QLINEAR_X_SCALE for op in ops):
        from calibrun.model import quantised_ops

        dynamic = quantised_ops(model)
        if dynamic:  # quantize_dynamic's: activation scales computed per run, none stored to read
            listed = ", ".join(f"{op} x{n}" for op, n in dynamic.items())
            raise CalibrunError(f"{where} is quantised dynamically ({listed}): its activations' scales are computed "
                                "as it runs, and none is stored for scales to read (scales reads a statically "
                                "quantised model, as `calibtool.py quantize` writes one)")
        if model.producer_name != QUANTIZER:
            raise CalibrunError(f"{where} has no QuantizeLinear and no QLinear op: it is not a quantised model "
                                "(scales reads an int8 model, as `calibtool.py quantize` writes one)")
    else:
        with contextlib.suppress(CalibrunError):
            quant = input_quant(model, where)
    return {
        "input_scale": quant.scale if quant else None,
        "input_zero_point": quant.zero_point if quant else None,
        "observed_span": quant.observed_span if quant else None,
        "quantize_nodes": ops.get("QuantizeLinear", 0),
        "dequantize_nodes": ops.get("DequantizeLinear", 0),
    }


def scales(path: str | Path) -> dict:
    """calibtool's `scales`; a warning line when the graph input stays float (its fields are null)."""
    model = load_model(path)
    summary = scales_summary(model, str(path))
    if summary["input_scale"] is None:
        log.warning(input_stays_float(model, str(path)))
    return summary


def input_stays_float(model: onnx.ModelProto, where: str) -> str:
    """The line for a model whose graph input no QuantizeLinear or QLinear op reads: quantisation starts further in,
    or nowhere (a model onnxruntime quantised nothing in: a tree ensemble, foreign ops)."""
    first = graph_inputs(model)[0]
    name, elem = first.name, first.elem_type
    readers = ", ".join(sorted({node.op_type for node in model.graph.node if name in node.input})) or "no node"
    ops = op_counts(model)
    further = ("quantisation starts further in" if ops.get("QuantizeLinear") or any(op.startswith("QLinear")
                                                                                     for op in ops)
               else "nothing in the model is quantised")
    if elem and elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                             onnx.TensorProto.BFLOAT16):  # token ids, a sample rate: fed as they are
        kind = onnx.TensorProto.DataType.Name(elem).lower()
        return (f"{where}: graph input {name!r} is {kind} (read by {readers}): only float tensors are quantised, so "
                f"it has no scale and {further}; its input_scale and input_zero_point are null")
    return (f"{where}: graph input {name!r} stays float (read by {readers}, not by a QuantizeLinear or QLinear op: "
            f"{further}); its input_scale and input_zero_point are null")


def keep_only(graph: onnx.GraphProto, outputs: list[str]) -> None:
    """Make `outputs` the graph's only outputs (float tensors whose shape is left to onnxruntime where the graph
    did not declare them) and drop the nodes and initializers none of them needs: a run then computes the graph up
    to its last wanted tensor, not all of it (`upstream`: what a node's subgraphs read from the outer scope counts as
    read by the node). The kept nodes keep their order. The graph inputs stay (a feed may name each of them)."""
    declared = {o.name: o for o in graph.output}
    wanted = list(dict.fromkeys(outputs))
    new_outputs = [declared.get(name) or onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                   for name in wanted]
    needed = upstream(graph, *wanted)
    kept = [node for node in graph.node if any(name in needed for name in node.output)]
    initializers = [t for t in graph.initializer if t.name in needed]
    del graph.output[:]
    graph.output.extend(new_outputs)
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(initializers)


def outer_reads(node: onnx.NodeProto) -> set[str]:
    """The outer-scope tensors `node`'s subgraphs read (recursively): what their nodes read that no node of the
    subgraph writes and that is not the subgraph's own input or initializer."""
    names: set[str] = set()
    for sub in node_subgraphs(node):
        local = {i.name for i in sub.input} | {t.name for t in sub.initializer}
        local.update(name for inner in sub.node for name in inner.output)
        for inner in sub.node:
            names.update(name for name in (*inner.input, *outer_reads(inner)) if name and name not in local)
    return names


def _metric_output(model: onnx.ModelProto, metric: str, key_of: Callable[[str], str]) -> str | None:
    """The graph output a per-output metric (`out.<key>.<...>`) is of; None for any other metric."""
    if not metric.startswith("out."):
        return None
    return next((o.name for o in model.graph.output if metric.startswith(f"out.{key_of(o.name)}.")), None)


def metric_tensor(model: onnx.ModelProto, metric: str, key_of: Callable[[str], str]) -> str | None:
    """The tensor a per-output metric is computed on (`out.<key>.<metric>`, `key_of(output name)` giving <key>):
    the output itself, or for a part `out.<key>.concat<j>.<metric>` the Concat input j that fills it (through the
    Identity/Transpose nodes output_blocks also walks). None for any other metric (a task's, a model-wide one)."""
    output = _metric_output(model, metric, key_of)
    if output is None:
        return None
    part = metric[len(f"out.{key_of(output)}."):].split(".", 1)[0]
    if not (part.startswith("concat") and part[len("concat"):].isdigit()):
        return output
    node, _, _ = _under_moves({out: node for node in model.graph.node for out in node.output}, output)
    j = int(part[len("concat"):])
    if node is None or node.op_type != "Concat" or j >= len(node.input):
        return output
    return node.input[j]


def part_carriers(model: onnx.ModelProto, metric: str, key_of: Callable[[str], str]) -> set[str]:
    """The tensors that carry a part metric's values (`out.<key>.concat<j>.<metric>`) from the Concat on to the graph
    output: the Concat's output and each Identity/Transpose output after it, the output itself. Their Q/DQ pairs
    round the part too, on the one scale every Concat input shares (YOLOv8's boxes and scores: a step of 4 over
    scores in 0..1), so they are as much the metric's as what feeds the part. Empty for any other metric."""
    tensor, output = metric_tensor(model, metric, key_of), _metric_output(model, metric, key_of)
    if tensor is None or tensor == output:  # not a part: the whole output, which upstream() holds
        return set()
    return set(_under_moves({out: node for node in model.graph.node for out in node.output}, output)[2])


def upstream(graph: onnx.GraphProto, *tensors: str) -> set[str]:
    """Every tensor `tensors` are computed from (themselves and the initializers read included), through the
    graph's nodes and what their subgraphs read."""
    producer = {out: node for node in graph.node for out in node.output}
    seen, stack = set(), list(tensors)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is not None:
            stack.extend(n for n in (*node.input, *outer_reads(node)) if n and n not in seen)
    return seen


def fold_weight_dequantize(model: onnx.ModelProto, limit: int | None = None) -> int:
    """Replace each DequantizeLinear whose inputs are all initializers (a quantised weight or bias) by the float
    initializer it computes, as onnxruntime's kernel does: (int32(q) - int32(zero point)) as float32 times the
    float32 scale, per tensor or along `axis` (one rounding: the same bits). Nothing is folded when the floats would
    take more than `limit` bytes (counted from the shapes, before any is computed). Returns the nodes folded."""
    from onnx import helper

    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}

    def foldable(node: onnx.NodeProto) -> bool:
        inputs = [n for n in node.input if n]
        return (node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx") and node.output[0] not in outputs
                and len(inputs) >= 2 and all(n in initializers for n in inputs)
                and initializers[inputs[1]].data_type == onnx.TensorProto.FLOAT
                and helper.tensor_dtype_to_np_dtype(initializers[inputs[0]].data_type).kind in "iu"
                and not any(a.name == "block_size" and a.i for a in node.attribute))

    nodes = [node for node in graph.node if foldable(node)]
    if not nodes or limit is not None and sum(4 * math.prod(initializers[n.input[0]].dims) for n in nodes) > limit:
        return 0
    folded, used = [], set()
    for node in nodes:
        inputs = [n for n in node.input if n]
        q = numpy_helper.to_array(initializers[inputs[0]])
        scale = numpy_helper.to_array(initializers[inputs[1]])
        zero = numpy_helper.to_array(initializers[inputs[2]]) if len(inputs) > 2 else np.zeros_like(scale, np.int32)
        if scale.ndim == 1 and q.ndim > 0:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            shape = [1] * q.ndim
            shape[axis % q.ndim] = -1
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        with np.errstate(over="ignore"):  # a mask's fill scale: inf, as onnxruntime's float32 product gives it
            values = (q.astype(np.int32) - zero.astype(np.int32)).astype(np.float32) * scale
        folded.append(numpy_helper.from_array(values.astype(np.float32), node.output[0]))
        used.update(inputs)
    dropped = {id(node) for node in nodes}
    kept = [node for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    still = {n for node in kept for n in node.input} | outputs
    remaining = [t for t in graph.initializer if t.name not in used or t.name in still]
    del graph.initializer[:]
    graph.initializer.extend(remaining + folded)
    return len(folded)
