"""User data sources (calibrun.data: npy.py, images.py, batches.py): npy/npz files and folders, image folders."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from PIL import Image

from calibrun.core.errors import CalibrunError
from calibrun.data import EvalData, FeedBatches
from calibrun.data.images import ImageTransform, image_calibration, image_evaluation
from calibrun.data.npy import RowsOnNewAxis, npy_calibration, npy_evaluation
from calibrun.model import InputInfo
from calibrun.quant.reader import make_reader
from tests.modelzoo import IR_VERSION, OPSET, save

FLOAT = TensorProto.FLOAT


def vec(name: str = "x", features: int = 4, first: int | str = "N") -> InputInfo:
    return InputInfo(name, FLOAT, (first, features))


def nchw(channels: int = 3, size: int = 4, first: int | str = "N", name: str = "img") -> InputInfo:
    return InputInfo(name, FLOAT, (first, channels, size, size))


def rows(n: int, features: int = 4, start: int = 0) -> np.ndarray:
    """n distinguishable rows: row i is filled with start + i."""
    return np.repeat(np.arange(start, start + n, dtype=np.float32)[:, None], features, axis=1)


def drain(feeds: FeedBatches) -> list[dict[str, np.ndarray]]:
    return [dict(feed) for feed in feeds]


def write_png(path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


# ------------------------------------------------------------------------------------- batches and counts


def test_batches_of_16_rows_first_batches_used(tmp_path, caplog):
    np.save(tmp_path / "d.npy", rows(100))
    with caplog.at_level(logging.WARNING, logger="calibrun"):
        feeds = npy_calibration(tmp_path / "d.npy", [vec()], batches=3)
    assert not caplog.records
    served = drain(feeds)
    assert len(feeds) == len(served) == 3
    for i, feed in enumerate(served):
        assert list(feed) == ["x"]
        assert feed["x"].dtype == np.float32
        np.testing.assert_array_equal(feed["x"], rows(16, start=16 * i))


def test_fewer_rows_than_requested_keeps_partial_batch_and_warns(tmp_path, caplog):
    np.save(tmp_path / "d.npy", rows(40))
    with caplog.at_level(logging.WARNING, logger="calibrun"):
        feeds = npy_calibration(tmp_path / "d.npy", [vec()], batches=10)
    assert [f["x"].shape[0] for f in feeds] == [16, 16, 8]
    assert len(feeds) == 3
    assert any(r.name == "calibrun" and "10 batches requested" in r.getMessage() for r in caplog.records)
    assert feeds.identity()["last_batch_rows"] == 8


def test_fixed_first_axis_uses_b_rows_and_drops_partial(tmp_path, caplog):
    np.save(tmp_path / "d.npy", rows(23))
    with caplog.at_level(logging.WARNING, logger="calibrun"):
        feeds = npy_calibration(tmp_path / "d.npy", [vec(first=5)], batches=10)
    shapes = [f["x"].shape for f in feeds]
    assert shapes == [(5, 4)] * 4
    assert "last 3 rows are dropped" in caplog.text
    assert feeds.identity()["rows_per_batch"] == 5
    assert "last_batch_rows" not in feeds.identity()
    with pytest.raises(CalibrunError, match="fewer than the 50 rows"):
        npy_calibration(tmp_path / "d.npy", [vec(first=50)], batches=1)


def test_iterating_twice_gives_identical_arrays(tmp_path):
    rng = np.random.default_rng(1)
    for i in range(3):
        np.save(tmp_path / f"part{i}.npy", rng.normal(size=(20, 4)))
    feeds = npy_calibration(tmp_path, [vec()], batches=3, factor=2.5)
    first, second = drain(feeds), drain(feeds)
    assert len(first) == len(second) == 3
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])


def test_batches_are_read_lazily(tmp_path):
    """Building the source and serving the first batch does not read later files: a later file that turns
    bad is only noticed when its batch comes."""
    np.save(tmp_path / "a.npy", rows(16))
    np.save(tmp_path / "b.npy", rows(16, start=16))
    feeds = npy_calibration(tmp_path, [vec()], batches=2)
    stream = iter(feeds)
    np.testing.assert_array_equal(next(stream)["x"], rows(16))
    np.save(tmp_path / "b.npy", np.full((16, 4), np.nan))
    with pytest.raises(CalibrunError, match="b.npy"):
        next(stream)


def test_factor_is_applied_before_the_cast(tmp_path):
    data = np.random.default_rng(3).normal(size=(32, 4)) * 1e3
    np.save(tmp_path / "d.npy", data)
    feeds = npy_calibration(tmp_path / "d.npy", [vec()], batches=2, factor=0.2)
    got = np.concatenate([f["x"] for f in feeds])
    expected = (data * 0.2).astype(np.float32)
    np.testing.assert_array_equal(got, expected)
    cast_first = data.astype(np.float32) * np.float32(0.2)
    assert not np.array_equal(got, cast_first)  # the order is observable on this data


def test_integer_and_float16_data_are_cast(tmp_path):
    np.save(tmp_path / "i.npy", np.arange(64, dtype=np.int16).reshape(16, 4))
    np.save(tmp_path / "h.npy", np.arange(64, dtype=np.float16).reshape(16, 4))
    for name in ("i.npy", "h.npy"):
        (feed,) = npy_calibration(tmp_path / name, [vec()], batches=1, factor=0.5)
        assert feed["x"].dtype == np.float32
        np.testing.assert_array_equal(feed["x"], (np.arange(64).reshape(16, 4) * 0.5).astype(np.float32))


# ------------------------------------------------------------------------------------------------ identity


def test_identity_is_stable_json_and_tracks_what_decides_the_arrays(tmp_path):
    path = tmp_path / "d.npy"
    np.save(path, rows(64))
    base = npy_calibration(path, [vec()], batches=2).identity()
    json.dumps(base)
    assert base == npy_calibration(path, [vec()], batches=2).identity()
    assert base["source"] == "npy"
    assert base["files"][0]["path"] == "d.npy"
    assert len(base["files"][0]["sha256"]) == 64
    assert base["inputs"] == [{"name": "x", "batch_shape": [16, 4]}]
    assert npy_calibration(path, [vec()], batches=3).identity() != base
    assert npy_calibration(path, [vec()], batches=2, factor=2.0).identity() != base
    changed = rows(64)
    changed[0, 0] = 1234.0
    np.save(path, changed)
    assert npy_calibration(path, [vec()], batches=2).identity()["files"] != base["files"]


def test_identity_lists_files_sorted_by_relative_path(tmp_path):
    for name in ("b.npy", "a.npy", "c.npz"):
        if name.endswith(".npz"):
            np.savez(tmp_path / name, x=rows(16))
        else:
            np.save(tmp_path / name, rows(16))
    identity = npy_calibration(tmp_path, [vec()], batches=3).identity()
    assert [f["path"] for f in identity["files"]] == ["a.npy", "b.npy", "c.npz"]


def test_image_identity_tracks_transform_and_bytes(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(3):
        write_png(tmp_path / "imgs" / f"{i}.png", rng.integers(0, 256, (10, 12, 3), dtype=np.uint8))
    info = nchw(size=4)
    small = ImageTransform(resize=8, crop=4)
    base = image_calibration(tmp_path / "imgs", [info], batches=1, transform=small).identity()
    json.dumps(base)
    assert base == image_calibration(tmp_path / "imgs", [info], batches=1, transform=small).identity()
    assert base["transform"]["resize"] == 8
    assert base["transform"]["mean"] == [0.485, 0.456, 0.406]
    other = ImageTransform(resize=6, crop=4)
    assert image_calibration(tmp_path / "imgs", [info], batches=1, transform=other).identity() != base
    assert image_calibration(tmp_path / "imgs", [info], batches=1, factor=0.5, transform=small).identity() != base
    write_png(tmp_path / "imgs" / "1.png", rng.integers(0, 256, (10, 12, 3), dtype=np.uint8))
    assert image_calibration(tmp_path / "imgs", [info], batches=1, transform=small).identity() != base


# ------------------------------------------------------------------------------------- npz, folders, inputs


def test_npz_multi_input_feeds_every_input(tmp_path):
    a, b = rows(32, 4), rows(32, 3, start=100)
    np.savez(tmp_path / "d.npz", a=a, b=b, labels=np.arange(32))
    feeds = npy_calibration(tmp_path / "d.npz", [vec("a", 4), vec("b", 3)], batches=2)
    served = drain(feeds)
    assert [list(f) for f in served] == [["a", "b"], ["a", "b"]]
    np.testing.assert_array_equal(served[1]["a"], a[16:])
    np.testing.assert_array_equal(served[1]["b"], b[16:])
    assert feeds.identity()["inputs"] == [{"name": "a", "batch_shape": [16, 4]}, {"name": "b", "batch_shape": [16, 3]}]


def test_missing_input_is_named(tmp_path):
    np.savez(tmp_path / "d.npz", a=rows(16))
    with pytest.raises(CalibrunError, match="'b'"):
        npy_calibration(tmp_path / "d.npz", [vec("a"), vec("b")], batches=1)
    folder = tmp_path / "f"
    folder.mkdir()
    np.save(folder / "a.npy", rows(16))
    with pytest.raises(CalibrunError, match=r"'b'.*b\.npy"):
        npy_calibration(folder, [vec("a"), vec("b")], batches=1)


def test_folder_of_per_input_npy_files(tmp_path):
    np.save(tmp_path / "a.npy", rows(16, 4))
    np.save(tmp_path / "b.npy", rows(16, 2, start=50))
    np.save(tmp_path / "labels.npy", np.arange(16))
    (feed,) = npy_calibration(tmp_path, [vec("a", 4), vec("b", 2)], batches=1)
    np.testing.assert_array_equal(feed["b"], rows(16, 2, start=50))
    ev = npy_evaluation(tmp_path, [vec("a", 4), vec("b", 2)], rows=10)
    assert ev.feeds["a"].shape == (10, 4)
    assert ev.feeds["b"].shape == (10, 2)
    np.testing.assert_array_equal(ev.labels, np.arange(10))


def test_single_input_npz_with_another_key_name(tmp_path):
    np.savez(tmp_path / "d.npz", rows(16))  # key arr_0
    (feed,) = npy_calibration(tmp_path / "d.npz", [vec()], batches=1)
    np.testing.assert_array_equal(feed["x"], rows(16))


def test_folder_concatenates_in_name_order(tmp_path):
    np.save(tmp_path / "b.npy", rows(10, start=100))
    np.save(tmp_path / "a.npy", rows(10, start=0))
    np.savez(tmp_path / "c.npz", x=rows(12, start=200))
    (tmp_path / "notes.txt").write_text("ignored")
    served = drain(npy_calibration(tmp_path, [vec()], batches=2))
    got = np.concatenate([f["x"] for f in served])[:, 0]
    expected = np.concatenate([np.arange(0, 10), np.arange(100, 110), np.arange(200, 212)])
    np.testing.assert_array_equal(got, expected)
    assert served[0]["x"].shape == (16, 4)  # a batch that spans two files


def test_symbolic_axes_take_the_data_size(tmp_path):
    np.save(tmp_path / "d.npy", np.zeros((16, 3, 7), np.float32))
    (feed,) = npy_calibration(tmp_path / "d.npy", [InputInfo("x", FLOAT, ("N", 3, "T"))], batches=1)
    assert feed["x"].shape == (16, 3, 7)


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("array", "info", "message"),
    [
        (np.zeros((16, 5)), vec(features=4), r"axis 1 is 5, the model wants 4"),
        (np.zeros((16, 4, 1)), vec(features=4), r"rank 3.*rank 2"),
        (np.zeros(16), vec(features=4), r"rank 1"),
    ],
)
def test_shape_mismatch_is_refused(tmp_path, array, info, message):
    np.save(tmp_path / "d.npy", array)
    with pytest.raises(CalibrunError, match=message) as err:
        npy_calibration(tmp_path / "d.npy", [info], batches=1)
    assert "d.npy" in str(err.value)
    assert "\n" not in str(err.value)


def test_files_with_different_row_shapes_are_refused(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((16, 3, 4)))
    np.save(tmp_path / "b.npy", np.zeros((16, 3, 5)))
    with pytest.raises(CalibrunError, match=r"b\.npy.*differ.*a\.npy"):
        npy_calibration(tmp_path, [InputInfo("x", FLOAT, ("N", 3, "T"))], batches=1)


def test_inputs_with_different_row_counts_are_refused(tmp_path):
    np.savez(tmp_path / "d.npz", a=rows(16), b=rows(15))
    with pytest.raises(CalibrunError, match="different row counts"):
        npy_calibration(tmp_path / "d.npz", [vec("a"), vec("b")], batches=1)


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.array([[1, "a"], [None, 2.0]], dtype=object), "object array"),
        (np.zeros((16, 4), dtype=bool), "holds bool data, which does not cast to float32 without loss"),
        (np.full((16, 4), "s"), "not numeric"),
        (np.zeros((16, 4), dtype=np.complex64), "not numeric"),
    ],
)
def test_non_numeric_arrays_are_refused(tmp_path, array, message):
    np.save(tmp_path / "d.npy", array, allow_pickle=True)
    with pytest.raises(CalibrunError, match=message) as err:
        npy_calibration(tmp_path / "d.npy", [vec(features=array.shape[1])], batches=1)
    assert "d.npy" in str(err.value)
    with pytest.raises(CalibrunError, match=message):
        npy_evaluation(tmp_path / "d.npy", [vec(features=array.shape[1])])


def test_object_array_in_npz_is_refused(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.array([[1.0, None]], dtype=object))
    with pytest.raises(CalibrunError, match=r"d\.npz\['x'\] is an object array"):
        npy_calibration(tmp_path / "d.npz", [vec(features=2)], batches=1)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_refused_naming_the_file(tmp_path, bad):
    np.save(tmp_path / "a.npy", rows(16))
    data = rows(16)
    data[5, 2] = bad
    np.save(tmp_path / "b.npy", data)
    feeds = npy_calibration(tmp_path, [vec()], batches=2)
    with pytest.raises(CalibrunError, match=r"b\.npy: NaN or Inf in row 5"):
        drain(feeds)
    with pytest.raises(CalibrunError, match=r"b\.npy: NaN or Inf in row 5"):
        npy_evaluation(tmp_path, [vec()])


def test_overflow_after_factor_is_refused(tmp_path):
    np.save(tmp_path / "d.npy", np.full((16, 4), 1e38))
    with pytest.raises(CalibrunError, match="overflows float32"):
        drain(npy_calibration(tmp_path / "d.npy", [vec()], batches=1, factor=10.0))


def test_missing_empty_and_unmatched_paths(tmp_path):
    with pytest.raises(CalibrunError, match="not found"):
        npy_calibration(tmp_path / "nope", [vec()], batches=1)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CalibrunError, match="empty"):
        npy_calibration(empty, [vec()], batches=1)
    with pytest.raises(CalibrunError, match="empty"):
        image_calibration(empty, [nchw(size=224)], batches=1)
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("1,2\n")
    with pytest.raises(CalibrunError, match=r"no \.npy or \.npz files"):
        npy_calibration(other, [vec()], batches=1)
    with pytest.raises(CalibrunError, match="no images"):
        image_calibration(other, [nchw(size=224)], batches=1)
    with pytest.raises(CalibrunError, match="not a .npy or .npz"):
        npy_calibration(other / "data.csv", [vec()], batches=1)
    (other / "bad.npy").write_bytes(b"not numpy")
    with pytest.raises(CalibrunError, match=r"bad\.npy: not a readable"):
        npy_calibration(other / "bad.npy", [vec()], batches=1)
    np.save(other / "zero.npy", np.zeros((0, 4)))
    with pytest.raises(CalibrunError, match="no rows"):
        npy_calibration(other / "zero.npy", [vec()], batches=1)


def test_bad_arguments(tmp_path):
    np.save(tmp_path / "d.npy", rows(16))
    with pytest.raises(CalibrunError, match="batches"):
        npy_calibration(tmp_path / "d.npy", [vec()], batches=0)
    with pytest.raises(CalibrunError, match="factor"):
        npy_calibration(tmp_path / "d.npy", [vec()], batches=1, factor=-1)
    with pytest.raises(CalibrunError, match="INT64"):
        npy_calibration(tmp_path / "d.npy", [InputInfo("x", TensorProto.INT64, ("N", 4))], batches=1)
    with pytest.raises(CalibrunError, match="crop: must fit inside resize=256"):
        ImageTransform(resize=256, crop=300)
    with pytest.raises(CalibrunError, match="std"):
        ImageTransform(std=(0.2, 0.0, 0.2))


# -------------------------------------------------------------------------------------------------- images


def pil_bilinear_weights(in_size: int, out_size: int) -> np.ndarray:
    """PIL's bilinear resampling as a matrix: a triangle filter widened by the scale when downscaling."""
    scale = in_size / out_size
    width = max(scale, 1.0)
    matrix = np.zeros((out_size, in_size))
    for o in range(out_size):
        center = (o + 0.5) * scale
        lo = max(int(center - width + 0.5), 0)
        hi = min(int(center + width + 0.5), in_size)
        weights = np.array([max(0.0, 1 - abs((i - center + 0.5) / width)) for i in range(lo, hi)])
        matrix[o, lo:hi] = weights / weights.sum()
    return matrix


def reference_transform(pixels: np.ndarray, resize: int, crop: int, mean, std) -> np.ndarray:
    """Shorter side -> resize (torchvision's int() for the longer), PIL bilinear (horizontal pass, 8-bit
    rounding, vertical pass), centre crop at round((size - crop) / 2), /255, normalise, CHW."""
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    height, width = pixels.shape[:2]
    if width <= height:
        new_w, new_h = resize, int(resize * height / width)
    else:
        new_w, new_h = int(resize * width / height), resize
    x = np.einsum("ow,hwc->hoc", pil_bilinear_weights(width, new_w), pixels.astype(np.float64))
    x = np.clip(np.floor(x + 0.5), 0, 255)
    x = np.einsum("oh,hwc->owc", pil_bilinear_weights(height, new_h), x)
    x = np.clip(np.floor(x + 0.5), 0, 255)
    top, left = int(round((new_h - crop) / 2)), int(round((new_w - crop) / 2))
    x = x[top : top + crop, left : left + crop] / 255.0
    x = (x - np.asarray(mean)) / np.asarray(std)
    return x.transpose(2, 0, 1)


def test_image_transform_matches_an_independent_computation(tmp_path):
    pixels = np.random.default_rng(7).integers(0, 256, (10, 12, 3), dtype=np.uint8)  # H=10, W=12
    write_png(tmp_path / "imgs" / "one.png", pixels)
    transform = ImageTransform(resize=8, crop=4)
    assert transform.resized_size(12, 10) == (9, 8)  # int(8 * 12 / 10) = 9; crop starts at round(2.5) = 2
    (feed,) = image_calibration(tmp_path / "imgs", [nchw(size=4)], batches=1, transform=transform)
    got = feed["img"]
    assert got.shape == (1, 3, 4, 4)
    assert got.dtype == np.float32
    expected = reference_transform(pixels, 8, 4, transform.mean, transform.std)
    # PIL resamples in fixed point: allow one grey level of rounding difference, no more.
    np.testing.assert_allclose(got[0], expected, rtol=0, atol=1.01 / 255 / min(transform.std))
    assert np.abs(got[0] - expected).mean() < 0.2 / 255 / min(transform.std)


def test_image_transform_tall_image_and_exact_values(tmp_path):
    """A constant-colour image survives any resampling exactly: checks channel order, mean and std."""
    pixels = np.zeros((9, 6, 3), np.uint8)
    pixels[...] = (10, 128, 250)
    write_png(tmp_path / "imgs" / "tall.png", pixels)
    transform = ImageTransform(resize=4, crop=3, mean=(0.1, 0.2, 0.3), std=(0.5, 0.25, 0.125))
    assert transform.resized_size(6, 9) == (4, 6)
    (feed,) = image_calibration(tmp_path / "imgs", [nchw(size=3)], batches=1, transform=transform)
    for channel, (value, m, s) in enumerate(zip((10, 128, 250), transform.mean, transform.std, strict=True)):
        np.testing.assert_allclose(feed["img"][0, channel], (value / 255 - m) / s, rtol=1e-6)


def test_grayscale_images(tmp_path):
    pixels = np.random.default_rng(8).integers(0, 256, (12, 10), dtype=np.uint8)
    write_png(tmp_path / "imgs" / "g.png", pixels)
    transform = ImageTransform(resize=8, crop=4, mean=(0.5,), std=(0.25,), grayscale=True)
    (feed,) = image_calibration(tmp_path / "imgs", [nchw(channels=1, size=4)], batches=1, transform=transform)
    assert feed["img"].shape == (1, 1, 4, 4)
    expected = reference_transform(pixels, 8, 4, (0.5,), (0.25,))
    np.testing.assert_allclose(feed["img"][0], expected, rtol=0, atol=1.01 / 255 / 0.25)
    # Three ImageNet values are averaged into one for a single channel.
    default_gray = ImageTransform(resize=8, crop=4, grayscale=True)
    (feed,) = image_calibration(tmp_path / "imgs", [nchw(channels=1, size=4)], batches=1, transform=default_gray)
    expected = reference_transform(pixels, 8, 4, (np.mean([0.485, 0.456, 0.406]),), (np.mean([0.229, 0.224, 0.225]),))
    np.testing.assert_allclose(feed["img"][0], expected, rtol=0, atol=1.01 / 255 / 0.224)


def test_image_batches_are_nchw_and_sorted(tmp_path):
    for i in range(5):  # each image a constant grey level i * 40, names out of creation order
        write_png(tmp_path / "imgs" / f"img_{4 - i}.PNG", np.full((6, 6, 3), (4 - i) * 40, np.uint8))
    write_png(tmp_path / "imgs" / "sub" / "z.jpg", np.full((6, 6, 3), 200, np.uint8))
    (tmp_path / "imgs" / ".hidden.png").write_bytes(b"junk")
    transform = ImageTransform(resize=4, crop=4, mean=(0, 0, 0), std=(1, 1, 1))
    feeds = image_calibration(tmp_path / "imgs", [nchw(size=4, first=2)], batches=5, transform=transform)
    assert len(feeds) == 3  # 6 images, batches of 2
    served = drain(feeds)
    levels = [round(float(b[0, 0, 0]) * 255) for f in served for b in f["img"]]
    assert levels[:5] == [0, 40, 80, 120, 160]
    assert abs(levels[5] - 200) <= 2  # jpeg
    assert all(f["img"].shape == (2, 3, 4, 4) for f in served)


def test_image_model_checks(tmp_path):
    write_png(tmp_path / "imgs" / "a.png", np.zeros((8, 8, 3), np.uint8))
    transform = ImageTransform(resize=4, crop=4)
    with pytest.raises(CalibrunError, match="4-D"):
        image_calibration(tmp_path / "imgs", [vec()], batches=1, transform=transform)
    with pytest.raises(CalibrunError, match="1 channels.*grayscale=true"):
        image_calibration(tmp_path / "imgs", [nchw(channels=1, size=4)], batches=1, transform=transform)
    with pytest.raises(CalibrunError, match=r"takes images of 5x5.*makes 4x4.*data\.crop=\[5,5\]"):
        image_calibration(tmp_path / "imgs", [nchw(size=5)], batches=1, transform=transform)
    with pytest.raises(CalibrunError, match="one image input; inputs img, b have no value"):
        image_calibration(tmp_path / "imgs", [nchw(size=4), nchw(size=4, name="b")], batches=1, transform=transform)
    (feed,) = image_calibration(tmp_path / "imgs", [InputInfo("i", FLOAT, ("N", "C", "H", "W"))], 1,
                                transform=transform)
    assert feed["i"].shape == (1, 3, 4, 4)


def test_unreadable_image_is_named(tmp_path):
    write_png(tmp_path / "imgs" / "a.png", np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "imgs" / "b.png").write_bytes(b"definitely not a png")
    feeds = image_calibration(tmp_path / "imgs", [nchw(size=4)], batches=1, transform=ImageTransform(4, 4))
    with pytest.raises(CalibrunError, match=r"cannot read image .*b\.png"):
        drain(feeds)


def test_class_folder_labels_and_rows_cap(tmp_path, caplog):
    root = tmp_path / "imgs"
    for cls, count in (("dog", 2), ("cat", 3), ("emu", 1)):
        for i in range(count):
            write_png(root / cls / f"{i}.png", np.full((5, 5, 3), 10 * i, np.uint8))
    transform = ImageTransform(resize=4, crop=4)
    ev = image_evaluation(root, [nchw(size=4)], transform=transform)
    assert isinstance(ev, EvalData)
    assert ev.classes == ("cat", "dog", "emu")
    assert ev.labels.dtype == np.int64
    np.testing.assert_array_equal(ev.labels, [0, 0, 0, 1, 1, 2])
    assert ev.feeds["img"].shape == (6, 3, 4, 4)
    assert ev.feeds["img"].dtype == np.float32
    with caplog.at_level(logging.WARNING, logger="calibrun"):  # the first 4 in path order: cat and dog, no emu
        capped = image_evaluation(root, [nchw(size=4)], rows=4, transform=transform)
    assert f"{root}: the 4 evaluation rows are the first images in path order, from class folders cat, dog only " \
           "(of 3); eval.rows=6 takes them all" in caplog.text
    caplog.clear()
    assert capped.feeds["img"].shape[0] == 4
    assert capped.rows == 4
    np.testing.assert_array_equal(capped.labels, [0, 0, 0, 1])
    np.testing.assert_array_equal(capped.feeds["img"], ev.feeds["img"][:4])
    with caplog.at_level(logging.WARNING, logger="calibrun"):
        assert image_evaluation(root, [nchw(size=4)], rows=100, transform=transform).rows == 6
    assert "100 evaluation rows requested" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="calibrun"):  # eval.rows at its default: all there is, said as info
        assert image_evaluation(root, [nchw(size=4)], rows=256, transform=transform).rows == 6
    assert [r.levelname for r in caplog.records if "evaluating the data's 6 rows" in r.message] == ["INFO"]
    write_png(root / "loose.png", np.zeros((5, 5, 3), np.uint8))
    assert image_evaluation(root, [nchw(size=4)], transform=transform).labels is None


# -------------------------------------------------------------------------------------------- evaluation


def test_npy_evaluation_rows_and_labels(tmp_path, caplog):
    data = np.random.default_rng(5).normal(size=(40, 4))
    np.savez(tmp_path / "d.npz", x=data, labels=np.arange(40, dtype=np.int32))
    with caplog.at_level(logging.INFO, logger="calibrun"):  # the rows left out are said, with the way to use them
        ev = npy_evaluation(tmp_path / "d.npz", [vec()], rows=25)
    assert [r.message for r in caplog.records if "evaluating the first" in r.message] == \
        [f"{tmp_path / 'd.npz'}: evaluating the first 25 of the data's 40 rows (eval.rows=25); eval.rows=40 "
         "evaluates them all"]
    assert ev.feeds["x"].dtype == np.float32
    np.testing.assert_array_equal(ev.feeds["x"], data[:25].astype(np.float32))
    assert ev.labels.dtype == np.int64
    np.testing.assert_array_equal(ev.labels, np.arange(25))
    full = npy_evaluation(tmp_path / "d.npz", [vec()])
    assert full.rows == 40
    json.dumps(full.identity)
    np.save(tmp_path / "plain.npy", data)
    assert npy_evaluation(tmp_path / "plain.npy", [vec()]).labels is None


def test_npy_evaluation_folder_labels(tmp_path):
    np.save(tmp_path / "a.npy", rows(10))
    np.save(tmp_path / "b.npy", rows(10, start=10))
    np.save(tmp_path / "labels.npy", np.arange(20) % 3)
    ev = npy_evaluation(tmp_path, [vec()], rows=15)
    np.testing.assert_array_equal(ev.feeds["x"][:, 0], np.arange(15))
    np.testing.assert_array_equal(ev.labels, np.arange(15) % 3)
    np.save(tmp_path / "labels.npy", np.arange(19))
    with pytest.raises(CalibrunError, match="19 labels for 20 rows"):
        npy_evaluation(tmp_path, [vec()])
    np.save(tmp_path / "labels.npy", np.zeros(20))
    with pytest.raises(CalibrunError, match="labels must be integers"):
        npy_evaluation(tmp_path, [vec()])


# ------------------------------------------------------------------------------------- into onnxruntime


def two_input_model() -> onnx.ModelProto:
    """(a + b) @ w + c: two float inputs with a symbolic first axis."""
    w = np.random.default_rng(0).normal(0, 0.5, (4, 3)).astype(np.float32)
    c = np.linspace(-1, 1, 3).astype(np.float32)
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"], name="add"),
        helper.make_node("MatMul", ["s", "w"], ["mm"], name="matmul"),
        helper.make_node("Add", ["mm", "c"], ["y"], name="bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_inputs",
        [helper.make_tensor_value_info(n, FLOAT, ["N", 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", FLOAT, ["N", 3])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


class FeedReader(CalibrationDataReader):
    def __init__(self, feeds):
        self._feeds = iter(feeds)

    def get_next(self):
        return next(self._feeds, None)


def test_feeds_drive_quantize_static_on_a_two_input_model(tmp_path):
    from calibrun.model import graph_inputs

    fp32 = save(two_input_model(), tmp_path / "m" / "fp32.onnx")
    rng = np.random.default_rng(11)
    np.savez(tmp_path / "calib.npz", a=rng.normal(size=(48, 4)), b=rng.normal(size=(48, 4)) * 3)
    inputs = graph_inputs(onnx.load(str(fp32)))
    feeds = npy_calibration(tmp_path / "calib.npz", inputs, batches=3)
    int8 = tmp_path / "m" / "int8.onnx"
    quantize_static(
        str(fp32), str(int8), FeedReader(feeds),
        quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
    )
    graph = onnx.load(str(int8)).graph
    quantized = {n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    assert {"a", "b"} <= quantized
    ev = npy_evaluation(tmp_path / "calib.npz", inputs, rows=8)
    out = ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"]).run(None, ev.feeds)[0]
    ref = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, ev.feeds)[0]
    assert out.shape == (8, 3)
    assert np.abs(out - ref).max() < 0.5


def test_single_input_view_fits_make_reader(tmp_path):
    np.save(tmp_path / "d.npy", rows(48))
    feeds = npy_calibration(tmp_path / "d.npy", [vec()], batches=3)
    view = feeds.arrays()
    assert len(view) == 3
    assert view.identity() == feeds.identity()
    reader = make_reader(view, "x")
    served = [reader.get_next() for _ in range(4)]
    assert served[3] is None
    np.testing.assert_array_equal(served[2]["x"], rows(16, start=32))
    with pytest.raises(CalibrunError, match="no input 'y'"):
        feeds.arrays("y")


# ------------------------------------------------------------------ image options: crop [h, w], letterbox, modes


def plain(**kw) -> ImageTransform:
    """A transform without normalisation: the output is the pixels in 0..1."""
    return ImageTransform(mean=(0, 0, 0), std=(1, 1, 1), **kw)


def test_non_square_crop_matches_a_centre_crop_of_the_resized_image(tmp_path):
    pixels = np.random.default_rng(11).integers(0, 256, (20, 30, 3), dtype=np.uint8)  # H=20, W=30
    write_png(tmp_path / "imgs" / "one.png", pixels)
    transform = plain(resize=10, crop=[6, 14])
    assert transform.crop_size == (6, 14)
    assert transform.identity()["crop"] == [6, 14]
    info = InputInfo("img", FLOAT, ("N", 3, "H", "W"))  # symbolic height and width: filled from the crop
    (feed,) = image_calibration(tmp_path / "imgs", [info], batches=1, transform=transform)
    assert feed["img"].shape == (1, 3, 6, 14)
    resized = np.asarray(Image.fromarray(pixels).resize((15, 10), Image.Resampling.BILINEAR), np.float32) / 255
    top, left = round((10 - 6) / 2), round((15 - 14) / 2)
    np.testing.assert_array_equal(feed["img"][0], resized[top : top + 6, left : left + 14].transpose(2, 0, 1))
    # the longer side of the crop may exceed `resize` (a wide crop from wide images); a tall image cannot give it
    write_png(tmp_path / "tall" / "t.png", pixels.transpose(1, 0, 2))
    feeds = image_calibration(tmp_path / "tall", [info], batches=1, transform=transform)
    with pytest.raises(CalibrunError, match=r"t\.png resized to 15x10 .* smaller than the crop 6x14"):
        drain(feeds)


def test_square_crop_given_as_a_pair_is_the_int_form():
    assert ImageTransform(crop=[224, 224]) == ImageTransform(crop=224)
    assert ImageTransform(crop=(224, 224)).identity() == ImageTransform().identity()
    assert "letterbox" not in ImageTransform().identity()  # the crop pipeline's cache keys did not change


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"crop": [48]}, "[height, width]"),
        ({"crop": [48, 0]}, "crop: sides must be in 1..16384, got [48, 0]"),
        ({"crop": [300, 400]}, "must fit inside resize=256"),
        ({"crop": "48"}, "crop"),
        ({"crop": 10**6}, "16384"),
        ({"resize": 0}, "resize"),
        ({"letterbox": "yes"}, "letterbox"),
        ({"letterbox": True, "pad_value": 1.5}, "pad_value"),
        ({"letterbox": True, "pad_value": float("nan")}, "pad_value"),
    ],
)
def test_bad_image_options_are_named(kwargs, word):
    with pytest.raises(CalibrunError, match=re.escape(word)):
        ImageTransform(**kwargs)


def test_letterbox_keeps_the_aspect_ratio_and_pads(tmp_path):
    pixels = np.random.default_rng(12).integers(0, 256, (10, 20, 3), dtype=np.uint8)  # H=10, W=20: 2:1
    write_png(tmp_path / "imgs" / "wide.png", pixels)
    transform = plain(crop=8, letterbox=True, pad_value=0.25, resize=1)  # resize is not used by letterbox
    assert transform.resized_size(20, 10) == (8, 4)
    (feed,) = image_calibration(tmp_path / "imgs", [nchw(size=8)], batches=1, transform=transform)
    got = feed["img"][0]
    assert got.shape == (3, 8, 8)
    np.testing.assert_array_equal(got[:, :2], 0.25)  # 2 rows of padding above, 2 below
    np.testing.assert_array_equal(got[:, 6:], 0.25)
    resized = np.asarray(Image.fromarray(pixels).resize((8, 4), Image.Resampling.BILINEAR), np.float32) / 255
    np.testing.assert_array_equal(got[:, 2:6], resized.transpose(2, 0, 1))
    # a tall image pads left and right; a non-square target
    write_png(tmp_path / "tall" / "t.png", np.full((40, 10, 3), 200, np.uint8))
    transform = plain(crop=(8, 16), letterbox=True, pad_value=0.0)
    (feed,) = image_calibration(tmp_path / "tall", [InputInfo("i", FLOAT, ("N", 3, 8, 16))], 1, transform=transform)
    got = feed["i"][0]
    assert transform.resized_size(10, 40) == (2, 8)
    np.testing.assert_array_equal(got[:, :, :7], 0.0)
    np.testing.assert_array_equal(got[:, :, 9:], 0.0)
    np.testing.assert_allclose(got[:, :, 7:9], 200 / 255, rtol=1e-6)


def test_letterbox_on_real_photos(tmp_path):
    from tests.trained import photo_folder

    folder = photo_folder(tmp_path / "photos", ("astronaut.png", "chelsea.png"))
    pad = 114 / 255
    transform = ImageTransform(crop=64, letterbox=True, pad_value=pad, mean=(0, 0, 0), std=(1, 1, 1))
    ev = image_evaluation(folder, [nchw(size=64)], transform=transform)
    astronaut, chelsea = ev.feeds["img"]  # sorted by name
    assert not np.any(np.all(astronaut == np.float32(pad), axis=0))  # 512x512: fills the square, no padding
    width, height = Image.open(folder / "chelsea.png").size  # 451 x 300: padded above and below
    rows_used = round(height * 64 / width)
    top = (64 - rows_used) // 2
    np.testing.assert_array_equal(chelsea[:, :top], np.float32(pad))
    np.testing.assert_array_equal(chelsea[:, top + rows_used :], np.float32(pad))
    assert np.std(chelsea[:, top : top + rows_used]) > 0.05  # the photo itself, not padding
    assert ev.identity["transform"]["letterbox"] is True
    assert ev.identity["transform"]["pad_value"] == pad


def _save_mode(path, array: np.ndarray, mode: str | None = None):
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(array) if mode is None else Image.fromarray(array).convert(mode)
    image.save(path)
    return path


def test_16_bit_png_divides_by_65535(tmp_path):
    values = np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000 + 535  # 535 .. 63535: most above 255
    values[0, 0], values[7, 7] = 0, 65535
    path = tmp_path / "imgs" / "deep.png"
    path.parent.mkdir(parents=True)
    Image.fromarray(values).save(path)  # a 16-bit greyscale PNG
    assert Image.open(path).mode.startswith("I")
    (feed,) = image_calibration(tmp_path / "imgs", [nchw(size=8)], 1, transform=plain(resize=8, crop=8))
    got = feed["img"][0]
    assert got.shape == (3, 8, 8)
    for channel in got:  # grey repeated into RGB, scaled by 65535 (not clipped at 255)
        np.testing.assert_allclose(channel, values / 65535, rtol=1e-6)
    assert got.max() == pytest.approx(1.0)
    assert got.min() == 0.0
    gray = ImageTransform(resize=8, crop=8, mean=(0,), std=(1,), grayscale=True)
    (feed,) = image_calibration(tmp_path / "imgs", [nchw(channels=1, size=8)], 1, transform=gray)
    np.testing.assert_allclose(feed["img"][0, 0], values / 65535, rtol=1e-6)


def test_16_bit_and_8_bit_versions_of_one_image_agree(tmp_path):
    """The same picture stored with 8 and with 16 bits gives the same pixels (a 16-bit level is v * 257)."""
    rng = np.random.default_rng(13)
    eight = rng.integers(0, 256, (24, 16), dtype=np.uint8)
    _save_mode(tmp_path / "a" / "x.png", eight)
    _save_mode(tmp_path / "b" / "x.png", eight.astype(np.uint16) * 257)
    transform = plain(resize=8, crop=[8, 6])  # a real resize: 16x24 -> 8x12, crop 8x6
    (a,) = image_calibration(tmp_path / "a", [InputInfo("img", FLOAT, ("N", 3, 8, 6))], 1, transform=transform)
    (b,) = image_calibration(tmp_path / "b", [InputInfo("img", FLOAT, ("N", 3, 8, 6))], 1, transform=transform)
    # Pillow resamples 8-bit images in fixed point with rounding to a level: within one 8-bit level
    np.testing.assert_allclose(a["img"], b["img"], rtol=0, atol=1.01 / 255)


def test_32_bit_modes(tmp_path):
    ints = (np.arange(16, dtype=np.int32).reshape(4, 4) * 4000)
    _save_mode(tmp_path / "i" / "x.png", ints.astype(np.uint16))  # stays within 16 bits
    tiff = tmp_path / "f" / "x.tiff"
    tiff.parent.mkdir()
    floats = np.linspace(0, 1, 16, dtype=np.float32).reshape(4, 4)
    Image.fromarray(floats, mode="F").save(tiff)
    (feed,) = image_calibration(tmp_path / "f", [nchw(size=4)], 1, transform=plain(resize=4, crop=4))
    np.testing.assert_allclose(feed["img"][0, 0], floats, rtol=1e-6)  # F: taken as it is
    big = tmp_path / "big" / "x.tiff"
    big.parent.mkdir()
    Image.fromarray(np.full((4, 4), 70000, np.int32), mode="I").save(big)
    assert Image.open(big).mode == "I"
    feeds = image_calibration(tmp_path / "big", [nchw(size=4)], 1, transform=plain(resize=4, crop=4))
    with pytest.raises(CalibrunError, match=r"x\.tiff.*outside the 16-bit range"):
        drain(feeds)


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "CMYK", "1", "L"])
def test_8_bit_modes_become_rgb_in_0_1(tmp_path, mode):
    pixels = np.random.default_rng(14).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    suffix = ".jpg" if mode == "CMYK" else ".png"
    path = tmp_path / "imgs" / f"x{suffix}"
    image = Image.fromarray(pixels).convert(mode)
    if mode == "RGBA":  # a varying alpha must not change the colours
        image.putalpha(Image.fromarray(np.arange(36, dtype=np.uint8).reshape(6, 6) * 7))
    path.parent.mkdir()
    image.save(path)
    with Image.open(path) as reopened:
        assert reopened.mode == mode
        expected = np.asarray(reopened.convert("RGB"), np.float32) / 255
    (feed,) = image_calibration(tmp_path / "imgs", [nchw(size=6)], 1, transform=plain(resize=6, crop=6))
    np.testing.assert_array_equal(feed["img"][0], expected.transpose(2, 0, 1))
    assert feed["img"].min() >= 0
    assert feed["img"].max() <= 1




def test_a_short_last_batch_of_the_batches_requested_is_said_not_warned(tmp_path, caplog):
    np.save(tmp_path / "d.npy", rows(33))
    with caplog.at_level(logging.INFO, logger="calibrun"):
        feeds = npy_calibration(tmp_path / "d.npy", [vec()], batches=3)
    assert [f["x"].shape[0] for f in feeds] == [16, 16, 1]
    said = [r for r in caplog.records if "3 batches requested" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    assert "2 full batches of 16 plus a last batch of 1 row; using 3 batches" in said[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="calibrun"):
        npy_calibration(tmp_path / "d.npy", [vec()], batches=5)
    assert any(r.levelno == logging.WARNING and "5 batches requested" in r.getMessage() for r in caplog.records)


def test_rows_the_batches_asked_for_leave_unread_are_said(tmp_path, caplog):
    """A model pinned to one row a batch calibrates on `batches` rows: the rest of the file is said, with the
    batches that read it all (a hand-landmark model read 64 of its 128 rows and no line said so)."""
    np.save(tmp_path / "d.npy", rows(128))
    with caplog.at_level(logging.INFO, logger="calibrun"):
        feeds = npy_calibration(tmp_path / "d.npy", [vec(first=1)], batches=64)
    assert len(feeds) == 64
    said = [r.getMessage() for r in caplog.records if "of the data's" in r.getMessage()]
    assert len(said) == 1
    assert said[0].endswith("calibrating on 64 of the data's 128 rows (64 batches of 1); batches=128 reads them all")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="calibrun"):
        npy_calibration(tmp_path / "d.npy", [vec()], batches=3)  # 48 of 128: a last short batch counts too
    said = [r.getMessage() for r in caplog.records if "of the data's" in r.getMessage()]
    assert len(said) == 1
    assert said[0].endswith("calibrating on 48 of the data's 128 rows (3 batches of 16); batches=8 reads them all")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="calibrun"):
        npy_calibration(tmp_path / "d.npy", [vec()], batches=8)  # every row read: nothing said
    assert not [r for r in caplog.records if "of the data's" in r.getMessage()]


def test_fewer_rows_than_one_batch_are_said_as_one_batch(tmp_path, caplog):
    np.save(tmp_path / "d.npy", rows(12))
    with caplog.at_level(logging.INFO, logger="calibrun"):
        feeds = npy_calibration(tmp_path / "d.npy", [vec()], batches=64)
    assert [f["x"].shape[0] for f in feeds] == [12]
    said = [r.getMessage() for r in caplog.records if "12 rows" in r.getMessage()]
    assert said == [f"{tmp_path / 'd.npy'}: calibrating on every row of the data, 12: one batch of 12 rows (fewer "
                    "than 16) (batches is 64 by default)"]
    assert all(r.levelno == logging.INFO for r in caplog.records if "12 rows" in r.getMessage())
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="calibrun"):  # a number the user gave: its shortfall is warned
        npy_calibration(tmp_path / "d.npy", [vec()], batches=10)
    said = [r for r in caplog.records if "10 batches requested" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING]


def test_a_source_is_recorded_with_what_it_reads():
    """result.json's eval_source: the image transform's options only for data=images (the config schema gives every
    source their defaults: a .npz source recorded `resize: 256, crop: 224` it never applied)."""
    from calibrun.data import IMAGE_KEYS, source_record

    node = {"name": "npy", "path": "eval.npz", "inputs": {}, **{key: 1 for key in IMAGE_KEYS}}
    assert source_record(node) == {"name": "npy", "path": "eval.npz", "inputs": {}}
    assert source_record({**node, "name": "images"}) == {**node, "name": "images"}
    assert {"resize", "crop", "mean", "std", "pad_value", "resize_mode", "channels", "layout"} <= set(IMAGE_KEYS)


@pytest.mark.parametrize("order", ["C", "F"])
def test_an_uncompressed_npz_member_is_memory_mapped_and_a_compressed_one_loaded(tmp_path, order):
    """numpy.savez stores members uncompressed: a member is read in place (a memmap), as an .npy file is, so a job
    that reads some rows of a large npz does not hold the whole member (a probe's 1.3 GB npz had cost 1.3 GB more
    than the same rows as .npy). savez_compressed's members must be inflated: loaded. The values are the same."""
    from calibrun.data import npy as npy_module

    rng = np.random.default_rng(5)
    arrays = {"x": np.asarray(rng.normal(size=(40, 6)), order=order).astype(">f4" if order == "F" else "<f8"),
              "ids": np.arange(40, dtype=np.int64)}
    np.savez(tmp_path / "plain.npz", **arrays)
    np.savez_compressed(tmp_path / "packed.npz", **arrays)
    for name, mapped in (("plain.npz", True), ("packed.npz", False)):
        for key, want in arrays.items():
            got = npy_module._mapped_member(tmp_path / name, key)
            assert (got is not None) == mapped
            if mapped:
                assert isinstance(got, np.memmap)
                np.testing.assert_array_equal(got, want)
                assert got.dtype == want.dtype
        rows = npy_evaluation(tmp_path / name, [vec("x", features=6)])  # the source reads the same values either way
        np.testing.assert_array_equal(np.concatenate([f["x"] for f, _ in rows.batches(16)]),
                                      arrays["x"].astype(np.float32))
def test_a_compressed_npz_member_is_inflated_as_its_rows_are_read(tmp_path):
    """A numpy.savez_compressed member was inflated whole on every pass (a 330 MB member of which a job read 256 rows:
    its peak 533 -> 269 MB, 8.4 -> 3.7 s, session 41). Its rows along axis 0, in C order, are now inflated as they
    are read: the same values in any batch sizes, and the rows before a damaged stretch read before the damage is
    met (its loading whole failed at once), which then fails in one line naming the member. Fortran order, or rows
    on another axis, are loaded as before."""
    import zipfile

    from calibrun.data import npy as npy_module

    rng = np.random.default_rng(6)
    x = rng.normal(size=(2000, 6)).astype(np.float32)
    np.savez_compressed(tmp_path / "packed.npz", x=x)
    for sizes in ([16] * 125, [7, 1, 500, 1492], [2000]):
        (segment,) = npy_module._scan_npz(npy_module._File.scan(tmp_path / "packed.npz", "packed.npz")).values()
        read, at, got = segment.rows(0), 0, []
        for size in sizes:
            got.append(read(at, at + size))
            at += size
        np.testing.assert_array_equal(np.concatenate(got), x)
    with zipfile.ZipFile(tmp_path / "packed.npz") as archive:
        info = archive.getinfo("x.npy")
    data = bytearray((tmp_path / "packed.npz").read_bytes())
    end = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size
    data[end - 2000:end - 1000] = bytes(1000)  # damage near the end of the deflated rows
    (tmp_path / "damaged.npz").write_bytes(bytes(data))
    (segment,) = npy_module._scan_npz(npy_module._File.scan(tmp_path / "damaged.npz", "damaged.npz")).values()
    read = segment.rows(0)
    np.testing.assert_array_equal(read(0, 64), x[:64])  # the rows before the damage
    with pytest.raises(CalibrunError, match=r"^cannot read .*damaged\.npz\['x'\]: "):
        read(64, 2000)
    np.savez_compressed(tmp_path / "fortran.npz", x=np.asfortranarray(x))
    for name, axis in (("fortran.npz", 0), ("packed.npz", 1)):
        (segment,) = npy_module._scan_npz(npy_module._File.scan(tmp_path / name, name)).values()
        read = segment.rows(axis)
        np.testing.assert_array_equal(read(0, 3), x[:3] if axis == 0 else x[:, :3])




def test_rows_stacked_on_an_axis_the_input_does_not_declare_raise_their_own_error(tmp_path):
    """A streaming denoiser takes one [512] frame a call and its states, every axis fixed: frames stacked on a first
    axis have no axis of the model. The data layer raises RowsOnNewAxis (the job adds the axis to a model whose every
    input is so, calibrun.model.row_axis), whose line says where such rows run and what a state beside a batch axis
    takes; a rank that is simply wrong keeps the plain line."""
    frame = InputInfo("input_frame", TensorProto.FLOAT, (8,))
    np.savez(tmp_path / "d.npz", input_frame=np.zeros((5, 8), np.float32))
    with pytest.raises(RowsOnNewAxis) as raised:
        npy_evaluation(tmp_path / "d.npz", [frame])
    message = str(raised.value)
    assert "has shape [5, 8] (rank 2); the input has rank 1 (or one axis fewer, for a constant row); every axis of " \
           "it is fixed: rows stacked on a first axis run where no input of the model has a batch axis" in message
    assert "eval_data.inputs.input_frame.value=..." in message
    np.savez(tmp_path / "e.npz", input_frame=np.zeros((5, 4, 2), np.float32))
    with pytest.raises(CalibrunError) as raised:
        npy_evaluation(tmp_path / "e.npz", [frame])
    assert not isinstance(raised.value, RowsOnNewAxis)
    assert "every axis of it" not in str(raised.value)


def test_a_stream_at_the_default_evaluates_its_rows_up_to_the_streams_bound(caplog):
    """A state fed back makes the evaluation one call a row, in order, over one recording: at eval.rows' default
    (256) it reads up to STREAM_EVAL_ROWS of the file's rows (an unseen denoiser's first 256 of 752 were its silent
    start); a row count the user sets, or a source with no state fed back, keeps its rows."""
    from omegaconf import OmegaConf

    from calibrun.data.batches import STREAM_EVAL_ROWS, _cap_rows
    from calibrun.job import eval_source

    def source(rows, inputs):
        cfg = OmegaConf.create({"eval": {"seed": 1, "rows": rows},
                                "eval_data": {"name": "npy", "path": "e.npz", "inputs": inputs}})
        return eval_source(cfg)["rows"]

    streamed = {"state": {"from_output": "stateN"}, "sr": {"value": 16000}}
    assert source(256, streamed) == STREAM_EVAL_ROWS == 2048
    assert source(300, streamed) == 300  # set by the user
    assert source(256, {"sr": {"value": 16000}}) == 256
    assert source(256, None) == 256
    with caplog.at_level("INFO", logger="calibrun"):
        assert _cap_rows(752, STREAM_EVAL_ROWS, "eval_data") == 752
    assert "evaluating the data's 752 rows (a stream's default: up to 2048)" in caplog.text
