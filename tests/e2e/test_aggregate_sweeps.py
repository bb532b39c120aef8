"""The aggregator on real sweeps (subprocesses, real onnxruntime, a trained classifier): the README's method sweep,
per-channel, a model-file sweep rebuilt from another folder, the lab runs of a wider sweep. The in-process tests on
sweep folders built by hand are in tests/unit/test_aggregate.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from calibrun import lab
from tests.conftest import Proc, run_python

PNG = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.slow  # subprocesses of the CLIs, real sweeps


def test_aggregate_help(tmp_path):
    proc = run_python(["-m", "calibrun.report.aggregate", "--help"], tmp_path, timeout=120)
    assert proc.returncode == 0
    assert "usage: python -m calibrun.report" in proc.stdout
    assert "SWEEP_DIR" in proc.stdout
    assert "report.dir=DIR" in proc.stdout
    assert "runs.json" in proc.stdout


def calibrun(cwd: Path, *args: str, module: str = "calibrun") -> Proc:
    return run_python(["-m", module, *args], cwd, timeout=900)


def real_sweep(tmp_path: Path, *overrides: str) -> tuple[Path, dict]:
    sweep = tmp_path / "sweep"
    proc = calibrun(tmp_path, "-m", *overrides, "tracking=off", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return sweep, json.loads((sweep / "report" / "runs.json").read_text())


def test_readme_method_sweep_reports_all_three_runs(tmp_path):
    sweep, runs = real_sweep(tmp_path, "method=minmax,entropy,percentile", "calibration=wide", "eval.rows=64")
    assert [r["label"] for r in runs["runs"]] == ["method=minmax", "method=entropy", "method=percentile"]
    for row in runs["runs"]:
        result = json.loads((sweep / row["job"] / "result.json").read_text())
        assert row["metrics"]["max_abs_error"] == result["metrics"]["max_abs_error"]
        composed = yaml.safe_load((sweep / row["job"] / ".hydra" / "config.yaml").read_text())
        assert composed["method"]["name"] == row["overrides"]["method"]
    assert len({r["metrics"]["input_scale"] for r in runs["runs"]}) == 3  # three calibrations, three scales
    text = (sweep / "report" / "report.md").read_text()
    assert all(f"| {m} |" in text for m in ("minmax", "entropy", "percentile"))
    assert (sweep / "report" / "max_abs_error_vs_method.png").read_bytes()[:8] == PNG


def test_per_channel_sweep_reports_both_runs(tmp_path):
    sweep, runs = real_sweep(tmp_path, "quant.per_channel=false,true", "batches=4", "eval.rows=64")
    # labelled as Hydra records the overrides
    assert [r["label"] for r in runs["runs"]] == ["quant.per_channel=False", "quant.per_channel=True"]
    # per-channel weights: a different int8 model from the same calibration
    assert (sweep / "0" / "int8.onnx").read_bytes() != (sweep / "1" / "int8.onnx").read_bytes()
    for row in runs["runs"]:
        result = json.loads((sweep / row["job"] / "result.json").read_text())
        assert row["metrics"]["mean_abs_error"] == result["metrics"]["mean_abs_error"]
        composed = yaml.safe_load((sweep / row["job"] / ".hydra" / "config.yaml").read_text())
        assert composed["quant"]["per_channel"] is (row["overrides"]["quant.per_channel"] == "True")
    assert (sweep / "report" / "max_abs_error_vs_quant.per_channel.png").is_file()


def test_model_file_sweep_with_relative_cache_aggregates_from_anywhere(tmp_path):
    """A trained classifier (PP-OCR text direction), the default relative cache folder, then the report rebuilt
    from another working directory into another folder."""
    import numpy as np
    from PIL import Image

    from tests.trained import model_path, photo_folder

    model = tmp_path / "cls.onnx"
    shutil.copyfile(model_path("ocr_cls"), model)
    work = tmp_path / "work"
    work.mkdir()
    # real photos as the classifier's input: 4 strips of 48 x 192 per photo, PP-OCR's (x / 255 - 0.5) / 0.5, NCHW
    strips = []
    for photo in sorted(photo_folder(tmp_path / "photos").iterdir()):
        image = Image.open(photo).convert("RGB")
        height = image.height // 4
        for i in range(4):
            strip = image.crop((0, i * height, image.width, (i + 1) * height)).resize((192, 48))
            strips.append((np.asarray(strip, dtype=np.float32) / 255 - 0.5) / 0.5)
    rows = np.stack(strips).transpose(0, 3, 1, 2)
    np.savez(work / "calib.npz", x=rows)
    np.savez(work / "eval.npz", x=rows[::2])
    # model.classifier=true: its Softmax feeds an Identity, which the automatic check does not look through
    sweep, runs = real_sweep(work, "model=file", f"model.path={model}", "model.classifier=true", "data=npy",
                             "data.path=calib.npz",
                             "eval_data=npy", "eval_data.path=eval.npz", "calibration=narrow,match", "batches=1,2",
                             f"eval.rows={len(rows[::2])}", "diagnostics=off")  # the report is the subject
    assert [r["label"] for r in runs["runs"]] == ["calibration=narrow batches=1", "calibration=narrow batches=2",
                                                  "calibration=match batches=1", "calibration=match batches=2"]
    assert (work / ".calibrun-cache" / "models").is_dir()
    assert runs["headline"]["metric"] == "top1_agreement"  # a classifier
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = calibrun(elsewhere, str(sweep), "report.dir=rebuilt", module="calibrun.report.aggregate")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    rebuilt = json.loads((elsewhere / "rebuilt" / "runs.json").read_text())
    assert rebuilt == runs
    assert (elsewhere / "rebuilt" / "report.html").is_file()
    # the sample trends need the evaluation span: from the relative eval.npz, found from the jobs' working directory
    diagnosis = json.loads((elsewhere / "rebuilt" / "diagnosis.json").read_text())
    assert set(diagnosis["samples"]) == {"narrow", "match"}
    assert diagnosis == json.loads((sweep / "report" / "diagnosis.json").read_text())


def test_lab_runs_of_a_method_sweep_build_the_lab_files(tmp_path):
    sweep, runs = real_sweep(tmp_path, "calibration=narrow,match,wide", "method=minmax,entropy")
    assert len(runs["runs"]) == 6
    calib = json.loads((sweep / "report" / "calib_report.json").read_text())
    minmax = {r["overrides"]["calibration"]: r["metrics"]["max_abs_error"] for r in runs["runs"]
              if r["overrides"]["method"] == "minmax"}
    assert {c: calib[c]["max_abs_error"] for c in lab.CALIBRATIONS} == minmax
    assert [r["lab"] for r in runs["runs"]] == [r["overrides"]["method"] == "minmax" for r in runs["runs"]]
    assert sum(r["lab"] for r in runs["runs"]) == 3
    assert calib["best"] == "match"
    assert calib["clipping_worse_than_coarse"] is True
