"""Errors of an int8 model against its fp32 original on the evaluation data, streamed batch by batch.

`evaluate` runs both models over the evaluation data `eval.batch_size` rows at a time and keeps running
statistics (sums, maxima, counts; and one float per row for each output and Concat part, the row shares below),
so memory holds no row's outputs beyond its batch:

- `max_abs_error`, `mean_abs_error` (float64), `max_abs_output`: over every element of every output (the lab
  contract); `rows`;
- per output `out.<name>.<metric>`: `max_abs_error`, `mean_abs_error`, `relative_error` (max abs error / the
  output's fp32 range max - min), `sqnr_db` (10 log10 of fp32 energy / error energy; SQNR_CAP when identical)
  and `cosine` (cosine similarity of the flattened outputs); for an output of rank >= 3 whose last axis has
  2..16 entries (a detector's box/score parts), the same per entry as `out.<name>.ch<k>.<metric>`; for an output a
  Concat joins (calibrun.model.graph.output_blocks), the same per Concat input as `out.<name>.concat<j>.<metric>`;
- per output and Concat part, `rows_under_20db`: the share of rows whose error, against the output's mean signal
  energy, is under the verdict's ok threshold (calibrun.measure.verdict; an output whose rows cannot be told apart
  gets none): the pooled `sqnr_db` averages the error over the rows, and an error concentrated on a few rows
  flips their decisions while the average stays at 20 dB;
- per output of one vector a row (`[N]` or `[N, k]`), `centred_sqnr_db`: its SQNR against the rows' variation, each
  value less its mean over the evaluation rows (CentredSignal), which the verdict's ok also reads; for `[N, k]`,
  each value against its own spread (`values_under_20db`, `worst_value_sqnr_db`), which the ok reads too, and
  `unit_norm` where fp32 gives every row a vector of L2 norm 1 (a direction, whose values the ok does not judge
  one by one);
- `eval_min`, `eval_max`, `eval_span` of the primary (first float) input's evaluation values;
- the task's metrics (calibrun.measure.tasks).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import posixpath
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibrun.core import interrupts
from calibrun.core.bounds import MAX_ROWS, check_positive_int
from calibrun.core.errors import CalibrunError, one_line
from calibrun.data import rows as feed_rows
from calibrun.data.inputs import input_dtype, is_float
from calibrun.lab import EVAL_ROWS, EVAL_SEED
from calibrun.lab.data import evaluation_rows
from calibrun.measure import feedback
from calibrun.measure.verdict import (
    CENTRED_KEY,
    CONSTANT_KEY,
    NONFINITE_KEY,
    ROW_SHARE_KEY,
    SQNR_CAP,
    SQNR_OK_DB,
    UNIT_KEY,
    VALUE_SHARE_KEY,
    VALUE_WORST_KEY,
)
from calibrun.model import FloatModel, open_float_model, primary
from calibrun.model.sessions import session

log = logging.getLogger("calibrun")

DEFAULT_BATCH = 16  # evaluation rows per run when eval.batch_size is not set and the model does not pin one
SEGMENTS_MAX = 16  # outputs whose last axis has at most this many entries get per-entry metrics


def not_whole_batches(rows: int, fixed: int) -> str:
    """The error for rows that do not fill whole batches of a model that pins its batch axis, with the nearest
    counts that do."""
    below, above = rows - rows % fixed, rows - rows % fixed + fixed
    nearest = f"{below} or {above}" if below else f"{above}"
    return f"rows ({rows}) must be a multiple of the model's fixed batch axis ({fixed}): {nearest}, for example"


def split_feeds(feeds: dict[str, np.ndarray], fixed: int | None, axes=None) -> list[dict[str, np.ndarray]]:
    """The feeds as one run (a symbolic batch axis) or as runs of `fixed` rows (a model that pins its batch axis),
    split along each input's batch axis (`axes`, calibrun.data.rows; constants are fed whole to every run)."""
    if fixed is None:
        return [feeds]
    rows = feed_rows.count(feeds, axes)
    if rows % fixed:
        raise CalibrunError(not_whole_batches(rows, fixed))
    return [feed_rows.take(feeds, axes, i, i + fixed) for i in range(0, rows, fixed)]


def as_array(value) -> np.ndarray:
    """One output of a session run as an array: a ZipMap's list of {class: probability} per row (a converted
    scikit-learn classifier) becomes [rows, classes], the classes in sorted order."""
    if isinstance(value, list) and all(isinstance(row, dict) for row in value):
        keys = sorted(value[0]) if value else []
        return np.array([[row[k] for k in keys] for row in value], dtype=np.float32).reshape(len(value), len(keys))
    return np.asarray(value)


def run_feeds(sess, feeds: dict[str, np.ndarray], fixed: int | None, axes=None) -> list[np.ndarray]:
    """Run all rows of `feeds`; a model that pins its batch axis to `fixed` is fed `fixed` rows at a time (the
    outputs of the runs are joined along their first axis)."""
    chunks = [sess.run(None, part) for part in split_feeds(feeds, fixed, axes)]
    return [np.concatenate([as_array(c[k]) for c in chunks]) for k in range(len(chunks[0]))]


def compare(fp32_outputs: list[np.ndarray], int8_outputs: list[np.ndarray]) -> dict:
    """max/mean |fp32 - int8| over every element of every output, and max |fp32 output|. An output whose size
    depends on the data (NonMaxSuppression's selections) and differs between the two is left out; when every
    output does, nothing can be compared (an error)."""
    if len(fp32_outputs) != len(int8_outputs):
        raise CalibrunError(f"models have {len(fp32_outputs)} and {len(int8_outputs)} outputs")
    diffs, refs, varying = [], [], []
    for ref, got in zip(fp32_outputs, int8_outputs, strict=True):
        if ref.shape != got.shape:
            if ref.ndim != got.ndim:
                raise CalibrunError(f"output shapes differ: {ref.shape} vs {got.shape}")
            varying.append(f"{ref.shape} vs {got.shape}")
            continue
        if ref.dtype.kind not in "fiub":  # labels as strings: no distance (the job's metrics count equal ones)
            continue
        ref64 = ref.astype(np.float64).ravel()
        diffs.append(np.abs(ref64 - got.astype(np.float64).ravel()))
        refs.append(np.abs(ref64))
    if not diffs:
        raise CalibrunError(f"no output could be compared element by element: their sizes differ "
                            f"({'; '.join(varying)}: data-dependent, after NonMaxSuppression, NonZero, ...)")
    diff = np.concatenate(diffs)
    return {
        "max_abs_error": float(diff.max()),
        "mean_abs_error": float(diff.mean()),
        "max_abs_output": float(np.concatenate(refs).max()),
    }


def max_abs_difference(a_outputs: list[np.ndarray], b_outputs: list[np.ndarray]) -> float:
    """max |a - b| over all output elements (QDQ vs QOperator)."""
    return compare(a_outputs, b_outputs)["max_abs_error"]


KEY_PART_MAX = 120  # characters of an output name in a metric key (MLflow's keys: 250 at most)


def metric_key(name: str) -> str:
    """An output name as an MLflow metric name part (alphanumerics, _ - . / and spaces). A name that would still
    make a key MLflow rejects (one that is a path leading elsewhere, `a/../b`, `a//b`, `./a`; or too long) has its
    slashes replaced, is shortened in the middle, and gets a short hash of the original name, so that two outputs
    never share a key; the original name is kept in the run's tags (`calibrun.output.<key>`)."""
    key = re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)
    probe = f"out.{key}.x"
    if posixpath.normpath(probe) == probe and len(key) <= KEY_PART_MAX:
        return key
    key = key.replace("/", "_")
    if len(key) > KEY_PART_MAX - 7:
        half = (KEY_PART_MAX - 10) // 2
        key = f"{key[:half]}...{key[-half:]}"
    return f"{key}-{hashlib.sha256(name.encode()).hexdigest()[:6]}"


def output_keys(names) -> dict[str, str]:
    """The metric key part of each output name that is not the name itself: {key: original name}."""
    return {key: name for name in names if (key := metric_key(name)) != name}


def _sqnr(signal: float, noise: float) -> float:
    """10 log10(signal / noise), capped at SQNR_CAP both ways; -inf where the int8 model made a value infinite (a
    divisor quantised to zero: an infinite noise energy), NaN where it made one NaN."""
    if noise <= 0:
        return SQNR_CAP
    if signal <= 0:
        return -SQNR_CAP
    if math.isinf(noise):
        return -math.inf
    ratio = signal / noise
    if math.isnan(ratio):
        return ratio
    return max(-SQNR_CAP, min(SQNR_CAP, 10 * math.log10(ratio))) if ratio > 0 else -SQNR_CAP


class ErrorStats:
    """Running statistics of fp32 `ref` vs int8 `got` (optionally per entry of the last axis)."""

    def __init__(self, parts: int | None = None):
        shape = () if parts is None else (parts,)
        self.parts = parts
        self.count = np.zeros(shape, np.int64)
        self.err_sum = np.zeros(shape)
        self.err_max = np.zeros(shape)
        self.ref_absmax = np.zeros(shape)
        self.ref_min = np.full(shape, np.inf)
        self.ref_max = np.full(shape, -np.inf)
        self.err_sq = np.zeros(shape)
        self.ref_sq = np.zeros(shape)
        self.got_sq = np.zeros(shape)
        self.dot = np.zeros(shape)
        self.nonfinite = np.zeros(shape, np.int64)  # int8's values that are Inf or NaN where fp32's are finite

    def update(self, ref: np.ndarray, got: np.ndarray) -> None:
        ref64, got64 = np.asarray(ref, np.float64), np.asarray(got, np.float64)
        if self.parts is not None:
            ref64, got64 = ref64.reshape(-1, self.parts), got64.reshape(-1, self.parts)
            axis = 0
        else:
            ref64, got64 = ref64.reshape(-1), got64.reshape(-1)
            axis = None
        if ref64.size == 0:
            return
        diff = np.abs(ref64 - got64)
        self.count += ref64.shape[0] if axis == 0 else ref64.size
        self.err_sum += diff.sum(axis=axis)
        self.err_max = np.maximum(self.err_max, diff.max(axis=axis))
        self.ref_absmax = np.maximum(self.ref_absmax, np.abs(ref64).max(axis=axis))
        self.ref_min = np.minimum(self.ref_min, ref64.min(axis=axis))
        self.ref_max = np.maximum(self.ref_max, ref64.max(axis=axis))
        self.err_sq += np.square(diff).sum(axis=axis)
        self.ref_sq += np.square(ref64).sum(axis=axis)
        self.got_sq += np.square(got64).sum(axis=axis)
        self.dot += (ref64 * got64).sum(axis=axis)
        self.nonfinite += (np.isfinite(ref64) & ~np.isfinite(got64)).sum(axis=axis)

    def metrics(self, index=()) -> dict[str, float]:
        count = int(self.count[index])
        if not count:
            return {}
        span = float(self.ref_max[index] - self.ref_min[index])
        err_max = float(self.err_max[index])
        norm = math.sqrt(float(self.ref_sq[index]) * float(self.got_sq[index]))
        if not math.isfinite(norm) or not math.isfinite(float(self.dot[index])):
            cosine = math.nan  # Inf or NaN among the values: no angle
        else:
            cosine = float(self.dot[index]) / norm if norm > 0 else (1.0 if self.ref_sq[index] == self.got_sq[index]
                                                                      else 0.0)
        out = {"max_abs_error": err_max, "mean_abs_error": float(self.err_sum[index]) / count}
        if span > 0 or err_max == 0:  # a constant fp32 output has no range to relate the error to
            out["relative_error"] = err_max / span if span > 0 else 0.0
        out["sqnr_db"] = _sqnr(float(self.ref_sq[index]), float(self.err_sq[index]))
        out["cosine"] = max(-1.0, min(1.0, cosine)) if math.isfinite(cosine) else math.nan
        if self.nonfinite[index]:
            out[NONFINITE_KEY] = int(self.nonfinite[index]) / count
        if span == 0:  # one value everywhere in fp32: nothing of what the model computes was put to the test
            out[CONSTANT_KEY] = 1.0
        return out


class RowShare:
    """How many rows carry an error over the verdict's ok bound: a row's error energy against the output's mean
    signal energy (both per value) under SQNR_OK_DB. The pooled SQNR averages the error over the rows; this asks
    whether the bound holds row by row. The output's signal, not the row's own, is the yardstick: a row that is
    nearly silent in fp32 (a detector's scores on a photo without objects) is not flagged for a small error."""

    def __init__(self):
        self.errors: list[np.ndarray] = []  # per row: mean squared error per value
        self.signal = 0.0  # sum of squared fp32 values
        self.values = 0

    SMALL = 2**16  # values: a batch this small is taken whole (a stream's gathered rows), not a row at a time

    def update(self, ref: np.ndarray, got: np.ndarray, axis: int) -> None:
        if ref.size <= self.SMALL:
            r = np.moveaxis(np.asarray(ref, np.float64), axis, 0).reshape(ref.shape[axis], -1)
            g = np.moveaxis(np.asarray(got, np.float64), axis, 0).reshape(ref.shape[axis], -1)
            self.errors.append(np.square(r - g).mean(axis=1) if r.shape[1] else np.zeros(r.shape[0]))
            self.signal += float(np.square(r).sum())
            self.values += r.size
            return
        errors = np.empty(ref.shape[axis])
        for row in range(ref.shape[axis]):  # a row at a time: float64 copies of one row only
            r = np.asarray(np.take(ref, row, axis=axis), np.float64)
            errors[row] = np.square(r - np.take(got, row, axis=axis)).mean() if r.size else 0.0
            self.signal += float(np.square(r).sum())
            self.values += r.size
        self.errors.append(errors)

    def metrics(self) -> dict[str, float]:
        if not self.errors or not self.values:
            return {}
        errors = np.concatenate(self.errors)
        signal = self.signal / self.values
        under = errors > 0 if signal <= 0 else errors * 10 ** (SQNR_OK_DB / 10) > signal  # as _sqnr: 0 noise caps
        return {ROW_SHARE_KEY: float(np.count_nonzero(under)) / errors.size}


UNIT_TOLERANCE = 1e-3  # |sum(x^2) - 1| of a row called a unit vector: float32 normalisation is within ~1e-6


class CentredSignal:
    """An output of one vector a row ([N] or [N, k], the rows on axis 0): its SQNR against its variation over the
    rows, each value less its mean over every evaluation row (`centred_sqnr_db`), from running sums (the means are
    known only at the end: sum(x^2) - sum(x)^2 / n per value). A level every row shares counts as signal in the
    pooled SQNR and tells a caller nothing about the row (calibrun.measure.verdict.ok_withheld). None where fewer
    than 2 rows were measured or fp32 gives every row the same vector (nothing varies to measure against)."""

    def __init__(self):
        self.sums: np.ndarray | None = None
        self.squares: np.ndarray | None = None  # per value: sum(x^2) and sum((x - int8's)^2)
        self.errors: np.ndarray | None = None
        self.rows = 0
        self.unit = True  # every row so far a vector of L2 norm 1 (a direction: an embedding F.normalize made)
        # the totals, summed batch by batch as before the per-value sums came (the same numbers to the last bit)
        self.ref_sq = self.err_sq = 0.0

    def update(self, ref: np.ndarray, got: np.ndarray) -> None:
        r = np.asarray(ref, np.float64).reshape(ref.shape[0], -1)
        if self.sums is not None and self.sums.shape[0] != r.shape[1]:  # the vector's length changed: no mean
            self.rows = -1
        if self.rows < 0:
            return
        self.sums = r.sum(axis=0) + (self.sums if self.sums is not None else 0.0)
        squares = np.square(r)
        errors = np.square(r - np.asarray(got, np.float64).reshape(r.shape))
        self.squares = squares.sum(axis=0) + (self.squares if self.squares is not None else 0.0)
        self.errors = errors.sum(axis=0) + (self.errors if self.errors is not None else 0.0)
        self.unit = self.unit and r.shape[1] >= 2 and bool(np.all(np.abs(squares.sum(axis=1) - 1.0) <= UNIT_TOLERANCE))
        self.rows += r.shape[0]
        self.ref_sq += float(squares.sum())
        self.err_sq += float(errors.sum())

    def metrics(self) -> dict[str, float]:
        if self.rows < 2 or self.sums is None:
            return {}
        centred = self.ref_sq - float(np.dot(self.sums, self.sums)) / self.rows
        if not centred > self.ref_sq * 1e-12:  # the same vector on every row, up to float64 rounding of the sums
            return {}
        out = {CENTRED_KEY: _sqnr(centred, self.err_sq)}
        if self.sums.size >= 2:  # each value of the vector against its own variation over the rows
            spread = self.squares - np.square(self.sums) / self.rows
            varies = spread > self.squares * 1e-12
            if np.any(varies):
                under = self.errors[varies] * 10 ** (SQNR_OK_DB / 10) > spread[varies]
                out[VALUE_SHARE_KEY] = float(np.count_nonzero(under)) / int(np.count_nonzero(varies))
                pairs = zip(spread[varies], self.errors[varies], strict=True)
                out[VALUE_WORST_KEY] = min(_sqnr(float(a), float(b)) for a, b in pairs)
            if self.unit:
                out[UNIT_KEY] = 1.0
        return out


_SAID_VARYING: set[str] = set()  # outputs whose data-dependent size was logged


class RowSets:
    """An integer output's rows (along axis 0) as multisets, batch by batch: the rows both models give over the
    rows either gives (NonMaxSuppression's selected (batch, class, box) rows: the selections int8 kept). Only for
    outputs of such rows (`holds`): a class per row or a map of classes is not a set, and would cost a Python tuple
    per row on every batch."""

    ROW_MAX = 16  # entries of a row: index tuples, not maps

    def __init__(self):
        self.shared = self.either = 0

    @classmethod
    def holds(cls, ref: np.ndarray, got: np.ndarray) -> bool:
        """Whether both arrays are integer [K, k] rows of at most ROW_MAX entries."""
        return (ref.dtype.kind in "iub" and got.dtype.kind in "iub" and ref.ndim == got.ndim == 2
                and ref.shape[1] == got.shape[1] <= cls.ROW_MAX)

    def update(self, ref: np.ndarray, got: np.ndarray) -> None:
        a, b = (Counter(map(tuple, x.reshape(x.shape[0], math.prod(x.shape[1:])).tolist())) for x in (ref, got))
        self.shared += sum((a & b).values())
        self.either += sum((a | b).values())

    def iou(self) -> float:
        return self.shared / self.either if self.either else 1.0


def row_axis(shape: Sequence[int], rows: int | None, declared: Sequence | None = None,
             names: frozenset[str] = frozenset()) -> int | None:
    """The axis of an output that holds the batch's `rows` rows: among the axes of that length, the one the model
    names as an input's batch axis (`names`, calibrun.data.rows.batch_names: `time, batch, 4` from an input `batch, 100,
    time`), else those it declares free (not a fixed size) first, axis 0 first among them; None when no axis has
    that length (or `rows` is unknown)."""
    if rows is None:
        return None
    axes = [a for a, size in enumerate(shape) if size == rows]
    if declared is not None and len(declared) == len(shape):
        named = [a for a in axes if isinstance(declared[a], str) and declared[a] in names]
        if len(named) == 1:
            return named[0]
        axes = [a for a in axes if not (isinstance(declared[a], int) and declared[a] > 0)] or axes
    return 0 if 0 in axes else (axes[0] if axes else None)


class OutputErrors:
    """The error metrics of every output, streamed (see the module docstring). `blocks`: the outputs a Concat joins
    (calibrun.model.graph.output_blocks), measured per Concat input too; `shapes`: the outputs' declared shapes
    (which axis holds the rows where several have the batch's length)."""

    def __init__(self, names: Sequence[str], blocks: dict | None = None, shapes: Sequence | None = None,
                 row_names: frozenset[str] = frozenset()):
        self.names = list(names)
        self.shapes = dict(zip(self.names, shapes, strict=True)) if shapes is not None else {}
        self.row_names = row_names  # the inputs' batch axes' names (row_axis)
        self.stats: dict[str, ErrorStats] = {name: ErrorStats() for name in self.names}
        # outputs whose size depends on the data (NonMaxSuppression's selections, NonZero): per output, the batches
        # where fp32 and int8 gave different sizes and the batches seen; integer outputs' rows as sets
        self.sizes: dict[str, list[int]] = {name: [0, 0] for name in self.names}
        self.row_sets: dict[str, RowSets] = {}
        self.same: dict[str, list[int]] = {}  # outputs of strings (a classifier's labels): [equal elements, elements]
        self.rows: dict[str, RowShare] = {name: RowShare() for name in self.names}
        self.centred: dict[str, CentredSignal] = {}  # the outputs of one vector a row (CentredSignal)
        self.parts: dict[str, ErrorStats] = {}
        self.blocks = {name: (axis, [(start, end, ErrorStats(), RowShare()) for start, end in spans])
                       for name, (axis, spans) in (blocks or {}).items() if name in self.stats}

    def update(self, ref_outputs: Sequence[np.ndarray], got_outputs: Sequence[np.ndarray],
               rows: int | None = None, axes: Sequence[int | None] | None = None) -> None:
        """One batch of both models' outputs; `rows`: the batch's row count (None: no per-row share); `axes`: each
        output's row axis when the caller knows it (Gathered), else found from the shapes (row_axis)."""
        if len(ref_outputs) != len(got_outputs):
            raise CalibrunError(f"models have {len(ref_outputs)} and {len(got_outputs)} outputs")
        for k, (name, ref, got) in enumerate(zip(self.names, ref_outputs, got_outputs, strict=True)):
            ref, got = np.asarray(ref), np.asarray(got)
            if RowSets.holds(ref, got):
                self.row_sets.setdefault(name, RowSets()).update(ref, got)
            self.sizes[name][1] += 1
            if ref.shape != got.shape:
                if ref.ndim != got.ndim:
                    raise CalibrunError(f"output {name!r} has rank {ref.ndim} in fp32 and {got.ndim} in int8")
                if name not in _SAID_VARYING:  # once a process: every candidate a recommendation measures repeats it
                    _SAID_VARYING.add(name)
                    log.warning("output %r: its size depends on the data (fp32 %s, int8 %s in a batch): left out of "
                                "the element-wise errors where the two differ%s", name, ref.shape, got.shape,
                                f"; its rows compared as sets (out.{metric_key(name)}.row_iou)"
                                if name in self.row_sets else "")
                self.sizes[name][0] += 1
                continue
            if ref.dtype.kind not in "fiub":  # strings (scikit-learn's class labels): equal or not, no distance
                same = self.same.setdefault(name, [0, 0])
                same[0] += int(np.count_nonzero(ref == got))
                same[1] += ref.size
                continue
            self.stats[name].update(ref, got)
            along = axes[k] if axes is not None else row_axis(ref.shape, rows, self.shapes.get(name),
                                                                           self.row_names)
            if along is not None:
                self.rows[name].update(ref, got, along)
            if along == 0 and ref.ndim <= 2 and ref.dtype.kind == "f":
                self.centred.setdefault(name, CentredSignal()).update(ref, got)
            if ref.ndim >= 3 and 2 <= ref.shape[-1] <= SEGMENTS_MAX:
                self.parts.setdefault(name, ErrorStats(ref.shape[-1])).update(ref, got)
            if name in self.blocks:
                axis, spans = self.blocks[name]
                if axis < ref.ndim and ref.shape[axis] == spans[-1][1]:
                    for start, end, stats, share in spans:
                        where = (slice(None),) * axis + (slice(start, end),)
                        stats.update(ref[where], got[where])
                        if along is not None and along != axis:
                            share.update(ref[where], got[where], along)

    def metrics(self) -> dict[str, float]:
        stats = list(self.stats.values())
        count = sum(int(s.count) for s in stats)
        if not count:
            varying = [name for name, (differ, _) in self.sizes.items() if differ]
            if varying:
                raise CalibrunError(f"no output could be compared element by element: the size of {varying} "
                                    "depends on the data and fp32 and int8 differ on it in every batch (after "
                                    "NonMaxSuppression, NonZero, ...); the other outputs are empty")
            raise CalibrunError("no evaluation rows were measured")
        out = {
            "max_abs_error": float(max(s.err_max for s in stats)),
            "mean_abs_error": float(sum(float(s.err_sum) for s in stats) / count),
            "max_abs_output": float(max(s.ref_absmax for s in stats)),
        }
        for name, s in self.stats.items():
            key = metric_key(name)
            out.update({f"out.{key}.{metric}": value for metric, value in s.metrics().items()})
            if self.same.get(name, (0, 0))[1]:
                out[f"out.{key}.agreement"] = self.same[name][0] / self.same[name][1]
            differ, batches = self.sizes[name]
            if differ:
                out[f"out.{key}.size_mismatch"] = differ / batches
                if name in self.row_sets:
                    out[f"out.{key}.row_iou"] = self.row_sets[name].iou()
            out.update({f"out.{key}.{metric}": value for metric, value in self.rows[name].metrics().items()})
            if name in self.centred:
                out.update({f"out.{key}.{metric}": value for metric, value in self.centred[name].metrics().items()})
            if name in self.parts:
                for k in range(self.parts[name].parts):
                    out.update({f"out.{key}.ch{k}.{metric}": value
                                for metric, value in self.parts[name].metrics(k).items()})
            for j, (_, _, stats, share) in enumerate(self.blocks.get(name, (0, []))[1]):
                out.update({f"out.{key}.concat{j}.{metric}": value
                            for metric, value in {**stats.metrics(), **share.metrics()}.items()})
        return out


class Gathered:
    """Both models' outputs of each run measured into `errors` (an OutputErrors) and `task`; consecutive one-row runs
    (a stream: calibrun.measure.feedback) joined along each output's row axis `size` rows at a time and measured at
    once. A row's own update cost DTLN's first stage 0.25 ms of Python over its outputs and parts, against
    onnxruntime's 0.06 ms a row; the sums are the same up to float rounding. `size` 1: every run measured as it comes
    (the evaluation without a state, to the bit as before). Runs whose outputs are not all float (rows compared as
    sets), or have no row axis, or change shape, are measured as they come."""

    def __init__(self, errors: OutputErrors, task, names: Sequence[str], shapes: Sequence | None = None,
                 size: int = 64):
        # a task that reads the inputs gets each run as it comes, with the inputs it was fed (never joined)
        self.inputs = bool(getattr(task, "wants_inputs", False))
        self.errors, self.task, self.names, self.size = errors, task, list(names), 1 if self.inputs else size
        self.declared = list(shapes) if shapes is not None else [None] * len(self.names)
        self.runs: list[tuple[list[np.ndarray], list[np.ndarray], np.ndarray | None]] = []
        self.axes: list[int | None] | None = None

    def _measure(self, ref, got, labels, rows: int | None, axes, inputs=None) -> None:
        self.errors.update(ref, got, rows, axes)
        if self.task is not None:
            fp32, int8 = dict(zip(self.names, ref, strict=True)), dict(zip(self.names, got, strict=True))
            self.task.check_shapes(fp32, int8)
            self.task.update(fp32, int8, labels, *((inputs,) if self.inputs else ()))

    def add(self, ref: Sequence[np.ndarray], got: Sequence[np.ndarray], labels, rows: int | None,
            inputs=None) -> None:
        """One run's outputs; `inputs`: the feeds fp32 was run on, for a task that reads them."""
        axes = [row_axis(r.shape, rows, d, self.errors.row_names) for r, d in zip(ref, self.declared, strict=False)] \
            if self.size > 1 and rows == 1 else None
        if axes is None or None in axes or any(np.asarray(r).dtype.kind != "f" for r in (*ref, *got)) or \
                any(r.shape != g.shape for r, g in zip(ref, got, strict=True)):
            self.flush()
            self._measure(ref, got, labels, rows, None, inputs)
            return
        if self.runs and (axes != self.axes or [r.shape for r in ref] != [r.shape for r in self.runs[0][0]]):
            self.flush()
        self.axes = axes
        self.runs.append((list(ref), list(got), labels))
        if len(self.runs) >= self.size:
            self.flush()

    def flush(self) -> None:
        if not self.runs:
            return
        runs, self.runs = self.runs, []
        if len(runs) == 1:
            self._measure(runs[0][0], runs[0][1], runs[0][2], 1, self.axes)
            return
        ref = [np.concatenate([r[0][k] for r in runs], axis=a) for k, a in enumerate(self.axes)]
        got = [np.concatenate([r[1][k] for r in runs], axis=a) for k, a in enumerate(self.axes)]
        labels = None if runs[0][2] is None else np.concatenate([np.asarray(r[2]).reshape(-1) for r in runs])
        self._measure(ref, got, labels, len(runs), self.axes)


class InputRange:
    """min / max of one input's evaluation values."""

    def __init__(self):
        self.low, self.high = math.inf, -math.inf

    def update(self, array: np.ndarray) -> None:
        if array.size:
            self.low = min(self.low, float(array.min()))
            self.high = max(self.high, float(array.max()))

    def metrics(self) -> dict[str, float]:
        return {"eval_min": self.low, "eval_max": self.high, "eval_span": self.high - self.low}


def batch_size_for(fixed: int | None, requested: int | None) -> int:
    """Rows per evaluation run: the model's pinned first axis, else `requested` (default DEFAULT_BATCH)."""
    if fixed is not None:
        return fixed
    return DEFAULT_BATCH if requested is None else int(requested)


def evaluate(fp32_path, int8_path, evaluation, task=None, threads: int = 0, batch_size: int | None = None,
             progress: str | None = "evaluation", budget: int | None = None,
             used: dict | None = None, keep=None, fp32_session=None) -> dict[str, float]:
    """Run the fp32 and int8 models over `evaluation` (a calibrun.data.EvalData) batch by batch; return the
    error metrics (module docstring), the primary input's eval_min/eval_max/eval_span, `rows`, `eval_batches`,
    `eval_batch_size` and the task's metrics.

    `task`: a calibrun.measure.tasks.Task (None: no task metrics). Rows are counted and split along each input's batch
    axis (`evaluation.axes`, calibrun.data.rows). A model that pins its batch axis to b is fed b rows at a time,
    and the rows must be a multiple of b.

    `budget` (memory.budget in bytes, None: auto; calibrun.core.memory): a batch whose rows' live activations, twice
    (calibrun.core.memory.live_bytes, and kernels' workspace), exceed the budget is run in runs of fewer rows
    (onnxruntime may round a row differently in a smaller batch, and the running sums add per run: equal to one
    run's within float rounding). `used` (a dict) receives `eval_rows_per_run`. `keep` (an empty
    calibrun.analysis.evaluate.Evaluator, `kept`) receives every run's feeds, fp32 outputs and labels: the
    recommendations measure against them without an fp32 pass of their own. `fp32_session`: the fp32 model's
    session when the caller holds one (the rows probe's), else one is opened.
    """
    import onnxruntime as ort

    from calibrun.core.progress import Progress
    from calibrun.model import graph_inputs, load_model
    from calibrun.model.graph import blocks_of

    fp32_model = load_model(fp32_path)
    infos = list(graph_inputs(fp32_model))
    del fp32_model
    axes = getattr(evaluation, "axes", None)
    fixed = feed_rows.pinned_rows({info.name: info.shape for info in infos}, axes)
    size = batch_size_for(fixed, batch_size)
    if fixed is not None and evaluation.rows % fixed:
        raise CalibrunError(not_whole_batches(evaluation.rows, fixed))
    int8_model = load_model(int8_path)  # a clear error for a missing file
    int8_inputs = [i.name for i in int8_model.graph.input]
    ref_floats, got_floats = declared_floats(infos), declared_floats(graph_inputs(int8_model))
    del int8_model
    blocks = blocks_of(fp32_path)  # reads the model's structure (cached, calibrun.model.structure) before the
    # sessions hold their weights: the whole file is read once, here or by the caller of a given fp32_session
    ref_sess, got_sess = fp32_session or session(fp32_path, threads), session(int8_path, threads)
    names, shapes = [o.name for o in ref_sess.get_outputs()], [o.shape for o in ref_sess.get_outputs()]
    row_names = feed_rows.batch_names({info.name: info.shape for info in infos}, axes)
    errors = OutputErrors(names, blocks, shapes, row_names)
    if keep is not None:
        keep.start(names, shapes, [i.name for i in ref_sess.get_inputs()], row_names)
    primary_input = primary(infos).name if infos else None
    span = InputRange()
    batches = evaluation.sizes(size)
    bar = Progress(f"{progress} ({size} rows per batch)", len(batches)) if progress else None
    done = 0
    per_run = None
    shrink = None  # onnxruntime RunOptions
    state = getattr(evaluation, "state", None) or {}
    if state:  # rows in order, one at a time, each model feeding back its own state (calibrun.measure.feedback)
        per_run = feedback.rows_per_run(state, fixed)
        if used is not None:
            used["eval_rows_per_run"] = per_run
    pairs = feedback.output_indices(state, names)
    ref_state, got_state = feedback.Carried(pairs, names), feedback.Carried(pairs, names)
    gathered = Gathered(errors, task, names, shapes, 64 if state else 1)  # a stream's one-row runs: 64 at once
    for feeds, labels in evaluation.batches(size):
        missing = [name for name in feeds if name not in int8_inputs]
        if missing:
            raise CalibrunError(f"{int8_path} has no input {missing[0]!r} (inputs: {int8_inputs})")
        rows = feed_rows.count(feeds, axes)
        if per_run is None:
            per_run = rows_per_run(fp32_path, feeds, fixed, size, budget, used, axes)
            if per_run < size:  # large rows: give the arenas' memory back after each run (the diagnostics run next)
                shrink = ort.RunOptions()
                shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        for start, stop, part in feed_rows.runs(feeds, axes, per_run):
            part, got_part = ref_state.feeds(part), got_state.feeds(part)
            try:
                ref = [as_array(v) for v in ref_sess.run(None, floats_as_declared(part, ref_floats), shrink)]
                got = [as_array(v) for v in got_sess.run(None, floats_as_declared(got_part, got_floats), shrink)]
            except Exception as exc:  # onnxruntime's own Fail/InvalidArgument on bad feeds
                raise CalibrunError(f"running the models on the evaluation data failed: {one_line(exc)}") from exc
            ref_state.took(ref)
            got_state.took(got)
            part_labels = labels if labels is None or per_run >= rows else labels[start:stop]
            gathered.add(ref, got, part_labels, feed_rows.count(part, axes), part)
            if keep is not None:
                keep.add(part, ref, part_labels, feed_rows.count(part, axes))
            del ref, got
        if primary_input in feeds:
            span.update(feeds[primary_input])
        interrupts.check()
        done += 1
        if bar is not None:
            bar.update(done)
    gathered.flush()
    if keep is not None:
        keep.ready()
    metrics = {"rows": evaluation.rows, "eval_batches": done, "eval_batch_size": size, **errors.metrics()}
    if primary_input is not None and math.isfinite(span.low):
        metrics.update(span.metrics())
    if task is not None:
        metrics.update(task.metrics())
    return metrics


def declared_floats(infos) -> dict[str, np.dtype]:
    """The numpy float type each float input (calibrun.model.InputInfo) declares."""
    return {info.name: input_dtype(info) for info in infos if is_float(info)}


def floats_as_declared(feeds: dict, floats: dict[str, type]) -> dict:
    """`feeds` with each float array in the float type its model declares for it: a float16 model (calibtool's `error`
    runs one as given) is compared with the int8 model of its float32 widening (calibrun.model.prepare) on the same
    rows. Arrays already of that type are passed as they are (no copy)."""
    return {name: value.astype(floats[name]) if name in floats and isinstance(value, np.ndarray)
            and value.dtype.kind == "f" and value.dtype != floats[name] else value for name, value in feeds.items()}


def rows_per_run(fp32_path, feeds, fixed: int | None, size: int, budget: int | None, used: dict | None,
                  axes=None) -> int:
    """Evaluation rows per run under the memory budget (calibrun.core.memory), from the first batch's shapes."""
    from calibrun.core import memory

    if fixed is not None:  # a model that pins its batch axis takes its batch as it is
        if used is not None:
            used.update(eval_rows_per_run=size)
        return size
    sizes = memory.row_bytes(fp32_path, feeds, axes)
    resolved = memory.resolve(budget, sizes)
    rows = memory.rows_for(resolved, 2 * memory.live_bytes(fp32_path, feeds, axes, sizes), size)  # and workspace
    if used is not None:
        used.update(budget_bytes=resolved, eval_rows_per_run=rows)
    return rows


def lab_feeds(fp32: FloatModel, seed: int, rows: int) -> dict[str, np.ndarray]:
    info = fp32.lab_input()
    return {info.name: evaluation_rows(info, seed, rows)}


def outputs(path: str | Path, fp32: FloatModel, feeds, threads: int = 0, axes=None) -> list[np.ndarray]:
    """Every output of the model at `path` on `feeds` (a dict of arrays, or an EvalData): all rows in memory, for
    small comparisons (QDQ vs QOperator); the measurement itself streams (`evaluate`). `axes`: the feeds' batch
    axes (an EvalData's own by default)."""
    if not isinstance(feeds, dict):
        axes = feeds.axes if axes is None else axes
        feeds = feeds.feeds
    fixed = feed_rows.pinned_rows({info.name: info.shape for info in fp32.inputs}, axes)
    return run_feeds(session(path, threads), feeds, fixed, axes)


CONTRACT_KEYS = ("rows", "max_abs_error", "mean_abs_error", "max_abs_output")


def error(fp32_path: str | Path, int8_path: str | Path, seed: int, rows: int, threads: int = 0,
          cache=None) -> dict:
    """The `error` contract: |fp32 - int8| over all output elements on the lab evaluation rows. The fp32 reference
    is the model as given (a float16 model runs in float16); where onnxruntime cannot load that file (an opset it no
    longer runs), the model prepared from it as `quantize` prepares it (kept in `cache`'s models folder when given),
    said in one log line."""
    rows = check_positive_int(rows, "rows", MAX_ROWS)
    from calibrun.data import lab_evaluation
    from calibrun.model import check_loadable, quantised_ops_of
    from calibrun.model.prepared import prepared_source

    given = open_float_model(fp32_path)
    if quantised_ops_of(int8_path) == {}:  # a float model given as INT8: the errors of two float models
        log.warning("%s holds no quantised operator (no QuantizeLinear, QLinear or integer op): these are the errors "
                    "of two float models", int8_path)
    try:
        check_loadable(given)
        reference = contextlib.nullcontext(given)
    except CalibrunError as exc:
        log.warning("%s; the error is measured against the model prepared from it", exc)
        reference = prepared_source(given, cache)
    with reference as fp32:
        metrics = evaluate(fp32.path, int8_path, lab_evaluation(fp32, seed, rows), None, threads, progress=None)
    found = {key: metrics[key] for key in CONTRACT_KEYS}
    if not all(math.isfinite(value) for value in found.values()):
        log.warning("the models' outputs are not all finite on the lab rows (max_abs_output %s, max_abs_error %s: a "
                    "NaN or an infinity, e.g. a square root of a negative row): not a number, written as null",
                    found["max_abs_output"], found["max_abs_error"])
    return found

# --- config: this concept's options (the `eval` node; calibrun.config assembles the schema) ---

@dataclass
class EvalConf:
    seed: int = EVAL_SEED
    rows: int = EVAL_ROWS
    batch_size: int | None = None  # rows per evaluation run; None: 16 (a model that pins its first axis: its size)

# --- config: this concept's options (the `ort` node; calibrun.config assembles the schema) ---

@dataclass
class OrtConf:
    intra_op_threads: int = 0
