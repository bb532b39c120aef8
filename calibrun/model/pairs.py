"""The QuantizeLinear/DequantizeLinear pairs of a QDQ model: one finder for every reader (the per-tensor
diagnostics in calibrun.measure, the sensitivity ranking and the repair in calibrun.analysis).

Naming follows onnxruntime's QDQ quantiser, as its `create_activation_matching` expects: a pair sits on tensor
`t` (Q reads `t`), or on a graph output `t` (the producer writes `t_QuantizeLinear_Input`, the DequantizeLinear
writes `t`). A weight is either a constant with its own Q node (`AddQDQPairToWeight`) or stored quantised
(`<w>_quantized -> DequantizeLinear`); both are found, as `kind="weight"`. Where quantize_static removed a Relu or
Clip after a quantised op (`QDQRemovableActivation`: the producer then writes the activation's output name, and the
pair's range starts at 0 and does the clipping), the pair carries that fp32 node as `fused`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnxruntime.quantization.quant_utils import QUANT_INPUT_SUFFIX, TENSOR_NAME_QUANT_SUFFIX

from calibrun.model.graph import constant_tensors

_QDQ = {"QuantizeLinear", "DequantizeLinear"}
_FUSABLE = {"Relu", "Clip"}
INT_TYPES = {
    TensorProto.INT8: ("int8", -128, 127),
    TensorProto.UINT8: ("uint8", 0, 255),
    TensorProto.INT16: ("int16", -32768, 32767),
    TensorProto.UINT16: ("uint16", 0, 65535),
    TensorProto.INT4: ("int4", -8, 7),
    TensorProto.UINT4: ("uint4", 0, 15),
}


@dataclass(frozen=True)
class Grid:
    """An activation pair's integer grid: one scale and zero point, its levels qmin..qmax."""

    scale: float
    zero_point: int
    qtype: str
    qmin: int
    qmax: int


@dataclass
class Pair:
    """One quantised tensor: the fp32 value `pre` it starts from and the dequantised values `posts` nodes read."""

    tensor: str  # the tensor's name in the fp32 model
    kind: str  # "activation" | "weight"
    pre: str  # int8 model: the fp32 tensor (activation: QuantizeLinear's input; weight: added fp32 initializer)
    posts: list[str]  # int8 model: the DequantizeLinear outputs
    q_output: str | None  # the QuantizeLinear's output (None for a weight stored quantised)
    dq_nodes: list[str] = field(default_factory=list)
    fused: onnx.NodeProto | None = None  # a Relu/Clip the quantiser folded into this pair (fp32 needs it back)
    node: str = ""  # the node that produces the tensor (activations) or reads it (weights, graph inputs)
    nodes: list[str] = field(default_factory=list)  # nodes to keep in fp32 so that the tensor is not quantised
    grid: Grid | None = None  # an activation's grid; None with `no_grid` saying why (weights: None)
    no_grid: str = ""

    @property
    def post(self) -> str:
        """The first DequantizeLinear output (every one holds the same values)."""
        return self.posts[0]


def _node_key(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"#{index}"


def find_pairs(int8: onnx.ModelProto, fp32: onnx.ModelProto) -> list[Pair]:
    """Every QDQ pair of the int8 QDQ model, in graph order, with the fp32 tensor it quantises. A tensor that
    carries two pairs (a requantisation) is one Pair with the DequantizeLinear outputs of both."""
    constants = constant_tensors(int8)
    fp32_constants = constant_tensors(fp32)
    producers = {out: n for n in int8.graph.node for out in n.output}
    graph_outputs = {o.name for o in int8.graph.output}
    pairs: dict[str, Pair] = {}
    for index, node in enumerate(int8.graph.node):
        if node.op_type != "DequantizeLinear" or not node.input:
            continue
        src, post = node.input[0], node.output[0]
        q = producers.get(src)
        if q is not None and q.op_type == "QuantizeLinear":
            pre = q.input[0]
            if pre in constants:  # a weight with its own Q node (AddQDQPairToWeight)
                key, kind = pre, "weight"
            else:
                key, kind = pre, "activation"
                if pre.endswith(QUANT_INPUT_SUFFIX) and pre[: -len(QUANT_INPUT_SUFFIX)] in graph_outputs | {post}:
                    key = pre[: -len(QUANT_INPUT_SUFFIX)]  # a graph output: its writer writes <t>_QuantizeLinear_Input
            pair = pairs.get(key)
            if pair is None:
                pair = pairs[key] = Pair(key, kind, pre, [], src)
                if kind == "activation":
                    pair.grid, pair.no_grid = _grid(q, constants)
        elif src in constants:  # a weight or bias stored quantised: <w>_quantized -> DequantizeLinear
            original = src[: -len(TENSOR_NAME_QUANT_SUFFIX)] if src.endswith(TENSOR_NAME_QUANT_SUFFIX) else src
            if original not in fp32_constants:
                continue  # no fp32 value to put back
            pair = pairs.setdefault(original, Pair(original, "weight", f"{original}_calibrun_fp32", [], None))
        else:
            continue
        pair.posts.append(post)
        pair.dq_nodes.append(_node_key(node, index))
    result = list(pairs.values())
    _attach_fused(result, producers, fp32)
    _attach_nodes(result, int8)
    return result


def _grid(q: onnx.NodeProto, constants) -> tuple[Grid | None, str]:
    scale_name = q.input[1] if len(q.input) > 1 else ""
    zp_name = q.input[2] if len(q.input) > 2 else ""
    if scale_name not in constants or (zp_name and zp_name not in constants):
        return None, "its scale or zero point is not a constant"
    scale = numpy_helper.to_array(constants[scale_name])
    if scale.size != 1:
        return None, f"per-channel activation quantisation ({scale.size} scales)"
    if zp_name:
        zp_proto = constants[zp_name]
        elem_type = zp_proto.data_type
        zero_point = int(np.asarray(numpy_helper.to_array(zp_proto)).astype(np.int64).reshape(-1)[0])
    else:  # no zero point: 0, and the output type is `output_dtype` (opset 21) or uint8
        elem_type = next((a.i for a in q.attribute if a.name == "output_dtype" and a.i), TensorProto.UINT8)
        zero_point = 0
    if elem_type not in INT_TYPES:
        name = TensorProto.DataType.Name(elem_type) if elem_type else "unknown"
        return None, f"quantised to {name}, not an integer type"
    qtype, qmin, qmax = INT_TYPES[elem_type]
    return Grid(float(scale.reshape(-1)[0]), zero_point, qtype, qmin, qmax), ""


def _attach_fused(pairs: list[Pair], int8_producers, fp32: onnx.ModelProto) -> None:
    """A Relu/Clip of the fp32 model on an activation pair's value that the int8 model no longer computes: the
    pair's fp32 value is that activation applied to the pair's input (`pre`), and its name is the activation's
    output (onnxruntime's quantiser writes it; a pair on the activation's input name is read the same way)."""
    for pair in pairs:
        if pair.kind != "activation":
            continue
        for node in fp32.graph.node:
            if node.op_type not in _FUSABLE or not node.input or pair.pre not in (node.input[0], node.output[0]):
                continue
            kept = int8_producers.get(node.output[0])
            if kept is not None and kept.op_type == node.op_type:
                continue  # still in the int8 model
            pair.fused = node
            pair.tensor = node.output[0]
            break


def fused_bounds(node: onnx.NodeProto, constants) -> tuple[float, float]:
    """(low, high) of a Relu or Clip (attributes before opset 11, constant inputs after)."""
    if node.op_type == "Relu":
        return (0.0, math.inf)
    low, high = -math.inf, math.inf
    for attr in node.attribute:  # opset < 11
        if attr.name == "min":
            low = attr.f
        elif attr.name == "max":
            high = attr.f
    for index, which in ((1, "low"), (2, "high")):
        if len(node.input) > index and node.input[index] in constants:
            number = float(numpy_helper.to_array(constants[node.input[index]]).reshape(-1)[0])
            low, high = (number, high) if which == "low" else (low, number)
    return (low, high)


def _attach_nodes(pairs: list[Pair], int8: onnx.ModelProto) -> None:
    """For each pair: the node named in the ranking, and every node that quantises the tensor.

    onnxruntime's QDQ quantiser puts one pair on a tensor when ANY quantised node reads or writes it (and every
    reader then reads the dequantised value), so keeping the tensor in fp32 takes excluding all of them: the
    nodes that read a DequantizeLinear output of the pair, and the node that writes the pair's input.
    """
    readers: dict[str, list[str]] = {}
    writer: dict[str, str] = {}
    for node in int8.graph.node:
        if node.op_type in _QDQ:
            continue
        for name in node.input:
            readers.setdefault(name, []).append(node.name)
        for name in node.output:
            writer[name] = node.name
    for pair in pairs:
        reading = [n for post in pair.posts for n in readers.get(post, [])]
        written = writer.get(pair.pre) if pair.kind == "activation" else None
        pair.node = written if written is not None else (reading[0] if reading else "")
        fused = [pair.fused.name] if pair.fused is not None and pair.fused.name else []
        pair.nodes = list(dict.fromkeys(([written] if written is not None else []) + fused + reading))
