"""Task metrics: does the int8 model still give the answers the fp32 model gives?

`task=auto|none|classification|dense|custom` (conf/task/). Each task is a streaming accumulator: `update` is
called once per evaluation batch with the fp32 and int8 outputs (dicts of numpy arrays by output name) and the
batch's labels (or None); `metrics()` gives the floats, keyed `task.<name>`.

- classification: top-1 agreement (the int8 argmax equals the fp32 argmax), top-k agreement (the fp32 top-1
  class is among the int8 top k; only when there are more than k classes) and, with labels and one prediction
  per row, both accuracies. The class axis is `task.axis`, else found from the graph: the axis of the Softmax
  (LogSoftmax) that produces the output, followed through Reshape/Flatten/Squeeze/Unsqueeze/Identity by matching
  its size in the output's shape. Every position other than the class axis is one prediction (a sequence
  model's time steps, a segmentation model's pixels).
- dense: the fp32 and int8 maps thresholded at `task.threshold` (value > threshold): IoU of the two positive
  sets and the fraction of elements on which they agree, over every evaluation element (IoU 1.0 when neither
  map has a positive element; `task.fp32_positive` says how much there was).
- custom: `task.fn=module:function`, called once per evaluation batch as `fn(fp32_outputs, int8_outputs, labels)`
  and returning a dict of floats; each metric is the mean over batches weighted by the batch's rows.
- auto: classification when the output comes from a Softmax (through shape ops), when the evaluation data has
  labels or `model.classifier=true`; dense when the output is a one-channel map of rank 4 (N, 1, H, W) or comes
  from a Sigmoid with rank >= 3; else none. The choice and its reason are logged and kept in result.json.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from calibrun.errors import CalibrunError, one_line

log = logging.getLogger("calibrun")

TASKS = ("auto", "none", "classification", "dense", "custom")
SHAPE_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}
# metrics the report and older readers know by their plain names (kept beside task.<name>)
LEGACY = {"task.top1_agreement": "top1_agreement", "task.fp32_accuracy": "fp32_accuracy",
          "task.int8_accuracy": "int8_accuracy"}


@dataclass(frozen=True)
class TaskSpec:
    name: str = "auto"
    output: str | None = None  # the output judged (default: the first)
    axis: int | None = None  # classification: the class axis (None: from the Softmax, else -1)
    threshold: float = 0.5  # dense: value > threshold is positive
    top_k: int = 5
    fn: str | None = None  # custom: module:function


class Task:
    name = "none"

    def __init__(self, reason: str = ""):
        self.reason = reason

    def update(self, fp32: Mapping[str, np.ndarray], int8: Mapping[str, np.ndarray], labels) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def describe(self) -> dict:
        return {"name": self.name, "reason": self.reason}


class Classification(Task):
    name = "classification"

    def __init__(self, output: str, axis: int, top_k: int = 5, reason: str = ""):
        super().__init__(reason)
        self.output, self.axis, self.top_k = output, axis, top_k
        self.predictions = self.top1 = self.topk = 0
        self.labelled = self.fp32_correct = self.int8_correct = 0
        self.classes: int | None = None
        self.warned = False
        self.evaluation = None  # the EvalData whose labels are judged (names the file of a bad label)

    def static_classes(self, model_path) -> int | None:
        """The number of classes when the graph states the class axis' size, else None (known when run)."""
        shape = _shape(onnx.load(str(model_path), load_external_data=False), self.output)
        if not shape:
            return None
        axis = self.axis if self.axis >= 0 else len(shape) + self.axis
        return shape[axis] if 0 <= axis < len(shape) and shape[axis] else None

    def _flat(self, array: np.ndarray) -> np.ndarray:
        if array.ndim == 0:
            raise CalibrunError(f"classification: output {self.output!r} is a scalar, not class scores")
        axis = self.axis if self.axis >= 0 else array.ndim + self.axis
        if not 0 <= axis < array.ndim:
            raise CalibrunError(f"task.axis {self.axis} is outside output {self.output!r} of shape {array.shape}")
        moved = np.moveaxis(array, axis, -1)
        return moved.reshape(-1, moved.shape[-1])

    def update(self, fp32, int8, labels) -> None:
        ref, got = self._flat(np.asarray(fp32[self.output])), self._flat(np.asarray(int8[self.output]))
        classes = ref.shape[1]
        if classes < 2:
            raise CalibrunError(f"classification: output {self.output!r} has {classes} class on axis {self.axis}; "
                                "set task.axis to the class axis (or task=dense / task=none)")
        self.classes = classes
        ref_top = ref.argmax(axis=1)
        self.predictions += len(ref_top)
        self.top1 += int(np.count_nonzero(ref_top == got.argmax(axis=1)))
        if classes > self.top_k:
            top = np.argpartition(-got, self.top_k - 1, axis=1)[:, : self.top_k]
            self.topk += int(np.count_nonzero((top == ref_top[:, None]).any(axis=1)))
        if labels is not None:
            labels = np.asarray(labels).reshape(-1)
            if len(labels) != len(ref_top):
                if not self.warned:
                    log.warning("classification: %d predictions for %d labels per batch: accuracy not measured "
                                "(labels need one prediction per row)", len(ref_top), len(labels))
                    self.warned = True
                return
            if labels.size and (labels.min() < 0 or labels.max() >= classes):
                if self.evaluation is not None:
                    self.evaluation.check_labels(classes, self.output)
                bad = labels[(labels < 0) | (labels >= classes)][0]
                raise CalibrunError(f"evaluation labels: label {int(bad)} is not a class of output {self.output!r}, "
                                    f"which has {classes} classes (0..{classes - 1})")
            self.labelled += len(labels)
            self.fp32_correct += int(np.count_nonzero(ref_top == labels))
            self.int8_correct += int(np.count_nonzero(got.argmax(axis=1) == labels))

    def metrics(self) -> dict[str, float]:
        if not self.predictions:
            return {}
        out = {"task.top1_agreement": self.top1 / self.predictions}
        if self.classes is not None and self.classes > self.top_k:
            out[f"task.top{self.top_k}_agreement"] = self.topk / self.predictions
        if self.labelled:
            out["task.fp32_accuracy"] = self.fp32_correct / self.labelled
            out["task.int8_accuracy"] = self.int8_correct / self.labelled
        return out

    def describe(self) -> dict:
        return {**super().describe(), "output": self.output, "axis": self.axis, "top_k": self.top_k}


class Dense(Task):
    name = "dense"

    def __init__(self, output: str, threshold: float = 0.5, reason: str = ""):
        super().__init__(reason)
        self.output, self.threshold = output, float(threshold)
        self.total = self.agree = self.inter = self.union = self.ref_pos = self.got_pos = 0

    def update(self, fp32, int8, labels) -> None:
        ref = np.asarray(fp32[self.output]) > self.threshold
        got = np.asarray(int8[self.output]) > self.threshold
        self.total += ref.size
        self.agree += int(np.count_nonzero(ref == got))
        self.inter += int(np.count_nonzero(ref & got))
        self.union += int(np.count_nonzero(ref | got))
        self.ref_pos += int(np.count_nonzero(ref))
        self.got_pos += int(np.count_nonzero(got))

    def metrics(self) -> dict[str, float]:
        if not self.total:
            return {}
        return {"task.iou": self.inter / self.union if self.union else 1.0,
                "task.pixel_agreement": self.agree / self.total,
                "task.fp32_positive": self.ref_pos / self.total,
                "task.int8_positive": self.got_pos / self.total}

    def describe(self) -> dict:
        return {**super().describe(), "output": self.output, "threshold": self.threshold}


class Custom(Task):
    name = "custom"

    def __init__(self, fn: str, reason: str = ""):
        super().__init__(reason)
        self.spec = fn
        self.fn = load_function(fn)
        self.sums: dict[str, float] = {}
        self.rows = 0

    def update(self, fp32, int8, labels) -> None:
        rows = len(next(iter(fp32.values())))
        try:
            result = self.fn(dict(fp32), dict(int8), labels)
        except CalibrunError:
            raise
        except Exception as exc:
            raise CalibrunError(f"task.fn {self.spec} failed: {one_line(exc)}") from exc
        if not isinstance(result, Mapping):
            raise CalibrunError(f"task.fn {self.spec} must return a dict of floats, got {type(result).__name__}")
        for key, value in result.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise CalibrunError(f"task.fn {self.spec}: metric {key!r} is not a number ({value!r})") from None
            self.sums[str(key)] = self.sums.get(str(key), 0.0) + number * rows
        self.rows += rows

    def metrics(self) -> dict[str, float]:
        return {f"task.{key}": total / self.rows for key, total in self.sums.items()} if self.rows else {}

    def describe(self) -> dict:
        return {**super().describe(), "fn": self.spec}


def load_function(spec: str):
    """`module:function` -> the callable, with one clear line when it cannot be found."""
    if not spec or ":" not in spec:
        raise CalibrunError(f"task.fn must be module:function, got {spec!r}")
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CalibrunError(f"task.fn: cannot import {module_name!r}: {one_line(exc)}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise CalibrunError(f"task.fn: {module_name!r} has no function {attr!r}")
    return fn


# --------------------------------------------------------------------------------------- graph reading


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
    """The Softmax/LogSoftmax behind `output` (through shape ops), or (None, why not)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    name, path = output, []
    while name in producers:
        node = producers[name]
        if node.op_type in ("Softmax", "LogSoftmax"):
            return node, " -> ".join([node.op_type, *reversed(path)])
        if node.op_type not in SHAPE_OPS or not node.input:
            return None, f"output {output!r} comes from {node.op_type} ({node.name or 'unnamed'}), not a Softmax"
        path.append(node.op_type)
        name = node.input[0]
    return None, f"output {output!r} has no Softmax before it"


def class_axis(model: onnx.ModelProto, output: str, softmax: onnx.NodeProto) -> int | None:
    """The output axis holding the Softmax's classes, or None when it cannot be told."""
    out_shape = _shape(model, output)
    sm_shape = _shape(model, softmax.output[0])
    axis = _softmax_axis(softmax, model)
    if softmax.output[0] == output:
        return axis if axis >= 0 or out_shape is None else len(out_shape) + axis
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


def _producer_op(model: onnx.ModelProto, output: str) -> str | None:
    producers = {o: n for n in model.graph.node for o in n.output}
    name = output
    while name in producers:
        node = producers[name]
        if node.op_type not in SHAPE_OPS or not node.input:
            return node.op_type
        name = node.input[0]
    return None


def resolve(spec: TaskSpec, model_path, labels: bool = False, classifier: bool | None = None) -> Task:
    """The task accumulator for `spec` on the fp32 model at `model_path`; `labels`: the evaluation data has
    labels; `classifier`: model.classifier (None: not set). Logs what `auto` picked and why."""
    if spec.name not in TASKS:
        raise CalibrunError(f"task.name must be one of {list(TASKS)}, got {spec.name!r}")
    if spec.name == "none":
        return Task("task=none")
    if spec.name == "custom":
        if not spec.fn:
            raise CalibrunError("task.fn is required with task=custom (task.fn=module:function)")
        return Custom(spec.fn, f"task.fn={spec.fn}")
    model = onnx.load(str(model_path), load_external_data=False)
    outputs = [o.name for o in model.graph.output]
    output = spec.output or outputs[0]
    if output not in outputs:
        raise CalibrunError(f"task.output {output!r} is not a model output (outputs: {outputs})")
    softmax, why = find_scores(model, output)
    if spec.name == "auto":
        if classifier is False:
            task = _auto_dense_or_none(model, output, spec)
        elif softmax is not None or labels or classifier:
            reason = (f"output {output!r} comes from {why}" if softmax is not None
                      else "the evaluation data has labels" if labels else "model.classifier=true")
            task = _classification(model, output, softmax, spec, reason, strict=False)
        else:
            task = _auto_dense_or_none(model, output, spec)
        log.info("task=auto picked %s: %s", task.name, task.reason)
        return task
    if spec.name == "classification":
        reason = f"task=classification; output {output!r} comes from {why}" if softmax is not None else \
            f"task=classification; {why}"
        return _classification(model, output, softmax, spec, reason, strict=True)
    return Dense(output, spec.threshold, f"task=dense on output {output!r}, threshold {spec.threshold}")


def _classification(model, output: str, softmax, spec: TaskSpec, reason: str, strict: bool) -> Task:
    if spec.axis is not None:
        return Classification(output, spec.axis, spec.top_k, f"{reason}; class axis {spec.axis} (task.axis)")
    if softmax is None:
        log.warning("classification: %s; cannot find the class scores from the graph: taking the last axis of "
                    "%r as the class axis (set task.axis to choose another)", reason.split("; ")[-1], output)
        return Classification(output, -1, spec.top_k, f"{reason}; no Softmax found, class axis -1 assumed")
    axis = class_axis(model, output, softmax)
    if axis is None:
        message = (f"cannot tell which axis of output {output!r} holds the classes of Softmax "
                   f"{softmax.name or softmax.output[0]!r} (shapes unknown or ambiguous after the reshape): "
                   "set task.axis")
        if strict:
            raise CalibrunError(message)
        log.warning("task=auto: %s; no task metrics", message)
        return Task(message)
    return Classification(output, axis, spec.top_k, f"{reason}; class axis {axis}")


def _auto_dense_or_none(model, output: str, spec: TaskSpec) -> Task:
    shape = _shape(model, output)
    op = _producer_op(model, output)
    if shape is not None and len(shape) == 4 and shape[1] == 1:
        return Dense(output, spec.threshold, f"output {output!r} is a one-channel map {shape}")
    if op == "Sigmoid" and shape is not None and len(shape) >= 3:
        return Dense(output, spec.threshold, f"output {output!r} is a Sigmoid map of rank {len(shape)}")
    return Task(f"output {output!r} ({op or 'input'}, shape {shape}) is neither class scores nor a one-channel map")


def legacy(metrics: Mapping[str, float]) -> dict[str, float]:
    """The plain names older readers use (top1_agreement, fp32_accuracy, int8_accuracy)."""
    return {LEGACY[k]: v for k, v in metrics.items() if k in LEGACY}


def spec_of(cfg_task) -> TaskSpec:
    """A TaskSpec from the `task` config node (or None: task=none)."""
    if cfg_task is None:
        return TaskSpec("none")
    return TaskSpec(name=cfg_task.name, output=cfg_task.output, axis=cfg_task.axis, threshold=cfg_task.threshold,
                    top_k=cfg_task.top_k, fn=cfg_task.fn)


__all__: Sequence[str] = ("TASKS", "TaskSpec", "Task", "Classification", "Dense", "Custom", "resolve", "legacy")
