"""Image preprocessing that reproduces a model family's own (calibrun.data.images, docs/data.md): resize modes,
channel order, layout, letterbox padding, and the other inputs of a multi-input image model."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto
from PIL import Image

from calibrun.core.errors import CalibrunError
from calibrun.data.images import YOLO_PAD, ImageTransform, image_calibration, image_evaluation
from calibrun.model import InputInfo

FLOAT = TensorProto.FLOAT
PIXELS = np.random.default_rng(21).integers(0, 256, (10, 20, 3), dtype=np.uint8)  # H=10, W=20


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "imgs"
    path.mkdir()
    Image.fromarray(PIXELS).save(path / "wide.png")
    return path


def plain(**kw) -> ImageTransform:
    """No normalisation: the output is the pixels in 0..1."""
    return ImageTransform(mean=(0, 0, 0), std=(1, 1, 1), **kw)


def one(folder, shape, transform, **kw) -> np.ndarray:
    (feed,) = image_calibration(folder, [InputInfo("img", FLOAT, shape)], 1, transform=transform, **kw)
    return feed["img"][0]


def test_stretch_resizes_to_the_size_without_keeping_the_aspect_ratio(folder):
    got = one(folder, ("N", 3, 6, 8), plain(resize_mode="stretch", crop=[6, 8], resize=1))
    want = np.asarray(Image.fromarray(PIXELS).resize((8, 6), Image.Resampling.BILINEAR), np.float32) / 255
    np.testing.assert_array_equal(got, want.transpose(2, 0, 1))


def test_bgr_reverses_the_channels_and_mean_std_follow_the_fed_order(folder):
    rgb = one(folder, ("N", 3, 4, 4), ImageTransform(resize=4, crop=4, mean=(0, 0, 0), std=(1, 1, 1)))
    bgr = one(folder, ("N", 3, 4, 4), ImageTransform(resize=4, crop=4, channels="bgr", mean=(0.1, 0, 0),
                                                     std=(0.5, 1, 1)))
    np.testing.assert_allclose(bgr[0], (rgb[2] - 0.1) / 0.5, rtol=1e-6)  # channel 0 fed is blue
    np.testing.assert_array_equal(bgr[1:], rgb[1::-1])


@pytest.mark.parametrize(("shape", "layout", "resolved", "crop"), [
    (("N", "H", "W", 3), None, "nhwc", 4),  # channels last, fixed to 3 (Keras, TFLite exports)
    (("N", 3, "H", "W"), None, "nchw", 4),
    (("N", "C", "H", "W"), None, "nchw", 4),  # nothing fixed: NCHW
    (("N", 3, 4, 3), None, "nchw", [4, 3]),  # both 3: NCHW ...
    (("N", 3, 4, 3), "nhwc", "nhwc", [3, 4]),  # ... unless set
])
def test_the_layout_is_inferred_from_the_input_shape_unless_set(folder, shape, layout, resolved, crop):
    got = one(folder, shape, plain(resize=4, crop=crop, layout=layout))
    chw = one(folder, ("N", 3, "H", "W"), plain(resize=4, crop=crop))
    np.testing.assert_array_equal(got, chw if resolved == "nchw" else chw.transpose(1, 2, 0))


@pytest.mark.parametrize(("shape", "layout", "channels_on"), [
    (("N", 3, 48, "W"), "nhwc", 1),  # PP-OCR's direction classifier: its channels on axis 1
    (("N", "H", "W", 3), "nchw", 3),
])
def test_a_layout_set_against_the_channels_the_shape_states_is_refused(folder, shape, layout, channels_on):
    """Fed as set, the channels land on a spatial axis: a probe's NCHW classifier with data.layout=nhwc followed the
    crop hint (crop=[3,192]) and was calibrated on 3-pixel-high images, its verdict given as if nothing were wrong."""
    other = "nchw" if layout == "nhwc" else "nhwc"
    with pytest.raises(CalibrunError, match=rf"^config data\.layout={layout}: input 'img' .* holds its 3 channels on "
                                            rf"axis {channels_on}, as {other.upper()} does; drop data\.layout "):
        one(folder, shape, plain(resize=4, crop=4, layout=layout))


def test_letterbox_pads_with_ultralytics_grey_by_default_and_is_a_resize_mode(folder):
    assert ImageTransform().pad_value == YOLO_PAD == 114 / 255
    by_mode = plain(resize_mode="letterbox", crop=8)
    assert by_mode == plain(letterbox=True, crop=8)
    assert by_mode.letterbox
    got = one(folder, ("N", 3, 8, 8), by_mode)
    np.testing.assert_array_equal(got[:, :2], np.float32(114 / 255))  # the 20x10 image fills 8x4: 2 rows above
    assert by_mode.identity()["pad_value"] == 114 / 255


def test_the_identity_keeps_the_earlier_keys_and_adds_what_changes_the_pixels(folder):
    before = {"resize", "crop", "mean", "std", "grayscale"}
    assert set(ImageTransform().identity()) == before  # the crop pipeline's cache keys did not change
    assert ImageTransform(channels="bgr").identity()["channels"] == "bgr"
    assert ImageTransform(resize_mode="stretch", crop=[6, 8]).identity()["resize_mode"] == "stretch"
    nhwc = image_calibration(folder, [InputInfo("img", FLOAT, ("N", 4, 4, 3))], 1, transform=plain(resize=4, crop=4))
    assert nhwc.identity()["transform"]["layout"] == "nhwc"
    nchw = image_calibration(folder, [InputInfo("img", FLOAT, ("N", 3, 4, 4))], 1, transform=plain(resize=4, crop=4))
    assert "layout" not in nchw.identity()["transform"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"resize_mode": "crop"}, "transform resize_mode: must be one of shorter, stretch, letterbox, got 'crop'"),
    ({"channels": "rgba"}, "transform channels: must be one of rgb, bgr, got 'rgba'"),
    ({"layout": "chw"}, "transform layout: must be one of nchw, nhwc, none, got 'chw'"),
    ({"letterbox": True, "resize_mode": "stretch"}, "letterbox: contradicts resize_mode=stretch"),
    ({"channels": "bgr", "grayscale": True, "mean": [0.5], "std": [0.5]}, "channels: bgr orders 3 channels"),
    ({"crop": [300, 400]}, "must fit inside resize=256 (the shorter side after resizing; or resize_mode=letterbox"),
])
def test_bad_image_options_name_the_option(kwargs, message):
    with pytest.raises(CalibrunError, match=re.escape(message)):
        ImageTransform(**kwargs)


def test_stretch_and_letterbox_take_any_crop_whatever_resize_is():
    assert ImageTransform(resize_mode="stretch", crop=[300, 400]).crop_size == (300, 400)


def test_the_other_inputs_of_an_image_model_come_from_config_values(folder):
    inputs = [InputInfo("img", FLOAT, ("N", 3, 4, 4)), InputInfo("size", TensorProto.INT64, ("N", 2)),
              InputInfo("scale", FLOAT, ())]
    given = {"size": {"value": [10, 20]}, "scale": {"value": 0.5}}
    (feed,) = image_calibration(folder, inputs, 1, 2.0, plain(resize=4, crop=4), given)
    assert list(feed) == ["img", "size", "scale"]
    np.testing.assert_array_equal(feed["size"], [[10, 20]])  # one row, repeated to the batch's rows
    assert feed["size"].dtype == np.int64
    assert feed["scale"].dtype == np.float32
    assert feed["scale"] == 0.5
    evaluation = image_evaluation(folder, inputs, None, plain(resize=4, crop=4), given)
    assert evaluation.axes == {"img": 0, "size": 0, "scale": None}
    with pytest.raises(CalibrunError, match=re.escape("input 'scale' (FLOAT []) is a scalar: it has no rows; give "
                                                      "it a constant (data.inputs.scale.value=...")):
        image_calibration(folder, inputs, 1, transform=plain(resize=4, crop=4), given={"size": {"value": [1, 2]}})


def test_calibration_and_evaluation_images_made_differently_are_said(caplog):
    """A probe set eval_data's stretch to 48x192 and left data at its 224 crop: calibrated on other pixels than it
    was measured on, with nothing said. One warning names each key that differs (data's value / eval_data's)."""
    import logging

    from omegaconf import OmegaConf

    from calibrun import job
    from calibrun.config import Config

    cfg = OmegaConf.structured(Config)
    cfg.data.name = cfg.eval_data.name = "images"
    with caplog.at_level(logging.WARNING, logger="calibrun"):
        job._say_other_pixels(cfg)
    assert caplog.records == []
    cfg.eval_data.resize_mode, cfg.eval_data.crop = "stretch", [48, 192]
    with caplog.at_level(logging.WARNING, logger="calibrun"):
        job._say_other_pixels(cfg)
    assert [r.getMessage() for r in caplog.records] == [
        "data and eval_data make their images differently (crop 224 / [48, 192]; resize_mode shorter / stretch): the "
        "ranges are calibrated on other pixels than the int8 model is measured on; set the same keys under both"]


def test_an_image_model_input_without_a_value_is_named_with_the_key_to_set(folder):
    """A probe's style network (an image and a style-weights input): the error named the image input too among
    those 'without a value'. The image input is the one 4-D float input; the others are named with their keys."""
    inputs = [InputInfo("image", FLOAT, ("N", 3, 4, 4)), InputInfo("style_weights", FLOAT, ("N", 26))]
    with pytest.raises(CalibrunError, match=re.escape(
            "image sources feed one image input ('image'); 'style_weights' (FLOAT [N, 26]) has no value: set "
            "eval_data.inputs.style_weights.value=..., or use eval_data=npy")):
        image_evaluation(folder, inputs, transform=plain(resize=4, crop=4))


def test_an_image_of_extreme_aspect_ratio_is_refused_before_it_is_resized(tmp_path):
    """A probe's 32 KB strip of 4000x2 pixels, resized so its shorter side is 256, made a 512000x256 image (2.7 GB
    peak) before the centre crop. Refused in one line naming the file, its size and what to use instead."""
    strip = tmp_path / "strip"
    strip.mkdir()
    Image.fromarray(np.zeros((2, 4000, 3), np.uint8)).save(strip / "strip.png")
    with pytest.raises(CalibrunError, match=re.escape("strip.png: image of 4000x2 (width x height) would be "
                                                      "512000x256 with its shorter side resized to 256")):
        next(image_evaluation(strip, [InputInfo("img", FLOAT, ("N", 3, 224, 224))],
                              transform=ImageTransform()).batches(1))
    ok = image_evaluation(strip, [InputInfo("img", FLOAT, ("N", 3, 224, 224))],
                          transform=ImageTransform(resize_mode="letterbox", crop=224))
    assert next(ok.batches(1))[0]["img"].shape == (1, 3, 224, 224)


def test_a_float_image_of_0_to_255_levels_is_said_to_be_taken_as_0_to_1(tmp_path, caplog, monkeypatch):
    """A probe's float TIFF of 0..255 levels was normalised as if 0..1 (values ~1000 fed) with nothing said."""
    import logging

    from calibrun.data import images

    monkeypatch.setattr(images, "_SAID_FLOAT", [])
    folder = tmp_path / "f"
    folder.mkdir()
    Image.fromarray(np.full((4, 4), 200.0, np.float32), mode="F").save(folder / "a.tif")
    with caplog.at_level(logging.WARNING, logger="calibrun"):
        feeds = next(image_evaluation(folder, [InputInfo("img", FLOAT, ("N", 3, 4, 4))],
                                      transform=plain(resize=4, crop=4)).batches(1))[0]
    assert float(feeds["img"].max()) == 200.0  # fed as it is
    assert "a 32-bit float image holds values up to 200: float images are taken as pixels in 0..1" in caplog.text


def test_an_image_past_pillows_bomb_warning_is_said_once_in_calibruns_words(folder, caplog, monkeypatch):
    """A 95-megapixel photo printed Pillow's DecompressionBombWarning raw (two lines, a file path into PIL) on every
    read; now one calibrun line naming the image and what its decoding costs, however many such images are read.
    (Pillow's limit is lowered here so that a small image passes it.)"""
    import logging
    import warnings

    from calibrun.data import images

    monkeypatch.setattr(images, "_SAID_LARGE", [])
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # warns past 100, refuses past 200 (Pillow's 2x)
    Image.fromarray(PIXELS[:, :10]).save(folder / "narrow.png")  # 100 pixels: within the limit
    Image.fromarray(PIXELS[:, :15]).save(folder / "wider.png")  # 150: past it
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning left to Python fails the read
        with caplog.at_level(logging.WARNING, logger="calibrun"):
            for name in ("narrow.png", "wider.png", "wide.png", "wider.png"):
                assert plain(resize=10, crop=10)(folder / name).shape == (3, 10, 10)
    said = [r.getMessage() for r in caplog.records if "megapixels" in r.getMessage()]
    assert said == [f"image {folder / 'wider.png'} is 0 megapixels: each such image is decoded whole before its "
                    "resize (about 0 MB at a time)"]
    Image.fromarray(np.tile(PIXELS, (2, 1, 1))).save(folder / "bomb.png")  # 400 pixels: past twice the limit
    with pytest.raises(CalibrunError, match=r"^cannot read image .*bomb\.png: Image size \(400 pixels\) exceeds limit"):
        plain(resize=10, crop=10)(folder / "bomb.png")
