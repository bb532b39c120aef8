"""Calibration batches and evaluation rows decoded from folders of images (the batch rules: calibrun.data.batches).

- images: `path` is a folder of jpg/jpeg/png/bmp/webp/tif/tiff (any case), searched recursively, sorted by relative
  path; names starting with "." (and hidden folders) are skipped. When every image lies in a first-level
  subfolder (`path/<class>/...`), the label of an image is the index of its folder in the sorted folder names
  (torchvision's ImageFolder rule). See `ImageTransform` for the pixel pipeline.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibrun.core.errors import CalibrunError, one_line
from calibrun.data import inputs as feeding
from calibrun.data.batches import (
    EvalData,
    FeedBatches,
    _cap_rows,
    _column_pieces,
    _File,
    _listed,
    check_inputs,
    source_axes,
)
from calibrun.data.inputs import declared
from calibrun.data.inputs import fmt_shape as _fmt_shape
from calibrun.data.rows import is_fixed as _is_fixed
from calibrun.model import InputInfo

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")

log = logging.getLogger("calibrun")


# ImageNet's per-channel mean and std (0..1 pixel scale): the image sources' defaults, here and nowhere else
# (config.DataConf and conf/*/images.yaml take them from here).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_IMAGE_SIDE = 16384  # resize / crop sides beyond this are a typo, not an image size
YOLO_PAD = 114 / 255  # the grey Ultralytics' YOLOv5/v8 (and YOLOX) letterbox pads with, on the 0..1 scale
RESIZE_MODES = ("shorter", "stretch", "letterbox")
CHANNEL_ORDERS = ("rgb", "bgr")
LAYOUTS = ("nchw", "nhwc")
# Pillow modes whose values are not 8-bit, and what 1.0 is in each (None: the values are taken as they are).
_WIDE_MODES = {"I;16": 65535.0, "I;16L": 65535.0, "I;16B": 65535.0, "I;16N": 65535.0, "I": 65535.0, "F": None}


class TransformError(CalibrunError):
    """A bad ImageTransform field. It names the field and its rule, so that the config can name its own key
    (`config data.crop: ...`); `{key}` in a rule stands for that key's prefix (empty outside a config)."""

    def __init__(self, field: str, rule: str, value) -> None:
        self.field, self.rule, self.value = field, rule, value
        super().__init__(f"transform {field}: {rule.replace('{key}', '')}, got {value!r}")

    def in_config(self, key: str) -> str:
        return f"config {key}.{self.field}: {self.rule.replace('{key}', key + '.')}, got {self.value!r}"


def _is_side(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | np.integer) and 1 <= value <= MAX_IMAGE_SIDE


def _crop(value) -> int | tuple[int, int]:
    """`crop`: an int (a square) or [height, width]; a square given as a pair stays an int."""
    pair = isinstance(value, Sequence) and not isinstance(value, str)
    sides = list(value) if pair else [value]
    if (pair and len(sides) != 2) or not all(isinstance(v, int | np.integer) and not isinstance(v, bool)
                                             for v in sides):
        raise TransformError("crop", "must be an integer or [height, width] (e.g. [48,192])",
                             sides if pair else value)
    if not all(_is_side(v) for v in sides):
        raise TransformError("crop", f"sides must be in 1..{MAX_IMAGE_SIDE}", sides if pair else value)
    height, width = (int(v) for v in sides) if pair else (int(value),) * 2
    return height if height == width else (height, width)


_SAID_FLOAT: list[bool] = []  # a float image past 1.0 was said (once a process)
_SAID_LARGE: list[bool] = []  # an image past Pillow's decompression-bomb warning was said (once a process)
RESIZED_PIXELS_MAX = 16 * 2**20  # pixels of an image resized before its crop: 192 MB as float32 RGB


@dataclass(frozen=True)
class ImageTransform:
    """The image pipeline: PIL open -> pixels in 0..1 -> resize -> crop or pad -> RGB or BGR -> (x - mean) / std ->
    CHW (the image source makes it HWC for an NHWC input: `layout`, inferred from the input's shape when null).

    - Pixels: 8-bit modes (1, L, P, RGB, RGBA, LA, PA, CMYK, YCbCr, ...) are converted by Pillow to RGB (L when
      `grayscale`; alpha is dropped, a palette expanded) and divided by 255. 16-bit grey (I;16*) is divided by
      65535; 32-bit integer grey (I, as Pillow opens some 16-bit files) too, and values outside 0..65535 are an
      error; 32-bit float grey (F) is taken as it is (already 0..1). Grey is repeated into 3 channels unless
      `grayscale`.
    - `resize_mode=shorter` (the default): the shorter side is resized to `resize` (bilinear, PIL's antialiased filter),
      then a centre crop of `crop` (an int: a square; or [height, width]: its shorter side must be at most
      `resize`, and an image whose resized longer side is shorter than the crop is an error naming it). As
      torchvision does it: the longer
      side becomes int(resize * long / short) (truncated), the crop starts at round((size - crop) / 2).
    - `resize_mode=letterbox` (or `letterbox=true`, as detectors expect): the image is scaled to fit inside `crop`
      keeping its aspect ratio, centred, and the rest is filled with `pad_value` (0..1 pixel scale, before
      mean/std; default 114/255, Ultralytics' grey). `resize` is not used.
    - `resize_mode=stretch`: the image is resized to `crop` exactly ([height, width]; the aspect ratio is not
      kept). `resize` is not used.
    - `channels=bgr`: the channels are reversed after decoding (OpenCV's order: PaddleOCR, Caffe models);
      `mean` and `std` are in the order of the channels fed.

    EXIF orientation is not applied. With `grayscale`, `mean` and `std` may have 1 value, or 3 that are averaged
    into one.
    """

    resize: int = 256
    crop: int | tuple[int, int] = 224
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    grayscale: bool = False
    letterbox: bool = False  # the same as resize_mode=letterbox (kept: the older name)
    pad_value: float = YOLO_PAD
    resize_mode: str = "shorter"
    channels: str = "rgb"
    layout: str | None = None  # nchw or nhwc; null: from the model input's shape (docs/data.md)

    def __post_init__(self):
        """Every value check of an image transform, for the config and for direct use alike."""
        if not _is_side(self.resize):
            raise TransformError("resize", f"must be an integer in 1..{MAX_IMAGE_SIDE}", self.resize)
        object.__setattr__(self, "resize", int(self.resize))
        object.__setattr__(self, "crop", _crop(self.crop))
        for name, allowed in (("resize_mode", RESIZE_MODES), ("channels", CHANNEL_ORDERS),
                              ("layout", (*LAYOUTS, None))):
            if getattr(self, name) not in allowed:
                raise TransformError(name, f"must be one of {', '.join(str(a).lower() for a in allowed)}",
                                     getattr(self, name))
        if self.letterbox is True:
            if self.resize_mode == "stretch":
                raise TransformError("letterbox", "contradicts {key}resize_mode=stretch (letterbox=true is "
                                     "resize_mode=letterbox); drop one", self.letterbox)
            object.__setattr__(self, "resize_mode", "letterbox")
        if self.resize_mode == "letterbox":
            object.__setattr__(self, "letterbox", True)
        if self.channels == "bgr" and self.grayscale:
            raise TransformError("channels", "bgr orders 3 channels; {key}grayscale=true makes one", self.channels)
        if self.resize_mode == "shorter" and min(self.crop_size) > self.resize:
            shown = self.crop if isinstance(self.crop, int) else list(self.crop)
            raise TransformError("crop", f"must fit inside {{key}}resize={self.resize} (the shorter side after "
                                 "resizing; or {key}resize_mode=letterbox or stretch)", shown)
        for name in ("grayscale", "letterbox"):
            if not isinstance(getattr(self, name), bool):
                raise TransformError(name, "must be true or false", getattr(self, name))
        try:
            pad = float(self.pad_value)
        except (TypeError, ValueError):
            pad = math.nan
        if not 0.0 <= pad <= 1.0:
            raise TransformError("pad_value", "must be a number in 0..1 (pixel scale, before mean/std)",
                                 self.pad_value)
        object.__setattr__(self, "pad_value", pad)
        sizes = (1, 3) if self.grayscale else (3,)
        for name in ("mean", "std"):
            value = getattr(self, name)
            try:
                values = tuple(float(v) for v in value)
            except (TypeError, ValueError):
                raise TransformError(name, "must be a list of numbers", value) from None
            if len(values) not in sizes or not all(np.isfinite(values)):
                want = "1 or 3" if self.grayscale else "3"
                raise TransformError(name, f"must hold {want} finite numbers (one per channel)", list(values))
            if name == "std" and min(values) <= 0:
                raise TransformError(name, "must be > 0", list(values))
            object.__setattr__(self, name, values)

    @classmethod
    def from_config(cls, source: Mapping) -> ImageTransform:
        """From a `data` / `eval_data` config node (or the dict result.json keeps of it)."""
        from calibrun.core.fields import build_from

        return build_from(cls, source)

    @property
    def crop_size(self) -> tuple[int, int]:
        """(height, width) of the images it makes."""
        return (self.crop, self.crop) if isinstance(self.crop, int) else self.crop

    @property
    def crop_label(self) -> str:
        height, width = self.crop_size
        return f"{height}x{width}"

    @property
    def channel_count(self) -> int:
        return 1 if self.grayscale else 3

    def _stats(self) -> tuple[np.ndarray, np.ndarray]:
        mean, std = np.array(self.mean, np.float64), np.array(self.std, np.float64)
        if self.grayscale:
            mean, std = mean.mean(keepdims=True), std.mean(keepdims=True)
        return mean.astype(np.float32).reshape(-1, 1, 1), std.astype(np.float32).reshape(-1, 1, 1)

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after resizing: the shorter side becomes `resize` (letterbox: fit inside `crop`;
        stretch: `crop`)."""
        if self.resize_mode == "stretch":
            height, width = self.crop_size
            return width, height
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
        if size[0] * size[1] > RESIZED_PIXELS_MAX:  # a strip 4000x2 to a shorter side of 256: 512000x256, GBs
            raise ValueError(f"image of {width}x{height} (width x height) would be {size[0]}x{size[1]} with its "
                             f"shorter side resized to {self.resize}: its aspect ratio is too extreme for "
                             "resize_mode=shorter (use resize_mode=stretch or letterbox, or leave it out)")
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
        if full is None and grey.size and float(grey.max()) > 1.0 + 1e-6 and not _SAID_FLOAT:
            _SAID_FLOAT.append(True)  # once a process: a folder of such images says it once
            log.warning("a 32-bit float image holds values up to %g: float images are taken as pixels in 0..1 as they "
                        "are (mean and std apply on that scale); save 0..255 levels as an 8- or 16-bit image",
                        float(grey.max()))
        grey = np.asarray(Image.fromarray(grey).resize(size, Image.Resampling.BILINEAR), np.float32)  # mode F
        return np.repeat(grey[:, :, None], self.channel_count, axis=2)

    def __call__(self, path: str | Path) -> np.ndarray:
        """One image file -> float32 CHW array."""
        from PIL import Image

        try:
            with warnings.catch_warnings():  # Pillow warns past ~89 MP in two raw lines: said once, in calibrun's
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image = Image.open(path)
            with image:
                if image.width * image.height > (Image.MAX_IMAGE_PIXELS or math.inf) and not _SAID_LARGE:
                    _SAID_LARGE.append(True)
                    log.warning("image %s is %.0f megapixels: each such image is decoded whole before its resize "
                                "(about %.0f MB at a time)", path, image.width * image.height / 1e6,
                                image.width * image.height * len(image.getbands()) / 2**20)
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
                                    f"crop {self.crop_label}; raise resize, or use resize_mode=letterbox")
            top = int(round((height - crop_h) / 2.0))
            left = int(round((width - crop_w) / 2.0))
            pixels = pixels[top : top + crop_h, left : left + crop_w]
        if self.channels == "bgr":
            pixels = pixels[:, :, ::-1]
        chw = np.ascontiguousarray(pixels.transpose(2, 0, 1))
        mean, std = self._stats()
        return (chw - mean) / std

    def identity(self) -> dict:
        """Everything that decides the pixels (enters the calibration cache key and result.json)."""
        identity = dataclasses.asdict(self) | {"mean": list(self.mean), "std": list(self.std)}
        if isinstance(self.crop, tuple):
            identity["crop"] = list(self.crop)
        # only what differs from the crop pipeline as it always was is added (earlier cache keys stay valid); the
        # layout is the source's (resolved against the model), not the transform's
        del identity["resize_mode"], identity["layout"]
        if not self.letterbox:
            del identity["letterbox"], identity["pad_value"]
        if self.resize_mode == "stretch":
            identity["resize_mode"] = "stretch"
        if self.channels == "rgb":
            del identity["channels"]
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


def image_layout(shape: Sequence, given: str | None) -> str:
    """`nchw` or `nhwc`: `given`, else NHWC when axis 3 is fixed to 1 or 3 and axis 1 is not, else NCHW."""
    if given is not None:
        return given
    last_is_channels = _is_fixed(shape[3]) and shape[3] in (1, 3)
    first_is_channels = _is_fixed(shape[1]) and shape[1] in (1, 3)
    return "nhwc" if last_is_channels and not first_is_channels else "nchw"


def _check_layout(info: InputInfo, given: str | None, key: str) -> None:
    """A layout set against what the input's shape states: its channels (1 or 3, fixed) on the other axis and the
    set one's axis not fixed to 1 or 3. Fed so, the images' channels land on a spatial axis (an NCHW classifier
    with data.layout=nhwc was calibrated on 3-pixel-high images, and the crop hint led there)."""
    if given not in ("nchw", "nhwc"):
        return
    shape = info.shape
    stated = {"nchw": 1, "nhwc": 3}
    other = "nhwc" if given == "nchw" else "nchw"
    here, there = shape[stated[given]], shape[stated[other]]
    if _is_fixed(there) and there in (1, 3) and not (_is_fixed(here) and here in (1, 3)):
        raise CalibrunError(f"config {key}.layout={given}: input {info.name!r} {_fmt_shape(info.shape)} holds its "
                            f"{there} channels on axis {stated[other]}, as {other.upper()} does; drop {key}.layout "
                            f"(inferred from the shape) or set {key}.layout={other}")


class _ImageColumn:
    """The image input's rows (NCHW or NHWC, batch axis 0); the model's other inputs are constants set in the
    config (`data.inputs.<name>.value`)."""

    axis = 0

    def __init__(self, root, inputs: Sequence[InputInfo], transform: ImageTransform, given: dict | None = None,
                 key: str = "data"):
        if not isinstance(transform, ImageTransform):
            raise CalibrunError(f"transform must be an ImageTransform, got {type(transform).__name__}")
        inputs = list(inputs)
        given = feeding.overrides(given, inputs, key)
        axes = feeding.batch_axes(inputs, given, key)
        self.constants = feeding.config_constants(inputs, given, axes, key)
        self.order = [info.name for info in inputs]
        images = check_inputs(inputs, self.constants, axes, key)
        if len(images) != 1:
            pictures = [info for info in images if feeding.is_float(info) and len(info.shape) == 4]
            if len(pictures) == 1:  # the image input is plain: name the others, each a value to set
                others = [info for info in images if info is not pictures[0]]
                raise CalibrunError(f"image sources feed one image input ({pictures[0].name!r}); "
                                    f"{', '.join(declared(i) for i in others)} "
                                    f"{'has' if len(others) == 1 else 'have'} no value: set "
                                    f"{' '.join(f'{key}.inputs.{feeding.spelled(i.name)}.value=...' for i in others)}"
                                    f", or use {key}=npy")
            names = ", ".join(info.name for info in images)
            raise CalibrunError(f"image sources feed one image input; inputs {names} have no value: set the others' "
                                f"{key}.inputs.<name>.value, or use {key}=npy")
        info = images[0]
        if not feeding.is_float(info) or len(info.shape) != 4:
            raise CalibrunError(f"input {declared(info)}: image sources feed a 4-D float input (NCHW or NHWC)")
        if axes[info.name] != 0:
            raise CalibrunError(f"config {key}.inputs.{info.name}.batch_axis: image rows are on axis 0, got "
                                f"{axes[info.name]}")
        self.layout = image_layout(info.shape, transform.layout)
        _check_layout(info, transform.layout, key)
        if self.layout == "nchw":
            channels, height, width = info.shape[1:]
        else:
            height, width, channels = info.shape[1:]
        if _is_fixed(channels) and channels != transform.channel_count:
            hint = "set grayscale=false" if transform.grayscale else ("set grayscale=true" if channels == 1 else "")
            raise CalibrunError(
                f"input {info.name!r} {_fmt_shape(info.shape)} ({self.layout}) takes {channels} channels, the image "
                f"transform gives {transform.channel_count}" + (f"; {hint}" if hint else "")
            )
        crop_h, crop_w = transform.crop_size
        if (_is_fixed(height) and height != crop_h) or (_is_fixed(width) and width != crop_w):
            want = [height if _is_fixed(height) else crop_h, width if _is_fixed(width) else crop_w]
            raise CalibrunError(
                f"input {info.name!r} {_fmt_shape(info.shape)} ({self.layout}) takes images of {want[0]}x{want[1]} "
                f"(height x width), the image transform makes {transform.crop_label}; set crop: "
                f"data.crop=[{want[0]},{want[1]}] (eval_data.crop too; and resize, or resize_mode)"
            )
        self.info = info
        self.transform = transform
        self.root = Path(os.path.expanduser(str(root)))
        self.files = [_File.scan(p, rel) for p, rel in _image_files(self.root)]
        self.rows = len(self.files)
        chw = (transform.channel_count, *transform.crop_size)
        self.sample_shape = chw if self.layout == "nchw" else (*transform.crop_size, transform.channel_count)
        self.columns = {info.name: self}
        self.axes = source_axes(self.columns, self.constants)

    def identity(self) -> dict:
        """The transform's identity, and the layout when it is not the NCHW every earlier key assumed."""
        identity = self.transform.identity()
        if self.layout != "nchw":
            identity["layout"] = self.layout
        return identity

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
        chw = self.transform(file.path)
        return chw if self.layout == "nchw" else np.ascontiguousarray(chw.transpose(1, 2, 0))

    def pieces(self, sizes: Sequence[int], factor: float) -> Iterator[np.ndarray]:
        start = 0
        for size in sizes:
            chunk = self.files[start : start + size]
            block = np.stack([self._load(f) for f in chunk])
            if factor != 1.0 or block.dtype != feeding.input_dtype(self.info):
                block = feeding.cast(block, self.info, factor, f"images {chunk[0].path} .. {chunk[-1].path}", start)
            start += size
            yield block


def image_calibration(
    path, inputs: Sequence[InputInfo], batches: int, factor: float = 1.0, transform: ImageTransform | None = None,
    given: dict | None = None, key: str = "data",
) -> FeedBatches:
    """Calibration batches (NCHW or NHWC) from a folder of images; `given`: the `data.inputs` node (the other
    inputs' constants)."""
    transform = ImageTransform() if transform is None else transform
    column = _ImageColumn(path, inputs, transform, given, key)
    extra = {"transform": column.identity(), "pillow": _pillow_version()}
    return FeedBatches("images", column.columns, factor, batches, str(column.root), extra, column.constants,
                       column.order)


def image_evaluation(
    path, inputs: Sequence[InputInfo], rows: int | None = None, transform: ImageTransform | None = None,
    given: dict | None = None, key: str = "eval_data",
) -> EvalData:
    """Evaluation images (NCHW or NHWC), the first `rows` in sorted order, decoded batch by batch;
    class-folder labels."""
    transform = ImageTransform() if transform is None else transform
    column = _ImageColumn(path, inputs, transform, given, key)
    used = _cap_rows(column.rows, rows, str(column.root))
    labels, classes = column.labels()
    if labels is not None:
        if used < len(labels) and len(set(labels[:used].tolist())) < len(classes):
            # the rows are the first in path order, so class folder by class folder: say which classes they hold
            held = [classes[c] for c in sorted(set(labels[:used].tolist()))]
            log.warning("%s: the %d evaluation rows are the first images in path order, from class folder%s %s only "
                        "(of %d); eval.rows=%d takes them all, or give a folder holding the rows to measure",
                        column.root, used, "" if len(held) == 1 else "s",
                        ", ".join(held[:3]) + (", ..." if len(held) > 3 else ""), len(classes), len(labels))
        labels = labels[:used]
    identity = {
        "source": "images",
        "files": _listed(column.files_used(used)),
        "transform": column.identity(),
        "pillow": _pillow_version(),
        "rows": used,
        "classes": list(classes) if classes else None,
        "inputs": [{"name": column.info.name, "shape": [used, *column.sample_shape]},
                   *[{"name": name, "constant": c.identity()} for name, c in column.constants.items()]],
    }
    data = EvalData(used, _column_pieces(column.columns, used, column.constants, column.order), labels, classes,
                    identity, column.order, column.axes)
    if classes:  # a label is a class folder's index: too many folders for the model's classes
        shown = ", ".join(classes[:3]) + (", ..." if len(classes) > 3 else "")
        data.label_sources = [(0, f"{column.root} (class folders {shown})")]
    return data


def _pillow_version() -> str:
    import PIL

    return PIL.__version__
