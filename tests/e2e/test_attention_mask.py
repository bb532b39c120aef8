"""An attention mask's fill value, end to end (`python -m calibrun`, real onnxruntime and Hydra): one attention head
as a PyTorch export of a Hugging Face encoder writes it ((1 - mask) * -3.4e38 added to the scores), on padded rows.

- The default job: int8 is broken (the scores share one grid with -3.4e38: each rounds to zero); both 16-bit changes
  alone do not help (the fill dequantises beyond float32 on a 16-bit grid: NaN); the matrix ops alone help; the two
  together make it ok, and that is the best recommendation, which, appended to the command, gives an ok model.
- Both 16-bit changes as a user's run: the diagnosis names the tensor that overflowed (the mask's fill) first, as
  `overflow`, and no numpy warning reaches stderr.

A mechanism on random weights; the trained MiniLM sentence encoder with the same mask is in the bench's zoo.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Proc, clean_env, run_python
from tests.modelzoo import masked_attention, padded_rows, save

BOTH_16 = ("quant.activation_type=QInt16", "quant.weight_type=QInt16")
MATRIX = "quant.op_types_to_quantize=[MatMul]"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("attention")
    path = save(masked_attention(), folder / "attention.onnx")
    calib, evaluation = padded_rows(folder / "calib.npz", 64, seed=1), padded_rows(folder / "eval.npz", 48, seed=2)
    return ["model=file", f"model.path={path}", "data=npy", f"data.path={calib}", "eval_data=npy",
            f"eval_data.path={evaluation}", "batches=4", "tracking=off"]


def calibrun(tmp: Path, *overrides: str) -> Proc:
    return run_python(["-m", "calibrun", *overrides, f"cache.dir={tmp / 'cache'}"], tmp, clean_env(), 600)


def done(tmp: Path, run: Proc, name: str) -> dict:
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Warning" not in run.stderr, run.stderr[-3000:]
    return json.loads((tmp / name / "result.json").read_text())


def test_16_bit_is_measured_with_the_matrix_ops_alone_where_the_mask_fill_kept_it_from_helping(model, tmp_path):
    result = done(tmp_path, calibrun(tmp_path, *model, "hydra.run.dir=default"), "default")
    assert result["verdict"]["status"] == "broken"
    measured = {e["change"]: e for e in json.loads((tmp_path / "default" / "recommendations.json").read_text())
                ["measured"]}
    alone = measured[" ".join(BOTH_16)]
    assert not alone["helps"]  # the fill overflows a 16-bit grid
    matrix = measured[MATRIX]
    assert matrix["helps"]
    assert matrix["status_after"] != "ok"
    together = measured[" ".join((MATRIX, *BOTH_16))]
    assert together["status_after"] == "ok"
    assert together["after"] > matrix["after"] + 20
    best = result["recommendations"][0]
    assert best["change"] == together["change"]
    # the mask's sums of squares, -3.4e38 squared, are taken where float32's overflow: a number, not null
    table = json.loads((tmp_path / "default" / "diagnostics.json").read_text())
    assert table["sqnr_db"][table["tensor"].index("masked")] is not None
    again = done(tmp_path, calibrun(tmp_path, *model, *best["change"].split(" "), "recommend=off",
                                    "hydra.run.dir=best"), "best")
    assert again["verdict"]["status"] == "ok"
    assert again["verdict"]["value"] == pytest.approx(best["after"], abs=1e-6)


def test_the_tensor_whose_values_overflow_is_named_first(model, tmp_path):
    result = done(tmp_path, calibrun(tmp_path, *model, *BOTH_16, "recommend=off", "hydra.run.dir=wide"), "wide")
    culprit = result["diagnosis"]["culprits"][0]
    assert (culprit["tensor"], culprit["node"], culprit["verdict"]) == ("bias", "fill_mask", "overflow")
    table = json.loads((tmp_path / "wide" / "diagnostics.json").read_text())
    overflowed = [t for t, n in zip(table["tensor"], table["nonfinite"], strict=True) if n]
    assert overflowed[0] == "bias"  # the first in graph order; what is computed from it follows
    assert result["diagnosis"]["counts"]["overflow"] == len(overflowed)
