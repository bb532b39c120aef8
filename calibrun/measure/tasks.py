"""Task metrics: does the int8 model still give the answers the fp32 model gives?

`task=auto|none|classification|dense|decision|image|custom` (conf/task/); which output each reads, and
`task=auto`'s pick, is calibrun.measure.task_pick. Each task is a streaming accumulator: `update` is
called once per evaluation batch with the fp32 and int8 outputs (dicts of numpy arrays by output name) and the
batch's labels (or None); `metrics()` gives the floats, keyed `task.<name>`.

- classification: top-1 agreement (the int8 argmax equals the fp32 argmax), top-k agreement (the fp32 top-1
  class is among the int8 top k; only when there are more than k classes) and, with labels and one prediction
  per row, both accuracies. The class axis is `task.axis`, else found from the graph: the axis of the Softmax
  (LogSoftmax) that produces the output, followed through Reshape/Flatten/Squeeze/Unsqueeze/Identity by matching
  its size in the output's shape; where the shapes do not say it (a Softmax reshaped to unknown shapes), the one axis
  over which the first row's probabilities sum to 1, read when the first batch runs. Every position other than the
  class axis is one prediction (a sequence model's time steps, a segmentation model's pixels); then
  `task.class_dice`, the Dice of the positions each model gives a class other than the one fp32 gives most positions
  (the background, a CTC model's blank), pooled over those classes, which the verdict reads, and `task.mean_iou` (per
  class, averaged over the classes either predicts).
- dense: the fp32 and int8 maps thresholded at `task.threshold` (value > threshold): IoU and Dice of the two
  positive sets (`task.iou`, `task.dice`: the verdict reads the Dice, `dice` below) and the fraction of elements on
  which they agree, over every evaluation element (1.0 when neither map has a positive element;
  `task.fp32_positive` says how much there was).
- decision: one probability per row (a Sigmoid's [N] or [N, 1]), the same counts as dense over rows:
  `task.decision_iou` (the rows both models say yes to over the rows either does), `task.decision_dice` and
  `task.decision_agreement`.
  auto takes it only when it is the model's one output (or `task.output`): beside other outputs, a recurrent state
  above all, the decision on a row fed fp32's state says nothing of the error the state carries to the next rows,
  which the worst output's SQNR does see.
- custom: `task.fn=module:function`, called once per evaluation batch as `fn(fp32_outputs, int8_outputs, labels)`
  and returning a dict of floats; each metric is the mean over batches weighted by the batch's rows.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from calibrun.core.errors import CalibrunError, one_line
from calibrun.measure import verdict

log = logging.getLogger("calibrun")

TASKS = ("auto", "none", "classification", "dense", "decision", "image", "custom")
# how far from 1 a Softmax's probabilities may sum over its classes (float32 rounding over thousands of classes is
# some 1e-6; a sum over any other axis misses 1 by far more)
SUMS_TO_ONE = 1e-3


@dataclass(frozen=True)
class TaskSpec:
    name: str = "auto"
    output: str | None = None  # the output judged (default: the first)
    axis: int | None = None  # classification: the class axis (None: from the Softmax, else -1); dense: channels
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

    def check_shapes(self, fp32: Mapping[str, np.ndarray], int8: Mapping[str, np.ndarray]) -> None:
        """Refuse, in one line, outputs this task compares position by position whose shape int8 changed (a
        quantised scale of a Resize makes another size): numpy's broadcast error said neither which output nor
        why. A custom task reads what it likes and is not checked."""
        for name in (getattr(self, "output", None), getattr(self, "predicted", None)):
            if name is not None and name in fp32 and np.shape(fp32[name]) != np.shape(int8[name]):
                raise CalibrunError(
                    f"task {self.name}: output {name!r} has shape {list(np.shape(int8[name]))} in the int8 model and "
                    f"{list(np.shape(fp32[name]))} in fp32: int8 computes another size (an input that sets a size "
                    "was quantised?), so its values cannot be compared position by position")


class Classification(Task):
    """Top-1/top-k agreement of the class scores in `output` (classes on `axis`) and, with labels and one
    prediction per row, both accuracies. `predicted`: an integer output holding the predicted class of each row
    (a converted classic model's `label`): the accuracies compare it with the labels directly; with `output`
    None it is all there is, and top-1 agreement compares the fp32 and int8 predicted classes."""

    name = "classification"

    def __init__(self, output: str | None, axis: int | None = -1, top_k: int = 5, reason: str = "",
                 predicted: str | None = None, normaliser: str | None = None):
        super().__init__(reason)
        self.output, self.axis, self.top_k, self.predicted = output, axis, top_k, predicted
        # axis None: the graph does not say which axis holds the classes of the Softmax/LogSoftmax (`normaliser`)
        # that writes the output; found on the first batch (_settle_axis), shared with this task's copies
        self.normaliser = normaliser
        self.settled: dict = {}
        self.predictions = self.top1 = self.topk = 0
        self.positional = False  # more than one prediction per row (a map's or a sequence's positions)
        self.inter: np.ndarray | None = None  # per class: positions both models give it
        self.union: np.ndarray | None = None  # per class: positions either model gives it
        self.ref: np.ndarray | None = None  # per class: positions fp32 gives it
        self.labelled = self.fp32_correct = self.int8_correct = 0
        self.classes: int | None = None
        self.fp32_seen: set[int] = set()  # the classes fp32 gives the rows (one prediction a row)
        self.seen: set[int] = set()  # label values seen (paired with `predicted`: at most `classes` of them)
        self.warned = False
        self.unfit: str | None = None  # why the labels do not fit the output: then nothing is measured
        self.evaluation = None  # the EvalData whose labels are judged (names the file of a bad label)
        self.static_classes: int | None = None  # the class axis' size when the graph states it (task_pick)

    def __deepcopy__(self, memo):
        """A fresh copy for another measurement: its counts copied, the evaluation rows it names shared."""
        clone = object.__new__(type(self))  # not copy.copy: it would pickle the state without the evaluation
        for key, value in vars(self).items():
            setattr(clone, key, value if key in ("evaluation", "settled") else copy.deepcopy(value, memo))
        return clone

    def __getstate__(self) -> dict:
        """Pickled for a worker process without the evaluation rows it names (their labels were judged here)."""
        return {**vars(self), "evaluation": None}

    def _flat(self, array: np.ndarray) -> np.ndarray:
        if array.ndim == 0:
            raise CalibrunError(f"classification: output {self.output!r} is a scalar, not class scores")
        axis = self.axis if self.axis >= 0 else array.ndim + self.axis
        if not 0 <= axis < array.ndim:
            raise CalibrunError(f"task.axis {self.axis} is outside output {self.output!r} of shape {array.shape}")
        if axis == 0:
            raise CalibrunError(f"classification: the class axis of output {self.output!r} (shape {array.shape}) "
                                "would be axis 0, the rows: these are not class scores (set task.output or task.axis)")
        moved = np.moveaxis(array, axis, -1)
        return moved.reshape(-1, moved.shape[-1])

    def _settle_axis(self, ref: np.ndarray) -> bool:
        """The class axis where the graph does not say it (a Softmax reshaped to unknown shapes, as onnx's version
        converter writes an opset-11 or 12 Softmax at opset 13): the one axis but the first over which every position
        of the first row (along axis 0) sums to 1, exps for a LogSoftmax. What a Softmax computes, not a guess: over
        any other axis the sums miss 1. Found once, on the first batch, and shared with the copies of this task (the
        job's result names it); False, and no task metric, where no axis or more than one does."""
        if "axis" not in self.settled:
            row = np.asarray(ref[:1], np.float64)
            values = np.exp(row) if self.normaliser == "LogSoftmax" else row
            with np.errstate(over="ignore", invalid="ignore"):
                found = [a for a in range(1, row.ndim) if row.shape[a] >= 2
                         and bool(np.all(np.abs(values.sum(axis=a) - 1) <= SUMS_TO_ONE))]
            self.settled["axis"] = found[0] if len(found) == 1 else None
            if len(found) == 1:
                log.info("classification: output %r holds its classes on axis %d (%d classes): the axis its %s's "
                         "probabilities sum to 1 over on the first batch", self.output, found[0],
                         row.shape[found[0]], self.normaliser)
            else:
                self.settled["why"] = (f"the {self.normaliser}'s probabilities of output {self.output!r} (shape "
                                       f"{list(np.shape(ref))}) sum to 1 over "
                                       f"{'no axis' if not found else f'axes {found}'} on the first batch, so "
                                       "which holds the classes cannot be told (set task=classification task.axis=K)")
                log.warning("classification: %s: task metrics not measured", self.settled["why"])
        if self.settled["axis"] is None:
            self.unfit = self.settled["why"]
            return False
        self.axis = self.settled["axis"]
        return True

    def _labels_fit(self, labels: np.ndarray) -> bool:
        """Do the labels fit the class count? A label outside the classes of a scores output is refused
        (refuse_labels); labels compared with a predicted-class output may be any values, but more distinct ones
        than classes leave the task unmeasured (said once)."""
        if self.unfit is None and labels.size and self.classes is not None:
            if self.predicted is None and (labels.min() < 0 or labels.max() >= self.classes):
                refuse_labels(labels, self.classes, self.output, self.evaluation)
            elif self.predicted is not None:
                self.seen.update(int(v) for v in np.unique(labels))
                if len(self.seen) > self.classes:
                    self.unfit = (f"{len(self.seen)} distinct labels do not fit the {self.classes} classes of "
                                  f"output {self.output!r}")
            if self.unfit is not None:
                log.warning("classification: %s: task metrics not measured", self.unfit)
        return self.unfit is None

    def _rows(self, fp32, int8, name: str) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(fp32[name]).reshape(-1), np.asarray(int8[name]).reshape(-1)

    def update(self, fp32, int8, labels) -> None:
        if self.unfit is not None:
            return
        labels = None if labels is None else np.asarray(labels).reshape(-1)
        if self.output is None:  # predicted classes only
            ref_top, got_top = self._rows(fp32, int8, self.predicted)
            if ref_top.size and ref_top.min() >= 0 and got_top.min() >= 0:  # a class map: per class IoU too
                self._count_classes(ref_top, got_top, int(max(ref_top.max(), got_top.max())) + 1,
                                    rows=len(np.asarray(fp32[self.predicted])))
        else:
            if self.axis is None and not self._settle_axis(np.asarray(fp32[self.output])):
                return
            ref, got = self._flat(np.asarray(fp32[self.output])), self._flat(np.asarray(int8[self.output]))
            classes = ref.shape[1]
            if classes < 2:
                raise CalibrunError(f"classification: output {self.output!r} has {classes} class on axis "
                                    f"{self.axis}; set task.axis to the class axis (or task=dense / task=none)")
            self.classes = classes
            if labels is not None and not self._labels_fit(labels):
                return
            ref_top, got_top = ref.argmax(axis=1), got.argmax(axis=1)
            self._count_classes(ref_top, got_top, classes, rows=len(np.asarray(fp32[self.output])))
            if classes > self.top_k:
                top = np.argpartition(-got, self.top_k - 1, axis=1)[:, : self.top_k]
                self.topk += int(np.count_nonzero((top == ref_top[:, None]).any(axis=1)))
        self.predictions += len(ref_top)
        self.top1 += int(np.count_nonzero(ref_top == got_top))
        if not self.positional:  # a map's classes are counted per class (_count_classes)
            self.fp32_seen.update(np.unique(ref_top).tolist())
        if labels is None:
            return
        ref_cls, got_cls = (ref_top, got_top) if self.predicted is None else self._rows(fp32, int8, self.predicted)
        if len(labels) != len(ref_cls):
            if not self.warned:
                log.warning("classification: %d predictions for %d labels per batch: accuracy not measured "
                            "(labels need one prediction per row)", len(ref_cls), len(labels))
                self.warned = True
            return
        self.labelled += len(labels)
        self.fp32_correct += int(np.count_nonzero(ref_cls == labels))
        self.int8_correct += int(np.count_nonzero(got_cls == labels))

    def _count_classes(self, ref_top: np.ndarray, got_top: np.ndarray, classes: int, rows: int) -> None:
        """Per-class intersection and union of the positions each model gives a class, when a row holds more
        than one prediction: there the majority class (the background) would dominate the agreement."""
        if len(ref_top) <= rows and not self.positional:
            return
        self.positional = True
        if self.inter is None:
            self.inter, self.union, self.ref = (np.zeros(classes, np.int64) for _ in range(3))
        elif len(self.inter) < classes:  # predicted classes: a later batch shows a higher class
            grow = classes - len(self.inter)
            self.inter, self.union, self.ref = (np.pad(a, (0, grow)) for a in (self.inter, self.union, self.ref))
        classes = len(self.inter)
        inter = np.bincount(ref_top[ref_top == got_top], minlength=classes)
        ref = np.bincount(ref_top, minlength=classes)
        self.inter += inter
        self.ref += ref
        self.union += ref + np.bincount(got_top, minlength=classes) - inter

    def metrics(self) -> dict[str, float]:
        if not self.predictions or self.unfit is not None:
            return {}
        out = {"task.top1_agreement": self.top1 / self.predictions}
        if not self.positional:
            out["task.predictions"] = float(self.predictions)  # the output's rows: fewer where it pools input rows
        if not self.positional and self.fp32_seen:
            out["task.fp32_classes"] = float(len(self.fp32_seen))  # 1: the rows test one class only (verdict)
        if self.positional and self.union is not None and self.union.any():
            present = self.union > 0  # the classes either model predicts somewhere
            out["task.mean_iou"] = float(np.mean(self.inter[present] / self.union[present]))
            others = np.arange(len(self.ref)) != self.ref.argmax()  # all but fp32's most frequent class
            out["task.class_dice"] = float(dice(self.inter[others].sum(), self.union[others].sum()))
            # which class that is, and its share of fp32's positions: the verdict names it (an unseen character
            # BERT's most frequent answer was a real one, ə on 74% of positions, padding's among them)
            out["task.frequent_class"] = float(self.ref.argmax())
            out["task.frequent_share"] = float(self.ref.max() / self.ref.sum())
            got = self.union + self.inter - self.ref  # per class: positions int8 gives it
            out["task.fp32_positive"] = float(self.ref[others].sum() / self.predictions)
            out["task.int8_positive"] = float(got[others].sum() / self.predictions)
        if self.classes is not None and self.classes > self.top_k:
            out[f"task.top{self.top_k}_agreement"] = self.topk / self.predictions
        if self.labelled:
            out["task.fp32_accuracy"] = self.fp32_correct / self.labelled
            out["task.int8_accuracy"] = self.int8_correct / self.labelled
        return out

    def describe(self) -> dict:
        axis = self.settled.get("axis", self.axis) if self.axis is None else self.axis
        out = {**super().describe(), "output": self.output, "axis": axis, "top_k": self.top_k}
        if self.normaliser is not None:
            out["axis_found"] = f"on the first batch: the axis the {self.normaliser}'s probabilities sum to 1 over"
        if self.predicted is not None:
            out["predicted"] = self.predicted
        if self.unfit is not None:
            out["not_measured"] = self.unfit
        return out


def dice(inter: np.ndarray, union: np.ndarray) -> np.ndarray:
    """The Dice (F1) of two sets from their intersections and unions, 2|A & B| / (|A| + |B|) (1 where both are
    empty): the share of the decisions the two models make (each model's counted) that the other model shares. A
    classifier's top-1 agreement is this over its classes, a changed row costing one of each model's decisions; the
    IoU counts a changed decision against the union and so reads about twice the change."""
    inter, union = np.asarray(inter, np.float64), np.asarray(union, np.float64)
    return np.divide(2 * inter, union + inter, out=np.ones(inter.shape), where=union > 0)


class Dense(Task):
    name = "dense"

    def __init__(self, output: str, threshold: float = 0.5, reason: str = "", axis: int = 1):
        super().__init__(reason)
        self.output, self.threshold, self.axis = output, float(threshold), axis  # axis: a 4-D map's channels
        self.total = self.agree = self.inter = self.union = self.ref_pos = self.got_pos = 0
        self.channels: tuple[np.ndarray, np.ndarray] | None = None  # a map's channels: their IoU's parts

    def update(self, fp32, int8, labels) -> None:
        ref = np.asarray(fp32[self.output]) > self.threshold
        got = np.asarray(int8[self.output]) > self.threshold
        if ref.ndim == 4 and self.axis != 1:  # channels last ([N, H, W, C]): counted as [N, C, H, W]
            ref, got = np.moveaxis(ref, self.axis, 1), np.moveaxis(got, self.axis, 1)
        self.total += ref.size
        self.agree += int(np.count_nonzero(ref == got))
        self.inter += int(np.count_nonzero(ref & got))
        self.union += int(np.count_nonzero(ref | got))
        self.ref_pos += int(np.count_nonzero(ref))
        self.got_pos += int(np.count_nonzero(got))
        if ref.ndim == 4 and ref.shape[1] > 1:  # channels of other meanings (a text core beside distances)
            inter, union = (np.count_nonzero(a, axis=(0, 2, 3)) for a in (ref & got, ref | got))
            self.channels = (inter, union) if self.channels is None else (self.channels[0] + inter,
                                                                          self.channels[1] + union)

    keys = ("task.iou", "task.dice", "task.pixel_agreement")  # the IoU's, the Dice's and the agreement's names

    def metrics(self) -> dict[str, float]:
        """The IoU and the Dice of the thresholded maps; of a map with several channels ([N, C, H, W]), each
        channel's (`task.iou.chK`, `task.dice.chK`) and the worst as `task.iou` and `task.dice`: one channel lost is
        a map lost, and a channel always above the threshold (a positive distance) would make the whole map's read 1."""
        if not self.total:
            return {}
        iou, dice_key, agreement = self.keys
        inter, union = (self.channels if self.channels is not None
                        else (np.array([self.inter]), np.array([self.union])))
        out = {}
        for key, values in ((iou, np.divide(inter, union, out=np.ones(len(inter)), where=union > 0)),
                            (dice_key, dice(inter, union))):
            out[key] = float(values.min())
            if self.channels is not None:
                out.update({f"{key}.ch{k}": float(value) for k, value in enumerate(values)})
        return {**out, agreement: self.agree / self.total,
                "task.fp32_positive": self.ref_pos / self.total,
                "task.int8_positive": self.got_pos / self.total}

    def describe(self) -> dict:
        found = {"output": self.output, "threshold": self.threshold}
        return {**super().describe(), **found, **({"channel_axis": self.axis} if self.axis != 1 else {})}


class Decision(Dense):
    """One probability per row (a Sigmoid's [N] or [N, 1]): a yes/no decision at `threshold`, counted as a dense
    map of one position per row. The IoU of the rows each model says yes to decides (a rare yes that int8 never
    says is all of it; agreement over the rows would call it 97% right when 3% of the rows are yes)."""

    name = "decision"
    keys = ("task.decision_iou", "task.decision_dice", "task.decision_agreement")

    def metrics(self) -> dict[str, float]:
        """The dense map's, and `task.decisions`: the probabilities judged (the output's rows, fewer than the
        evaluation rows where the model reads several input rows for one: a window of frames)."""
        out = super().metrics()
        return {**out, "task.decisions": float(self.total)} if out else out


class Image(Task):
    """An image the model computes from an image (super-resolution, denoising, restoration): int8's output is judged
    as an image is, by its PSNR against fp32's over the image's range, `task.psnr_db` (docs/verdict.md). The range is
    that of the image the model is fed (input `source`, set as `span` from the evaluation rows: the scale the output
    image is shown on, whatever the model overshoots), unless fp32's output spans more than twice that (no image on
    the fed image's scale: logits, another quantity), then the fp32 output's own."""

    name = "image"
    CAP = 200.0  # dB when int8's image is fp32's exactly

    def __init__(self, output: str, reason: str = "", source: str | None = None):
        super().__init__(reason)
        self.output, self.source = output, source
        self.span: float | None = None  # the input image's range over the evaluation rows (None: the output's)
        self.err_sq, self.count, self.low, self.high = 0.0, 0, math.inf, -math.inf

    def update(self, fp32, int8, labels) -> None:
        ref = np.asarray(fp32[self.output], np.float64)
        got = np.asarray(int8[self.output], np.float64)
        if not ref.size:
            return
        self.err_sq += float(np.square(ref - got).sum())
        self.count += ref.size
        self.low, self.high = min(self.low, float(ref.min())), max(self.high, float(ref.max()))

    def metrics(self) -> dict[str, float]:
        if not self.count:
            return {}
        span = self._range()
        mse = self.err_sq / self.count
        psnr = self.CAP if mse == 0 else (10 * math.log10(span * span / mse) if span > 0 else -self.CAP)
        return {"task.psnr_db": min(psnr, self.CAP), "task.image_range": span}

    def _fed_scale(self) -> bool:
        """The PSNR is over the fed image's range (else the output's own)."""
        own = self.high - self.low
        return bool(self.span) and (not self.count or own <= 2 * self.span)

    def _range(self) -> float:
        return self.span if self._fed_scale() else self.high - self.low

    def describe(self) -> dict:
        found = {"output": self.output, "input": self.source, "range_of": "input" if self._fed_scale() else "output"}
        return {**super().describe(), **found}


class Custom(Task):
    name = "custom"

    def __init__(self, fn: str, reason: str = ""):
        super().__init__(reason)
        self.spec = fn
        self.fn = load_function(fn)
        # `fn(fp32, int8, labels, inputs)`: it also reads the inputs of the batch (a masked language model's metric
        # over its masked positions, which only the input marks: an unseen character BERT)
        self.wants_inputs = takes_inputs(self.fn)
        self.sums: dict[str, float] = {}
        self.rows = 0

    def update(self, fp32, int8, labels, inputs=None) -> None:
        rows = len(next(iter(fp32.values())))
        try:
            result = self.fn(dict(fp32), dict(int8), labels, *((dict(inputs or {}),) if self.wants_inputs else ()))
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


def takes_inputs(fn) -> bool:
    """Whether a task function takes the batch's inputs: a fourth positional parameter, or one named `inputs`."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the three arguments
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params) or any(p.name == "inputs" for p in params):
        return True
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 4


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


class LabelsDoNotFit(CalibrunError):
    """The evaluation labels fit no output's classes (task=auto): a data error, refused before any work. `classes`
    and `output`: the candidate with the most classes, for the message that names the labels' file and value."""

    def __init__(self, message: str, classes: int, output: str):
        super().__init__(message)
        self.classes, self.output = classes, output


def refuse_labels(labels: np.ndarray, classes: int, output: str | None, evaluation=None) -> None:
    """Labels outside 0..classes-1 are a data error: refused in one line naming the labels' file, row and value
    (`evaluation`: the EvalData they came from), never measured as if they were right."""
    if evaluation is not None:
        evaluation.check_labels(classes, output)
    bad = labels[(labels < 0) | (labels >= classes)][0]
    raise CalibrunError(f"evaluation labels: label {int(bad)} is not a class of output {output!r}, which has "
                        f"{classes} classes (0..{classes - 1})")


def legacy(metrics: Mapping[str, float]) -> dict[str, float]:
    """The plain names older readers use (top1_agreement, fp32_accuracy, int8_accuracy)."""
    return {verdict.LEGACY[k]: v for k, v in metrics.items() if k in verdict.LEGACY}  # kept beside task.<name>


def spec_of(cfg_task) -> TaskSpec:
    """A TaskSpec from the `task` config node (or None: task=none)."""
    if cfg_task is None:
        return TaskSpec("none")
    return TaskSpec(name=cfg_task.name, output=cfg_task.output, axis=cfg_task.axis, threshold=cfg_task.threshold,
                    top_k=cfg_task.top_k, fn=cfg_task.fn)


__all__: Sequence[str] = ("TASKS", "TaskSpec", "Task", "Classification", "Dense", "Decision", "Image", "Custom",
                          "legacy", "refuse_labels", "LabelsDoNotFit")

# --- config: this concept's options (the `task` node; calibrun.config assembles the schema) ---

@dataclass
class TaskConf:
    """Task metrics (calibrun.measure.tasks): auto | none | classification | dense | custom."""

    name: str = "auto"
    output: str | None = None  # the output judged (default: the first)
    axis: int | None = None  # classification: class axis (None: from the Softmax, else -1); dense: a 4-D map's
    # channel axis (None: from the graph, docs/tasks.md)
    threshold: float = 0.5  # dense: value > threshold is positive
    top_k: int = 5
    fn: str | None = None  # custom: module:function
