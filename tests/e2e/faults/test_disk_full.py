"""A full filesystem, for real: a tracked lab sweep whose sweep folder is on a tmpfs too small to finish it, and
`calibtool quantize` whose OUT is on a full tmpfs. Every failure is one line naming "No space left on device" and
the path, exits non-zero, leaves no traceback, no RUNNING run, no temp file, nothing half-written; after space is
freed (the tmpfs remounted bigger) `resume=true` completes the sweep. Needs root (mount); skipped with the reason
when mounting is refused."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import onnx
import pytest

from tests.conftest import PROGRESS_LINE, run_calibtool
from tests.e2e.faults.record import SMALL, check_record, fresh, results, run, runs_of, temp_files

pytestmark = pytest.mark.slow

SWEEP = SMALL  # 3 lab jobs at the lab's 64 batches (check_record compares calib_report.json with them)
JOBS = 3
FULL = "No space left on device"


def _mount(folder: Path, size: str, remount: bool = False) -> subprocess.CompletedProcess:
    options = f"remount,size={size}" if remount else f"size={size}"
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True,
                          text=True)


@contextlib.contextmanager
def tmpfs(folder: Path, size: str):
    """A tmpfs of `size` mounted on `folder` for the block, unmounted after it whatever happens."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = _mount(folder, size)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.fixture(autouse=True)
def private_temp_dir(tmp_path, monkeypatch):
    """The children's system temp dir is the test's own: other processes' calibrun.* folders (a parallel test
    worker, another checkout's suite) cannot count as this test's leftovers."""
    folder = tmp_path / "systemp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


def calibrun_temp_dirs() -> set[str]:
    return {p.name for p in Path(os.environ["TMPDIR"]).glob("calibrun.*")
            if f".{os.getpid()}." not in p.name}


def fill(folder: Path) -> None:
    """Fill the filesystem of `folder` to the last byte."""
    for name, block in (("filler", 4096), ("filler2", 1)):
        with contextlib.suppress(OSError), open(folder / name, "wb") as handle:
            while True:
                handle.write(b"\0" * block)
                handle.flush()


def complete(path: Path) -> None:
    """A file calibrun wrote is whole: a result.json parses, an int8.onnx loads and passes the checker."""
    if path.name == "result.json":
        assert isinstance(json.loads(path.read_text()), dict)
    else:
        onnx.checker.check_model(onnx.load(str(path)))


def one_line(stderr: str, prefix: str) -> str:
    """The one line that reports the failure (the MLflow UI link of a sweep that ran to its end is not one)."""
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "--- Logging error ---" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines()
             if line.startswith(prefix) and not PROGRESS_LINE.match(line) and not line.startswith("calibrun: MLflow:")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


# Only the cache folder here: with the SWEEP folder full, Hydra fails writing a job's .hydra/ config outside the jobs
# (test_full_sweep_folder_leaves_no_run_running_and_resumes).
@pytest.mark.parametrize("full", ["cache"])
def test_sweep_on_a_full_tmpfs_fails_in_one_line_and_resumes(tmp_path, full):
    """The cache folder on a tmpfs too small for the sweep: the jobs that cannot write fail in one line each."""
    before = calibrun_temp_dirs()
    fresh(tmp_path)  # the MLflow store, in tmp_path: off the tmpfs
    sweep = tmp_path / ("disk" if full == "sweep" else "") / "sweep"
    disk = sweep.parent if full == "sweep" else tmp_path / "cache"
    with tmpfs(disk, "48k" if full == "sweep" else "8k"):
        first, first_seconds = run(tmp_path, *SWEEP, sweep=sweep)
        on_disk = results(sweep)
        runs = runs_of(tmp_path)
        leftovers = temp_files(tmp_path)
        written = list(sweep.glob("*/result.json")) + list(sweep.glob("*/int8.onnx"))
        _mount(disk, "16m", remount=True)  # space freed
        resumed, resumed_seconds = run(tmp_path, *SWEEP, "resume=true", sweep=sweep)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        check_record(tmp_path, sweep, JOBS)
    print(f"\n{full} full: reported in {first_seconds:.1f} s, resumed in {resumed_seconds:.1f} s")
    print(first.stderr)
    assert first.returncode != 0
    line = one_line(first.stderr, "calibrun:")
    assert FULL in line, line
    assert f"folder {disk}" in line, line  # the folder that is full
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    assert leftovers == []
    assert len([r for r in on_disk.values() if r["status"] == "ok"]) < JOBS  # it did not finish
    for path in written:
        complete(path)
    assert calibrun_temp_dirs() <= before


def test_full_sweep_folder_leaves_no_run_running_and_resumes(tmp_path):
    """The SWEEP folder full: Hydra fails writing a job's .hydra/ config outside the jobs (its own message, see
    above); the parent run is still closed FAILED at exit, with one calibrun line, and resume=true completes."""
    fresh(tmp_path)
    sweep = tmp_path / "disk" / "sweep"
    with tmpfs(sweep.parent, "48k"):
        first, _ = run(tmp_path, *SWEEP, sweep=sweep)
        runs = runs_of(tmp_path)
        _mount(sweep.parent, "16m", remount=True)
        resumed, _ = run(tmp_path, *SWEEP, "resume=true", sweep=sweep)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        check_record(tmp_path, sweep, JOBS)
    assert first.returncode != 0
    line = one_line(first.stderr, "calibrun:")
    assert line.startswith(f"calibrun: error: folder {sweep}/"), line  # the folder that is full, in one line
    assert FULL in line, line
    assert f"sweep {sweep} stopped before its end: MLflow parent run FAILED" in line, line
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []


def test_calibtool_quantize_to_a_full_tmpfs_fails_in_one_line(tmp_path):
    from calibrun.lab.model import write_lab_model

    before = calibrun_temp_dirs()
    fp32 = write_lab_model(tmp_path / "lab.onnx")
    out_dir = tmp_path / "out"
    with tmpfs(out_dir, "16k"):
        fill(out_dir)
        start = time.monotonic()
        code, stdout, stderr = run_calibtool(["quantize", fp32, out_dir / "int8.onnx", 4242, 1.0, 8], tmp_path,
                                             tmp_path / "cache")
        seconds = time.monotonic() - start
        listing = sorted(p.name for p in out_dir.iterdir())
    print(f"calibtool on a full device reported in {seconds:.1f} s")
    assert code != 0
    line = one_line(stderr, "calibtool: error:")
    assert FULL in line, line
    assert f"folder {out_dir} is full" in line, line
    assert stdout == ""
    assert listing == ["filler", "filler2"]  # no int8.onnx, no temp file
    assert temp_files(tmp_path) == []
    assert calibrun_temp_dirs() <= before


def test_model_preparation_on_a_full_cache_names_the_folder_and_runs_after_space_is_freed(tmp_path):
    """A user's model is prepared into the cache (cache.dir/models): on a full device, one line naming that
    folder (not the ONNX checker's "no ir_version" on the short file onnx wrote), nothing left in it; after space
    is freed the same command completes."""
    from calibrun.lab.model import write_lab_model

    model = write_lab_model(tmp_path / "mine.onnx")
    fresh(tmp_path)
    cache = tmp_path / "cache"
    args = ("model=file", f"model.path={model}", "batches=2", "eval.rows=32", "diagnostics=off",
            f"hydra.run.dir={tmp_path / 'run'}")
    with tmpfs(cache, "64k"):
        (cache / "models").mkdir()
        fill(cache)
        first, _ = run(tmp_path, *args, multirun=False)
        # the preparation's lock file stays (empty; filelock keeps it so that every process locks the same file)
        left = sorted(p.name for p in (cache / "models").iterdir() if p.suffix != ".lock")
        lock_sizes = [p.stat().st_size for p in (cache / "models").iterdir() if p.suffix == ".lock"]
        runs = runs_of(tmp_path)
        (cache / "filler").unlink()
        (cache / "filler2").unlink()
        again, _ = run(tmp_path, *args, multirun=False)
    assert first.returncode == 1
    line = one_line(first.stderr, "calibrun:")
    assert line.startswith(f"calibrun: error: folder {cache / 'models'} is full ({FULL})"), line
    assert "checker" not in line
    assert left == []  # no temp folder, no half-written model
    assert lock_sizes == [0]
    assert [r.info.status for r in runs] == ["FAILED"]
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "ok"
