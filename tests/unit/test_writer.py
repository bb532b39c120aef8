"""The tracking writer (calibrun.tracking.writer): a real child process serving a real SQLite MLflow store."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from mlflow import MlflowClient

from calibrun.core.errors import CalibrunError
from calibrun.tracking import writer
from tests.stores import fresh_mlflow_store


def writer_pid(tracker) -> int:
    return os.getpid()


@pytest.fixture(scope="module")
def served():
    w = writer.Writer()
    yield w
    w.stop()
    assert w.proc.returncode == 0  # asked to end: it closed its store's session and exited by itself


def test_a_job_record_goes_through_the_writer_without_waiting_until_an_id_is_needed(served, tmp_path):
    uri = fresh_mlflow_store(tmp_path)
    tracker = writer.RemoteTracker(served, uri, "exp", check=True)
    run_id = tracker.start_run("job", {"calibrun.job_dir": str(tmp_path)})
    assert isinstance(run_id, writer.Pending)  # nothing waited for: the store is opened and the run started later
    (tmp_path / "a.txt").write_text("artifact")
    assert tracker.log(run_id, params={"quant.per_channel": True}, metrics={"sqnr": 31.5}) is None
    tracker.log_artifact(run_id, tmp_path / "a.txt")
    tracker.finish(run_id)  # waits: every call before it is done
    run = MlflowClient(uri).get_run(tracker.resolve(run_id))
    assert run.info.status == "FINISHED"
    assert run.data.params["quant.per_channel"] == "true"
    assert run.data.metrics["sqnr"] == 31.5
    assert run.info.experiment_id == tracker.experiment_id
    assert [a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id)] == ["a.txt"]
    assert tracker.run(writer_pid) == served.proc.pid != os.getpid()  # a step runs in the writer's process


def test_an_error_of_a_call_nobody_waited_for_is_raised_by_the_next_wait_once(served, tmp_path):
    tracker = writer.RemoteTracker(served, fresh_mlflow_store(tmp_path), "exp")
    tracker.log("0123456789abcdef0123456789abcdef", params={"a": 1})  # no such run: fails in the writer
    with pytest.raises(Exception, match="0123456789abcdef0123456789abcdef"):
        tracker.flush()
    tracker.flush()  # raised once, not again


def test_the_stores_error_is_the_in_process_trackers_line(served, tmp_path):
    uri = fresh_mlflow_store(tmp_path)
    client = MlflowClient(uri)
    client.delete_experiment(client.create_experiment("gone"))
    tracker = writer.RemoteTracker(served, uri, "gone")  # unchecked: what MLflow finds comes when waited for
    with pytest.raises(CalibrunError, match=f"MLflow tracking store {uri} is not usable: experiment 'gone' .* is "
                                            "deleted"):
        _ = tracker.experiment_id
    with pytest.raises(CalibrunError, match=f"MLflow tracking store {uri} is not usable: experiment 'gone' .* is "
                                            "deleted"):  # checked: found by the store's own check, at once
        writer.RemoteTracker(served, uri, "gone", check=True)
    (tmp_path / "folder.db").mkdir()  # what the store's own check finds stops at once, in this process
    with pytest.raises(CalibrunError, match="is a folder, not a database file"):
        writer.RemoteTracker(served, f"sqlite:///{tmp_path / 'folder.db'}", "exp", check=True)


def test_a_writer_that_dies_fails_the_call_and_the_run_is_closed_in_this_process(tmp_path):
    uri = fresh_mlflow_store(tmp_path)
    w = writer.Writer()
    try:
        tracker = writer.RemoteTracker(w, uri, "exp", check=True)
        run_id = tracker.start_run("job", {"calibrun.job_dir": str(tmp_path / "job")})
        tracker.flush()  # the run exists; its id was never asked for
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait()
        with pytest.raises(CalibrunError, match=rf"the MLflow tracking writer \(pid {w.proc.pid}\) died"):
            tracker.log(run_id, params={"a": 1})  # a call nobody waits for: its pipe's reader is gone
        assert tracker.close(run_id, "FAILED") is None  # found again by its job folder, closed here
        runs = MlflowClient(uri).search_runs([tracker.experiment_id])
        assert [(r.info.status, r.data.tags["calibrun.job_dir"]) for r in runs] == [("FAILED", str(tmp_path / "job"))]
    finally:
        w.stop()


@pytest.mark.parametrize(("argv", "env", "imported", "expected"), [
    (["calibration=narrow"], {}, False, True),
    (["tracking=off"], {}, False, False),
    (["+tracking=off"], {}, False, False),
    (["--cfg", "job"], {}, False, False),
    ([], {writer.ENV: "off"}, False, False),
    (["calibration=narrow"], {}, True, False),  # MLflow imported already (a fork of a process that preloaded it)
])
def test_a_writer_is_started_only_where_it_pays(monkeypatch, argv, env, imported, expected):
    monkeypatch.delenv(writer.ENV, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if not imported:
        monkeypatch.delitem(sys.modules, "mlflow")
    assert writer.wanted(argv) is expected


def test_a_parent_run_is_found_by_its_sweep_folder_from_when_its_record_was_written(tmp_path):
    """What a resumed sweep finds when the writer could not record the parent run's id (calibrun.sweep writes the
    record without it before the jobs): the latest run of that sweep folder without a parent of its own, started
    since the record was written; not a job's run, not another folder's, not an earlier sweep's in the same folder."""
    import time

    from calibrun.tracking import Tracker
    from calibrun.tracking.record import parent_by_folder

    tracker = Tracker(fresh_mlflow_store(tmp_path), "exp")
    folder, reused = tmp_path / "sweep", tmp_path / "reused"
    earlier = tracker.start_run("sweep", {"calibrun.sweep_dir": str(reused)})  # a sweep whose folder was removed
    first = tracker.start_run("sweep", {"calibrun.sweep_dir": str(folder)})
    time.sleep(0.01)
    since = int(time.time() * 1000)
    time.sleep(0.01)
    parent = tracker.start_run("sweep", {"calibrun.sweep_dir": str(folder)})
    tracker.start_run("job", {"calibrun.sweep_dir": str(folder)}, parent_id=parent)
    tracker.start_run("sweep", {"calibrun.sweep_dir": str(tmp_path / "other")})
    assert parent_by_folder(tracker, folder, since) == parent
    assert parent_by_folder(tracker, folder, 0) == parent != first  # the latest
    assert parent_by_folder(tracker, reused, 0) == earlier
    assert parent_by_folder(tracker, reused, since) is None  # started before the record was written
    assert parent_by_folder(tracker, tmp_path / "none", 0) is None
