"""Models that declare no batch axis: every input's every axis fixed, one input a call (a streaming denoiser taking
one `[512]` frame and its recurrent states, each of its own fixed shape). Rows of such a model, stacked on a first
axis in the data files (`[rows, 512]`), have no axis of the model to be counted along.

`added_copy` writes the model with a leading axis of 1 on every input and output: each input `X [1, *s]` is read at
row 0 (a Gather) as the graph's `X`, each output `Y` broadcast to `Y [1, *s]` (an Expand to 1 and its shape when it
runs). Not Squeeze and Unsqueeze at both ends: onnxruntime's QDQ propagation crosses those when it loads
the int8 model, and with 16-bit weights beside 8-bit activations it wrote a QuantizeLinear onnxruntime then refused
(DeepFilterNet 3, an output that is an input passed through). Every stage then treats the copy as a model that pins
its batch at one row (calibrun.data.rows.pinned_rows): one row a run, a state streamed row after row. The added
nodes (named `ADDED`...) are kept in float by the quantiser (calibrun.quant.quantize), so the int8 model of the
copy computes what the int8 model of the original would, with a float copy at each end.
`declared_copy` turns such an int8 model back into the original's interface (each added node an Identity, each
declared shape without the axis): the model a user deploys where the original ran.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from calibrun.core.errors import CalibrunError
from calibrun.data.rows import is_fixed
from calibrun.model import FloatModel, InputInfo, graphs_of, open_float_model

ADDED = "calibrun_row_axis"  # the prefix of the added nodes' names, their constants' and their inner tensors'
STEP = ("added a leading axis of 1 to every input and output (the model declares no batch axis; its data stacks "
        "rows on a first axis): one row a run")  # in `preparation`
FORM = 3  # in the shared copy's name: bumped when the added nodes change (a copy of another form is not reused)
DECLARED_FILE = "int8_as_declared.onnx"  # the job's int8 model in the original's interface, beside int8.onnx


def declares_no_batch_axis(inputs: Iterable[InputInfo]) -> bool:
    """Every input has a known shape with every axis fixed (a scalar input too): no axis can count rows."""
    inputs = list(inputs)
    return bool(inputs) and all(info.has_shape and all(map(is_fixed, info.shape)) for info in inputs)


def add_row_axis(model: onnx.ModelProto) -> None:
    """The model, in place, with a leading axis of 1 on every graph input and output (module docstring). A graph
    output that is a graph input or an initializer itself (passed straight through) cannot be given its own axis:
    an error."""
    graph = model.graph
    names = _names(graph)
    through = sorted({o.name for o in graph.output} & ({i.name for i in graph.input} |
                                                       {t.name for t in graph.initializer}))
    if through:
        raise CalibrunError(f"the model passes {', '.join(map(repr, through))} straight from an input to an output: "
                            "calibrun cannot add a row axis to it (give the model a batch axis)")
    other = [v.name for v in (*graph.input, *graph.output) if not v.type.HasField("tensor_type")]
    if other:
        raise CalibrunError(f"{', '.join(map(repr, other))} is no tensor (a sequence or a map): calibrun cannot add "
                            "a row axis to it (give the model a batch axis)")
    first = _constant(graph, names, "first", np.array(0, np.int64))
    renamed: dict[str, str] = {}
    head, tail = [], []
    weights = {t.name for t in graph.initializer}
    inputs = [value for value in graph.input if value.name not in weights]  # (an old export lists its weights too)
    for k, value in enumerate(inputs):
        inner = renamed[value.name] = _free(f"{value.name}_{ADDED}", names)
        head.append(helper.make_node("Gather", [value.name, first], [inner], name=f"{ADDED}_in{k}", axis=0))
    one = _constant(graph, names, "one", np.array([1], np.int64))
    for k, value in enumerate(graph.output):
        inner = renamed[value.name] = _free(f"{value.name}_{ADDED}", names)
        shape, full = _free(f"{inner}_shape", names), _free(f"{inner}_full", names)
        # broadcast to [1, *its shape]: an Expand, which onnxruntime's QDQ propagation does not cross, to the shape
        # the output has when it runs (a declared rank can be wrong: ddddocr's OCR model declares [1, seqlen] and
        # returns [1, 1, 8210])
        tail += [helper.make_node("Shape", [inner], [shape], name=f"{ADDED}_out{k}_shape"),
                 helper.make_node("Concat", [one, shape], [full], name=f"{ADDED}_out{k}_full", axis=0),
                 helper.make_node("Expand", [inner, full], [value.name], name=f"{ADDED}_out{k}")]
    for sub in graphs_of(graph):  # every reader and writer, subgraphs' outer reads included
        for node in sub.node:
            node.input[:] = [renamed.get(i, i) for i in node.input]
            node.output[:] = [renamed.get(o, o) for o in node.output]
    for value in graph.value_info:
        value.name = renamed.get(value.name, value.name)
    for value in (*inputs, *graph.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            value.type.tensor_type.shape.dim.insert(0, onnx.TensorShapeProto.Dimension(dim_value=1))
    nodes = [*head, *graph.node, *tail]
    del graph.node[:]
    graph.node.extend(nodes)


def is_added(name: str) -> bool:
    """Whether `name` is a node `add_row_axis` added."""
    return name.startswith((f"{ADDED}_in", f"{ADDED}_out"))


def inner(graph: onnx.GraphProto, ends: set[str]) -> set[str]:
    """The tensors inside the added ends of the graph inputs or outputs `ends` (`X_calibrun_row_axis`): the values
    the model itself reads or writes. Empty for a model given no row axis."""
    if not any(is_added(node.name) for node in graph.node):
        return set()
    names = {o for node in graph.node for o in node.output} | {i for node in graph.node for i in node.input}
    return {f"{end}_{ADDED}" for end in ends} & names


def added_nodes(graph: onnx.GraphProto) -> list[str]:
    """The names of the nodes `add_row_axis` added (the quantiser keeps them in float; the diagnostics name none)."""
    return [node.name for node in graph.node if is_added(node.name)]


def declared_copy(src: str | Path, dst: str | Path) -> None:
    """The model at `src` (a copy `add_row_axis` made, or its int8 model) with its inputs and outputs as the original
    declares them, written to `dst`: each added node an Identity, each added axis gone from the declared shapes."""
    model = onnx.load(str(src))
    graph = model.graph
    ends = {node.input[0] if node.op_type == "Gather" else node.output[0]: node for node in graph.node
            if is_added(node.name) and node.op_type in ("Gather", "Expand")}
    for node in ends.values():
        del node.input[1:]
        del node.attribute[:]  # (the Gather's axis)
        node.op_type = "Identity"
    kept = [node for node in graph.node if not is_added(node.name) or node.op_type == "Identity"]
    del graph.node[:]
    graph.node.extend(kept)  # the output's shape nodes gone
    for value in (*graph.input, *graph.output):
        if value.name in ends and value.type.tensor_type.HasField("shape"):
            del value.type.tensor_type.shape.dim[0]
    used = {i for sub in graphs_of(graph) for node in sub.node for i in node.input}
    kept = [t for t in graph.initializer if not t.name.startswith(ADDED) or t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    onnx.save(model, str(dst))


def added_copy(fp32: FloatModel, folder: Path, name: str) -> FloatModel:
    """`fp32` with a leading axis of 1 on every input and output, written as `folder/name` (reused when there)."""
    from calibrun.model.one_row import write_copy

    if (folder / name).is_file():  # made by an earlier job on this prepared model: not loaded and changed again
        return open_float_model(folder / name)
    model = onnx.load(str(fp32.path))
    add_row_axis(model)
    return write_copy(model, fp32, folder / name)


def _constant(graph: onnx.GraphProto, names: set[str], what: str, value: np.ndarray) -> str:
    """The name of the initializer `ADDED_<what>` holding `value`, added the first time."""
    name = f"{ADDED}_{what}"
    if not any(t.name == name for t in graph.initializer):
        name = _free(name, names)
        graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def _names(graph: onnx.GraphProto) -> set[str]:
    return {t.name for g in graphs_of(graph) for t in g.initializer} | \
        {o for g in graphs_of(graph) for n in g.node for o in n.output} | {v.name for v in graph.input} | \
        {n.name for g in graphs_of(graph) for n in g.node}


def _free(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name
