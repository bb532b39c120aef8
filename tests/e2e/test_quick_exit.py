"""The quick exit (calibrun.__main__, issue 14): a real tracked sweep exits 0, leaves no write-ahead log beside the
database, and its records are complete."""

from __future__ import annotations

import sqlite3

from tests.conftest import clean_env, run_python
from tests.stores import fresh_mlflow_store


def test_a_tracked_sweep_exits_quickly_and_leaves_a_complete_store(tmp_path):
    uri = fresh_mlflow_store(tmp_path)
    proc = run_python(["-m", "calibrun", "-m", "calibration=narrow,wide", "batches=1", f"cache.dir={tmp_path / 'c'}",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path, clean_env(MLFLOW_TRACKING_URI=uri),
                      timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    db = tmp_path / "mlflow.db"
    assert not db.with_name("mlflow.db-wal").exists() or db.with_name("mlflow.db-wal").stat().st_size == 0
    with sqlite3.connect(db) as connection:
        statuses = sorted(row[0] for row in connection.execute("SELECT status FROM runs"))
    assert statuses == ["FINISHED"] * 3  # the parent and its two jobs
