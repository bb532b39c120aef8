"""calibrun.tracking: its LoggedModel is the same saved model as mlflow.onnx.log_model, without its serving check;
the SQLite store's lock is taken after MLflow is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from calibrun.lab.model import write_lab_model
from calibrun.tracking import onnx_signature, open_tracker
from tests.conftest import clean_env
from tests.stores import fresh_mlflow_store

VARYING = {"artifact_path", "model_id", "model_uuid", "run_id", "utc_time_created"}  # ids and times


def _saved(client, model_id: str) -> tuple[dict, dict[str, bytes]]:
    """(MLmodel without ids and times, every other file of the LoggedModel's artifacts by name)."""
    folder = Path(client.get_logged_model(model_id).artifact_location.removeprefix("file://"))
    mlmodel = yaml.safe_load((folder / "MLmodel").read_text())
    files = {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != "MLmodel"}
    return {k: v for k, v in mlmodel.items() if k not in VARYING}, files


def test_the_logged_model_is_mlflow_onnx_log_models_and_serves_its_example(tmp_path):
    import mlflow
    import mlflow.onnx
    import onnx
    import onnxruntime

    tracker = open_tracker(fresh_mlflow_store(tmp_path), "calibrun")
    model = write_lab_model(tmp_path / "lab.onnx")
    runs = [tracker.client.create_run(tracker.experiment_id).info.run_id for _ in range(2)]
    ours = tracker.log_model(runs[0], model, "int8")

    signature, example = onnx_signature(model)
    theirs = mlflow.onnx.log_model(  # MLflow's own call, serving check included
        onnx.load(str(model)), name="int8", run_id=runs[1],
        signature=signature, input_example=example, await_registration_for=0, save_as_external_data=False,
        pip_requirements=[f"onnx=={onnx.__version__}", f"onnxruntime=={onnxruntime.__version__}"],
        onnx_execution_providers=["CPUExecutionProvider"]).model_id

    assert _saved(tracker.client, ours) == _saved(tracker.client, theirs)
    assert tracker.client.get_logged_model(ours).tags == tracker.client.get_logged_model(theirs).tags
    # what the skipped check would have done: load it as a pyfunc and predict on the serving example
    served = json.loads(_saved(tracker.client, ours)[1]["serving_input_example.json"])
    prediction = mlflow.pyfunc.load_model(f"models:/{ours}").predict(np.array(served["inputs"], np.float32))
    assert np.asarray(prediction["y"]).shape == (1, 8)
    for run_id in runs:
        tracker.finish(run_id)


def test_mlflow_does_not_print_a_traceback_for_a_lock_calibrun_retries(caplog):
    """MLflow's store logs each OperationalError with its traceback; 'database is locked' is retried and reported by
    calibrun in one line (tracking._retry), so MLflow's record of it is dropped; other errors are kept."""
    import logging

    import calibrun.tracking  # noqa: F401 (installs the filter)

    store_log = logging.getLogger("mlflow.store.db.utils")
    with caplog.at_level(logging.ERROR, logger="mlflow.store.db.utils"):
        store_log.error("SQLAlchemy database error. The following exception is caught.\n%s",
                        "(sqlite3.OperationalError) database is locked")
        store_log.error("SQLAlchemy database error. The following exception is caught.\n%s",
                        "(sqlite3.OperationalError) no such table: runs")
    kept = [r.getMessage().splitlines()[-1] for r in caplog.records]
    assert kept == ["(sqlite3.OperationalError) no such table: runs"]


def test_mlflow_creating_a_fresh_stores_tables_says_nothing_of_its_own(caplog):
    """MLflow's INFO lines as it creates a fresh store's tables are dropped (calibrun's MLflow line names the store);
    anything else it logs there, a warning of the same words included, is kept."""
    import logging

    import calibrun.tracking  # noqa: F401 (installs the filter)

    store_log = logging.getLogger("mlflow.store.db.utils")
    with caplog.at_level(logging.INFO, logger="mlflow.store.db.utils"):
        store_log.info("Creating initial MLflow database tables...")
        store_log.info("Updating database tables")
        store_log.info("something else")
        store_log.warning("Updating database tables failed")
    assert [r.getMessage() for r in caplog.records] == ["something else", "Updating database tables failed"]

def test_close_takes_a_second_attempt_and_returns_the_error_only_when_both_fail(tmp_path, monkeypatch):
    """Tracker.close (a job's run ended while an error or an interrupt goes on up, a sweep's parent run): a first
    store call that fails (e.g. spoiled by an interrupt) is followed by a second; both failing returns the error."""
    tracker = open_tracker(fresh_mlflow_store(tmp_path), "close")
    once, twice = (tracker.start_run(name, {}) for name in ("once", "twice"))
    set_terminated = tracker.client.set_terminated
    failures = {once: 1, twice: 2}

    def flaky(run_id, status=None, *args, **kwargs):
        if failures[run_id]:
            failures[run_id] -= 1
            raise RuntimeError(f"spoiled connection ({run_id})")
        return set_terminated(run_id, status, *args, **kwargs)

    monkeypatch.setattr(tracker.client, "set_terminated", flaky)
    assert tracker.close(once, "KILLED") is None
    assert tracker.status(once) == "KILLED"
    error = tracker.close(twice, "FAILED")
    assert isinstance(error, RuntimeError)
    assert twice in str(error)
    assert tracker.status(twice) == "RUNNING"
    set_terminated(twice, "KILLED")  # the store ends with no run RUNNING, as every store calibrun leaves


def test_mlflow_is_imported_before_the_stores_lock_is_taken(tmp_path):
    """The store's lock guards its file (creation, schema check, experiment); MLflow's import (~1.6 s in a fresh
    process) under it made workers that start together open the store one after another (bench/parallel.py: the
    second worker's first job 1.7 s late). A fresh interpreter records what is imported when the lock is asked for."""
    probe = (
        "import sys\n"
        "import calibrun.tracking as tracking\n"
        "class Lock:\n"
        "    def acquire(self):\n"
        "        print(','.join(m for m in ('mlflow', 'mlflow.store.tracking.sqlalchemy_store') if m in sys.modules))\n"
        "        raise SystemExit(0)\n"
        "tracking.store_lock = lambda db: Lock()\n"
        "tracking.Tracker(sys.argv[1], 'probe')\n")
    proc = subprocess.run([sys.executable, "-c", probe, f"sqlite:///{tmp_path / 'mlflow.db'}"], capture_output=True,
                          text=True, timeout=120, env=clean_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["mlflow,mlflow.store.tracking.sqlalchemy_store"]


def test_a_full_sqlite_store_is_one_line_naming_its_file_and_mlflows_traceback_is_not_printed():
    """A probe's store on a full device: ~290 lines of MLflow's logged tracebacks, then SQLAlchemy's message with
    its catalogue link and no file named. The line names the store; MLflow's logged error is filtered."""
    import logging

    from calibrun.tracking import _not_a_lock, store_message

    raw = ("(sqlite3.OperationalError) database or disk is full (Background on this error at: "
           "https://sqlalche.me/e/21/e3q8)")
    assert store_message(raw, "sqlite:////data/m.db") == (
        "MLflow store /data/m.db is full (database or disk is full): free space on its device and run again (a "
        "sweep: the same command with resume=true)")
    assert store_message("(psycopg2.OperationalError) boom (Background on this error at: https://sqlalche.me/e/"
                         "21/e3q8)", "postgresql://h/db") == "(psycopg2.OperationalError) boom"
    try:
        raise RuntimeError(raw)
    except RuntimeError:
        import sys

        record = logging.LogRecord("mlflow.store.db.utils", logging.ERROR, __file__, 1,
                                   "SQLAlchemy database error. The following exception is caught.", (),
                                   sys.exc_info())
    assert not _not_a_lock(record)
    other = logging.LogRecord("mlflow.store.db.utils", logging.ERROR, __file__, 1, "something else", (), None)
    assert _not_a_lock(other)


def test_a_tracking_server_gone_mid_job_is_one_line_and_urllib3_retries_are_not_printed():
    import logging

    from calibrun.tracking import _not_a_retry, store_message

    raw = ("API request to http://127.0.0.1:5088/api/2.0/mlflow/experiments/get failed with exception "
           "HTTPConnectionPool(host='127.0.0.1', port=5088): Max retries exceeded with url: /api/2.0/mlflow/"
           "experiments/get?experiment_id=1 (Caused by NewConnectionError(\"HTTPConnection(host='127.0.0.1', "
           "port=5088): Failed to establish a new connection: [Errno 111] Connection refused\"))")
    assert store_message(raw, "http://127.0.0.1:5088") == (
        "MLflow tracking server http://127.0.0.1:5088 stopped answering ([Errno 111] Connection refused): the job's "
        "run is left as the server last had it; run again once it is up (a sweep: the same command with "
        "resume=true)")
    assert store_message(raw, "sqlite:////data/m.db") == raw  # not a server's
    retry = logging.LogRecord("urllib3.connectionpool", logging.WARNING, __file__, 1,
                              "Retrying (Retry(total=0, connect=0)) after connection broken by %r: %s",
                              ("NewConnectionError", "/api/2.0/mlflow/runs/log-batch"), None)
    assert not _not_a_retry(retry)
    assert _not_a_retry(logging.LogRecord("urllib3.connectionpool", logging.WARNING, __file__, 1, "other", (), None))
