"""MLflow tracking: one run per job, one parent run per sweep (jobs are its nested children).

The client API with explicit run ids is used throughout (no fluent active-run state), so jobs in other
processes (joblib, Ray, SLURM) attach to the sweep's parent through the id the sweep callback writes
into the sweep folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from calibrun.errors import CalibrunError, one_line

log = logging.getLogger(__name__)
T = TypeVar("T")

PARENT_FILE = "mlflow_parent.json"


def resolve_uri(configured: str | None) -> str:
    """Config first, then $MLFLOW_TRACKING_URI, then the embedded store sqlite:///mlflow.db (made absolute)."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        uri = prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def _retry(call: Callable[[], T], what: str, attempts: int = 8) -> T:
    """Retry SQLite's 'database is locked' with exponential backoff (parallel jobs share one file)."""
    delay = 0.1
    for attempt in range(attempts):
        try:
            return call()
        except Exception as exc:
            if "database is locked" not in str(exc) or attempt == attempts - 1:
                raise
            log.warning("%s: database is locked, retrying in %.1fs", what, delay)
            time.sleep(delay * (1 + random.random()))
            delay *= 2
    raise AssertionError("unreachable")


def check_server(uri: str, timeout: float = 10.0) -> None:
    """Fail at once when nothing answers at an http(s) tracking URI.

    MLflow's client retries a refused connection for about four minutes (MLFLOW_HTTP_REQUEST_MAX_RETRIES=7
    with exponential backoff); that is kept for a server that answers, not spent on one that is not there.
    Only a connection that cannot be made fails here: any answer, a slow one, or a TLS problem (MLflow has its
    own certificate settings) is left to MLflow's client.
    """
    if not uri.lower().startswith(("http://", "https://")):
        return
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=timeout, allow_redirects=False)
        return
    except requests.exceptions.ConnectTimeout:
        reason = f"no connection within {timeout:g} s"
    except requests.exceptions.SSLError:
        return
    except requests.exceptions.ConnectionError as exc:
        reason = "connection refused" if "refused" in str(exc).lower() else one_line(exc)
    except requests.exceptions.RequestException:
        return
    raise CalibrunError(f"MLflow tracking server {uri} is not reachable: {reason}")


def _write_ahead_log(db: Path) -> None:
    """SQLite in WAL mode: readers do not block the writer and parallel jobs wait less on 'database is locked'
    (MLflow's calls for a lab sweep: 24-33% less time, bench/lab_overhead.py). The mode is kept in the file."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(db, timeout=30)) as connection:
        if connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            connection.execute("PRAGMA journal_mode=WAL")


class Tracker:
    """An MLflow experiment on one tracking URI."""

    def __init__(self, uri: str, experiment: str):
        from mlflow import MlflowClient

        check_server(uri)
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        try:
            self.experiment_id = _retry(lambda: self._experiment(experiment), "create experiment")
            if uri.startswith("sqlite:///"):
                _write_ahead_log(Path(uri[len("sqlite:///"):]))
        except Exception as exc:
            first = one_line(exc)
            raise CalibrunError(f"MLflow tracking store {uri} is not usable: {first}") from exc

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        artifact_location = None
        if self.uri.startswith("sqlite:///"):
            # Artifacts beside the database, whatever the working directory of a later `mlflow ui`.
            artifact_location = (Path(self.uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=artifact_location)
        except Exception:
            found = self.client.get_experiment_by_name(name)  # another process created it first
            if found is None:
                raise
            return found.experiment_id

    def start_run(self, name: str, tags: dict[str, str], parent_id: str | None = None) -> str:
        tags = dict(tags)
        if parent_id:
            tags["mlflow.parentRunId"] = parent_id
        run = _retry(lambda: self.client.create_run(self.experiment_id, tags=tags, run_name=name), "create run")
        return run.info.run_id

    def log(self, run_id: str, params: dict | None = None, metrics: dict | None = None,
            tags: dict | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        batch_params = [Param(k, str(v)) for k, v in (params or {}).items()]
        batch_metrics = [Metric(k, float(v), now, 0) for k, v in (metrics or {}).items() if v is not None]
        batch_tags = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
        _retry(lambda: self.client.log_batch(run_id, metrics=batch_metrics, params=batch_params, tags=batch_tags),
               "log batch")

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def log_artifacts(self, run_id: str, folder: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(run_id, str(folder), artifact_path)

    def log_table(self, run_id: str, table: dict, artifact_file: str) -> None:
        self.client.log_table(run_id, data=table, artifact_file=artifact_file)

    def finish(self, run_id: str, failed: bool = False) -> None:
        _retry(lambda: self.client.set_terminated(run_id, "FAILED" if failed else "FINISHED"), "end run")
