"""Calibration batches and evaluation rows read from .npy/.npz files (the batch rules: calibrun.data.batches).

- npy: `path` is a `.npy` file (the rows of the single input the files feed), a `.npz` file (one key per input
  name, an optional `labels` key), or a folder of them (top level only; every `.npy`/`.npz` sorted by file name and
  concatenated along each input's batch axis; with several inputs the folder may instead hold one
  `<input_name>.npy` per input). A `labels.npy` in a folder holds labels. A single-input model also takes an
  `.npz` whose only (non-`labels`) key has another name (`numpy.savez(f, x)` writes `arr_0`). Extra `.npz` keys
  are ignored.
  Rows are counted and joined along each input's batch axis (calibrun.data.rows). An array with no batch axis
  (0-d for a scalar input, or one axis fewer than the input) is a constant fed with every batch (the same in
  every file); `data.inputs.<name>.value` sets one instead of the files. Each input is fed in its declared type
  (calibrun.data.inputs). Files are only ever opened with `allow_pickle=False`; headers are read first, so
  object, string and complex arrays fail before any data is loaded. A `.npy` file is memory-mapped and an `.npz`
  member loaded only when a batch needs it, so a pass over a big folder holds one file (one member) per input at a
  time.
"""

from __future__ import annotations

import logging
import math
import os
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibrun.core.errors import CalibrunError, one_line
from calibrun.data import inputs as feeding
from calibrun.data.batches import (
    EVAL_CHUNK,
    EvalData,
    FeedBatches,
    _cap_rows,
    _column_pieces,
    _File,
    _listed,
    batch_shape,
    check_inputs,
    source_axes,
)
from calibrun.data.inputs import Constant, declared, spelled
from calibrun.data.inputs import fmt_shape as _fmt_shape
from calibrun.data.rows import along, is_fixed
from calibrun.model import InputInfo

log = logging.getLogger("calibrun")

NPY_SUFFIXES = (".npy", ".npz")
LABELS = "labels"


@dataclass(frozen=True)
class _Segment:
    """One array in one file: a .npy file (key None) or an .npz member."""

    file: _File
    key: str | None
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def where(self) -> str:
        return str(self.file.path) if self.key is None else f"{self.file.path}[{self.key!r}]"

    def load(self) -> np.ndarray:
        """The array: memory-mapped for .npy and for an .npz member stored uncompressed (numpy.savez), loaded (this
        member only) for a compressed one (numpy.savez_compressed: its bytes must be inflated to be read; `rows`
        streams it instead)."""
        self.file.check()
        try:
            if self.key is None:
                array = np.load(self.file.path, mmap_mode="r", allow_pickle=False)
            else:
                array = _mapped_member(self.file.path, self.key)
                if array is None:
                    with np.load(self.file.path, allow_pickle=False) as archive:
                        array = archive[self.key]
        except Exception as exc:  # ValueError, OSError, zipfile.BadZipFile, EOFError ...
            raise CalibrunError(f"cannot read {self.where}: {one_line(exc)}") from exc
        if tuple(array.shape) != self.shape or array.dtype != self.dtype:
            raise CalibrunError(f"{self.where} changed after calibrun scanned it; start again")
        return array

    def rows(self, axis: int) -> Callable[[int, int], np.ndarray]:
        """`read(start, stop)`: the rows start:stop along `axis`, asked for in order, each start the last stop. A
        compressed .npz member in C order with its rows on axis 0 is inflated as they are asked for (a
        numpy.savez_compressed file of 6000 rows of which a job reads 256 had been inflated whole, every pass);
        any other array is loaded (memory-mapped where it can be) and sliced."""
        stream = self._compressed_rows() if axis == 0 else None
        if stream is None:
            array = self.load()
            return lambda start, stop: along(array, axis, start, stop)
        return stream

    def _compressed_rows(self) -> Callable[[int, int], np.ndarray] | None:
        """A reader of a compressed member's rows in order (None where the member is stored uncompressed, in
        Fortran order, holds objects or is not one)."""
        if self.key is None or self.dtype.hasobject or 0 in self.shape or not self.shape:
            return None
        self.file.check()
        archive = None
        try:
            archive = zipfile.ZipFile(self.file.path)
            info = archive.getinfo(f"{self.key}.npy")
            if info.compress_type == zipfile.ZIP_STORED:
                archive.close()
                return None
            member = archive.open(info)
            shape, fortran, dtype = _npy_header(member)
            if shape != self.shape or dtype != self.dtype:
                raise CalibrunError(f"{self.where} changed after calibrun scanned it; start again")
        except Exception as exc:  # zipfile.BadZipFile, KeyError, ValueError, OSError ...
            if archive is not None:
                archive.close()
            if isinstance(exc, CalibrunError):
                raise
            raise CalibrunError(f"cannot read {self.where}: {one_line(exc)}") from exc
        if fortran:
            archive.close()
            return None
        row_shape, row_bytes = self.shape[1:], self.dtype.itemsize * math.prod(self.shape[1:])
        at = [0]

        def read(start: int, stop: int) -> np.ndarray:
            if start != at[0]:
                raise ValueError(f"{self.where}: rows {start}:{stop} asked for after row {at[0]} (read in order only)")
            try:
                data = member.read((stop - start) * row_bytes)
            except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:  # a bad CRC, a truncated stream
                raise CalibrunError(f"cannot read {self.where}: {one_line(exc)}") from exc
            if len(data) != (stop - start) * row_bytes:
                raise CalibrunError(f"cannot read {self.where}: the archive ends before row {stop}")
            at[0] = stop
            if stop == self.shape[0]:
                archive.close()
            return np.frombuffer(data, self.dtype).reshape((stop - start, *row_shape))

        return read


def _mapped_member(path: Path, key: str) -> np.ndarray | None:
    """The .npz member `key` memory-mapped where the archive stores it uncompressed (numpy.savez does): its .npy bytes
    lie whole in the file at the member's data offset. None where it is compressed or empty (then it is loaded):
    a 1.3 GB npz of which a job reads 64 rows had cost 1.3 GB more memory than the same rows as .npy."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{key}.npy")
    if info.compress_type != zipfile.ZIP_STORED or info.file_size == 0:
        return None
    with open(path, "rb") as fp:
        fp.seek(info.header_offset)
        local = fp.read(30)  # the member's local header: its name and extra field lengths at bytes 26..29
        if local[:4] != b"PK\x03\x04":
            return None
        names = int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
        fp.seek(info.header_offset + 30 + names)
        try:
            shape, fortran, dtype = _npy_header(fp)
        except ValueError:  # a format version numpy's reader does not know: loaded, which says so
            return None
        offset = fp.tell()
    if dtype.hasobject or 0 in shape:
        return None
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def _npy_header(fp) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) of the .npy bytes at `fp` (left at the array's first byte); ValueError for a
    format version numpy's reader does not know."""
    version = np.lib.format.read_magic(fp)
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read is None:
        raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
    shape, fortran, dtype = read(fp)
    return tuple(int(d) for d in shape), bool(fortran), np.dtype(dtype)


def _read_header(fp, where: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        shape, _, dtype = _npy_header(fp)
    except Exception as exc:
        raise CalibrunError(f"{where}: not a readable .npy array ({one_line(exc)})") from exc
    return shape, dtype


def _scan_npy(file: _File) -> _Segment:
    try:
        with open(file.path, "rb") as fp:
            shape, dtype = _read_header(fp, str(file.path))
    except OSError as exc:
        raise CalibrunError(f"cannot read {file.path}: {one_line(exc)}") from exc
    return _Segment(file, None, shape, dtype)


def _scan_npz(file: _File) -> dict[str, _Segment]:
    segments = {}
    try:
        with zipfile.ZipFile(file.path) as archive:
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    continue
                key = member[: -len(".npy")]
                with archive.open(member) as fp:
                    shape, dtype = _read_header(fp, f"{file.path}[{key!r}]")
                segments[key] = _Segment(file, key, shape, dtype)
    except CalibrunError:
        raise
    except Exception as exc:
        raise CalibrunError(f"{file.path}: not a readable .npz archive ({one_line(exc)})") from exc
    if not segments:
        raise CalibrunError(f"{file.path}: the .npz archive holds no arrays")
    return segments


def _fits(shape: Sequence[int], declared_shape: Sequence, axis: int) -> bool:
    """Whether data of `shape` fits the declared shape with its rows on `axis` (every other fixed size equal)."""
    return len(shape) == len(declared_shape) and all(
        not is_fixed(d) or shape[k] == d for k, d in enumerate(declared_shape) if k != axis)


def _rows_axis(segment: _Segment, info: InputInfo, axis: int, key: str) -> int:
    """The inferred batch axis, unless the data cannot hold its rows there and can on axis 0 where the model fixes
    axis 0 at 1: then axis 0 (the rule's own fallback, the usual batch axis), said in one line. A model that pins its
    batch to one row and leaves another axis free (ddddocr's OCR input [1, 1, 64, W]; trueocr's `feats` [1, N, 16])
    has that free axis inferred as its rows, and its data [rows, 1, 64, 160] fits only with the rows on axis 0: fed
    one row at a time, as batch_axis=0 would. Another axis fixed at 1 is no such evidence: [N, 1] data saved as
    [20, 2] is a wrong width, not 2 rows of 20."""
    if axis == 0 or info.shape[0] != 1 or _fits(segment.shape, info.shape, axis) \
            or not _fits(segment.shape, info.shape, 0):
        return axis
    log.info("%s: input %s: %s holds %d on axis 0, which the model fixes at 1: its rows, fed one at a time (set "
             "%s.inputs.%s.batch_axis to choose)", key, declared(info), segment.where, segment.shape[0], key,
             spelled(info.name))
    return 0


class RowsOnNewAxis(CalibrunError):
    """Rows stacked on a first axis the input does not declare (every axis of it fixed, the data one axis more, the
    rest the input's shape): a model whose every input is so gets that axis added (calibrun.model.row_axis)."""


def _check_data_shape(segment: _Segment, info: InputInfo, axis: int, key: str = "data") -> None:
    shape = segment.shape
    if len(shape) != len(info.shape):
        message = (f"input {declared(info)}: {segment.where} has shape {_fmt_shape(shape)} (rank {len(shape)}); the "
                   f"input has rank {len(info.shape)}" + (" (or one axis fewer, for a constant row)" if info.shape
                                                          else ""))
        if len(shape) == len(info.shape) + 1 and all(map(is_fixed, info.shape)) and list(shape[1:]) == list(info.shape):
            # rows stacked on a new first axis (a streaming denoiser's [512] frames and its states): fed one row a
            # run where no input has a batch axis (calibrun.job); beside inputs with rows, this one has none
            raise RowsOnNewAxis(message + "; every axis of it is fixed: rows stacked on a first axis run where no "
                                "input of the model has a batch axis (calibrun adds one); beside an input with one, it "
                                "has no rows and is fed whole with every batch (save it without the first axis, or set "
                                f"{key}.inputs.{spelled(info.name)}.value=...)")
        raise CalibrunError(message)
    for index, dim in enumerate(info.shape):
        if index != axis and is_fixed(dim) and shape[index] != dim:
            # rows on that axis instead would fit (an axis fixed at more than 1, or one a batch_axis set): say how
            fits = _fits(shape, info.shape, index)
            other = "data" if key == "eval_data" else "eval_data"
            hint = (f"; if the rows are on axis {index}, set {key}.inputs.{spelled(info.name)}.batch_axis={index} (and "
                    f"the same under {other}.)") if fits else ""
            raise CalibrunError(
                f"input {declared(info)}: {segment.where} has shape {_fmt_shape(shape)}: axis {index} is "
                f"{shape[index]}, the model wants {dim} (rows are on axis {axis}){hint}"
            )


def _check_labels(segment: _Segment) -> None:
    if segment.dtype.hasobject or segment.dtype.kind not in "iu":
        raise CalibrunError(f"{segment.where}: labels must be integers, got dtype {segment.dtype}")
    if len(segment.shape) != 1:
        raise CalibrunError(f"{segment.where}: labels must be 1-D, got shape {_fmt_shape(segment.shape)}")


class _ArrayColumn:
    """The rows of one input: segments concatenated along its batch axis, cast to the input's type."""

    def __init__(self, info: InputInfo, segments: list[_Segment], axis: int, key: str = "data"):
        self.info = info
        self.axis = axis
        self.segments = segments
        self.float = feeding.is_float(info)
        for segment in segments:
            feeding.check_dtype(segment.dtype, info, segment.where)
            _check_data_shape(segment, info, axis, key)
        first = segments[0]
        sample = _drop(first.shape, axis)
        for segment in segments[1:]:
            if _drop(segment.shape, axis) != sample:
                raise CalibrunError(
                    f"input {declared(info)}: {segment.where} rows of shape {_fmt_shape(_drop(segment.shape, axis))} "
                    f"differ from {first.where} rows of shape {_fmt_shape(sample)}"
                )
        self.rows = sum(s.shape[axis] for s in segments)
        self.sample_shape = sample

    def files_used(self, rows: int) -> list[_File]:
        used, start = [], 0
        for segment in self.segments:
            if start >= rows:
                break
            if segment.shape[self.axis]:
                used.append(segment.file)
            start += segment.shape[self.axis]
        return used

    def pieces(self, sizes: Sequence[int], factor: float) -> Iterator[np.ndarray]:
        """Consecutive blocks of rows along the batch axis, sizes[i] rows each, in the input's type (`factor`
        multiplies float inputs only); one segment loaded at a time."""
        factor = factor if self.float else 1.0
        axis = self.axis
        segments = iter(s for s in self.segments if s.shape[axis])
        segment, read, offset = None, None, 0
        for size in sizes:
            parts = []
            need = size
            while need:
                if read is None or offset == segment.shape[axis]:
                    read = None  # drop the previous file before opening the next
                    segment = next(segments)
                    read, offset = segment.rows(axis), 0
                take = min(need, segment.shape[axis] - offset)
                parts.append(feeding.cast(read(offset, offset + take), self.info, factor, segment.where, offset))
                offset += take
                need -= take
            yield parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)


def _drop(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + shape[axis + 1:]


def _file_constant(info: InputInfo, segments: list[_Segment], axis: int | None) -> Constant:
    """An input whose arrays have no batch axis: the same constant in every file."""
    first = segments[0].load()
    for segment in segments[1:]:
        if not np.array_equal(segment.load(), first):
            raise CalibrunError(f"input {declared(info)}: {segment.where} differs from {segments[0].where}; a "
                                "constant (an array without the batch axis) must be the same in every file")
    return feeding.constant(info, first, axis, segments[0].where)


def _npy_files(root: Path) -> list[Path]:
    if not root.exists():
        raise CalibrunError(f"data path not found: {root}")
    if root.is_file():
        if root.suffix.lower() not in NPY_SUFFIXES:
            raise CalibrunError(f"{root}: not a .npy or .npz file (or a folder of them)")
        return [root]
    if not root.is_dir():
        raise CalibrunError(f"data path is neither a file nor a folder: {root}")
    entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    if not entries:
        raise CalibrunError(f"data folder is empty: {root}")
    files = [p for p in entries if p.is_file() and p.suffix.lower() in NPY_SUFFIXES]
    if not files:
        raise CalibrunError(f"no .npy or .npz files in {root}")
    return files


class _NpySource:
    """The layout of an npy source: one column of segments per input, plus optional labels."""

    def __init__(self, path, inputs: Sequence[InputInfo], given: dict | None = None, key: str = "data"):
        inputs = list(inputs)
        given = feeding.overrides(given, inputs, key)
        self.axes = feeding.batch_axes(inputs, given, key)
        self.order = [info.name for info in inputs]
        self.constants = feeding.config_constants(inputs, given, self.axes, key)
        from_files = [info for info in inputs if info.name not in self.constants]
        for info in from_files:  # the type and shape are checked before any file is read
            feeding.input_dtype(info)
            if not info.has_shape:
                raise CalibrunError(f"input {declared(info)} has no known shape (not even a rank)")
        root = Path(os.path.expanduser(str(path)))
        self.root = root
        paths = _npy_files(root)
        names = [info.name for info in from_files]
        if not names:
            raise CalibrunError(f"config {key}.inputs: every input is a constant; the data at {root} feeds none")
        single = len(names) == 1
        folder = root.is_dir()
        base = root if folder else root.parent
        files = {p: _File.scan(p, p.relative_to(base).as_posix()) for p in paths}

        labels_file = None
        if folder and LABELS not in names:
            labels_file = next((p for p in paths if p.name == "labels.npy"), None)
            paths = [p for p in paths if p != labels_file]
            if not paths:
                raise CalibrunError(f"no data files beside labels.npy in {root}")
        npy = [p for p in paths if p.suffix.lower() == ".npy"]
        npz = [p for p in paths if p.suffix.lower() == ".npz"]

        columns: dict[str, list[_Segment]] = {name: [] for name in names}
        label_segments: list[_Segment] = []
        if not single and not folder and npy:
            raise CalibrunError(
                f"{root} holds one array, the model has inputs {', '.join(names)}: use an .npz with one key "
                "per input, or a folder of <input_name>.npy files"
            )
        if not single and npy:
            if npz:
                raise CalibrunError(f"{root} mixes .npy and .npz files; with several inputs use one layout")
            # One <input_name>.npy per input.
            by_name = {p.name[: -len(p.suffix)]: p for p in npy}
            for name in names:
                if name not in by_name:
                    raise CalibrunError(f"no data for input {name!r}: expected {name}.npy in {root}")
            extra = sorted(p.name for stem, p in by_name.items() if stem not in names)
            if extra:
                raise CalibrunError(f"{root}: {', '.join(extra)} name no model input (inputs: {', '.join(names)})")
            for name in names:
                columns[name].append(_scan_npy(files[by_name[name]]))
        else:
            for p in paths:
                if p.suffix.lower() == ".npy":
                    columns[names[0]].append(_scan_npy(files[p]))
                    continue
                members = _scan_npz(files[p])
                data_keys = [k for k in members if k != LABELS or LABELS in names]
                for name in names:
                    if name in members:
                        member = name
                    elif single and len(data_keys) == 1:
                        member = data_keys[0]
                    else:
                        info = next(i for i in from_files if i.name == name)
                        hint = f"; or set {key}.inputs.{spelled(name)}.value=..." if not info.shape else ""
                        raise CalibrunError(f"{p}: no array for input {declared(info)} (keys: "
                                            f"{', '.join(sorted(members)) or 'none'}){hint}")
                    columns[name].append(members[member])
                if LABELS in members and LABELS not in names:
                    label_segments.append(members[LABELS])
            if label_segments and len(label_segments) != len(paths):
                lacking = [p.name for p in paths if all(s.file.path != p for s in label_segments)]
                raise CalibrunError(f"{root}: some data files have labels and some do not ({', '.join(lacking)})")

        self.columns = {}
        for info in from_files:
            segments = columns[info.name]
            axis = self.axes[info.name]
            if axis is None or len(segments[0].shape) < len(info.shape):  # no batch axis in the data: a constant
                self.constants[info.name] = _file_constant(info, segments, axis)
                continue
            if given.get(info.name, {}).get("batch_axis") is None:  # inferred: the data may show where the rows are
                axis = _rows_axis(segments[0], info, axis, key)
            self.columns[info.name] = _ArrayColumn(info, segments, axis, key)
        self.inputs = [info for info in inputs if info.name in self.columns or info.name in self.constants]
        check_inputs(self.inputs, self.constants, self.axes, key)
        self.axes = source_axes(self.columns, self.constants)
        _check_row_counts(self.columns, root, key)
        self.rows = next(iter(self.columns.values())).rows

        self.labels: list[_Segment] = []
        if labels_file is not None:
            self.labels = [_scan_npy(files[labels_file])]
        elif label_segments:
            self.labels = label_segments
        for segment in self.labels:
            _check_labels(segment)
        labelled = sum(s.shape[0] for s in self.labels)
        if self.labels and labelled != self.rows:
            raise CalibrunError(f"{root}: {labelled} labels for {self.rows} rows of data")


def _check_row_counts(columns: dict[str, _ArrayColumn], root: Path, key: str = "data") -> None:
    """The batched inputs hold as many rows in each file (rows are matched file by file) and in all."""
    if len(columns) < 2:
        return
    per_file: dict[Path, dict[str, int]] = {}
    for name, column in columns.items():
        for segment in column.segments:
            counts = per_file.setdefault(segment.file.path, {})
            counts[name] = counts.get(name, 0) + segment.shape[column.axis]
    # an input whose declared axes are all fixed (an RNN's [25] state beside [T, F] frames) has no rows of its own
    fixed = [name for name, column in columns.items() if column.info.shape and all(map(is_fixed, column.info.shape))]
    hint = (f"; {', '.join(repr(n) for n in fixed)} declare{'s' if len(fixed) == 1 else ''} no free axis: a constant "
            "is saved without its first axis (a 0-d array for one value, filled to the declared shape) or given as "
            f"{key}.inputs.{spelled(fixed[0])}.value=...") if fixed else ""
    for path, counts in per_file.items():
        if len(counts) == len(columns) and len(set(counts.values())) > 1:
            raise CalibrunError(f"{path}: the inputs' arrays hold different row counts (along their batch axes): "
                                f"{counts}{hint}")
    totals = {name: column.rows for name, column in columns.items()}
    if len(set(totals.values())) > 1:
        raise CalibrunError(f"{root}: the inputs have different row counts (along their batch axes): {totals}{hint}")
    _check_shared_axes(columns)


def _check_shared_axes(columns: dict[str, _ArrayColumn]) -> None:
    """Inputs whose shapes name one free axis alike (`sequence_length` of a text model's ids and mask) hold one size
    on it in each file: the model computes them together, and onnxruntime refused the mismatch only when the batch
    ran (for an evaluation file, after the calibration and the quantisation)."""
    seen: dict[tuple[Path, str], tuple[str, int, str]] = {}  # (file, axis name) -> (input, size, where)
    for name, column in columns.items():
        for segment in column.segments:
            for index, dim in enumerate(column.info.shape):
                if index == column.axis or is_fixed(dim) or not isinstance(dim, str) or index >= len(segment.shape):
                    continue
                first = seen.setdefault((segment.file.path, dim), (name, segment.shape[index], segment.where))
                if first[1] != segment.shape[index]:
                    raise CalibrunError(f"inputs {first[0]!r} and {name!r} share the axis the model names {dim!r}, "
                                        f"and the data holds {first[1]} on it in {first[2]} and "
                                        f"{segment.shape[index]} in {segment.where}")


def npy_calibration(path, inputs: Sequence[InputInfo], batches: int, factor: float = 1.0,
                    given: dict | None = None, key: str = "data") -> FeedBatches:
    """Calibration batches from a .npy file, an .npz file or a folder of them (see the module docstring);
    `given`: the `data.inputs` node (constants, batch axes)."""
    source = _NpySource(path, inputs, given, key)
    return FeedBatches("npy", source.columns, factor, batches, str(source.root), constants=source.constants,
                       order=source.order)


def npy_evaluation(path, inputs: Sequence[InputInfo], rows: int | None = None, given: dict | None = None,
                   key: str = "eval_data") -> EvalData:
    """Evaluation rows of every input (in its declared type), capped at `rows`, read batch by batch; labels from
    an npz `labels` key or a `labels.npy` in the folder."""
    source = _NpySource(path, inputs, given, key)
    used = _cap_rows(source.rows, rows, str(source.root))
    labels = None
    spans = []
    if source.labels:
        parts = [segment.load() for segment in source.labels]
        labels = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])[:used]
        start = 0
        for segment, part in zip(source.labels, parts, strict=True):
            spans.append((start, segment.where))
            start += len(part)
    files = [f for column in source.columns.values() for f in column.files_used(used)]
    files += [segment.file for segment in source.labels]
    identity = {
        "source": "npy",
        "files": _listed(files),
        "rows": used,
        "inputs": _eval_inputs(source, used),
    }
    order = source.order
    pieces = _column_pieces(source.columns, used, source.constants, order)
    # One pass that keeps nothing: NaN/Inf in a file fails here, before any work (memory-mapped, so cheap).
    for _ in pieces([min(EVAL_CHUNK, used - start) for start in range(0, used, EVAL_CHUNK)]):
        pass
    data = EvalData(used, pieces, labels, None, identity, order, source.axes)
    data.label_sources = spans
    return data


def _eval_inputs(source: _NpySource, used: int) -> list[dict]:
    """The evaluation inputs in result.json: name and shape (rows at the batch axis), and what differs from a
    float32 input with rows on axis 0."""
    entries = []
    for name, column in source.columns.items():
        entry = {"name": name, "shape": list(batch_shape(column.sample_shape, column.axis, used))}
        if column.axis != 0:
            entry["batch_axis"] = column.axis
        if feeding.input_dtype(column.info) != np.float32:
            entry["dtype"] = str(feeding.input_dtype(column.info))
        entries.append(entry)
    entries += [{"name": name, "constant": c.identity()} for name, c in source.constants.items()]
    return entries
