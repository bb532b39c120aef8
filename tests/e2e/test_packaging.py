"""The wheel works (issue 12 item 1): conf/ ships inside it as calibrun.conf, the `calibrun` and `calibtool`
commands run from an empty folder, one job and a small sweep with its report; and the Hydra app's own face:
`experiment=lab` without `+`, a preset without -m, a custom --help.

The wheel is built from this checkout and installed without its dependencies into a fresh venv whose
dependencies come from the test venv (a .pth line): what is checked is what the wheel holds, quickly. CI's
`.ci/run` installs the same wheel WITH its dependencies from the package index into a clean venv.
"""

from __future__ import annotations

import json
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import Proc, clean_env, run_cmd

pytestmark = pytest.mark.slow  # subprocesses of the CLIs (multi-second each): `pytest -m "not slow"` leaves them out

REPO = Path(__file__).resolve().parents[2]


def run(args, cwd: Path, timeout: float = 600, env: dict | None = None) -> Proc:
    proc = run_cmd(args, cwd, clean_env(**(env or {})), timeout)
    assert not proc.timed_out, f"{proc.args} still running after {timeout} s"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, REPO], cwd=dist)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (found,) = dist.glob("calibrun-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding only the wheel; its dependencies are the test venv's (one .pth line)."""
    venv = tmp_path_factory.mktemp("venv")
    proc = run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv)
    assert proc.returncode == 0, proc.stderr
    site = Path(run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    cwd=venv).stdout.strip())
    (site / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", "--no-deps", wheel],
               cwd=venv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return venv


def test_wheel_ships_every_config_and_both_commands(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n.removeprefix("calibrun/conf/") for n in names
               if n.startswith("calibrun/conf/") and n.endswith(".yaml")}
    in_repo = {p.relative_to(REPO / "conf").as_posix() for p in (REPO / "conf").rglob("*.yaml")}
    assert shipped == in_repo
    assert {"calibtool.py", "calibrun/__main__.py"} <= names
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "calibrun").rglob("*.py")}
    assert modules - names == set()  # every package folder is listed in pyproject.toml
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "calibrun = calibrun.__main__:main" in text
    assert "calibtool = calibtool:main" in text


@pytest.mark.slow
def test_installed_wheel_runs_a_job_and_a_sweep_from_an_empty_folder(installed, tmp_path):
    bin_dir = installed / "bin"
    empty = tmp_path / "empty"
    empty.mkdir()
    where = run([bin_dir / "python", "-c", "import calibrun, calibtool; print(calibrun.__file__, calibtool.__file__)"],
                cwd=empty)
    assert where.returncode == 0, where.stderr
    assert all(Path(p).is_relative_to(installed) for p in where.stdout.split()), where.stdout

    job = run([bin_dir / "calibrun", "tracking=off", "batches=2", "eval.rows=32", "hydra.run.dir=run"], cwd=empty)
    assert job.returncode == 0, job.stderr[-3000:]
    result = json.loads((empty / "run" / "result.json").read_text())
    assert result["status"] == "ok"
    assert result["params"]["batches"] == 2

    sweep = run([bin_dir / "calibrun", "-m", "calibration=narrow,match", "batches=2", "eval.rows=32",
                 "hydra.sweep.dir=sweep"], cwd=empty)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    runs = json.loads((empty / "sweep" / "report" / "runs.json").read_text())
    assert [r["label"] for r in runs["runs"]] == ["calibration=narrow", "calibration=match"]
    assert (empty / "sweep" / "report" / "report.html").is_file()
    assert (empty / "mlflow.db").is_file()  # tracked in the working directory's store

    scales = run([bin_dir / "calibtool", "scales", empty / "run" / "int8.onnx"], cwd=empty)
    assert scales.returncode == 0, scales.stderr
    assert json.loads(scales.stdout)["input_scale"] == result["metrics"]["input_scale"]

    helped = run([bin_dir / "calibrun", "--help"], cwd=empty)
    assert helped.returncode == 0
    assert "what did my calibration data do" in helped.stdout


# --- the app's face: presets, help (no sweep run) ----------------------------------------------------------------

def calibrun(*args: str, cwd: Path) -> Proc:
    return run([sys.executable, "-m", "calibrun", *args], cwd=cwd, timeout=300)


def test_help_has_description_groups_and_examples(tmp_path):
    proc = calibrun("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("calibrun: what did my calibration data do to my INT8 model?")
    assert "calibration: match, narrow, wide" in out
    assert "experiment: digits, lab" in out
    assert "calibrun -m experiment=lab" in out
    assert "python -m calibrun.report SWEEP_DIR" in out
    assert "Powered by Hydra" not in out
    assert list(tmp_path.iterdir()) == []  # help writes nothing


@pytest.mark.parametrize("preset", ["experiment=lab", "+experiment=lab"])
def test_preset_without_multirun_says_how(tmp_path, preset):
    proc = calibrun(preset, "tracking=off", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("calibrun: error: experiment=lab is a sweep (over calibration, batches, format): "
                                   "add -m, as in python -m calibrun -m experiment=lab")
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing written


@pytest.mark.parametrize("preset", ["experiment=lab", "+experiment=lab"])
def test_preset_with_and_without_plus_composes_the_lab_sweep(tmp_path, preset):
    proc = calibrun(preset, "--cfg", "hydra", cwd=tmp_path)  # (Hydra refuses --cfg together with -m)
    assert proc.returncode == 0, proc.stderr
    assert "calibration: narrow,match,wide" in proc.stdout
    assert "batches: 1,8,64,512" in proc.stdout
    assert "format: qdq,qoperator" in proc.stdout


def test_unknown_preset_is_hydras_one_line(tmp_path):
    proc = calibrun("-m", "experiment=nope", "tracking=off", cwd=tmp_path)
    assert proc.returncode == 1
    assert "Could not find 'experiment/nope'" in proc.stderr
    assert "Traceback" not in proc.stderr
