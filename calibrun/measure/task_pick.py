"""Which output a task reads: what the fp32 graph says (op types, element types, shapes) and task=auto's rules.

`resolve(spec, model_path, labels, classifier)` gives the accumulator of calibrun.measure.tasks that measures it.

task=auto looks at every output (docs/tasks.md has the rules and examples). The class output is the one a
Softmax/LogSoftmax writes (through shape ops and Cast), or a converted classic model's probabilities (a ZipMap, the
probabilities output of an ai.onnx.ml *Classifier op, the scores an integer output takes the ArgMax of). Integer
outputs are never scores: one holding a predicted class per row (`label`) is compared directly, and with labels the
accuracies come from it. With labels, an output whose class count cannot hold them is not the class output. Without
such an output, labels (or `model.classifier=true`) make the one float [N, C] output they fit the logits; then a
one-channel map (N, 1, H, W) or a Sigmoid map of rank >= 3 is dense when it has real spatial extent (every axis but
the rows' and the channels' unknown or longer than 1; a 4-D map's channel axis carried from the Conv behind it
through each Transpose, as a Keras export's [N, H, W, C]); else none. When two outputs qualify, or labels fit none,
it measures none. The pick and why (and why not the other outputs) are one log line, kept in result.json. Labels
that turn out not to fit (values beyond the class count) leave the task unmeasured: no task metric is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from calibrun.core.errors import CalibrunError
from calibrun.measure.tasks import (
    TASKS,
    Classification,
    Custom,
    Decision,
    Dense,
    Image,
    LabelsDoNotFit,
    Task,
    TaskSpec,
)

log = logging.getLogger("calibrun")

SHAPE_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}
AXIS_FOUND_LATER = ("its class axis is the one its probabilities sum to 1 over, found on the first batch (the graph's "
                    "shapes do not say it)")


def _read_classes(task: Classification, model: onnx.ModelProto) -> None:
    """The task's `static_classes` from the graph (None when its shape does not say: known when the model runs)."""
    shape = _shape(model, task.output) if task.output is not None else None
    axis = None if not shape or task.axis is None else task.axis if task.axis >= 0 else len(shape) + task.axis
    task.static_classes = shape[axis] if axis is not None and 0 <= axis < len(shape) and shape[axis] else None


def _shape(model: onnx.ModelProto, name: str) -> list | None:
    for info in (*model.graph.output, *model.graph.value_info, *model.graph.input):
        if info.name == name and info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            return [d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim]
    return None


def _softmax_axis(node: onnx.NodeProto, model: onnx.ModelProto) -> int:
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    default = -1 if opset >= 13 else 1
    return next((a.i for a in node.attribute if a.name == "axis"), default)


def find_scores(model: onnx.ModelProto, output: str) -> tuple[onnx.NodeProto | None, str]:
    """The Softmax/LogSoftmax behind `output` (through shape ops and Cast, and a Softmax's through a mean: `averaged`),
    or (None, why not). A Softmax written out in ops (a Div of Exp's values by their ReduceSum) counts: the Div is
    returned, its class axis found when the model runs (class_axis gives None for it, and for a mean)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    tensors = walk_back(producers, output, PASS_OPS)
    node = producers.get(tensors[-1])
    if node is not None and node.op_type in AVERAGING:  # a mean of probabilities is probabilities: look behind it
        behind = walk_back(producers, output, PASS_OPS | AVERAGING)
        if (found := producers.get(behind[-1])) is not None and \
                (found.op_type == "Softmax" or written_softmax(found, producers)):  # (a mean of logs is no LogSoftmax)
            tensors, node = behind, found
    path = [producers[t].op_type for t in reversed(tensors[:-1])]  # the ops passed, in graph order
    if node is None:
        return None, f"output {output!r} has no Softmax before it"
    if node.op_type in ("Softmax", "LogSoftmax"):
        return node, " -> ".join([node.op_type, *path])
    if written_softmax(node, producers):
        return node, " -> ".join(["Exp / ReduceSum of it (a Softmax written out)", *path])
    return None, f"output {output!r} comes from {node.op_type} ({node.name or 'unnamed'}), not a Softmax"


def averaged(model: onnx.ModelProto, output: str) -> bool:
    """Does a mean (ReduceMean) lie between `output` and the Softmax find_scores found behind it? Then the class axis
    is found when the model runs (class_axis: None), where the probabilities sum to 1: a mean over another axis (the
    views of one item averaged: mne-icalabel's ICLabel) keeps that, a mean over the classes would not."""
    producers = {o: n for n in model.graph.node for o in n.output}
    return any(producers[t].op_type in AVERAGING for t in walk_back(producers, output, PASS_OPS | AVERAGING)[:-1])


def walk_back(producers: Mapping[str, onnx.NodeProto], name: str, through: Collection[str]) -> list[str]:
    """The tensors from `name` back through the ops in `through` (each followed on its first input), `name` first:
    the last is the first tensor another op writes (its producer, `producers.get(last)`), or a graph input or
    initializer (no producer). The one walk of every rule here that looks behind value-keeping ops."""
    tensors = [name]
    while name in producers and producers[name].op_type in through and producers[name].input:
        name = producers[name].input[0]
        tensors.append(name)
    return tensors


def written_softmax(node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto]) -> bool:
    """Is `node` a Softmax written out in ops: Div(e, ReduceSum(e)), e an Exp's output (each operand reached through
    value-keeping ops: tf2onnx moves the class axis with a Transpose on one side and a Reshape on the other)? Each
    position is then an Exp's value over the sum of the Exps it is normalised with: probabilities that sum to 1 over
    the reduced axis, whatever shift (a ReduceMax subtracted) came before the Exp."""
    if node.op_type != "Div" or len(node.input) != 2:
        return False

    def behind(name: str) -> onnx.NodeProto | None:
        return producers.get(walk_back(producers, name, PASS_OPS)[-1])

    exp, total = behind(node.input[0]), behind(node.input[1])
    return (exp is not None and exp.op_type == "Exp" and total is not None and total.op_type == "ReduceSum"
            and bool(total.input) and behind(total.input[0]) is exp)


NORM_OPS = ("Expand", "Clip", "Max", "Add", "Unsqueeze", "Reshape", "Cast", "Identity")  # between a norm and its Div


def l2_normalised(name: str, producers: Mapping[str, onnx.NodeProto]) -> bool:
    """Is `name` a vector divided by its own L2 norm (an embedding: torch's F.normalize, `x / x.norm()`, ONNX's
    LpNormalization with p=2)? The divisor, reached through what F.normalize puts between (a clamp to eps, an
    expand, an epsilon added), is a ReduceL2 of the numerator, or a square root (Sqrt, or the Pow torch exports) of
    a ReduceSumSquare or of a ReduceSum of its square (Pow or Mul, of it or of its Abs), each operand reached through
    value-keeping ops. Its values are unit vectors, no class scores."""
    node = producers.get(name)
    if node is None:
        return False
    if node.op_type == "LpNormalization":
        return next((a.i for a in node.attribute if a.name == "p"), 2) == 2
    if node.op_type != "Div" or len(node.input) != 2:
        return False

    def behind(tensor: str, through=PASS_OPS) -> tuple[str, onnx.NodeProto | None]:
        last = walk_back(producers, tensor, through)[-1]
        return last, producers.get(last)

    def of_numerator(op: onnx.NodeProto | None, types: tuple[str, ...]) -> bool:
        return op is not None and op.op_type in types and bool(op.input) and \
            behind(op.input[0], (*PASS_OPS, "Abs"))[0] == numerator

    numerator = behind(node.input[0])[0]
    _, root = behind(node.input[1], (*PASS_OPS, *NORM_OPS))
    if of_numerator(root, ("ReduceL2",)):
        return True
    if root is None or root.op_type not in ("Sqrt", "Pow") or not root.input:
        return False
    _, total = behind(root.input[0])
    if of_numerator(total, ("ReduceSumSquare",)):
        return True
    return total is not None and total.op_type == "ReduceSum" and bool(total.input) and \
        of_numerator(behind(total.input[0])[1], ("Pow", "Mul"))


def normaliser(node: onnx.NodeProto) -> str:
    """What `find_scores`'s node computes: LogSoftmax, else Softmax (one written out too)."""
    return "LogSoftmax" if node.op_type == "LogSoftmax" else "Softmax"


def class_axis(model: onnx.ModelProto, output: str, softmax: onnx.NodeProto) -> int | None:
    """The output axis holding the Softmax's classes, or None when it cannot be told (a Softmax written out: found
    when the model runs, the axis its probabilities sum to 1 over)."""
    if softmax.op_type not in ("Softmax", "LogSoftmax") or averaged(model, output):
        return None
    out_shape = _shape(model, output)
    sm_shape = _shape(model, softmax.output[0])
    axis = _softmax_axis(softmax, model)
    if softmax.output[0] == output:
        return axis if axis >= 0 or out_shape is None else len(out_shape) + axis
    moved = _through_transposes(model, output, softmax, axis, out_shape)
    if moved is not None:
        return moved
    if out_shape is not None and len(out_shape) == 2:
        return 1  # [rows, classes]: the first axis is the batch, so the classes can only be on the other one
    if sm_shape is None or out_shape is None:
        return None
    axis = axis if axis >= 0 else len(sm_shape) + axis
    classes = sm_shape[axis] if 0 <= axis < len(sm_shape) else None
    if not classes:
        return None
    matches = [i for i, d in enumerate(out_shape) if d == classes]
    return matches[0] if len(matches) == 1 else None


def _through_transposes(model: onnx.ModelProto, output: str, softmax: onnx.NodeProto, axis: int,
                        out_shape: list | None) -> int | None:
    """The class axis carried exactly from the Softmax to `output` when only Transposes, Casts and Identities lie
    between them (each keeps the rank; a Transpose moves axis a to perm.index(a)); None when another op does (a
    reshape: the axis is found by its size instead)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    path, name = [], output
    while name != softmax.output[0]:
        node = producers.get(name)
        if node is None or node.op_type not in ("Transpose", "Cast", "Identity"):
            return None
        path.append(node)
        name = node.input[0]
    perms = [next((list(a.ints) for a in n.attribute if a.name == "perm"), None) for n in reversed(path)
             if n.op_type == "Transpose"]
    rank = len(out_shape) if out_shape is not None else next((len(p) for p in perms if p), None)
    if not rank:
        return None
    axis %= rank
    for perm in perms:  # a Transpose without perm reverses the axes
        axis = (perm or list(range(rank))[::-1]).index(axis)
    return axis


def _producer_op(model: onnx.ModelProto, output: str) -> str | None:
    """The op that writes `output`'s values (through shape ops and Cast; None: a graph input). Through an If too:
    the op both branches write that output with (an openWakeWord head's Sigmoid, whose If picks between two), else
    If."""
    return _op_behind(model.graph, output, {})


def _op_behind(graph: onnx.GraphProto, name: str, outer: dict) -> str | None:
    producers = {**outer, **{o: n for n in graph.node for o in n.output}}  # a branch also reads the outer values
    name = walk_back(producers, name, PASS_OPS)[-1]
    node = producers.get(name)
    if node is None or node.op_type != "If":
        return None if node is None else node.op_type
    k = list(node.output).index(name)
    ops = {_op_behind(a.g, a.g.output[k].name, producers) for a in node.attribute
           if a.name in ("then_branch", "else_branch")}
    return ops.pop() if len(ops) == 1 else "If"


FLOATS = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}
INTEGERS = {TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
            TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64}
PROBABILITY_OPS = ("Sigmoid", "HardSigmoid")  # a map of their values is one of probabilities (task.threshold 0.5)
CHANNELS_FIRST_OPS = {"Conv", "ConvTranspose", "BatchNormalization", "InstanceNormalization", "MaxPool",
                      "AveragePool", "LpPool"}  # ONNX defines them on [N, C, ...]: their channels are axis 1
LAYOUT_KEEPING_OPS = {"Sigmoid", "HardSigmoid", "Relu", "LeakyRelu", "Clip", "Tanh", "Neg", "Abs", "Exp", "Cast",
                      "Identity", "Dropout", "Add", "Sub", "Mul", "Div", "PRelu"}  # element-wise: an axis stays put
AVERAGING = {"ReduceMean"}  # the mean of probability vectors over another axis is one: still class scores
PASS_OPS = SHAPE_OPS | {"Cast", "Transpose"}  # ops that keep the values of a tensor (what a class output may pass
# through; a Transpose moves the class axis, which class_axis carries through its perm)
ML = "ai.onnx.ml"

# what keeps the order of its input's values along the axis a decision is read on: the value-keeping ops, a Softmax
# or LogSoftmax along its axis and a Sigmoid at every value (each increasing)
ORDER_KEEPING = PASS_OPS | {"Softmax", "LogSoftmax", *PROBABILITY_OPS}


def order_kept_tail(graph: onnx.GraphProto, output: str) -> set[str]:
    """`output` and the tensors it is computed from through order-keeping ops alone, back to the first other op's
    output (a classifier's logits and probabilities; a map's logits and its Sigmoid). A decision read from `output`
    (an argmax, a threshold) is made the same from any of them, and rounding one of them to its grid is increasing
    too: it changes a decision only where two values land on one level or a value sits within half a step of the
    threshold."""
    return set(walk_back({out: node for node in graph.node for out in node.output}, output, ORDER_KEEPING))



@dataclass(frozen=True)
class Labels:
    """What the task resolution knows of the evaluation labels (None: not known)."""

    low: int | None = None
    high: int | None = None
    distinct: int | None = None

    @classmethod
    def of(cls, labels) -> Labels | None:
        """From the label array (or True: labels exist, values unknown; None/False: no labels)."""
        if labels is None or labels is False:
            return None
        if labels is True:
            return cls()
        values = np.asarray(labels).reshape(-1)
        if not values.size:
            return cls()
        return cls(int(values.min()), int(values.max()), int(len(np.unique(values))))

    def __str__(self) -> str:
        return "labels" if self.low is None else f"labels {self.low}..{self.high}"


@dataclass(frozen=True)
class Output:
    """A graph output as the task rules see it."""

    name: str
    kind: str  # "float", "integer", "zipmap" (a ZipMap's sequence of {class: probability}), another tensor's
    # element type ("bool", "string"), "other"
    shape: list | None  # None: unknown (or not a tensor)
    producer: str  # the op that writes it, through value-keeping ops ("input" for a graph input)

    def __str__(self) -> str:
        shape = "" if self.shape is None else f" {_fmt(self.shape)}"
        return f"{self.name!r} ({self.kind}{shape}, from {self.producer})"


def _fmt(shape: list) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


@dataclass
class Candidate:
    """An output that holds class scores, and why."""

    output: str
    why: str
    axis: int | None  # the class axis (None: cannot be told from the graph)
    classes: int | None  # the class count when the shape says it
    predicted: str | None = None  # the integer output holding the predicted class of each row, if any
    rank: int | None = None
    normaliser: str | None = None  # the Softmax or LogSoftmax that writes the scores, if one does


class _Graph:
    """What the rules read from the fp32 graph: producers, outputs, and which outputs hold classes."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.producers = {o: (n, i) for n in model.graph.node for i, o in enumerate(n.output) if o}
        self.nodes = {o: n for o, (n, _) in self.producers.items()}
        self.outputs = [self._output(o) for o in model.graph.output]
        self.by_name = {o.name: o for o in self.outputs}
        initializers = {t.name for t in model.graph.initializer}
        self.inputs = [self._output(i) for i in model.graph.input if i.name not in initializers]

    def _output(self, info: onnx.ValueInfoProto) -> Output:
        node = self.producers.get(info.name, (None, 0))[0]
        if info.type.HasField("tensor_type"):
            elem = info.type.tensor_type.elem_type
            kind = "float" if elem in FLOATS else "integer" if elem in INTEGERS else \
                TensorProto.DataType.Name(elem).lower() if elem else "other"
            shape = _shape(self.model, info.name)
        else:
            kind = "zipmap" if node is not None and node.op_type == "ZipMap" else "other"
            shape = None
        return Output(info.name, kind, shape, _producer_op(self.model, info.name) or "input")

    def root(self, name: str) -> tuple[str, tuple | None]:
        """Walk back from `name` through value-keeping ops: the first tensor written by another op (or an
        input), with its (node, output index)."""
        name = walk_back(self.nodes, name, PASS_OPS)[-1]
        return name, self.producers.get(name)

    def _classic(self, name: str, index: int) -> onnx.NodeProto | None:
        """The ai.onnx.ml classifier op whose output `index` (0: labels, 1: probabilities) `name` is."""
        _, found = self.root(name)
        if found is None or found[1] != index:
            return None
        node = found[0]
        return node if node.domain == ML and node.op_type.endswith("Classifier") else None

    def argmaxes(self, name: str) -> list[onnx.NodeProto]:
        """The ArgMax ops an output is computed from (the nearest on each path)."""
        found, seen, todo = [], set(), [name]
        while todo:
            tensor = todo.pop()
            if tensor in seen or tensor not in self.producers:
                continue
            seen.add(tensor)
            node = self.producers[tensor][0]
            if node.op_type == "ArgMax":
                found.append(node)
            else:
                todo.extend(i for i in node.input if i)
        return found

    def predicted_classes(self, out: Output) -> str | None:
        """Why an integer output holds predicted classes: one per row (None: the graph does not say so), or, from an
        ArgMax, one per position of a map (a segmentation's class map [N, H, W])."""
        if out.kind != "integer":
            return None
        per_row = out.shape is None or len(out.shape) == 1 or out.shape[1:] == [1]
        node = self._classic(out.name, 0)
        if node is not None and per_row:
            return f"the labels of {node.op_type} ({ML})"
        if self.argmaxes(out.name):
            return "computed from an ArgMax" + ("" if per_row else ", a class per position")
        return None

    def scores(self, out: Output) -> Candidate | None:
        """The output as class scores, when the graph says it holds them (a Softmax, a classic model's
        probabilities, the input of an ArgMax that gives an integer output, a ZipMap); else None."""
        rank = None if out.shape is None else len(out.shape)
        if out.kind == "zipmap":
            node = self.producers[out.name][0]
            return Candidate(out.name, "is a ZipMap of class probabilities", 1, None, self._pair(node.input[0]), 2)
        if out.kind != "float":
            return None
        softmax, why = find_scores(self.model, out.name)
        if softmax is not None:
            axis = class_axis(self.model, out.name, softmax)
            classes = out.shape[axis] if axis is not None and out.shape and axis < len(out.shape) else None
            return Candidate(out.name, f"comes from {why}", axis, classes, self._pair(out.name), rank,
                             normaliser(softmax))
        node = self._classic(out.name, 1)
        if node is not None:
            why = f"is the probabilities output of {node.op_type} ({ML})"
        elif self._pair(out.name) is not None:
            why = f"is what integer output {self._pair(out.name)!r} takes the ArgMax of"
        else:
            return None
        axis = 1 if rank in (None, 2) else None
        classes = out.shape[1] if axis == 1 and out.shape else None
        return Candidate(out.name, why, axis, classes or None, self._pair(out.name), rank)

    def _pair(self, name: str) -> str | None:
        """The integer output that holds the predicted class of the scores `name` (the argmax of the same
        tensor, or the labels output of the same classic classifier op)."""
        root, found = self.root(name)
        for out in self.outputs:
            if self.predicted_classes(out) is None:
                continue
            label = self._classic(out.name, 0)
            if label is not None and found is not None and found[0] is label:
                return out.name
            if any(self.root(a.input[0])[0] == root for a in self.argmaxes(out.name) if a.input):
                return out.name
        return None

    def dense(self, out: Output) -> str | None:
        """Why the output is a probability map (None: it is not one). A map has real spatial extent: every axis
        but the rows' and the channels' is unknown or longer than 1 (an embedding [N, 1, 1, 96] or a vector
        [N, 1, 1, 1] is no map, whatever its rank); IoU of values thresholded at task.threshold means something only
        there."""
        shape = out.shape
        if out.kind != "float" or shape is None or out.producer not in PROBABILITY_OPS:
            return None
        axis, carried = self.map_axis(out)
        if not _spatial(shape, axis):
            return None
        how = carried or "its last axis, of size 1"
        where = "" if axis == 1 else f" (channels on axis {axis}: {how})"
        if len(shape) == 4 and shape[axis] == 1:
            return f"is a one-channel {out.producer} map {_fmt(shape)}{where}"
        return f"is a {out.producer} map of rank {len(shape)}{where}"

    def map_axis(self, out: Output) -> tuple[int, str | None]:
        """The channel axis of a 4-D map and, when the graph says it, how: axis 1 of the channels-first op that
        computes it (ONNX's Conv, pooling and normalisation ops work on [N, C, ...]) carried through each
        Transpose between them, as tf2onnx returns a Keras model to its channels-last layout ([N, H, W, C]);
        where no such op is found through element-wise ops, axis 3 of [N, H, W, 1] (one channel, last: read as
        channels first its last axis, of size 1, would leave the map no width); else axis 1."""
        shape = out.shape
        if shape is None or len(shape) != 4:
            return 1, None
        carried = self._carried_channels(out.name)
        if carried is not None:
            return carried
        if shape[3] == 1 and shape[1] != 1:
            return 3, None
        return 1, None

    def _carried_channels(self, name: str) -> tuple[int, str] | None:
        perms, path = [], []
        while name in self.producers:
            node = self.producers[name][0]
            if node.op_type in CHANNELS_FIRST_OPS:
                if not perms:
                    return 1, None  # the op's own layout
                axis = 1
                for perm in reversed(perms):  # a Transpose moves axis a to perm.index(a)
                    axis = (perm or [3, 2, 1, 0]).index(axis)
                return axis, f"{node.op_type}'s channels carried through {' -> '.join(reversed(path))}"
            if node.op_type == "Transpose":
                perms.append(next((list(a.ints) for a in node.attribute if a.name == "perm"), None))
            elif node.op_type not in LAYOUT_KEEPING_OPS:
                return None
            path.append(node.op_type)
            name = next((i for i in node.input if i in self.producers), None)
        return None

    def image(self, out: Output) -> str | None:
        """Why the output is an image computed from an image (None: it is not): a float [N, C, H, W] (or [N, H, W, C])
        with 1 or 3 channels and real spatial extent, where the model's first float input (what it is fed: not a
        recurrent state beside it, which an output of its shape returns) is an image of as many channels on the same
        axis: the model maps an image to an image (super-resolution, denoising, restoration, style transfer). A
        one-channel probability map is dense instead (asked first: a mask of a grey image); three channels of a
        Sigmoid beside the fed image's three colour channels are its colours, bounded to 0..1, not three
        probabilities: an image."""
        axis = self._image_axis(out)
        if axis is None:
            return None
        given = self._fed()
        return (f"is a {out.shape[axis]}-channel image {_fmt(out.shape)} (from {out.producer}) computed from input "
                f"{given.name!r} {_fmt(given.shape)}, an image of as many channels")

    def channels(self, out: Output) -> int | None:
        """An image output's channels (1 or 3); None: not an image."""
        axis = self._image_axis(out)
        return None if axis is None else out.shape[axis]

    def _image_axis(self, out: Output) -> int | None:
        """The channel axis (1 or 3) on which `out` is an image of the fed image's channels; None: not an image."""
        shape, given = out.shape, self._fed()
        if out.kind != "float" or shape is None or len(shape) != 4 or given is None or given.shape is None or \
                len(given.shape) != 4:
            return None
        return next((axis for axis in (1, 3) if shape[axis] in (1, 3) and given.shape[axis] == shape[axis]
                     and _spatial(shape, axis) and _spatial(given.shape, axis)
                     and not _coarser(shape, given.shape, axis)), None)

    def _fed(self) -> Output | None:
        """The model's first float input: what it is fed."""
        return next((i for i in self.inputs if i.kind == "float"), None)

    def image_input(self) -> str | None:
        """The input an image output is computed from (the first float one; `image`)."""
        given = self._fed()
        return None if given is None else given.name

    def not_dense(self, out: Output) -> str | None:
        """Why a 4-D one-channel output is not a probability map (no real spatial extent, or values that are no
        probabilities: a log-mel spectrogram), for the reason line; else None."""
        shape = out.shape
        if out.kind == "float" and shape is not None and len(shape) == 4 and shape[1] == 1:
            if not _spatial(shape, 1):
                return f"{_fmt(shape)} has no spatial extent (an embedding or a vector, not a map)"
            if out.producer not in PROBABILITY_OPS:
                return f"{_fmt(shape)} holds no probabilities (from {out.producer}, not a Sigmoid)"
        return None


def _decision(out: Output) -> str | None:
    """Why the output is one probability per row (None: it is not): a float written by a Sigmoid (through
    value-keeping ops), shaped [N] or [N, 1, ...] (every axis after the rows of size 1)."""
    shape = out.shape
    if out.kind != "float" or shape is None or not shape or out.producer not in PROBABILITY_OPS:
        return None
    if any(d != 1 for d in shape[1:]):
        return None
    return f"is one {out.producer} probability per row {_fmt(shape)}: a yes/no decision"


def _coarser(shape: list, given: list, channels: int) -> bool:
    """Is a map `shape` on a coarser grid than the image `given` (channels on axis `channels` of both): under half its
    size on a spatial axis both state? An image computed from an image keeps its resolution up to the border a valid
    convolution crops, or scales it (super-resolution); a map read from it at a fraction of its size is a reading of
    it (a grid of coordinates, features, a heat map), whose values are not pixels to look at."""
    spatial = [a for a in range(1, 4) if a != channels]
    return any(isinstance(shape[a], int) and isinstance(given[a], int) and shape[a] > 0 and given[a] > 0
               and 2 * shape[a] < given[a] for a in spatial)


def _spatial(shape: list, channels: int = 1) -> bool:
    """Every axis but the rows' (0) and the channels' is unknown or longer than 1, and there is at least one."""
    positions = [d for k, d in enumerate(shape) if k not in (0, channels)]
    return len(shape) >= 3 and all(d is None or d > 1 for d in positions)


def resolve(spec: TaskSpec, model_path, labels=None, classifier: bool | None = None) -> Task:
    """The task accumulator for `spec` on the fp32 model at `model_path`; `labels`: the evaluation labels (an
    array; True: there are labels; None/False: none); `classifier`: model.classifier (None: not set). Logs what
    `auto` picked and why, in one line (docs/tasks.md has the rules)."""
    if spec.name not in TASKS:
        raise CalibrunError(f"task.name must be one of {list(TASKS)}, got {spec.name!r}")
    if spec.name == "none":
        return Task("task=none")
    if spec.name == "custom":
        if not spec.fn:
            raise CalibrunError("task.fn is required with task=custom (task.fn=module:function)")
        return Custom(spec.fn, f"task.fn={spec.fn}")
    graph = _Graph(onnx.load(str(model_path), load_external_data=False))
    names = [o.name for o in graph.outputs]
    if spec.output is not None and spec.output not in names:
        raise CalibrunError(f"task.output {spec.output!r} is not a model output (outputs: {names})")
    facts = Labels.of(labels)
    if spec.name == "auto":
        task, refused = _auto(graph, spec, facts, classifier)
        (log.warning if refused else log.info)("task=auto picked %s: %s", task.name, task.reason)
    elif spec.name == "classification":
        task = _explicit_classification(graph, spec)
    else:
        task = None
    if task is not None:
        if isinstance(task, Classification):
            _read_classes(task, graph.model)
        return task
    if spec.name == "image":
        output = spec.output or _single([o.name for o in graph.outputs if graph.image(o)]) or names[0]
        return Image(output, f"task=image on output {output!r}", graph.image_input())
    kind, found = (Dense, graph.dense) if spec.name == "dense" else (Decision, _decision)
    output = spec.output or _single([o.name for o in graph.outputs if found(o)]) or names[0]
    reason = f"task={spec.name} on output {output!r}, threshold {spec.threshold}"
    if kind is Decision:
        return Decision(output, spec.threshold, reason)
    axis = spec.axis if spec.axis is not None else graph.map_axis(graph.by_name[output])[0]
    return Dense(output, spec.threshold, reason + ("" if axis == 1 else f", channels on axis {axis}"), axis)


def _single(items: list):
    return items[0] if len(items) == 1 else None


def _names(items) -> str:
    items = list(items)
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _fits(candidate: Candidate, facts: Labels | None) -> str | None:
    """Why the labels do not fit the candidate's class count (None: they fit, or it cannot be told yet)."""
    if facts is None or facts.low is None or candidate.classes is None:
        return None
    if candidate.predicted is not None:  # labels are compared with the predicted classes: values may be any
        if facts.distinct > candidate.classes:
            return f"{facts.distinct} distinct labels do not fit its {candidate.classes} classes"
        return None
    if facts.low < 0 or facts.high >= candidate.classes:
        return f"{facts} do not fit its {candidate.classes} classes"
    return None


def _from_candidate(c: Candidate, spec: TaskSpec, facts: Labels | None, reason: str, tail: str = "") -> Task:
    found_later = c.axis is None and c.normaliser is not None  # read on the first batch (_settle_axis)
    if c.axis is None and not found_later:
        return Task(f"{reason}, but which axis of it holds the classes cannot be told (shapes unknown or "
                    f"ambiguous after a reshape): no task metrics; set task=classification task.axis=K{tail}")
    if c.rank and c.axis is not None and c.axis % c.rank == 0:  # a Softmax over the rows (a sequence's frames, a
        # model without a batch axis)
        return Task(f"{reason}, but over axis 0, the rows' axis: no class per row; no task metrics{tail}")
    detail = f"{reason}; " + (AXIS_FOUND_LATER if found_later else f"class axis {c.axis}" +
                              (f" ({c.classes} classes)" if c.classes else ""))
    if c.predicted is not None:
        detail += f"; integer output {c.predicted!r} is its predicted class (compared with the labels directly)"
    if facts is not None and c.rank is not None and c.rank > 2 and c.predicted is None:
        detail += "; one prediction per position, labels are per row: accuracy not measured"
    task = Classification(c.output, c.axis, spec.top_k, detail + tail, predicted=c.predicted,
                          normaliser=c.normaliser if found_later else None)
    task.warned = "accuracy not measured" in detail  # said in the pick's line: not again per batch
    return task


def _auto(graph: _Graph, spec: TaskSpec, facts: Labels | None, classifier: bool | None) -> tuple[Task, bool]:
    """auto's pick and whether it refused (two outputs qualify, or labels fit none of them)."""
    outputs = [graph.by_name[spec.output]] if spec.output else graph.outputs
    if classifier is not False:
        scores = [c for c in map(graph.scores, outputs) if c is not None]
        if scores:
            unfit = {c.output: why for c in scores if (why := _fits(c, facts)) is not None}
            fit = [c for c in scores if c.output not in unfit]
            dropped = "; ".join(f"not {name!r}: {why}" for name, why in unfit.items())
            if not fit:
                widest = max((c for c in scores if c.classes), key=lambda c: c.classes, default=None)
                if widest is None:
                    return Task(f"class scores found, but the evaluation labels fit none: {dropped}; no task "
                                "metrics (set task.output, or check the labels)"), True
                raise LabelsDoNotFit(f"evaluation {facts} fit no output's classes ({dropped})", widest.classes,
                                     widest.output)
            if len(fit) > 1:
                return Task(f"{len(fit)} outputs hold class scores: "
                            f"{_names(f'{c.output!r} ({c.why})' for c in fit)}; measuring none of them "
                            "(set task.output=NAME to choose)"), True
            c = fit[0]
            others = [str(o) for o in outputs if o.name not in (c.output, c.predicted)]
            tail = (f"; {dropped}" if dropped else "") + (f"; not class scores: {_names(others)}" if others else "")
            return _from_candidate(c, spec, facts, f"output {c.output!r} {c.why}", tail), False
        predicted = [o for o in outputs if graph.predicted_classes(o)]
        if len(predicted) > 1:
            return Task(f"{len(predicted)} integer outputs hold predicted classes: "
                        f"{_names(repr(o.name) for o in predicted)}; measuring none of them "
                        "(set task.output=NAME to choose)"), True
        if predicted:
            o = predicted[0]
            return Classification(None, 1, spec.top_k, f"integer output {o.name!r} is {graph.predicted_classes(o)}: "
                                  "its predicted classes are compared directly", predicted=o.name), False
        if facts is not None or classifier:
            task = _guess_scores(graph, outputs, spec, facts, classifier)
            if task is not None:
                return task
    colours = {o.name for o in outputs if graph.channels(o) == 3}  # an image before a map
    maps = [(o, why, Dense) for o in outputs if (why := graph.dense(o)) and o.name not in colours]
    if len(outputs) == 1:  # a decision is the model's answer only where it is all the model gives (module docstring)
        maps += [(o, why, Decision) for o in outputs if (why := _decision(o))]
    if len(maps) > 1:
        return Task(f"{len(maps)} outputs are probability maps or probabilities per row: "
                    f"{_names(repr(o.name) for o, _, _ in maps)}; measuring none of them (set task=dense "
                    "task.output=NAME to choose)"), True
    if maps:
        o, why, kind = maps[0]
        reason = f"output {o.name!r} {why} at task.threshold {spec.threshold:g}"
        if kind is Dense:
            return Dense(o.name, spec.threshold, reason, graph.map_axis(o)[0]), False
        return kind(o.name, spec.threshold, reason), False
    images = [(o, why) for o in outputs if (why := graph.image(o))]
    if len(images) > 1:
        return Task(f"{len(images)} outputs are images computed from an image: "
                    f"{_names(repr(o.name) for o, _ in images)}; measuring none of them (set task=image "
                    "task.output=NAME to choose)"), True
    if images:
        o, why = images[0]
        return Image(o.name, f"output {o.name!r} {why}: judged as an image, by its PSNR against fp32's",
                     graph.image_input()), False
    where = f"output {spec.output!r} is neither" if spec.output else "no output is"
    flat = [f"{o.name!r} {why}" for o in outputs if (why := graph.not_dense(o))]
    # a lone float [N, C] output may be logits or C regression values: not guessed, but the way to say it is named
    floats = [o for o in outputs if o.kind == "float"]
    lone = floats[0] if len(floats) == 1 and floats[0].shape is not None and len(floats[0].shape) >= 2 and \
        classifier is None and floats[0].producer != "Concat" else None
    # (a Concat's output joins parts, a detector's boxes beside its scores: its last axis holds no one kind of value)
    # a 4-D map's classes would be on its channel axis (axis 1 of a Conv's [N, C, H, W]), any other output's last
    axis = graph.map_axis(lone)[0] if lone is not None and len(lone.shape) == 4 else -1
    logits = lone if lone is not None and (lone.shape[axis] or 0) >= 2 else None
    hint = ""
    if logits is not None and l2_normalised(logits.name, graph.nodes):
        hint = f"; {logits.name!r} is divided by its own L2 norm: an embedding of unit vectors, not class logits"
    elif logits is not None and len(logits.shape) == 2:
        hint = (f"; if {logits.name!r} holds class logits, model.classifier=true measures top-1 agreement (or give "
                "labels)")
    elif logits is not None and axis % len(logits.shape) != len(logits.shape) - 1 and _spatial(logits.shape, axis):
        hint = (f"; if {logits.name!r} holds class logits on axis {axis} (a class per pixel: a segmenter's map), "
                f"task=classification task.axis={axis} measures each pixel's class")
    elif logits is not None and sum(d != 1 for d in logits.shape[:-1]) >= 2:  # rows and positions beside the
        # last axis: a sequence's or a map's logits (a CTC recogniser's, read by argmax); an embedding [N, 1, 1, 96]
        # has no positions
        hint = (f"; if {logits.name!r} holds class logits on its last axis (a class per position: a CTC "
                "recogniser's steps), model.classifier=true measures each position's class; features per position "
                "(an embedding per frame) are judged as now, by their SQNR")
    decisions = [o for o in outputs if _decision(o)] if len(outputs) > 1 else []
    if decisions:  # beside other outputs a Sigmoid per row is not taken as the answer, but may be the one read (a
        # hand-landmark model's presence flag, read at 0.5, beside its 63 coordinates)
        hint += (f"; {_names(f'{o.name!r} ({o.producer})' for o in decisions)} "
                 f"{'is' if len(decisions) == 1 else 'are each'} one probability per row: where your application "
                 f"reads {'it' if len(decisions) == 1 else 'one'} as a yes/no decision, "
                 f"task=decision task.output={decisions[0].name} judges it")
    return Task(f"{where} class scores, predicted classes, a probability map or a probability per row: "
                f"{_names(str(o) for o in outputs)}" + (f"; {'; '.join(flat)}" if flat else "") + hint), False


def _guess_scores(graph: _Graph, outputs: list[Output], spec: TaskSpec, facts: Labels | None,
                  classifier: bool | None) -> tuple[Task, bool] | None:
    """No Softmax and no classic model's probabilities: with labels (or model.classifier=true) the one float
    output of shape [N, C] whose C classes hold the labels is taken as logits; model.classifier=true on a
    single float output takes its last axis."""
    floats = [o for o in outputs if o.kind == "float"]
    if classifier and len(floats) == 1 and floats[0].shape is not None and len(floats[0].shape) == 1:
        return Task(f"model.classifier=true, but output {floats[0].name!r} has one axis, the rows': no class axis; no "
                    "task metrics"), False
    if classifier and len(floats) == 1 and (floats[0].shape is None or len(floats[0].shape) != 2):
        o = floats[0]
        return Classification(o.name, -1, spec.top_k, f"model.classifier=true; output {o.name!r} ({o.producer}) "
                              "is the only float output; no Softmax found, class axis -1 assumed"), False
    rows = [o for o in floats if o.shape is not None and len(o.shape) == 2 and (o.shape[1] or 2) >= 2]
    fit = [o for o in rows if _fits(Candidate(o.name, "", 1, o.shape[1]), facts) is None]
    sized = [o for o in rows if o.shape[1]]
    if not fit and sized and facts is not None and facts.low is not None:  # labels no [N, C] output can hold
        widest = max(sized, key=lambda o: o.shape[1])
        raise LabelsDoNotFit(f"evaluation {facts} fit no float [N, C] output: {_names(str(o) for o in sized)}",
                             widest.shape[1], widest.name)
    said = "model.classifier=true" if classifier else f"the evaluation data has {facts}"
    if len(fit) == 1:
        o = fit[0]
        return Classification(o.name, 1, spec.top_k, f"{said} and output {o.name!r} ({o.producer}, "
                              f"{o.shape}) is the only float [N, C] output they fit; no Softmax: its argmax is the "
                              "predicted class (logits)"), False
    if len(fit) > 1:
        return Task(f"{said}, but no output is marked as class scores (no Softmax, no classifier op) and "
                    f"{len(fit)} float [N, C] outputs could hold them: {_names(repr(o.name) for o in fit)}; "
                    "measuring none of them (set task=classification task.output=NAME)"), True
    return None


def _explicit_classification(graph: _Graph, spec: TaskSpec) -> Task:
    """task=classification: task.output, else the one output the rules find, else the first output."""
    if spec.output is None:
        found = [c for c in map(graph.scores, graph.outputs) if c is not None]
        if len(found) != 1:
            found = [Candidate(o.name, "", None, None, o.name) for o in graph.outputs if graph.predicted_classes(o)]
        name = found[0].output if len(found) == 1 else graph.outputs[0].name
    else:
        name = spec.output
    out = graph.by_name[name]
    if out.kind == "integer":
        return Classification(None, 1, spec.top_k, f"task=classification; integer output {name!r}: its predicted "
                              "classes are compared directly (integer outputs are never class scores)", predicted=name)
    c = graph.scores(out)
    if spec.axis is not None:
        why = f"output {name!r} {c.why}" if c is not None else f"output {name!r}"
        return Classification(name, spec.axis, spec.top_k, f"task=classification; {why}; class axis {spec.axis} "
                              "(task.axis)", predicted=c.predicted if c is not None else None)
    if c is None:
        _, why = find_scores(graph.model, name)
        log.warning("classification: %s; cannot find the class scores from the graph: taking the last axis of "
                    "%r as the class axis (set task.axis to choose another)", why, name)
        return Classification(name, -1, spec.top_k, f"task=classification; {why}; no Softmax found, class axis -1 "
                              "assumed")
    if c.axis is None and c.normaliser is not None:
        return Classification(name, None, spec.top_k, f"task=classification; output {name!r} {c.why}; "
                              f"{AXIS_FOUND_LATER}", predicted=c.predicted, normaliser=c.normaliser)
    if c.axis is None:
        raise CalibrunError(f"cannot tell which axis of output {name!r} holds the classes ({c.why}; shapes unknown "
                            "or ambiguous after the reshape): set task.axis")
    return Classification(name, c.axis, spec.top_k, f"task=classification; output {name!r} {c.why}; class axis "
                          f"{c.axis}", predicted=c.predicted)
