"""The batch protocol every data source serves, and the helpers the file sources (npy.py, images.py) share.

User data sources: calibration batches and evaluation rows read from .npy/.npz files or image folders.

Calibration (`npy_calibration`, `image_calibration`) gives a `FeedBatches`: sized, lazy, re-iterable and
deterministic, one feed `{input_name: batch}` per batch, with an `identity()` for the calibration cache.
Evaluation (`npy_evaluation`, `image_evaluation`) gives an `EvalData` that serves the evaluation rows batch by
batch (never all at once), plus class labels when the source has them. Both carry `axes`, each input's batch axis
(calibrun.data.rows; None: a constant), which every consumer uses to count and split rows.

The rules every source follows (docs/data.md)
- batches: 16 rows (calibrun.lab.ROWS_PER_BATCH), or `b` when the model pins its inputs' batch axis to `b`; the
  first `batches` batches are used. With too few rows for `batches` full batches, what there is is used and a
  warning goes to the "calibrun" logger (an info line at batches' default, 64: every row is what was asked for).
  A trailing partial batch is KEPT (as a smaller last batch) when the batch axis is symbolic, and DROPPED when the
  model pins it (the model cannot take another batch size).
- values: each input is fed in the type the model declares (calibrun.data.inputs: lossless casts only); float
  inputs are multiplied by `factor` in float64, then cast (with factor 1 this is exactly `astype`). NaN/Inf in a
  file, or values that overflow after the factor, fail naming the file.
- shapes: the data's rank and every fixed axis beside the batch axis must match the model's; symbolic axes take
  the data's size (the same in every file). Constants (`data.inputs.<name>.value`, a 0-d array) are fed with every
  batch and never split.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibrun.core.bounds import MAX_BATCHES, check_factor, check_positive_int
from calibrun.core.errors import CalibrunError
from calibrun.data import rows as rowsmod
from calibrun.data.inputs import Constant, declared, input_dtype
from calibrun.lab import EVAL_ROWS, MAIN_BATCHES, ROWS_PER_BATCH
from calibrun.model import InputInfo, file_sha256

logger = logging.getLogger("calibrun")

EVAL_CHUNK = 1024  # rows converted at a time when evaluation data is read


def check_inputs(inputs: Sequence[InputInfo], constants: dict[str, Constant],
                 axes: dict[str, int | None], key: str = "data") -> list[InputInfo]:
    """The inputs the data must give rows for (every input that is not a constant), each one that calibrun can
    feed: a known shape and a numeric or bool type. A scalar input without a constant is an error. `key`: the
    config key of the source (data, eval_data) the hints name."""
    inputs = list(inputs)
    if not inputs:
        raise CalibrunError("the model has no graph input to feed")
    names = [info.name for info in inputs]
    if len(set(names)) != len(names):
        raise CalibrunError(f"the model's input names are not unique: {names}")
    batched = []
    for info in inputs:
        input_dtype(info)
        if not info.has_shape:
            raise CalibrunError(f"input {declared(info)} has no known shape (not even a rank)")
        if info.name in constants:
            continue
        if axes[info.name] is None:
            raise CalibrunError(f"input {declared(info)} is a scalar: it has no rows; give it a constant "
                                f"({key}.inputs.{info.name}.value=..., or a 0-d array in the .npz)")
        batched.append(info)
    if not batched:
        raise CalibrunError(f"every input is a constant ({', '.join(names)}): no input has rows to calibrate on")
    return batched


def _rows_per_batch(inputs: Sequence[InputInfo], axes) -> tuple[int, bool]:
    """(rows per batch, pinned): every pinned batch axis must agree (all inputs share one batch)."""
    pinned = rowsmod.pinned_rows({info.name: info.shape for info in inputs}, axes)
    return (pinned, True) if pinned is not None else (ROWS_PER_BATCH, False)


def batch_shape(sample_shape: Sequence[int], axis: int, rows: int) -> tuple[int, ...]:
    """The shape of `rows` rows of an input whose one row (without the batch axis) is `sample_shape`."""
    return (*sample_shape[:axis], rows, *sample_shape[axis:])


def input_identity(name: str, shape: Sequence[int], dtype, axis: int | None, constant: Constant | None) -> dict:
    """One input in a source's identity: its name and shape, and (only when they differ from a float32 input
    with rows on axis 0, so that earlier cache keys stay valid) its dtype, batch axis and constant."""
    entry = {"name": name, "batch_shape": list(shape)}
    if np.dtype(dtype) != np.float32:
        entry["dtype"] = str(np.dtype(dtype))
    if axis != 0:
        entry["batch_axis"] = axis
    if constant is not None:
        entry["constant"] = constant.identity()
    return entry


@dataclass(frozen=True)
class _File:
    """A file the source reads, with the size and mtime it had when scanned (a later change is an error)."""

    path: Path
    rel: str
    size: int
    mtime_ns: int

    @classmethod
    def scan(cls, path: Path, rel: str) -> _File:
        st = path.stat()
        return cls(path, rel, st.st_size, st.st_mtime_ns)

    def check(self) -> None:
        try:
            st = self.path.stat()
        except OSError:
            raise CalibrunError(f"{self.path} disappeared after calibrun scanned it") from None
        if (st.st_size, st.st_mtime_ns) != (self.size, self.mtime_ns):
            raise CalibrunError(f"{self.path} changed after calibrun scanned it; start again")

    def sha256(self) -> str:
        self.check()
        digest = file_sha256(self.path)
        self.check()
        return digest


def _hashes(files: Sequence[_File]) -> list[dict]:
    unique = {f.rel: f for f in files}
    return [{"path": rel, "sha256": unique[rel].sha256()} for rel in sorted(unique)]


def _listed(files: Sequence[_File]) -> list[dict]:
    """The files an evaluation reads, by relative path: what result.json's `used` reports (their number); nothing
    reads a hash of them (tracking digests the evaluation source itself), so none is computed."""
    return [{"path": rel} for rel in sorted({f.rel for f in files})]


def _plan(total: int, per_batch: int, pinned: bool, requested: int, where: str) -> tuple[int, int]:
    """(batches served, rows used) for `requested` batches over `total` rows; warns when short."""
    full, rest = divmod(total, per_batch)
    if total == 0:
        raise CalibrunError(f"{where}: no rows of data")
    if pinned and full == 0:
        raise CalibrunError(f"{where}: {total} rows, fewer than the {per_batch} rows per batch the model pins")
    available = full if pinned else full + (1 if rest else 0)
    count = min(requested, available)
    if full < requested:
        if rest and pinned:
            tail = f"; the last {rest} rows are dropped (the model pins batches of {per_batch})"
        elif rest:
            tail = f" plus a last batch of {rest} {_plural(rest, 'row')}"
        else:
            tail = ""
        # every requested batch served (the last one short): said, not warned; and at batches' default (64, the
        # lab's) every row of a smaller file is what the user asked for by asking nothing (an unseen forecaster's 48
        # rows warned on every job): said too, unless rows are dropped
        default = requested == MAIN_BATCHES and not (rest and pinned)
        say = logger.warning if count < requested and not default else logger.info
        if full == 0:  # one short batch: "0 full batches of 16 plus a last batch of 12 rows" said it twice over
            held = f"one batch of {total} {_plural(total, 'row')} (fewer than {per_batch})"
        else:
            held = f"{full} full {_plural(full, 'batch')} of {per_batch}{tail}"
        if default:
            say("%s: calibrating on every row of the data, %d: %s (batches is %d by default)", where, total, held,
                requested)
        else:
            say("%s: %d batches requested, the data has %d rows: %s; using %d %s", where, requested, total, held,
                count, _plural(count, "batch"))
    elif count * per_batch < total:  # the rest of the data is not read: said (a hand-landmark model pinned to one
        # row a batch calibrated on 64 of its file's 128 rows, the second photo's never, and no line said so)
        whole = full + (1 if rest and not pinned else 0)
        logger.info("%s: calibrating on %d of the data's %d rows (%d %s of %d); batches=%d reads them all", where,
                    count * per_batch, total, count, _plural(count, "batch"), per_batch, whole)
    return count, min(total, count * per_batch)


def _plural(count: int, noun: str) -> str:
    return noun if count == 1 else noun + ("es" if noun.endswith("ch") else "s")


# A stream's evaluation rows at eval.rows' default (a state fed back: one call a row, in order): every row of the
# file up to this many. Its rows are consecutive calls of one recording, and a recording's first 256 calls are often
# its silent start: an unseen denoiser's (session 44) first 256 of 752 were the 6 s before anyone spoke, where a
# recommendation measured ok that measured 11.5 dB (degraded) on all 752 and failed its check; the zoo's DTLN streams
# set eval.rows=2048 for the same reason.
STREAM_EVAL_ROWS = 2048


def _cap_rows(total: int, rows: int | None, where: str) -> int:
    if total == 0:
        raise CalibrunError(f"{where}: no rows of data")
    if rows is None:
        return total
    rows = check_positive_int(rows, "rows")
    default = rows in (EVAL_ROWS, STREAM_EVAL_ROWS)  # eval.rows at its default (a stream's: calibrun.job.eval_source)
    said = f"a stream's default: up to {rows}" if rows == STREAM_EVAL_ROWS else f"eval.rows is {rows} by default"
    if rows > total and default:  # the data's rows are all there is to use
        logger.info("%s: evaluating the data's %d rows (%s)", where, total, said)
    elif rows > total:
        logger.warning("%s: %d evaluation rows requested, the data has %d; using %d", where, rows, total, total)
    elif rows < total:  # the rest is not measured: said (an unseen voice detector's file, one recording in its first
        # 299 rows and music after, was judged on its first 256 rows with no line saying so, 12 of 16 flips unseen)
        logger.info("%s: evaluating the first %d of the data's %d rows (%s); eval.rows=%d evaluates them all", where,
                    rows, total, said if default else f"eval.rows={rows}", total)
    return min(rows, total)


class FeedBatches:
    """Calibration batches from user files: sized, lazy, re-iterable and deterministic.

    Each iteration reopens the files and yields one feed `{input_name: batch}` per batch, in model input order
    (constants included); nothing is held between batches beyond the file (or .npz member) currently being read.
    `columns`: name -> a column (`info`, `axis`, `rows`, `sample_shape`, `pieces(sizes, factor)`, `files_used`);
    `constants`: name -> calibrun.data.inputs.Constant; `order`: the model's input names.
    """

    def __init__(self, kind: str, columns: dict, factor: float, batches: int, where: str, extra: dict | None = None,
                 constants: dict[str, Constant] | None = None, order: Sequence[str] | None = None):
        self.kind = kind
        self.columns = columns
        self.constants = constants or {}
        self.order = list(order) if order is not None else [*columns, *self.constants]
        self.axes = source_axes(columns, self.constants)
        self.factor = check_factor(factor)
        self.requested = check_positive_int(batches, "batches", MAX_BATCHES)
        infos = [column.info for column in columns.values()]
        self.rows_per_batch, pinned = _rows_per_batch(infos, self.axes)
        first = next(iter(columns.values()))
        self.batches, self.rows = _plan(first.rows, self.rows_per_batch, pinned, self.requested, where)
        self.sizes = [min(self.rows_per_batch, self.rows - i * self.rows_per_batch) for i in range(self.batches)]
        self._extra = extra or {}
        self._identity: dict | None = None

    @property
    def input_names(self) -> list[str]:
        return list(self.order)

    def batch_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {name: batch_shape(col.sample_shape, col.axis, self.rows_per_batch)
                  for name, col in self.columns.items()}
        shapes.update({name: c.fed(self.rows_per_batch).shape for name, c in self.constants.items()})
        return {name: shapes[name] for name in self.order}

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        streams = {name: column.pieces(self.sizes, self.factor) for name, column in self.columns.items()}
        for size in self.sizes:
            feeds = {name: next(stream) for name, stream in streams.items()}
            feeds.update({name: c.fed(size) for name, c in self.constants.items()})
            yield {name: feeds[name] for name in self.order}

    def arrays(self, name: str | None = None) -> _InputArrays:
        """A sized, re-iterable view of one input's batches (plain arrays; same identity), for the
        single-input pipeline `make_reader(arrays, input_name)`. `name` defaults to the only input."""
        if name is None:
            if len(self.columns) != 1 or self.constants:
                raise CalibrunError(f"this source feeds several inputs ({', '.join(self.order)}); name one")
            name = next(iter(self.columns))
        if name not in self.columns:
            raise CalibrunError(f"this source feeds no input {name!r} (inputs: {', '.join(self.columns)})")
        return _InputArrays(self, name)

    def identity(self) -> dict:
        """Everything that decides the arrays (JSON-able; enters the calibration cache key). Hashes the files
        used once and remembers the answer."""
        if self._identity is None:
            files = [f for column in self.columns.values() for f in column.files_used(self.rows)]
            dtypes = {name: input_dtype(column.info) for name, column in self.columns.items()}
            dtypes.update({name: c.array.dtype for name, c in self.constants.items()})
            identity = {
                "source": self.kind,
                "files": _hashes(files),
                **self._extra,
                "factor": self.factor,
                "cast": "float64 multiply, then float32",
                "batches": self.batches,
                "rows_per_batch": self.rows_per_batch,
                "rows": self.rows,
                "inputs": [input_identity(name, shape, dtypes[name], self.axes[name], self.constants.get(name))
                           for name, shape in self.batch_shapes().items()],
            }
            if self.sizes and self.sizes[-1] != self.rows_per_batch:
                identity["last_batch_rows"] = self.sizes[-1]
            self._identity = identity
        return dict(self._identity)

    def __repr__(self) -> str:
        return (f"FeedBatches({self.kind}, inputs={self.input_names}, batches={self.batches}, "
                f"rows_per_batch={self.rows_per_batch}, factor={self.factor})")


class _InputArrays:
    def __init__(self, feeds: FeedBatches, name: str):
        self.feeds, self.name = feeds, name

    def __len__(self) -> int:
        return len(self.feeds)

    def __iter__(self) -> Iterator[np.ndarray]:
        column = self.feeds.columns[self.name]
        return column.pieces(self.feeds.sizes, self.feeds.factor)

    def identity(self) -> dict:
        return self.feeds.identity()


class EvalData:
    """The evaluation rows of every input (in its declared type, never scaled), served batch by batch, plus int64 class
    labels when the source has them (labels are small: they are held).

    `batches(size)` yields `(feeds, labels)` with `size` rows per batch (the last one shorter), reading only
    that batch; nothing of an earlier batch is kept. `feeds` concatenates every row into memory at once: it is
    there for small data and old callers, the measurement never uses it.
    """

    def __init__(self, rows: int, pieces, labels: np.ndarray | None = None, classes: tuple[str, ...] | None = None,
                 identity: dict | None = None, inputs: Sequence[str] = (), axes: dict | None = None):
        self.rows = int(rows)
        self.axes = dict(axes or {})  # input name -> batch axis (None: a constant); a name not here: axis 0
        self._pieces = pieces  # sizes -> iterator of feeds dicts
        self.labels = labels
        self.classes = classes  # class folder names, for image class folders
        self.identity = identity if identity is not None else {}  # source kind, files, transform, rows
        self.inputs = list(inputs)
        self.state: dict[str, str] = {}  # input -> the output it takes back on the next row (calibrun.measure.feedback)
        # where the labels come from, as (first row, where) spans in row order: an error names the file
        self.label_sources: list[tuple[int, str]] = []

    def label_where(self, row: int) -> str:
        """The file (or folder) that holds the label of evaluation row `row`."""
        found = "the evaluation labels"
        for start, where in self.label_sources:
            if start <= row:
                found = where
        return found

    def check_labels(self, classes: int, output: str) -> None:
        """Every label is a class of the model's output (0..classes-1): one outside is refused naming its file,
        row and value (accuracy against it would be silently wrong)."""
        if self.labels is None:
            return
        bad = np.flatnonzero((self.labels < 0) | (self.labels >= classes))
        if bad.size:
            row = int(bad[0])
            raise CalibrunError(f"{self.label_where(row)}: label {int(self.labels[row])} (row {row}) is not a class "
                                f"of output {output!r}, which has {classes} classes (0..{classes - 1})")

    @classmethod
    def from_arrays(cls, feeds: dict[str, np.ndarray], labels=None, classes=None, identity=None,
                    axes: dict | None = None) -> EvalData:
        """Rows already in memory (small data, tests); `axes`: each input's batch axis (default 0)."""
        rows = rowsmod.count(feeds, axes)

        def pieces(sizes):
            start = 0
            for size in sizes:
                yield rowsmod.take(feeds, axes, start, start + size)
                start += size

        return cls(rows, pieces, labels, classes, identity, list(feeds), axes)

    def head(self, rows: int) -> EvalData:
        """The first `rows` rows (all of them when there are fewer), served the same way."""
        if rows >= self.rows:
            return self
        labels = None if self.labels is None else self.labels[:rows]
        head = EvalData(rows, self._pieces, labels, self.classes, {**self.identity, "rows": rows}, self.inputs,
                        self.axes)
        head.label_sources, head.state = self.label_sources, self.state
        return head

    def sizes(self, size: int) -> list[int]:
        size = check_positive_int(size, "batch size")
        return [min(size, self.rows - start) for start in range(0, self.rows, size)]

    def batches(self, size: int) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray | None]]:
        start = 0
        for feeds in self._pieces(self.sizes(size)):
            rows = rowsmod.count(feeds, self.axes)
            labels = None if self.labels is None else self.labels[start : start + rows]
            start += rows
            yield feeds, labels

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        """Every row of every input in memory (see the class docstring: not for big data)."""
        return rowsmod.join([feeds for feeds, _ in self.batches(EVAL_CHUNK)], self.axes)


def _column_pieces(columns: dict, rows: int, constants: dict[str, Constant] | None = None,
                   order: Sequence[str] | None = None):
    """sizes -> feeds, reading the first `rows` rows of each column batch by batch (one file at a time), the
    constants fed with each."""
    constants = constants or {}
    order = list(order) if order is not None else [*columns, *constants]

    def pieces(sizes):
        if sum(sizes) > rows:
            raise CalibrunError(f"{sum(sizes)} evaluation rows asked of {rows}")
        streams = {name: column.pieces(sizes, 1.0) for name, column in columns.items()}
        for size in sizes:
            feeds = {name: next(stream) for name, stream in streams.items()}
            feeds.update({name: c.fed(size) for name, c in constants.items()})
            yield {name: feeds[name] for name in order}

    return pieces


def source_axes(columns: dict, constants: dict[str, Constant]) -> dict[str, int | None]:
    """Each fed input's batch axis: its column's, or its constant's (None: fed whole)."""
    return {**{name: column.axis for name, column in columns.items()},
            **{name: c.axis for name, c in constants.items()}}
