"""User data sources: calibration batches and evaluation rows read from .npy/.npz files or image folders.

Calibration (`npy_calibration`, `image_calibration`) gives a `FeedBatches`: sized, lazy, re-iterable and
deterministic, one feed `{input_name: float32 batch}` per batch, with an `identity()` for the calibration
cache. Evaluation (`npy_evaluation`, `image_evaluation`) gives an `EvalData` that serves the evaluation rows
batch by batch (never all at once), plus class labels when the source has them.

The rules
- npy: `path` is a `.npy` file (the rows of the single input), a `.npz` file (one key per input name, an
  optional `labels` key), or a folder of them (top level only; every `.npy`/`.npz` sorted by file name and
  concatenated along the first axis; with several inputs the folder may instead hold one `<input_name>.npy`
  per input). A `labels.npy` in a folder holds labels. A single-input model also takes an `.npz` whose only
  (non-`labels`) key has another name (`numpy.savez(f, x)` writes `arr_0`). Extra `.npz` keys are ignored.
  Files are only ever opened with `allow_pickle=False`; headers are read first, so object, string, bool and
  complex arrays fail before any data is loaded. A `.npy` file is memory-mapped and an `.npz` member loaded
  only when a batch needs it, so a pass over a big folder holds one file (one member) per input at a time.
- images: `path` is a folder of jpg/jpeg/png/bmp/webp/tif/tiff (any case), searched recursively, sorted by relative
  path; names starting with "." (and hidden folders) are skipped. When every image lies in a first-level
  subfolder (`path/<class>/...`), the label of an image is the index of its folder in the sorted folder names
  (torchvision's ImageFolder rule). See `ImageTransform` for the pixel pipeline.
- batches: 16 rows (calibrun.data.ROWS_PER_BATCH), or `b` when the model pins its first axis to `b`; the first
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

import dataclasses
import logging
import math
import os
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto

from calibrun.data import MAX_BATCHES, ROWS_PER_BATCH, check_factor, check_positive_int, fixed_rows
from calibrun.errors import CalibrunError, one_line
from calibrun.model import InputInfo, file_sha256

logger = logging.getLogger("calibrun")

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
NPY_SUFFIXES = (".npy", ".npz")
LABELS = "labels"
_EVAL_CHUNK = 1024  # rows converted at a time when evaluation data is read


# ----------------------------------------------------------------------------------------------- helpers


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


# ------------------------------------------------------------------------------------------- npy files


@dataclass(frozen=True)
class _Segment:
    """One array in one file: a .npy file (key None) or an .npz member."""

    file: _File
    key: str | None
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def where(self) -> str:
        return str(self.file.path) if self.key is None else f"{self.file.path}[{self.key!r}]"

    def load(self) -> np.ndarray:
        """The array: memory-mapped for .npy, loaded (this member only) for .npz."""
        self.file.check()
        try:
            if self.key is None:
                array = np.load(self.file.path, mmap_mode="r", allow_pickle=False)
            else:
                with np.load(self.file.path, allow_pickle=False) as archive:
                    array = archive[self.key]
        except Exception as exc:  # ValueError, OSError, zipfile.BadZipFile, EOFError ...
            raise CalibrunError(f"cannot read {self.where}: {one_line(exc)}") from exc
        if tuple(array.shape) != self.shape or array.dtype != self.dtype:
            raise CalibrunError(f"{self.where} changed after calibrun scanned it; start again")
        return array


def _read_header(fp, where: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
    except Exception as exc:
        raise CalibrunError(f"{where}: not a readable .npy array ({one_line(exc)})") from exc
    return tuple(int(d) for d in shape), np.dtype(dtype)


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


def _check_data_dtype(segment: _Segment) -> None:
    dtype = segment.dtype
    if dtype.hasobject:
        raise CalibrunError(f"{segment.where}: object array (dtype {dtype}); calibrun never loads pickled data")
    if dtype.kind not in "fiu":
        raise CalibrunError(f"{segment.where}: dtype {dtype} is not numeric; calibrun needs float (or integer) data")


def _check_data_shape(segment: _Segment, info: InputInfo) -> None:
    shape = segment.shape
    if len(shape) != len(info.shape):
        raise CalibrunError(
            f"{segment.where}: array of shape {_fmt_shape(shape)} has rank {len(shape)}, "
            f"input {info.name!r} {_fmt_shape(info.shape)} has rank {len(info.shape)}"
        )
    for axis in range(1, len(shape)):
        dim = info.shape[axis]
        if _is_fixed(dim) and shape[axis] != dim:
            raise CalibrunError(
                f"{segment.where}: array of shape {_fmt_shape(shape)} does not fit input {info.name!r} "
                f"{_fmt_shape(info.shape)}: axis {axis} is {shape[axis]}, the model wants {dim}"
            )


def _check_labels(segment: _Segment) -> None:
    if segment.dtype.hasobject or segment.dtype.kind not in "iu":
        raise CalibrunError(f"{segment.where}: labels must be integers, got dtype {segment.dtype}")
    if len(segment.shape) != 1:
        raise CalibrunError(f"{segment.where}: labels must be 1-D, got shape {_fmt_shape(segment.shape)}")


class _ArrayColumn:
    """The rows of one input: segments concatenated along the first axis."""

    def __init__(self, info: InputInfo, segments: list[_Segment]):
        self.info = info
        self.segments = segments
        for segment in segments:
            _check_data_dtype(segment)
            _check_data_shape(segment, info)
        first = segments[0]
        for segment in segments[1:]:
            if segment.shape[1:] != first.shape[1:]:
                raise CalibrunError(
                    f"{segment.where}: rows of shape {_fmt_shape(segment.shape[1:])} differ from "
                    f"{first.where} rows of shape {_fmt_shape(first.shape[1:])}"
                )
        self.rows = sum(s.rows for s in segments)
        self.sample_shape = first.shape[1:]

    def files_used(self, rows: int) -> list[_File]:
        used, start = [], 0
        for segment in self.segments:
            if start >= rows:
                break
            if segment.rows:
                used.append(segment.file)
            start += segment.rows
        return used

    def pieces(self, sizes: Sequence[int], factor: float) -> Iterator[np.ndarray]:
        """Consecutive blocks of rows, sizes[i] rows each, as float32; one segment loaded at a time."""
        segments = iter(s for s in self.segments if s.rows)
        segment, array, offset = None, None, 0
        for size in sizes:
            parts = []
            need = size
            while need:
                if array is None or offset == segment.rows:
                    array = None  # drop the previous file before opening the next
                    segment = next(segments)
                    array, offset = segment.load(), 0
                take = min(need, segment.rows - offset)
                parts.append(_to_float32(array[offset : offset + take], factor, segment.where, offset))
                offset += take
                need -= take
            yield parts[0] if len(parts) == 1 else np.concatenate(parts)


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

    def __init__(self, path, inputs: Sequence[InputInfo]):
        self.inputs = _check_inputs(inputs)
        root = Path(os.path.expanduser(str(path)))
        self.root = root
        paths = _npy_files(root)
        names = [info.name for info in self.inputs]
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
            rows = {name: columns[name][0].rows for name in names}
            if len(set(rows.values())) > 1:
                raise CalibrunError(f"{root}: the inputs' files hold different row counts: {rows}")
        else:
            for p in paths:
                if p.suffix.lower() == ".npy":
                    columns[names[0]].append(_scan_npy(files[p]))
                    continue
                members = _scan_npz(files[p])
                data_keys = [k for k in members if k != LABELS or LABELS in names]
                for name in names:
                    if name in members:
                        key = name
                    elif single and len(data_keys) == 1:
                        key = data_keys[0]
                    else:
                        raise CalibrunError(
                            f"{p}: no array for input {name!r} (keys: {', '.join(sorted(members)) or 'none'})"
                        )
                    columns[name].append(members[key])
                rows = {name: columns[name][-1].rows for name in names}
                if len(set(rows.values())) > 1:
                    raise CalibrunError(f"{p}: the inputs' arrays hold different row counts: {rows}")
                if LABELS in members and LABELS not in names:
                    label_segments.append(members[LABELS])
            if label_segments and len(label_segments) != len(paths):
                lacking = [p.name for p in paths if all(s.file.path != p for s in label_segments)]
                raise CalibrunError(f"{root}: some data files have labels and some do not ({', '.join(lacking)})")

        self.columns = {info.name: _ArrayColumn(info, columns[info.name]) for info in self.inputs}
        totals = {name: column.rows for name, column in self.columns.items()}
        if len(set(totals.values())) > 1:
            raise CalibrunError(f"{root}: the inputs have different row counts: {totals}")
        self.rows = next(iter(totals.values()))

        self.labels: list[_Segment] = []
        if labels_file is not None:
            self.labels = [_scan_npy(files[labels_file])]
        elif label_segments:
            self.labels = label_segments
        for segment in self.labels:
            _check_labels(segment)
        if self.labels and sum(s.rows for s in self.labels) != self.rows:
            raise CalibrunError(
                f"{root}: {sum(s.rows for s in self.labels)} labels for {self.rows} rows of data"
            )


# ----------------------------------------------------------------------------------------------- images


# ImageNet's per-channel mean and std (0..1 pixel scale): the image sources' defaults, here and nowhere else
# (config.DataConf and conf/*/images.yaml take them from here).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_IMAGE_SIDE = 16384  # resize / crop sides beyond this are a typo, not an image size
# Pillow modes whose values are not 8-bit, and what 1.0 is in each (None: the values are taken as they are).
_WIDE_MODES = {"I;16": 65535.0, "I;16L": 65535.0, "I;16B": 65535.0, "I;16N": 65535.0, "I": 65535.0, "F": None}


def _side(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 1 <= value <= MAX_IMAGE_SIDE:
        raise CalibrunError(f"{name} must be an integer in 1..{MAX_IMAGE_SIDE}, got {value!r}")
    return int(value)


def _crop(value) -> int | tuple[int, int]:
    """`crop`: an int (a square) or [height, width]; a square given as a pair stays an int."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != 2:
            raise CalibrunError(f"crop must be an integer or [height, width], got {list(value)!r}")
        height, width = _side(value[0], "crop height"), _side(value[1], "crop width")
        return height if height == width else (height, width)
    return _side(value, "crop")


@dataclass(frozen=True)
class ImageTransform:
    """The image pipeline: PIL open -> pixels in 0..1 -> resize -> crop or letterbox -> (x - mean) / std -> CHW.

    - Pixels: 8-bit modes (1, L, P, RGB, RGBA, LA, PA, CMYK, YCbCr, ...) are converted by Pillow to RGB (L when
      `grayscale`; alpha is dropped, a palette expanded) and divided by 255. 16-bit grey (I;16*) is divided by
      65535; 32-bit integer grey (I, as Pillow opens some 16-bit files) too, and values outside 0..65535 are an
      error; 32-bit float grey (F) is taken as it is (already 0..1). Grey is repeated into 3 channels unless
      `grayscale`.
    - Default (`letterbox=false`): the shorter side is resized to `resize` (bilinear, PIL's antialiased filter),
      then a centre crop of `crop` (an int: a square; or [height, width]: its shorter side must be at most
      `resize`, and an image whose resized longer side is shorter than the crop is an error naming it). As
      torchvision does it: the longer
      side becomes int(resize * long / short) (truncated), the crop starts at round((size - crop) / 2).
    - `letterbox=true` (as detectors expect): the image is scaled to fit inside `crop` keeping its aspect
      ratio, centred, and the rest is filled with `pad_value` (0..1 pixel scale, before mean/std; YOLO uses
      114/255 = 0.447). `resize` is not used.

    EXIF orientation is not applied. With `grayscale`, `mean` and `std` may have 1 value, or 3 that are averaged
    into one.
    """

    resize: int = 256
    crop: int | tuple[int, int] = 224
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    grayscale: bool = False
    letterbox: bool = False
    pad_value: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "resize", _side(self.resize, "transform resize"))
        object.__setattr__(self, "crop", _crop(self.crop))
        if not self.letterbox and min(self.crop_size) > self.resize:
            shown = self.crop if isinstance(self.crop, int) else list(self.crop)
            raise CalibrunError(f"transform crop {shown} is larger than resize {self.resize} "
                                "(the shorter side after resizing); raise resize, or use letterbox")
        for name in ("grayscale", "letterbox"):
            if not isinstance(getattr(self, name), bool):
                raise CalibrunError(f"transform {name} must be true or false, got {getattr(self, name)!r}")
        try:
            pad = float(self.pad_value)
        except (TypeError, ValueError):
            pad = math.nan
        if not 0.0 <= pad <= 1.0:
            raise CalibrunError(f"transform pad_value must be a number in 0..1 (pixel scale), got {self.pad_value!r}")
        object.__setattr__(self, "pad_value", pad)
        sizes = (1, 3) if self.grayscale else (3,)
        for name in ("mean", "std"):
            value = getattr(self, name)
            try:
                values = tuple(float(v) for v in value)
            except (TypeError, ValueError):
                raise CalibrunError(f"transform {name} must be a list of numbers, got {value!r}") from None
            if len(values) not in sizes or not all(np.isfinite(values)):
                want = "1 or 3" if self.grayscale else "3"
                raise CalibrunError(f"transform {name} must hold {want} finite numbers, got {value!r}")
            if name == "std" and min(values) <= 0:
                raise CalibrunError(f"transform std must be > 0, got {value!r}")
            object.__setattr__(self, name, values)

    @classmethod
    def from_config(cls, source: Mapping) -> ImageTransform:
        """From a `data` / `eval_data` config node (or the dict result.json keeps of it)."""
        crop = source.get("crop", 224)
        if isinstance(crop, Sequence) and not isinstance(crop, str):
            crop = tuple(crop)
        return cls(resize=source.get("resize", 256), crop=crop, mean=tuple(source.get("mean", IMAGENET_MEAN)),
                   std=tuple(source.get("std", IMAGENET_STD)), grayscale=source.get("grayscale", False),
                   letterbox=source.get("letterbox", False), pad_value=source.get("pad_value", 0.0))

    @property
    def crop_size(self) -> tuple[int, int]:
        """(height, width) of the images it makes."""
        return (self.crop, self.crop) if isinstance(self.crop, int) else self.crop

    @property
    def crop_label(self) -> str:
        height, width = self.crop_size
        return f"{height}x{width}"

    @property
    def channels(self) -> int:
        return 1 if self.grayscale else 3

    def _stats(self) -> tuple[np.ndarray, np.ndarray]:
        mean, std = np.array(self.mean, np.float64), np.array(self.std, np.float64)
        if self.grayscale:
            mean, std = mean.mean(keepdims=True), std.mean(keepdims=True)
        return mean.astype(np.float32).reshape(-1, 1, 1), std.astype(np.float32).reshape(-1, 1, 1)

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after resizing: the shorter side becomes `resize` (letterbox: fit inside `crop`)."""
        if self.letterbox:
            target_h, target_w = self.crop_size
            scale = min(target_h / height, target_w / width)
            return (min(target_w, max(1, int(round(width * scale)))), min(target_h, max(1, int(round(height * scale)))))
        if width <= height:
            return self.resize, int(self.resize * height / width)
        return int(self.resize * width / height), self.resize

    def _resized(self, image) -> np.ndarray:
        """HWC float32 pixels in 0..1 (before cropping or padding), resized."""
        from PIL import Image

        width, height = image.size
        if width < 1 or height < 1:
            raise ValueError(f"image of size {width}x{height}")
        size = self.resized_size(width, height)
        if image.mode not in _WIDE_MODES:  # 8-bit: Pillow converts and resizes, then / 255
            image = image.convert("L" if self.grayscale else "RGB").resize(size, Image.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.uint8)
            pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
            return pixels.astype(np.float32) / np.float32(255)
        full = _WIDE_MODES[image.mode]
        values = np.asarray(image)
        if image.mode == "I" and values.size and (values.min() < 0 or values.max() > 65535):
            raise ValueError(f"32-bit integer image with values {values.min()}..{values.max()}, outside the "
                             "16-bit range 0..65535 it can be scaled from")
        grey = values.astype(np.float32) if full is None else (values.astype(np.float64) / full).astype(np.float32)
        if not np.all(np.isfinite(grey)):
            raise ValueError("float image holds NaN or Inf")
        grey = np.asarray(Image.fromarray(grey).resize(size, Image.Resampling.BILINEAR), np.float32)  # mode F
        return np.repeat(grey[:, :, None], self.channels, axis=2)

    def __call__(self, path: str | Path) -> np.ndarray:
        """One image file -> float32 CHW array."""
        from PIL import Image

        try:
            with Image.open(path) as image:
                image.load()
                pixels = self._resized(image)
        except Exception as exc:  # UnidentifiedImageError, OSError (truncated), DecompressionBombError ...
            raise CalibrunError(f"cannot read image {path}: {one_line(exc)}") from exc
        crop_h, crop_w = self.crop_size
        height, width = pixels.shape[:2]
        if self.letterbox:
            canvas = np.full((crop_h, crop_w, pixels.shape[2]), self.pad_value, np.float32)
            top, left = (crop_h - height) // 2, (crop_w - width) // 2
            canvas[top : top + height, left : left + width] = pixels
            pixels = canvas
        else:
            if height < crop_h or width < crop_w:  # a crop longer than `resize` needs an image long enough
                raise CalibrunError(f"image {path} resized to {height}x{width} (height x width) is smaller than the "
                                    f"crop {self.crop_label}; raise resize, or use letterbox")
            top = int(round((height - crop_h) / 2.0))
            left = int(round((width - crop_w) / 2.0))
            pixels = pixels[top : top + crop_h, left : left + crop_w]
        chw = np.ascontiguousarray(pixels.transpose(2, 0, 1))
        mean, std = self._stats()
        return (chw - mean) / std

    def identity(self) -> dict:
        """Everything that decides the pixels (enters the calibration cache key and result.json)."""
        identity = dataclasses.asdict(self) | {"mean": list(self.mean), "std": list(self.std)}
        if isinstance(self.crop, tuple):
            identity["crop"] = list(self.crop)
        if not self.letterbox:  # the keys of the crop pipeline as they always were (cache keys stay valid)
            del identity["letterbox"], identity["pad_value"]
        return identity


def _image_files(root: Path) -> list[tuple[Path, str]]:
    if not root.exists():
        raise CalibrunError(f"image folder not found: {root}")
    if not root.is_dir():
        raise CalibrunError(f"image data must be a folder of images: {root}")
    found = []
    anything = False
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        anything = True
        if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
            found.append((path, rel.as_posix()))
    if not found:
        if not anything:
            raise CalibrunError(f"image folder is empty: {root}")
        raise CalibrunError(f"no images ({'/'.join(s[1:] for s in IMAGE_SUFFIXES)}) in {root}")
    return sorted(found, key=lambda item: item[1])


class _ImageColumn:
    def __init__(self, root, inputs: Sequence[InputInfo], transform: ImageTransform):
        if not isinstance(transform, ImageTransform):
            raise CalibrunError(f"transform must be an ImageTransform, got {type(transform).__name__}")
        inputs = _check_inputs(inputs)
        if len(inputs) != 1:
            names = ", ".join(info.name for info in inputs)
            raise CalibrunError(f"image sources feed single-input models; this model has inputs {names} (use npz)")
        info = inputs[0]
        if len(info.shape) != 4:
            raise CalibrunError(
                f"input {info.name!r} has shape {_fmt_shape(info.shape)}; image sources need a 4-D NCHW input"
            )
        channels, height, width = info.shape[1:]
        if _is_fixed(channels) and channels != transform.channels:
            hint = "set grayscale=false" if transform.grayscale else ("set grayscale=true" if channels == 1 else "")
            raise CalibrunError(
                f"input {info.name!r} {_fmt_shape(info.shape)} takes {channels} channels, the image transform "
                f"gives {transform.channels}" + (f"; {hint}" if hint else "")
            )
        crop_h, crop_w = transform.crop_size
        if (_is_fixed(height) and height != crop_h) or (_is_fixed(width) and width != crop_w):
            want = [height if _is_fixed(height) else crop_h, width if _is_fixed(width) else crop_w]
            raise CalibrunError(
                f"input {info.name!r} {_fmt_shape(info.shape)} takes images of {_fmt_shape(info.shape[2:])}, the "
                f"image transform makes {transform.crop_label} (height x width); set crop: "
                f"data.crop=[{want[0]},{want[1]}] (eval_data.crop too; and resize, or letterbox)"
            )
        self.info = info
        self.transform = transform
        self.root = Path(os.path.expanduser(str(root)))
        self.files = [_File.scan(p, rel) for p, rel in _image_files(self.root)]
        self.rows = len(self.files)
        self.sample_shape = (transform.channels, *transform.crop_size)

    def labels(self) -> tuple[np.ndarray | None, tuple[str, ...] | None]:
        """Class-folder labels when every image lies in a first-level subfolder."""
        parts = [f.rel.split("/") for f in self.files]
        if any(len(p) < 2 for p in parts):
            return None, None
        classes = tuple(sorted({p[0] for p in parts}))
        index = {name: i for i, name in enumerate(classes)}
        return np.array([index[p[0]] for p in parts], dtype=np.int64), classes

    def files_used(self, rows: int) -> list[_File]:
        return self.files[:rows]

    def _load(self, file: _File) -> np.ndarray:
        file.check()
        return self.transform(file.path)

    def pieces(self, sizes: Sequence[int], factor: float) -> Iterator[np.ndarray]:
        start = 0
        for size in sizes:
            chunk = self.files[start : start + size]
            block = np.stack([self._load(f) for f in chunk])
            if factor != 1.0:
                block = _to_float32(block, factor, f"images {chunk[0].path} .. {chunk[-1].path}", start)
            start += size
            yield block


# ------------------------------------------------------------------------------------------ the sources


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
        self.identity = identity if identity is not None else {}  # source kind, file hashes, transform, rows
        self.inputs = list(inputs)

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
        for feeds, _ in self.batches(_EVAL_CHUNK):
            for name, array in feeds.items():
                parts.setdefault(name, []).append(array)
        return {name: p[0] if len(p) == 1 else np.concatenate(p) for name, p in parts.items()}


def npy_calibration(path, inputs: Sequence[InputInfo], batches: int, factor: float = 1.0) -> FeedBatches:
    """Calibration batches from a .npy file, an .npz file or a folder of them (see the module docstring)."""
    source = _NpySource(path, inputs)
    return FeedBatches("npy", source.columns, factor, batches, str(source.root))


def image_calibration(
    path, inputs: Sequence[InputInfo], batches: int, factor: float = 1.0, transform: ImageTransform | None = None
) -> FeedBatches:
    """Calibration batches (NCHW float32) from a folder of images."""
    transform = ImageTransform() if transform is None else transform
    column = _ImageColumn(path, inputs, transform)
    extra = {"transform": transform.identity(), "pillow": _pillow_version()}
    return FeedBatches("images", {column.info.name: column}, factor, batches, str(column.root), extra)


def _column_pieces(columns: dict, rows: int):
    """sizes -> feeds, reading the first `rows` rows of each column batch by batch (one file at a time)."""

    def pieces(sizes):
        if sum(sizes) > rows:
            raise CalibrunError(f"{sum(sizes)} evaluation rows asked of {rows}")
        streams = {name: column.pieces(sizes, 1.0) for name, column in columns.items()}
        for _ in sizes:
            yield {name: next(stream) for name, stream in streams.items()}

    return pieces


def npy_evaluation(path, inputs: Sequence[InputInfo], rows: int | None = None) -> EvalData:
    """Evaluation rows (float32) of every input, capped at `rows`, read batch by batch; labels from an npz
    `labels` key or a `labels.npy` in the folder."""
    source = _NpySource(path, inputs)
    used = _cap_rows(source.rows, rows, str(source.root))
    labels = None
    if source.labels:
        parts = [segment.load() for segment in source.labels]
        labels = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])[:used]
    files = [f for column in source.columns.values() for f in column.files_used(used)]
    files += [segment.file for segment in source.labels]
    identity = {
        "source": "npy",
        "files": _hashes(files),
        "rows": used,
        "inputs": [{"name": name, "shape": [used, *column.sample_shape]} for name, column in source.columns.items()],
    }
    pieces = _column_pieces(source.columns, used)
    # One pass that keeps nothing: NaN/Inf in a file fails here, before any work (memory-mapped, so cheap).
    for _ in pieces([min(_EVAL_CHUNK, used - start) for start in range(0, used, _EVAL_CHUNK)]):
        pass
    return EvalData(used, pieces, labels, None, identity, list(source.columns))


def image_evaluation(
    path, inputs: Sequence[InputInfo], rows: int | None = None, transform: ImageTransform | None = None
) -> EvalData:
    """Evaluation images (NCHW float32), the first `rows` in sorted order, decoded batch by batch;
    class-folder labels."""
    transform = ImageTransform() if transform is None else transform
    column = _ImageColumn(path, inputs, transform)
    used = _cap_rows(column.rows, rows, str(column.root))
    labels, classes = column.labels()
    if labels is not None:
        labels = labels[:used]
    identity = {
        "source": "images",
        "files": _hashes(column.files_used(used)),
        "transform": transform.identity(),
        "pillow": _pillow_version(),
        "rows": used,
        "classes": list(classes) if classes else None,
        "inputs": [{"name": column.info.name, "shape": [used, *column.sample_shape]}],
    }
    return EvalData(used, _column_pieces({column.info.name: column}, used), labels, classes, identity,
                    [column.info.name])


def _pillow_version() -> str:
    import PIL

    return PIL.__version__
