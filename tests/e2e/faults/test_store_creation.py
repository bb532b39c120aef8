"""A new SQLite MLflow store appears whole or not at all, and processes that start together on it wait for each
other (issue 27 item 1, issue 25 item 2): tracked sweeps started at once all complete, a first start killed while
MLflow creates the tables leaves no broken store, and a store a killed start left half-created is created again
with a warning. Real `python -m calibrun` processes on real stores."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import run_python
from tests.e2e.faults.record import argv, cli, env_for, run, runs_of
from tests.stores import fresh_mlflow_store

pytestmark = pytest.mark.slow

QUICK = ("calibration=narrow", "batches=2", "eval.rows=32", "diagnostics=off")


def usable(tmp: Path) -> list:
    """The store at tmp/mlflow.db opens and holds no RUNNING run; its runs."""
    runs = runs_of(tmp)
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    run_id = client.create_run(client.get_experiment_by_name("calibrun").experiment_id).info.run_id
    client.set_terminated(run_id, "FINISHED")  # still writable
    return runs


def test_tracked_sweeps_started_together_on_a_new_store_all_complete(tmp_path):
    count = 4  # four processes racing to create one store (two racing is a case of it; its own run cost 13 s)

    def sweep(num: int):  # forked from the preloaded server (tests/forked.py), from threads: they start together
        return run_python(cli(tmp_path, *QUICK, sweep=tmp_path / f"sweep{num}"), tmp_path, env_for(tmp_path),
                          timeout=300)

    with ThreadPoolExecutor(count) as pool:
        procs = list(pool.map(sweep, range(count)))
    assert [p.returncode for p in procs] == [0] * count, [p.stderr[-2000:] for p in procs]
    assert not any("Traceback" in p.stderr for p in procs)
    runs = usable(tmp_path)
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert len(finished) == 2 * count  # a parent and a job per sweep
    assert not list(tmp_path.glob(".mlflow.db.*"))  # no temp store left


def creating(tmp: Path) -> bool:
    """MLflow is creating the store's tables: a database file exists, in place or under a temp name."""
    return any(p.is_file() and p.stat().st_size > 0
               for p in [tmp / "mlflow.db", *tmp.glob(".mlflow.db.*.tmp/mlflow.db")])


def test_first_start_killed_while_the_store_is_created_leaves_no_broken_store(tmp_path):
    """The issue's reproduction: SIGKILL while MLflow creates and migrates the tables of a new store, then the
    same command with resume=true."""
    with open(tmp_path / "first.err", "w") as err:
        proc = subprocess.Popen(argv(tmp_path, *QUICK, sweep=tmp_path / "sweep"), cwd=tmp_path,
                                env=env_for(tmp_path), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        end = time.monotonic() + 120
        while not creating(tmp_path):
            assert proc.poll() is None, (tmp_path / "first.err").read_text()[-3000:]
            assert time.monotonic() < end
            time.sleep(0.02)
        time.sleep(0.5)  # MLflow's migration takes seconds: killed part-way
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    first = (tmp_path / "first.err").read_text()
    assert "calibrun: MLflow:" not in first  # it did not get past the store
    again, _ = run(tmp_path, *QUICK, "resume=true", sweep=tmp_path / "sweep")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Traceback" not in again.stderr
    runs = usable(tmp_path)
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 2
    assert not list(tmp_path.glob(".mlflow.db.*"))  # the killed start's temp store was removed


def half_created_store(tmp: Path) -> None:
    """A store as a killed first start leaves it: tables of later migrations there, MLflow's record of the
    migrations gone with the rest (MLflow then fails every open with `table ... already exists`)."""
    fresh_mlflow_store(tmp)
    with contextlib.closing(sqlite3.connect(tmp / "mlflow.db")) as connection:
        connection.execute("DROP TABLE alembic_version")
        connection.execute("DROP TABLE experiment_tags")
        connection.execute("DELETE FROM experiments")
        connection.commit()


def test_half_created_store_holding_no_runs_is_created_again_with_a_warning(tmp_path):
    half_created_store(tmp_path)
    proc, _ = run(tmp_path, *QUICK, sweep=tmp_path / "sweep")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert f"MLflow store {tmp_path / 'mlflow.db'} was left half-created" in proc.stderr
    assert "holds no runs: creating it again" in proc.stderr
    assert sorted(r.info.status for r in usable(tmp_path)) == ["FINISHED"] * 2
