"""QDQ graph edits for the sensitivity analysis: take pairs (calibrun.model.pairs) out without re-calibrating (the
other pairs keep their scales).

Two ways, chosen by measurement (bench/sensitivity.py):
- `switch_model`: one model where every pair is bypassable at run time. Each pair's DequantizeLinear output is
  renamed and a `Where(bypass_i, fp32 value, dequantised value)` writes the original name, with one boolean
  scalar graph input per pair. One onnxruntime session serves every trial (feed one switch true).
- `without_pair`: one model per pair with that pair removed (its consumers read the fp32 tensor); a session each.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from calibrun.model.graph import constant_tensors
from calibrun.model.pairs import Pair

SWITCH_PREFIX = "calibrun_bypass_"


def _fp32_value(model: onnx.ModelProto, fp32: onnx.ModelProto, pair: Pair) -> str:
    """The name of pair's fp32 value in `model` (adding the weight, or the fused activation, when needed)."""
    if pair.q_output is None:
        model.graph.initializer.append(_fp32_weight(fp32, pair))
    if pair.fused is None:
        return pair.pre
    value = f"{pair.pre}_calibrun_{pair.fused.op_type.lower()}"
    if any(value in n.output for n in model.graph.node):
        return value
    node = onnx.NodeProto()
    node.CopyFrom(pair.fused)
    node.name = f"{pair.fused.name or value}_calibrun"
    node.input[0] = pair.pre  # the int8 model's name of the activation's input
    del node.output[:]
    node.output.append(value)
    have = {i.name for i in model.graph.initializer} | {o for n in model.graph.node for o in n.output}
    fp32_constants = constant_tensors(fp32)
    for name in node.input[1:]:  # Clip's min/max
        if name and name not in have and name in fp32_constants:
            model.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(fp32_constants[name]), name))
    model.graph.node.append(node)
    return value


def _fp32_weight(fp32: onnx.ModelProto, pair: Pair) -> onnx.TensorProto:
    value = numpy_helper.to_array(constant_tensors(fp32)[pair.tensor])
    return numpy_helper.from_array(np.asarray(value), pair.pre)


def switch_model(int8: onnx.ModelProto, fp32: onnx.ModelProto, pairs: list[Pair]) -> onnx.ModelProto:
    """A copy of `int8` where input `calibrun_bypass_<i>` (bool scalar) true makes pair i's readers see fp32."""
    model = onnx.ModelProto()
    model.CopyFrom(int8)
    dq_outputs = {post: i for i, pair in enumerate(pairs) for post in pair.posts}
    count = len(model.graph.node)
    values = [_fp32_value(model, fp32, pair) for pair in pairs]
    extra = list(model.graph.node[count:])  # fused activations put back: sorted in below
    del model.graph.node[count:]
    new_nodes = []
    for node in model.graph.node:
        new_nodes.append(node)
        if node.op_type == "DequantizeLinear" and node.output[0] in dq_outputs:
            i = dq_outputs[node.output[0]]
            post = node.output[0]
            node.output[0] = f"{post}_calibrun_q"
            new_nodes.append(helper.make_node("Where", [f"{SWITCH_PREFIX}{i}", values[i], node.output[0]], [post],
                                              name=f"calibrun_where_{i}_{len(new_nodes)}"))
    del model.graph.node[:]
    model.graph.node.extend(new_nodes + extra)
    for i in range(len(pairs)):
        model.graph.input.append(helper.make_tensor_value_info(f"{SWITCH_PREFIX}{i}", TensorProto.BOOL, []))
    _drop_value_info(model, set(dq_outputs))
    return _sorted(model)


def switches(count: int, on: int | set[int] | None = None) -> dict[str, np.ndarray]:
    """Feeds for the switch inputs: every pair quantised except `on` (an index or a set of indices)."""
    on = set() if on is None else {on} if isinstance(on, int) else set(on)
    return {f"{SWITCH_PREFIX}{i}": np.array(i in on) for i in range(count)}


def without_pair(int8: onnx.ModelProto, fp32: onnx.ModelProto, pair: Pair) -> onnx.ModelProto:
    """A copy of `int8` with `pair` removed: its readers read the fp32 tensor (every other pair is kept)."""
    model = onnx.ModelProto()
    model.CopyFrom(int8)
    graph_outputs = {o.name for o in model.graph.output}
    posts = set(pair.posts)
    kept = [n for n in model.graph.node
            if not (n.op_type == "DequantizeLinear" and n.output[0] in posts)
            and not (n.op_type == "QuantizeLinear" and n.output[0] == pair.q_output)]
    count = len(model.graph.node)
    source = _fp32_value(model, fp32, pair)
    kept += list(model.graph.node[count:])
    out_posts = [p for p in pair.posts if p in graph_outputs]
    if out_posts:  # a graph output: the producer writes the output's own name again
        source = out_posts[0]
        for node in kept:
            for k, name in enumerate(node.output):
                if name == pair.pre:
                    node.output[k] = source
            for k, name in enumerate(node.input):
                if name == pair.pre:
                    node.input[k] = source
    for node in kept:
        for k, name in enumerate(node.input):
            if name in posts:
                node.input[k] = source
    del model.graph.node[:]
    model.graph.node.extend(kept)
    _drop_value_info(model, posts | {pair.pre})
    return _sorted(model)


def _sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """Nodes in topological order (the nodes added above go where their inputs are ready)."""
    ready = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer} | {""}
    pending = list(model.graph.node)
    ordered = []
    while pending:
        rest = []
        for node in pending:
            if all(name in ready for name in node.input):
                ordered.append(node)
                ready.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):  # inputs from nowhere (e.g. subgraph captures): keep the given order
            ordered += rest
            break
        pending = rest
    del model.graph.node[:]
    model.graph.node.extend(ordered)
    return model


def _drop_value_info(model: onnx.ModelProto, names: set[str]) -> None:
    kept = [v for v in model.graph.value_info if v.name not in names]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
