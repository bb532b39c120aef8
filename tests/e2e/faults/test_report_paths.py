"""A sweep folder whose result.json names files outside the job (issue 27 item 2): `python -m calibrun.report`
must not copy them into the report's bundle; a model whose bytes are not the ones its record gives is not
bundled either. The run is named and left out, the exit status is non-zero. A real lab sweep, copied per case."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_python
from tests.e2e.faults.record import SMALL

pytestmark = pytest.mark.slow

SECRET = Path("/etc/passwd")


@pytest.fixture(scope="module")
def lab_sweep(tmp_path_factory) -> Path:
    """The lab's narrow, match and wide runs (what the bundle is made of), untracked."""
    tmp = tmp_path_factory.mktemp("lab")
    proc = run_python(["-m", "calibrun", "-m", *SMALL, "tracking=off", "diagnostics=off",
                       f"hydra.sweep.dir={tmp / 'sweep'}", f"cache.dir={tmp / 'cache'}"], tmp, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "sweep"


def tamper_paths(job: Path) -> None:
    result = json.loads((job / "result.json").read_text())
    result["files"]["int8"] = "../" * 12 + str(SECRET).lstrip("/")
    result["files"]["fp32"] = str(SECRET)
    (job / "result.json").write_text(json.dumps(result))


def tamper_bytes(job: Path) -> None:
    shutil.copyfile(job / "fp32.onnx", job / "int8.onnx")  # an ONNX model, not the one the record gives


CASES = {"paths outside the job": (tamper_paths, "leads outside the job folder"),
         "model bytes replaced": (tamper_bytes, "does not have the sha256")}


@pytest.mark.skipif(not SECRET.is_file(), reason="needs a file outside the sweep to point at")
@pytest.mark.parametrize("case", sorted(CASES))
def test_record_naming_other_files_is_left_out_of_the_report(tmp_path, lab_sweep, case):
    tamper, reason = CASES[case]
    sweep = tmp_path / "sweep"
    shutil.copytree(lab_sweep, sweep)
    shutil.rmtree(sweep / "report")
    labels = {json.loads((sweep / str(n) / "result.json").read_text())["params"]["calibration"]: n for n in range(3)}
    job = sweep / str(labels["match"])
    tamper(job)
    proc = run_python(["-m", "calibrun.report.aggregate", str(sweep), f"report.dir={tmp_path / 'rep'}"], tmp_path,
                      timeout=120)
    secret = SECRET.read_bytes()
    copies = [p for p in tmp_path.rglob("*") if p.is_file() and p.read_bytes() == secret]
    assert copies == []
    assert not (tmp_path / "rep" / "bundle").exists()  # the lab files need the run that was left out
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith(f"calibrun.report: error: job {job.name}")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert reason in lines[0], lines[0]
    assert "left out" in lines[0], lines[0]
    runs = json.loads((tmp_path / "rep" / "runs.json").read_text())
    assert len(runs["runs"]) == (2 if case == "paths outside the job" else 3)  # the others are reported
