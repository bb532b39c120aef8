"""End-to-end: a real parallel sweep with the Hydra joblib launcher (loky worker processes).

6 jobs (narrow/match/wide x QDQ/QOperator at the lab's 64 batches: enough for every report file except
samples.json) on two workers with one onnxruntime thread each, in a tmp dir, a fresh MLflow SQLite store and
a fresh calibration cache shared by the workers. Needs the `parallel` extra (it is in `test` too).
"""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from tests.conftest import clean_env, run_python
from tests.stores import fresh_mlflow_store

pytestmark = pytest.mark.slow

SWEEP = ["calibration=narrow,match,wide", "batches=64", "format=qdq,qoperator"]
JOBS = 6
CALIBRATIONS = 3  # the format reuses the ranges: one calibration per calibration set
REPORT_FILES = {"calib_report.json", "match.json", "narrow.json", "wide.json", "format.json", "report.md"}
BUNDLE_FILES = {"fp32.onnx", "int8_narrow.onnx", "int8_match.onnx", "int8_wide.onnx", "int8_qop.onnx"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parallel")
    proc = run_python(["-m", "calibrun", "-m", *SWEEP, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                       "ort.intra_op_threads=1", f"cache.dir={tmp / 'cache'}", f"hydra.sweep.dir={tmp / 'sweep'}"],
                      tmp, clean_env(MLFLOW_TRACKING_URI=fresh_mlflow_store(tmp)), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp, proc


def test_joblib_launcher_ran_the_jobs(sweep):
    _, proc = sweep
    assert "Joblib.Parallel(n_jobs=2,backend=loky" in proc.stderr


def test_every_job_ok(sweep):
    tmp, _ = sweep
    results = [json.loads((tmp / "sweep" / str(n) / "result.json").read_text()) for n in range(JOBS)]
    assert [r["status"] for r in results] == ["ok"] * JOBS
    assert {(r["params"]["calibration"], r["params"]["batches"], r["params"]["format"]) for r in results} == {
        (c, 64, f) for c in ("narrow", "match", "wide") for f in ("qdq", "qoperator")}


def test_mlflow_has_parent_and_every_child_finished(sweep):
    tmp, _ = sweep
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("calibrun")
    runs = list(client.search_runs([experiment.experiment_id], max_results=1000))
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    parent_file = json.loads((tmp / "sweep" / "mlflow_parent.json").read_text())
    assert parent_file["run_id"] == parent.info.run_id
    assert len(children) == JOBS
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert [r.info.status for r in children] == ["FINISHED"] * JOBS
    assert sorted(int(r.data.tags["calibrun.job_num"]) for r in children) == list(range(JOBS))
    assert all("max_abs_error" in r.data.metrics for r in children)
    models = client.search_logged_models([experiment.experiment_id])  # logged by the workers, in this experiment
    assert sorted(m.source_run_id for m in models) == sorted(r.info.run_id for r in children)
    # two worker processes ran the jobs (whether their runs overlap in time depends on the machine's load)
    workers = {r.data.tags["calibrun.worker"] for r in children}
    assert len(workers) == 2, workers


def test_cache_has_one_file_per_calibration(sweep):
    tmp, _ = sweep
    cache = tmp / "cache" / "ranges"
    names = sorted(p.name for p in cache.iterdir())
    ranges = [n for n in names if not n.endswith((".key.json", ".lock"))]
    keys = [n for n in names if n.endswith(".key.json")]
    locks = [n for n in names if n.endswith(".lock")]  # each key's lock, held by the job that calibrated it
    assert len(ranges) == CALIBRATIONS, names
    assert sorted(n.removesuffix(".key.json") for n in keys) == sorted(n.removesuffix(".json") for n in ranges)
    assert sorted(n.removesuffix(".lock") for n in locks) == sorted(n.removesuffix(".json") for n in ranges)
    assert all(n.endswith(".json") for n in ranges)
    leftovers = [p for p in tmp.rglob(".*") if p.name.endswith((".tmp", ".prepare"))]
    assert not leftovers, f"temp files left behind: {leftovers}"
    results = [json.loads((tmp / "sweep" / str(n) / "result.json").read_text()) for n in range(JOBS)]
    assert {f"{r['cache_key']}.json" for r in results} == set(ranges)


def test_report_built(sweep):
    tmp, _ = sweep
    report = tmp / "sweep" / "report"
    files = {p.name for p in report.iterdir() if p.is_file()}
    assert files >= REPORT_FILES
    assert "samples.json" not in files  # needs narrow with 1, 8, 64 and 512 batches
    assert {p.name for p in (report / "bundle").iterdir() if p.is_file()} >= BUNDLE_FILES
    fmt = json.loads((report / "format.json").read_text())
    assert fmt["same_input_scale"] is True


def test_an_interrupted_joblib_sweep_leaves_no_run_running(tmp_path):
    """SIGTERM to the sweep's process while its workers run jobs (`kill PID`; Ctrl-C reaches the workers too): the
    workers end with it, and the runs of their jobs in flight had stayed RUNNING, with loky's "leaked semlock"
    warning after the one line. The sweep closes them KILLED beside its parent run; stderr ends with the one line."""
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import message_lines

    proc = subprocess.Popen([sys.executable, "-m", "calibrun", "-m", "calibration=narrow,match,wide", "batches=2000",
                             "format=qdq,qoperator", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                             "ort.intra_op_threads=1", f"cache.dir={tmp_path / 'cache'}",
                             f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path,
                            env=clean_env(MLFLOW_TRACKING_URI=fresh_mlflow_store(tmp_path)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 300
    while not list((tmp_path / "sweep").glob("*/result.json")):  # one job done, the next ones in flight
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < end
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM
    assert message_lines(stderr)[-1].startswith(f"calibrun: interrupted by SIGTERM: sweep {tmp_path / 'sweep'} "
                                                "stopped, MLflow parent run KILLED")
    assert "leaked semlock" not in stderr
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("calibrun").experiment_id], max_results=1000)
    statuses = sorted(r.info.status for r in runs)
    assert "RUNNING" not in statuses, statuses
    assert "KILLED" in statuses  # the parent, and the jobs that were in flight


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _alive(pid: int) -> bool:
    from pathlib import Path

    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_joblib_sweep_killed_with_sigkill_takes_its_workers_with_it(tmp_path):
    """The OOM killer's SIGKILL of the sweep's process: its loky workers had lived on (parent 1), finished their jobs
    in flight and marked the runs FINISHED after the sweep's death, under a resume that had closed them KILLED; an
    idle one waited on its pipe for good. Each worker now gets SIGTERM when the sweep's process dies."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "calibrun", "-m", "calibration=narrow,match,wide", "batches=2000",
                             "format=qdq,qoperator", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                             "ort.intra_op_threads=1", "tracking=off", f"cache.dir={tmp_path / 'cache'}",
                             f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 300
    while not list((tmp_path / "sweep").glob("*/result.json")):  # workers started, one job done
        assert proc.poll() is None
        assert time.monotonic() < end
        time.sleep(0.05)
    workers = _children(proc.pid)
    assert workers
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    end = time.monotonic() + 60
    while any(_alive(w) for w in workers) and time.monotonic() < end:
        time.sleep(0.1)
    assert [w for w in workers if _alive(w)] == []
