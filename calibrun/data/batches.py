"""The batch protocol every data source serves, and the helpers the file sources (npy.py, images.py) share.

User data sources: calibration batches and evaluation rows read from .npy/.npz files or image folders.

Calibration (`npy_calibration`, `image_calibration`) gives a `FeedBatches`: sized, lazy, re-iterable and
deterministic, one feed `{input_name: float32 batch}` per batch, with an `identity()` for the calibration
cache. Evaluation (`npy_evaluation`, `image_evaluation`) gives an `EvalData` that serves the evaluation rows
batch by batch (never all at once), plus class labels when the source has them.

The rules every source follows
- batches: 16 rows (calibrun.lab.ROWS_PER_BATCH), or `b` when the model pins its first axis to `b`; the first
  `batches` batches are used. With too few rows for `batches` full batches, what there is is used and a
  warning goes to the "calibrun" logger. A trailing partial batch is KEPT (as a smaller last batch) when the
  first axis is symbolic, and DROPPED when the model pins it (the model cannot take another batch size).
- values: each batch is multiplied by `factor` in float64, then cast to float32 (the lab rule's
  cast-after-multiply; with factor 1 this is exactly `astype(float32)`). Float and integer data are accepted;
  NaN/Inf in a file, or values that overflow float32 after the factor, fail naming the file.
- model inputs must be float32 with a known rank; the data's rank and every non-symbolic axis beyond the first
  must match; symbolic axes beyond the first take the data's size (the same in every file).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto

from calibrun.bounds import MAX_BATCHES, check_factor, check_positive_int
from calibrun.data.lab import fixed_rows
from calibrun.errors import CalibrunError
from calibrun.lab import ROWS_PER_BATCH
from calibrun.model import InputInfo, file_sha256

logger = logging.getLogger("calibrun")

EVAL_CHUNK = 1024  # rows converted at a time when evaluation data is read


def _fmt_shape(shape: Sequence) -> str:
    return "[" + ", ".join("?" if d is None or d == "" else str(d) for d in shape) + "]"


def _is_fixed(dim) -> bool:
    return isinstance(dim, int) and not isinstance(dim, bool) and dim > 0


def _check_inputs(inputs: Sequence[InputInfo]) -> list[InputInfo]:
    inputs = list(inputs)
    if not inputs:
        raise CalibrunError("the model has no graph input to feed")
    names = [info.name for info in inputs]
    if len(set(names)) != len(names):
        raise CalibrunError(f"the model's input names are not unique: {names}")
    for info in inputs:
        if info.elem_type != TensorProto.FLOAT:
            type_name = TensorProto.DataType.Name(info.elem_type) if info.elem_type else "unknown"
            raise CalibrunError(f"input {info.name!r} is {type_name}; calibrun data sources feed float32 inputs only")
        if not info.shape:
            raise CalibrunError(f"input {info.name!r} has no known shape (rank 0 or missing)")
    return inputs


def _rows_per_batch(inputs: Sequence[InputInfo]) -> tuple[int, bool]:
    """(rows per batch, pinned): every pinned first axis must agree (all inputs share one batch)."""
    pinned = {info.name: fixed_rows(info) for info in inputs if fixed_rows(info) is not None}
    if len(set(pinned.values())) > 1:
        raise CalibrunError(f"the model pins different first axes on its inputs: {pinned}")
    if pinned:
        return next(iter(pinned.values())), True
    return ROWS_PER_BATCH, False


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


def _to_float32(raw: np.ndarray, factor: float, where: str, first_row: int) -> np.ndarray:
    """(raw * factor) computed in float64, then cast to float32; NaN/Inf/overflow name the file and row."""
    values = np.asarray(raw, dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        row = first_row + int(np.argwhere(bad)[0][0])
        raise CalibrunError(f"{where}: NaN or Inf in row {row}")
    with np.errstate(over="ignore"):  # overflow is reported below, naming the file
        out = (values * factor).astype(np.float32) if factor != 1.0 else values.astype(np.float32)
    bad = ~np.isfinite(out)
    if bad.any():
        row = first_row + int(np.argwhere(bad)[0][0])
        scaled = f" multiplied by {factor}" if factor != 1.0 else ""
        raise CalibrunError(f"{where}: row {row}{scaled} overflows float32")
    return out


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
            tail = f" plus a last batch of {rest} rows"
        else:
            tail = ""
        logger.warning(
            "%s: %d batches requested, the data has %d rows: %d full batches of %d%s; using %d batches",
            where, requested, total, full, per_batch, tail, count,
        )
    return count, min(total, count * per_batch)


def _cap_rows(total: int, rows: int | None, where: str) -> int:
    if total == 0:
        raise CalibrunError(f"{where}: no rows of data")
    if rows is None:
        return total
    rows = check_positive_int(rows, "rows")
    if rows > total:
        logger.warning("%s: %d evaluation rows requested, the data has %d; using %d", where, rows, total, total)
    return min(rows, total)


class FeedBatches:
    """Calibration batches from user files: sized, lazy, re-iterable and deterministic.

    Each iteration reopens the files and yields one feed `{input_name: float32 batch}` per batch, in model
    input order; nothing is held between batches beyond the file (or .npz member) currently being read.
    """

    def __init__(self, kind: str, columns: dict, factor: float, batches: int, where: str, extra: dict | None = None):
        self.kind = kind
        self.columns = columns
        self.factor = check_factor(factor)
        self.requested = check_positive_int(batches, "batches", MAX_BATCHES)
        infos = [column.info for column in columns.values()]
        self.rows_per_batch, pinned = _rows_per_batch(infos)
        first = next(iter(columns.values()))
        self.batches, self.rows = _plan(first.rows, self.rows_per_batch, pinned, self.requested, where)
        self.sizes = [min(self.rows_per_batch, self.rows - i * self.rows_per_batch) for i in range(self.batches)]
        self._extra = extra or {}
        self._identity: dict | None = None

    @property
    def input_names(self) -> list[str]:
        return list(self.columns)

    def batch_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: (self.rows_per_batch, *col.sample_shape) for name, col in self.columns.items()}

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        streams = {name: column.pieces(self.sizes, self.factor) for name, column in self.columns.items()}
        for _ in self.sizes:
            yield {name: next(stream) for name, stream in streams.items()}

    def arrays(self, name: str | None = None) -> _InputArrays:
        """A sized, re-iterable view of one input's batches (plain arrays; same identity), for the
        single-input pipeline `make_reader(arrays, input_name)`. `name` defaults to the only input."""
        if name is None:
            if len(self.columns) != 1:
                raise CalibrunError(f"this source feeds several inputs ({', '.join(self.columns)}); name one")
            name = next(iter(self.columns))
        if name not in self.columns:
            raise CalibrunError(f"this source feeds no input {name!r} (inputs: {', '.join(self.columns)})")
        return _InputArrays(self, name)

    def identity(self) -> dict:
        """Everything that decides the arrays (JSON-able; enters the calibration cache key). Hashes the files
        used once and remembers the answer."""
        if self._identity is None:
            files = [f for column in self.columns.values() for f in column.files_used(self.rows)]
            identity = {
                "source": self.kind,
                "files": _hashes(files),
                **self._extra,
                "factor": self.factor,
                "cast": "float64 multiply, then float32",
                "batches": self.batches,
                "rows_per_batch": self.rows_per_batch,
                "rows": self.rows,
                "inputs": [{"name": name, "batch_shape": list(shape)} for name, shape in self.batch_shapes().items()],
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
    """The evaluation rows of every input (float32, never scaled), served batch by batch, plus int64 class
    labels when the source has them (labels are small: they are held).

    `batches(size)` yields `(feeds, labels)` with `size` rows per batch (the last one shorter), reading only
    that batch; nothing of an earlier batch is kept. `feeds` concatenates every row into memory at once: it is
    there for small data and old callers, the measurement never uses it.
    """

    def __init__(self, rows: int, pieces, labels: np.ndarray | None = None, classes: tuple[str, ...] | None = None,
                 identity: dict | None = None, inputs: Sequence[str] = ()):
        self.rows = int(rows)
        self._pieces = pieces  # sizes -> iterator of feeds dicts
        self.labels = labels
        self.classes = classes  # class folder names, for image class folders
        self.identity = identity if identity is not None else {}  # source kind, files, transform, rows
        self.inputs = list(inputs)
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
    def from_arrays(cls, feeds: dict[str, np.ndarray], labels=None, classes=None, identity=None) -> EvalData:
        """Rows already in memory (small data, tests)."""
        rows = len(next(iter(feeds.values())))

        def pieces(sizes):
            start = 0
            for size in sizes:
                yield {name: array[start : start + size] for name, array in feeds.items()}
                start += size

        return cls(rows, pieces, labels, classes, identity, list(feeds))

    def head(self, rows: int) -> EvalData:
        """The first `rows` rows (all of them when there are fewer), served the same way."""
        if rows >= self.rows:
            return self
        labels = None if self.labels is None else self.labels[:rows]
        head = EvalData(rows, self._pieces, labels, self.classes, {**self.identity, "rows": rows}, self.inputs)
        head.label_sources = self.label_sources
        return head

    def sizes(self, size: int) -> list[int]:
        size = check_positive_int(size, "batch size")
        return [min(size, self.rows - start) for start in range(0, self.rows, size)]

    def batches(self, size: int) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray | None]]:
        start = 0
        for feeds in self._pieces(self.sizes(size)):
            rows = len(next(iter(feeds.values())))
            labels = None if self.labels is None else self.labels[start : start + rows]
            start += rows
            yield feeds, labels

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        """Every row of every input in memory (see the class docstring: not for big data)."""
        parts: dict[str, list[np.ndarray]] = {}
        for feeds, _ in self.batches(EVAL_CHUNK):
            for name, array in feeds.items():
                parts.setdefault(name, []).append(array)
        return {name: p[0] if len(p) == 1 else np.concatenate(p) for name, p in parts.items()}


def _column_pieces(columns: dict, rows: int):
    """sizes -> feeds, reading the first `rows` rows of each column batch by batch (one file at a time)."""

    def pieces(sizes):
        if sum(sizes) > rows:
            raise CalibrunError(f"{sum(sizes)} evaluation rows asked of {rows}")
        streams = {name: column.pieces(sizes, 1.0) for name, column in columns.items()}
        for _ in sizes:
            yield {name: next(stream) for name, stream in streams.items()}

    return pieces
