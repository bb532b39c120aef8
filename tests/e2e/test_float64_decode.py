"""A trained model that computes part of its graph in float64: swift-f0 0.3.0's pitch tracker (`audio` [1, samples],
`fmin` and `fmax` scalars -> `pitch` float64 [1, frames] in Hz and `confidence` [1, frames]), whose decode casts to
float64 for a Softmax over the pitch bins. onnxruntime's quantize_static failed on it in both forms: in QDQ its Softmax
output has no calibrated range (calibration ranges float32 tensors) and onnxruntime sets every Softmax output's
range; in QOperator it wrote a model reading tensors no node writes (a Transpose and a Sigmoid). calibrun keeps the
float64 nodes in float, and quantises again with the producers of such tensors kept in float, said in one line each.
Its QOperator job measures the matrix ops alone in QDQ form among its recommendations. Data: pyannote-audio's speech,
2 s clips as the package scales them (int16 / 32768)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.conftest import run_python
from tests.trained import SWIFT_F0, package_file
from tests.zoo import speech

pytestmark = pytest.mark.slow  # subprocesses of the CLI

FMIN, FMAX = 46.875, 2093.75  # the package's defaults (swift_f0/core.py)


@pytest.mark.parametrize("form", ["qdq", "qoperator"])
def test_a_float64_pitch_decode_stays_in_float_and_the_model_quantises(tmp_path, form):
    model = package_file(*SWIFT_F0, "swift_f0/model.onnx")
    audio, rate = speech()
    audio = audio.astype(np.float32) / 32768
    clips = np.stack([audio[s:s + 2 * rate] for s in range(0, len(audio) - 2 * rate + 1, rate)])
    constants = {"fmin": np.array(FMIN, np.float32), "fmax": np.array(FMAX, np.float32)}
    np.savez(tmp_path / "calib.npz", audio=clips[0::2], **constants)
    np.savez(tmp_path / "eval.npz", audio=clips[1::2], **constants)
    run = tmp_path / "run"
    proc = run_python(["-m", "calibrun", "model=file", f"model.path={model}", "data=npy",
                       f"data.path={tmp_path / 'calib.npz'}", "eval_data=npy",
                       f"eval_data.path={tmp_path / 'eval.npz'}",
                       f"format={form}", f"recommend={'on' if form == 'qoperator' else 'off'}", "tracking=off",
                       f"cache.dir={tmp_path / 'cache'}",
                       f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "kept in float: 6 node(s) computing in float64" in proc.stderr
    if form == "qoperator":
        assert "reads tensors no node writes any more" in proc.stderr
        # its candidates include the matrix ops alone in QDQ form, read from its integer ops (QLinearConv: Conv)
        measured = json.loads((run / "recommendations.json").read_text())["measured"]
        assert any(e["change"].startswith("format=qdq quant.op_types_to_quantize=[Conv,MatMul]") and
                   math.isfinite(e["after"]) for e in measured), [e["change"] for e in measured]
    result = json.loads((run / "result.json").read_text())
    assert result["verdict"]["status"] in ("ok", "degraded", "broken")
    assert math.isfinite(result["metrics"]["out.pitch.sqnr_db"])
    assert result["ops"].get("QuantizeLinear" if form == "qdq" else "QLinearConv", 0) > 0  # the network is int8
