"""An image source end to end: a trained classifier through `python -m calibrun` on real photos (the in-process
tests of the data sources are in tests/unit/test_sources.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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


@pytest.mark.slow
def test_the_classifier_saved_after_onnxruntimes_graph_optimisation_is_quantised_and_judged(tmp_path):
    """The same classifier as onnxruntime saves it at its extended optimisation level (a common file to bring: 24
    Conv + activation pairs become com.microsoft FusedConv, an operator onnx's shape inference has no schema for,
    so the tensors after them had no type). onnxruntime's quantize_static refuses it as it is (a bias with no scale
    for its input); through `python -m calibrun` the preparation gives those tensors onnxruntime's own types, and
    the job quantises the model on the photos, measures it and gives a verdict on its classes."""
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    from tests.conftest import run_python
    from tests.trained import TEXT_PHOTOS, model_path, photo_folder

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "cls_optimised.onnx")
    ort.InferenceSession(str(model_path("ocr_cls")), options, providers=["CPUExecutionProvider"])
    model = onnx.load(options.optimized_model_filepath)
    assert sum(n.op_type == "FusedConv" and n.domain == "com.microsoft" for n in model.graph.node) >= 10

    class Constant(CalibrationDataReader):  # two batches of the photos' size: any values show the refusal
        def __init__(self):
            self.batches = iter([{"x": np.full((2, 3, 48, 192), v, np.float32)} for v in (-0.5, 0.5)])

        def get_next(self):
            return next(self.batches, None)

    with pytest.raises(ValueError, match="quantization scale"):
        quantize_static(options.optimized_model_filepath, str(tmp_path / "bare.onnx"), Constant())

    photos = photo_folder(tmp_path / "photos", ("astronaut.png", "chelsea.png", "coffee.png", *TEXT_PHOTOS))
    norm = ["mean=[0.5,0.5,0.5]", "std=[0.5,0.5,0.5]"]
    overrides = [
        "model=file", f"model.path={options.optimized_model_filepath}", "batches=1", "eval.rows=6", "tracking=off",
        "data=images", f"data.path={photos}", "data.crop=[48,192]", *[f"data.{n}" for n in norm],
        "eval_data=images", f"eval_data.path={photos}", "eval_data.crop=[48,192]", *[f"eval_data.{n}" for n in norm],
        f"hydra.run.dir={tmp_path / 'run'}", f"cache.dir={tmp_path / 'cache'}", "recommend=off",
    ]
    proc = run_python(["-m", "calibrun", *overrides], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "com.microsoft.FusedConv x24" in proc.stderr  # the preparation's line says why it typed tensors
    # and the job says what stays in float: quantize_static has no int8 form of onnxruntime's FusedConv
    assert "no static int8 form of com.microsoft.FusedConv x24" in proc.stderr
    assert result_float_ops(tmp_path / "run") == {"com.microsoft.FusedConv": 24}
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "ok"
    assert result["verdict"]["metric"] == "task.top1_agreement"
    assert result["verdict"]["status"] in ("ok", "degraded", "broken")
    int8 = onnx.load(str(tmp_path / "run" / "int8.onnx"))
    produced = {o: n.op_type for n in int8.graph.node for o in n.output}
    (gemm,) = [n for n in int8.graph.node if n.op_type == "Gemm"]
    assert produced[gemm.input[0]] == "DequantizeLinear"  # the classifier's head reads int8 values
    plain = [n for n in int8.graph.node if n.op_type == "Conv"]
    assert plain
    assert all(produced.get(n.input[0]) == "DequantizeLinear" for n in plain)


def result_float_ops(job: Path) -> dict:
    return json.loads((job / "result.json").read_text())["used"]["float_weighted_ops"]
