"""Streaming evaluation on a trained model (memory does not grow with the evaluation rows) and in real lab jobs
(`python -m calibrun`: result.json's per-output metrics, diagnostics on and off). The in-process tests on the lab
MLP are in tests/unit/test_measure.py."""

from __future__ import annotations

import dataclasses
import tracemalloc

import pytest

from calibrun.data import EvalData
from calibrun.lab.data import evaluation_pieces, evaluation_rows
from calibrun.measure import errors as measure
from calibrun.measure.tensor_stats import StreamingDiagnostics
from calibrun.model import open_float_model
from calibrun.quant.calibrate import CalibrationCache
from calibrun.quant.quantize import quantize_with

pytestmark = pytest.mark.slow  # a trained model in-process, subprocesses of the CLI


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_rows_on_a_trained_model(tmp_path):
    """ocr_cls (MobileNetV3, trained) quantised, then evaluated with diagnostics at 8 and 32 rows in batches of 8:
    the peak of Python/numpy allocations stays within 1.3x (a run holding every row would need ~4x)."""
    from calibrun.lab.data import lab_batches
    from tests.trained import model_path

    fp32 = open_float_model(model_path("ocr_cls"))
    # the lab rule on its symbolic height and width: an input description with them fixed to 48 x 192
    fp32_info = dataclasses.replace(fp32.info, shape=(fp32.info.shape[0], 3, 48, 192))
    data = lab_batches(fp32_info, 4242, 1.0, 2)
    int8 = tmp_path / "int8.onnx"
    cache = CalibrationCache(tmp_path / "cache")
    quant = quantize_with(fp32, int8, data, cache=cache, ranges_copy=tmp_path / "ranges.json")
    assert quant["batches"] == 2

    def run(rows):
        evaluation = EvalData(rows, lambda sizes: ({fp32_info.name: a} for a in
                                                   evaluation_pieces(fp32_info, 777, rows)(sizes)))
        m = measure.evaluate(fp32.path, int8, evaluation, batch_size=8, progress=None)
        with StreamingDiagnostics(fp32.path, int8, tmp_path / "ranges.json") as diag:  # the job's second pass
            assert diag.over(evaluation, batch_size=8, progress=None)
            assert diag.rows_seen == rows
        assert m["rows"] == rows

    run(8)  # warm up onnxruntime and imports
    small, large = _peak(lambda: run(8)), _peak(lambda: run(32))
    print(f"peak traced memory: {small / 2**20:.1f} MiB at 8 rows, {large / 2**20:.1f} MiB at 32 rows")
    assert large < 1.3 * small, (small, large)


def test_lab_job_records_and_diagnostics_off(tmp_path):
    """A real lab job: per-output metrics, the evaluation span and what was used in result.json; with
    diagnostics=off no diagnostics file and no diagnosis, the same errors."""
    import json

    from tests.conftest import run_python

    def job(name, *extra):
        proc = run_python(["-m", "calibrun", "tracking=off", "recommend=off", "batches=2", "eval.batch_size=100",
                           f"cache.dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / name}", *extra], tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads((tmp_path / name / "result.json").read_text()), proc.stderr

    on, _ = job("on")
    off, log = job("off", "diagnostics=off")
    assert "diagnosis" in on
    assert "diagnostics" in on["files"]
    assert "diagnosis" not in off
    assert "diagnostics" not in off["files"]
    assert not (tmp_path / "off" / "diagnostics.json").exists()
    assert on["metrics"]["max_abs_error"] == off["metrics"]["max_abs_error"]
    assert on["used"]["eval_batches"] == 3  # 256 rows in batches of 100
    assert on["used"]["calibration_batches"] == 2
    assert on["task"]["name"] == "none"
    rows = evaluation_rows(open_float_model(tmp_path / "on" / "fp32.onnx").info, 777, 256)
    assert on["metrics"]["eval_span"] == float(rows.max()) - float(rows.min())
    assert on["metrics"]["out.y.max_abs_error"] == on["metrics"]["max_abs_error"]
    assert "requested" not in log  # used counts equal the requested ones: no warning
    culprits = on["diagnosis"]["culprits"]
    assert culprits[0]["node"] in {"fc1_matmul", "fc1_add", "relu", "fc2_matmul", "fc2_add", None}
