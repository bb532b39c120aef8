"""An image source end to end: a trained classifier through `python -m calibrun` on real photos (the in-process
tests of the data sources are in tests/unit/test_sources.py)."""

from __future__ import annotations

import json

import onnx
import pytest

pytestmark = pytest.mark.slow  # a subprocess of the CLI, a trained model


@pytest.mark.slow
def test_ocr_classifier_end_to_end_on_real_photos_with_a_non_square_crop(tmp_path):
    """PP-OCR's text-direction classifier (trained, input [N, 3, ?, ?]: the crop fills height and width) runs
    through `python -m calibrun` on scikit-image photos: calibration with a centre crop [48, 192], evaluation
    letterboxed into 48x192 as PP-OCR pads its inputs."""
    from tests.conftest import run_python
    from tests.trained import TEXT_PHOTOS, model_path, photo_folder

    photos = photo_folder(tmp_path / "photos", ("astronaut.png", "chelsea.png", "coffee.png", *TEXT_PHOTOS))
    norm = ["mean=[0.5,0.5,0.5]", "std=[0.5,0.5,0.5]"]
    overrides = [
        "model=file", f"model.path={model_path('ocr_cls')}", "batches=1", "eval.rows=6", "tracking=off",
        "data=images", f"data.path={photos}", "data.crop=[48,192]", *[f"data.{n}" for n in norm],
        "eval_data=images", f"eval_data.path={photos}", "eval_data.crop=[48,192]", "eval_data.letterbox=true",
        "eval_data.pad_value=0.5", *[f"eval_data.{n}" for n in norm],
        f"hydra.run.dir={tmp_path / 'run'}", f"cache.dir={tmp_path / 'cache'}",
    ]
    proc = run_python(["-m", "calibrun", *overrides, "recommend=off"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "ok"
    metrics = result["metrics"]
    assert 0 < metrics["input_scale"] < 1
    assert 0 < metrics["max_abs_error"] < 1  # softmax probabilities: the int8 model is close, not identical
    assert 1.0 < metrics["span"] <= 2.0  # pixels in 0..1 normalised by (x - 0.5) / 0.5: the photos span -1..1
    assert result["eval_source"]["crop"] == [48, 192]
    assert result["eval_source"]["letterbox"] is True
    assert onnx.load(str(tmp_path / "run" / "int8.onnx")).graph.node
