"""The tracking writer (calibrun.tracking.writer) in real `python -m calibrun` processes (plain subprocesses: the
suite's forked CLI runs have MLflow preloaded and keep it in-process): the calibrun process never imports MLflow,
and a writer killed in the middle of a sweep fails the jobs it had not recorded, closes their runs, and the sweep
records the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import clean_env
from tests.stores import fresh_mlflow_store

pytestmark = pytest.mark.slow

# calibrun as `python -m calibrun` runs it, telling at exit whether MLflow was imported in its process
WRAPPER = ("import atexit, runpy, sys\n"
           "atexit.register(lambda: print('mlflow imported:', 'mlflow' in sys.modules, file=sys.stderr))\n"
           "runpy.run_module('calibrun', run_name='__main__', alter_sys=True)\n")


def sweep(tmp: Path, *overrides: str) -> subprocess.Popen:
    uri = fresh_mlflow_store(tmp)
    return subprocess.Popen([sys.executable, "-c", WRAPPER, "-m", f"hydra.sweep.dir={tmp / 'sweep'}",
                             f"cache.dir={tmp / 'cache'}", *overrides], cwd=tmp,
                            env=clean_env(MLFLOW_TRACKING_URI=uri), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def results(tmp: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((tmp / "sweep").glob("*/result.json"))}


def runs(tmp: Path) -> list:
    """The runs of the store's calibrun experiment (none before the experiment exists)."""
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("calibrun")
    return client.search_runs([experiment.experiment_id], max_results=1000) if experiment is not None else []


def test_a_tracked_sweep_never_imports_mlflow_in_the_calibrun_process(tmp_path):
    proc = sweep(tmp_path, "calibration=narrow,match")
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    assert "mlflow imported: False" in stderr
    found = {r.info.run_id: r for r in runs(tmp_path)}
    jobs = results(tmp_path)
    assert len(jobs) == 2
    assert len(found) == 3
    assert all(r.info.status == "FINISHED" for r in found.values())
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    for job, result in jobs.items():
        run = found[result["mlflow"]["run_id"]]
        assert run.data.tags["calibrun.job_dir"] == str(tmp_path / "sweep" / job)
        assert run.data.tags["mlflow.source.name"].endswith(str(Path("calibrun", "__main__.py")))  # not the writer
        assert run.data.metrics["max_abs_error"] == result["metrics"]["max_abs_error"]
        assert client.get_logged_model(result["mlflow"]["model_id"]).source_run_id == run.info.run_id


def writer_of(pid: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"calibrun.tracking.writer" in cmdline:
                return int(entry.name)
    return None


def test_a_writer_killed_mid_sweep_fails_the_jobs_it_had_not_recorded_and_the_rest_are_recorded(tmp_path):
    proc = sweep(tmp_path, "calibration=narrow,match,wide", "batches=1,8,64,512")
    end = time.monotonic() + 180
    while not results(tmp_path):  # the first job is recorded: kill the writer while the others run
        assert proc.poll() is None
        assert time.monotonic() < end
        time.sleep(0.02)
    pid = writer_of(proc.pid)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=240)
    jobs = results(tmp_path)
    assert len(jobs) == 12
    failed = {job: r for job, r in jobs.items() if r["status"] != "ok"}
    numbers = sorted(int(job) for job in failed)
    assert numbers, stderr[-3000:]
    # the jobs whose records the writer had not ended when it died, one block: the jobs after it are recorded
    assert numbers == list(range(numbers[0], numbers[-1] + 1))
    assert numbers[-1] < 11
    assert all(f"the MLflow tracking writer (pid {pid}) died" in r["error"] for r in failed.values())
    assert proc.returncode == 1
    assert f"{len(failed)} problem(s)" in stderr
    found = {r.info.run_id: r for r in runs(tmp_path)}
    assert [r.info.run_name for r in found.values() if r.info.status == "RUNNING"] == []  # nothing left RUNNING
    for result in jobs.values():
        if result["status"] == "ok":
            assert found[result["mlflow"]["run_id"]].info.status == "FINISHED"
    for job in failed:  # their runs, where the writer had started them, closed FAILED
        lost = [r for r in found.values() if r.data.tags.get("calibrun.job_dir") == str(tmp_path / "sweep" / job)]
        assert [r.info.status for r in lost] in ([], ["FAILED"])


# calibrun as WRAPPER runs it, telling each time the sweep waits for its parent run before a job
WAITS = ("import sys\n"
         "import calibrun.sweep as sweep\n"
         "ready = sweep._parent_ready\n"
         "def told():\n"
         "    print('waited for the parent run', file=sys.stderr)\n"
         "    ready()\n"
         "sweep._parent_ready = told\n" + WRAPPER)


def test_the_first_job_does_not_wait_for_the_parent_run_and_resume_finds_it_by_its_folder(tmp_path):
    """Through the writer, a fresh sweep's jobs start while the writer still imports MLflow: they name the parent run
    by its pending id (the writer serves requests in order), and the writer records the id in the sweep folder once
    it has started the run. Before the jobs the folder holds the parent's record without the id; a resumed sweep
    that finds only that (the writer could not write it: a full disk) finds the run by its sweep folder."""
    uri = fresh_mlflow_store(tmp_path)
    command = [sys.executable, "-c", WAITS, "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}",
               f"cache.dir={tmp_path / 'cache'}", "calibration=narrow,match"]
    proc = subprocess.run(command, cwd=tmp_path, env=clean_env(MLFLOW_TRACKING_URI=uri), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "waited for the parent run" not in proc.stderr
    assert "mlflow imported: False" in proc.stderr
    found = runs(tmp_path)
    (parent,) = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    assert sorted(r.data.tags.get("mlflow.parentRunId") for r in found if r is not parent) == [parent.info.run_id] * 2
    assert f"MLflow parent run {parent.info.run_id} in {uri}" in proc.stderr  # the writer's line
    record = json.loads((tmp_path / "sweep" / "mlflow_parent.json").read_text())
    assert record["run_id"] == parent.info.run_id
    assert record["experiment_id"] == parent.info.experiment_id
    assert parent.info.status == "FINISHED"

    record.update(run_id=None, experiment="calibrun", since_ms=parent.info.start_time)  # as written before the jobs
    del record["experiment_id"]
    (tmp_path / "sweep" / "mlflow_parent.json").write_text(json.dumps(record))
    (tmp_path / "sweep" / "1" / "result.json").unlink()
    resumed = subprocess.run([*command, "resume=true"], cwd=tmp_path, env=clean_env(MLFLOW_TRACKING_URI=uri),
                             capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"continuing MLflow parent run {parent.info.run_id}" in resumed.stderr
    again = runs(tmp_path)
    assert [r.info.run_id for r in again if "mlflow.parentRunId" not in r.data.tags] == [parent.info.run_id]
    assert {r.info.status for r in again} <= {"FINISHED", "FAILED"}


def _gone(pid: int, seconds: float) -> bool:
    """Whether process `pid` ended (or is a zombie nobody reaped) within `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("when", ["run started", "first log line"])
def test_a_job_killed_with_sigkill_leaves_no_run_running(tmp_path, when):
    """SIGKILL (the OOM killer) gives the job no chance to close its run. The writer sees its pipe close, or its
    parent change, and closes the runs it started KILLED; requests still in the pipe are not served, so a kill
    before the writer had imported MLflow starts no run at all (a probe's writer started the run 5.6 s after the
    kill and left it RUNNING)."""
    uri = fresh_mlflow_store(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "calibrun", f"hydra.run.dir={tmp_path / 'run'}",
                             f"cache.dir={tmp_path / 'cache'}", "batches=2000", "eval.rows=20000"], cwd=tmp_path,
                            env=clean_env(MLFLOW_TRACKING_URI=uri), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    end = time.monotonic() + 120
    writer = None
    while writer is None:
        assert proc.poll() is None
        assert time.monotonic() < end
        writer = writer_of(proc.pid)
        time.sleep(0.01)
    log = tmp_path / "run" / "calibrun.log"
    while when == "first log line" and not (log.is_file() and log.stat().st_size):  # the writer still importing
        assert proc.poll() is None
        assert time.monotonic() < end
        time.sleep(0.005)
    if when == "run started":
        while not [r for r in runs(tmp_path) if r.info.status == "RUNNING"]:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < end
            time.sleep(0.1)
    proc.kill()
    proc.communicate(timeout=60)
    assert _gone(writer, 60)
    found = runs(tmp_path)
    assert [r.info.status for r in found if r.info.status == "RUNNING"] == []
    if when == "run started":
        assert [r.info.status for r in found] == ["KILLED"]
