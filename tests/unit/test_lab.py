"""The lab's qualitative results (docs/lab.md) on the lab model, through calibrun's functions."""

from __future__ import annotations

import numpy as np
import pytest

from calibrun.lab.model import write_lab_model
from calibrun.measure import errors as measure
from calibrun.model import open_float_model
from calibrun.quant.calibrate import CalibrationCache
from calibrun.quant.quantize import QuantOptions, quantize_lab
from tests.modelzoo import evaluation_rows

CALIB_SEED, EVAL_SEED, EVAL_ROWS = 4242, 777, 256
FACTORS = {"narrow": 0.2, "match": 1.0, "wide": 10.0}
RUNS = {  # name -> (calibration, batches, format)
    "narrow": ("narrow", 64, "qdq"),
    "match": ("match", 64, "qdq"),
    "wide": ("wide", 64, "qdq"),
    "narrow_n512": ("narrow", 512, "qdq"),
    "match_n8": ("match", 8, "qdq"),
    "match_qop": ("match", 64, "qoperator"),
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Quantise every run of the lab once; return fp32 path, per-run quantize result and error."""
    root = tmp_path_factory.mktemp("lab")
    fp32 = open_float_model(write_lab_model(root / "fp32.onnx"))
    cache = CalibrationCache(root / "cache")
    runs = {}
    for name, (calibration, batches, fmt) in RUNS.items():
        out = root / f"{name}.onnx"
        result = quantize_lab(fp32, out, CALIB_SEED, FACTORS[calibration], batches,
                                     options=QuantOptions(format=fmt), cache=cache)
        result["error"] = measure.error(fp32.path, out, EVAL_SEED, EVAL_ROWS)
        runs[name] = result
    return fp32, runs


def err(lab, name: str) -> float:
    return lab[1][name]["error"]["max_abs_error"]


def test_every_run_is_what_was_asked(lab):
    _, runs = lab
    for name, (_, batches, fmt) in RUNS.items():
        assert runs[name]["batches"] == batches
        assert runs[name]["format"] == fmt
        assert runs[name]["error"]["rows"] == EVAL_ROWS
        assert runs[name]["error"]["max_abs_error"] > 0


def test_narrow_and_wide_are_both_worse_than_match(lab):
    assert err(lab, "narrow") > err(lab, "match")
    assert err(lab, "wide") > err(lab, "match")


def test_clipping_is_worse_than_a_coarse_grid(lab):
    assert err(lab, "narrow") > err(lab, "wide")


def test_more_narrow_samples_do_not_fix_clipping(lab):
    assert err(lab, "narrow_n512") > err(lab, "match_n8")


def test_scales_follow_the_calibration_range(lab):
    """narrow pins a range far smaller than the real data's, wide a far larger one."""
    fp32, runs = lab
    rows = evaluation_rows(EVAL_SEED, EVAL_ROWS, fp32.info.shape[-1])
    real_span = float(rows.max() - rows.min())
    assert runs["narrow"]["input_scale"] * 255 < real_span / 2
    assert runs["wide"]["input_scale"] * 255 > real_span * 5
    assert runs["narrow"]["input_scale"] < runs["match"]["input_scale"] < runs["wide"]["input_scale"]


def test_qdq_and_qoperator_same_scale_similar_error_different_outputs(lab):
    fp32, runs = lab
    qdq, qop = runs["match"], runs["match_qop"]
    assert qdq["input_scale"] == qop["input_scale"]
    assert qdq["input_zero_point"] == qop["input_zero_point"]
    assert 0.5 <= err(lab, "match_qop") / err(lab, "match") <= 2
    assert qdq["ops"] != qop["ops"]
    feeds = measure.lab_feeds(fp32, EVAL_SEED, EVAL_ROWS)
    out_qdq = measure.outputs(qdq["out"], fp32, feeds)
    out_qop = measure.outputs(qop["out"], fp32, feeds)
    assert len(out_qdq) == len(out_qop) == 1
    assert out_qdq[0].shape == out_qop[0].shape
    difference = float(np.max(np.abs(out_qdq[0].astype(np.float64) - out_qop[0].astype(np.float64))))
    assert difference > 0
