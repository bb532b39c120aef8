"""A model whose rows are the frames of one sequence, end to end (`python -m calibrun`, real onnxruntime and Hydra),
as madmom's audio networks are exported: x [T, F] with no batch axis, a convolution over 5 frames, [T - 4, C] out.

- It cannot run one row: the per-tensor diagnostics, which start with one row to size their runs, diagnose each
  batch whole instead of failing the job (it failed with onnxruntime's "Invalid input shape").
- Its output for a row depends on the rows beside it: the job says so in one warning, result.json `used.rows_depend`
  names the output, and the verdict's sentence says it was measured on batches of 16 rows.
- The job's summary line gives the batches the data held, not the 64 asked for.
- A text-line model whose one free axis is its width has its columns taken as rows: the warning names that axis
  and the override that moves the rows.
- A model whose rows are independent (the lab's) gets no such warning.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.conftest import Proc, clean_env, run_python
from tests.modelzoo import frame_conv, save, width_conv


def calibrun(tmp: Path, *overrides: str) -> Proc:
    return run_python(["-m", "calibrun", *overrides, "tracking=off", f"cache.dir={tmp / 'cache'}"], tmp, clean_env(),
                      600)


def test_frames_of_one_sequence_are_diagnosed_whole_and_said_to_depend_on_each_other(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((40, 8)).astype(np.float32))
    np.savez(tmp_path / "eval.npz", x=rng.standard_normal((48, 8)).astype(np.float32))
    model = save(frame_conv(), tmp_path / "frames.onnx")
    run = calibrun(tmp_path, "model=file", f"model.path={model}", "data=npy", f"data.path={tmp_path / 'calib.npz'}",
                   "eval_data=npy", f"eval_data.path={tmp_path / 'eval.npz'}", "hydra.run.dir=frames")
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "frames" / "result.json").read_text())
    assert result["status"] == "ok"
    assert result["used"]["diagnostics_rows"] == 48  # every evaluation row diagnosed, each batch whole
    assert "diagnostics: the model does not run one row at a time" in run.stderr
    assert result["used"]["rows_depend"] == "runs 8 rows but not 4 of them"
    warned = [line for line in run.stderr.splitlines() if "depends on the rows fed beside it" in line]
    assert len(warned) == 1
    assert "WARNING" in warned[0]
    assert "the rows are counted along" not in warned[0]  # axis 0: nothing to move
    assert result["verdict"]["because"].endswith("; measured on batches of 16 rows: the model's rows depend on each "
                                                 "other")
    assert "QDQ int8 model from 3 calibration batch(es)" in run.stderr  # 40 rows: 3 batches, not the 64 asked for


def test_a_width_taken_as_rows_is_named_with_the_override_that_moves_them(tmp_path):
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((1, 1, 8, 40)).astype(np.float32))
    np.savez(tmp_path / "eval.npz", x=rng.standard_normal((1, 1, 8, 48)).astype(np.float32))
    model = save(width_conv(), tmp_path / "line.onnx")
    run = calibrun(tmp_path, "model=file", f"model.path={model}", "data=npy", f"data.path={tmp_path / 'calib.npz'}",
                   "eval_data=npy", f"eval_data.path={tmp_path / 'eval.npz'}", "recommend=off", "hydra.run.dir=line")
    assert run.returncode == 0, run.stderr[-3000:]
    warned = [line for line in run.stderr.splitlines() if "depends on the rows fed beside it" in line]
    assert len(warned) == 1, run.stderr[-3000:]
    assert "the rows are counted along axis 3 of input 'x'" in warned[0]
    assert "set data.inputs.x.batch_axis and eval_data.inputs.x.batch_axis" in warned[0]


def test_independent_rows_are_not_said_to_depend(tmp_path):
    run = calibrun(tmp_path, "recommend=off", "hydra.run.dir=lab")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "depends on the rows" not in run.stderr
    assert json.loads((tmp_path / "lab" / "result.json").read_text())["used"]["rows_depend"] is None
