"""Large activations under a memory limit (issue 28, docs/memory.md): a default job (calibration, quantisation,
evaluation, per-tensor diagnostics) of the trained text detector ocr_det at 512x512 (one calibration and one
evaluation photo), and an entropy calibration of three photos, run with their address space capped (RLIMIT_AS, as
`ulimit -v` sets it) at 1.6 GB.

Before memory.budget the diagnostics returned every diagnosed tensor of a row three times (fp32, before and after
its Q/DQ pair, ~1.2 GB at 512x512 on this model): that job peaked at ~1.5 GB RSS and failed with std::bad_alloc
under a 2.0 GB cap (and passed at 2.4 GB). With the budget (auto: 256 MiB) the tensors are diagnosed in groups and
the job peaks near 0.6 GB RSS, passing even under 1.2 GB.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_python
from tests.trained import model_path, skimage_data

LIMIT = 1_600_000_000  # bytes of address space
SIZE = 512
# run `python -m calibrun ...` with RLIMIT_AS set in the child itself (no prlimit binary needed)
LIMITED = ("import resource, runpy, sys; limit = int(sys.argv[1]); "
           "resource.setrlimit(resource.RLIMIT_AS, (limit, limit)); "
           "sys.argv = ['calibrun', *sys.argv[2:]]; runpy.run_module('calibrun', run_name='__main__')")


def _job(tmp_path: Path, *extra: str, photos: tuple[str, ...] = ("page",)):
    calib, evaluation = tmp_path / "calib", tmp_path / "eval"
    calib.mkdir()
    evaluation.mkdir()
    for photo in photos:
        shutil.copyfile(skimage_data() / f"{photo}.png", calib / f"{photo}.png")
    shutil.copyfile(skimage_data() / "coffee.png", evaluation / "coffee.png")
    overrides = ["model=file", f"model.path={model_path('ocr_det')}", "batches=1", "eval.rows=1", "tracking=off",
                 "cache=off", "hydra.run.dir=job", *extra]
    for key, folder in (("data", calib), ("eval_data", evaluation)):
        overrides += [f"{key}=images", f"{key}.path={folder}", f"{key}.resize={SIZE}", f"{key}.crop={SIZE}"]
    return run_python(["-c", LIMITED, str(LIMIT), *overrides], tmp_path, clean_env(), 600)


@pytest.mark.slow
def test_default_job_on_large_activations_fits_a_memory_limit(tmp_path):
    run = _job(tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    memory = result["used"]["memory"]
    assert memory["budget"] == "auto"
    assert memory["budget_bytes"] == 256 * 2**20
    assert memory["diagnostics_groups"] > 1  # one row's diagnosed tensors exceed the budget
    assert memory["calibration_rows_per_run"] == 1
    assert result["diagnosis"]["tensors"] > 200  # every quantised activation was diagnosed
    table = json.loads((tmp_path / "job" / "diagnostics.json").read_text())
    assert len(table["tensor"]) == result["diagnosis"]["tensors"]
    assert all(value is not None for value in table["sqnr_db"])  # each one got its fp32 and int8 copies


@pytest.mark.slow
def test_the_limit_bites_without_the_budget(tmp_path):
    """The same job with a budget so large that the diagnostics return every tensor of a row at once (what they
    did before memory.budget) fails under the same cap: the limit is real, and the budget is what makes it fit."""
    run = _job(tmp_path, "memory.budget=4GiB")
    assert run.returncode != 0
    assert "bad_alloc" in run.stderr or "MemoryError" in run.stderr or "Failed to allocate" in run.stderr, \
        run.stderr[-3000:]
    assert json.loads((tmp_path / "job" / "result.json").read_text())["status"] == "failed"


HISTOGRAM = ("method=entropy", "diagnostics=off", "recommend=off")
THREE = ("page", "astronaut", "chelsea")


@pytest.mark.slow
def test_histogram_calibration_on_large_activations_fits_the_limit(tmp_path):
    """Entropy calibration over a batch of three photos: every calibrated tensor of the batch is 1.3 GB at 512x512
    (onnxruntime's calibrator holds them all); over the budget the model runs in pieces of tensors, a row at a time,
    in two passes (calibrun.quant.histogram_runs), ~0.5 GB RSS."""
    run = _job(tmp_path, *HISTOGRAM, photos=THREE)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    memory = result["used"]["memory"]
    assert memory["calibration_groups"] > 1
    assert memory["calibration_rows_per_run"] == 1
    assert result["params"]["method"] == "entropy"
    assert "two passes" in run.stderr


@pytest.mark.slow
def test_the_limit_bites_histogram_calibration_without_the_budget(tmp_path):
    """The same calibration with a budget that holds the whole batch (what onnxruntime's calibrator does) fails
    under the cap."""
    run = _job(tmp_path, *HISTOGRAM, "memory.budget=4GiB", photos=THREE)
    assert run.returncode != 0
    assert json.loads((tmp_path / "job" / "result.json").read_text())["status"] == "failed"
