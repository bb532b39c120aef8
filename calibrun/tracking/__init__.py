"""MLflow tracking: one run per job, one parent run per sweep (jobs are its nested children).

The client API with explicit run ids is used throughout (no fluent active-run state), so jobs in other
processes (joblib, Ray, SLURM) attach to the sweep's parent through the id the sweep callback writes
into the sweep folder. What a user of MLflow expects is there: MLflow's context tags (user, source, git
commit), the int8 model as an MLflow 3 LoggedModel with the run's metrics linked to it, the calibration and
evaluation data as datasets, params named as config keys.

A store that cannot be used is found out once, before any job (`Tracker(..., check=True)`): one line naming the
URI and the cause, instead of MLflow's minutes of retries.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
import sqlite3
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from calibrun.core import patches
from calibrun.core.errors import CalibrunError, one_line

log = logging.getLogger(__name__)
T = TypeVar("T")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # MLflow 3 reports usage over the network otherwise


def _not_a_lock(record: logging.LogRecord) -> bool:
    """MLflow logs every SQLAlchemy OperationalError of its store with a traceback before raising it. A 'database
    is locked' is calibrun's to report: `_retry` retries it and says so in one line, and one that is not retried
    ends the job with the one-line error. No traceback on stderr for it, nor for 'database or disk is full' (a
    full store's job ends with store_message's line; a probe's had ~290 lines of these before it)."""
    text = record.getMessage() + (str(record.exc_info[1]) if record.exc_info and record.exc_info[1] else "")
    return "database is locked" not in text and "database or disk is full" not in text


def _not_table_setup(record: logging.LogRecord) -> bool:
    """MLflow's two INFO lines as it creates a fresh store's tables ("Creating initial MLflow database tables...",
    "Updating database tables"), in its own format among calibrun's lines on the first run a newcomer makes; the
    store's address is in calibrun's own MLflow line at the end of the run."""
    return not (record.levelno <= logging.INFO and ("database tables" in record.getMessage()))


logging.getLogger("mlflow.store.db.utils").addFilter(_not_a_lock)
logging.getLogger("mlflow.store.db.utils").addFilter(_not_table_setup)

PARENT_FILE = "mlflow_parent.json"
# sweep folder -> its parent run, for the jobs this process runs before the tracking writer has recorded it in the
# folder's PARENT_FILE (calibrun.sweep; its run id may be a Pending answer of the writer)
PARENTS_HERE: dict[Path, dict] = {}
HTTP_TIMEOUT = 10  # seconds per request to a tracking server (MLflow's own default: 120)
HTTP_RETRIES = 1  # retries per request (MLflow's own default: 7, about four minutes on a dead server)
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")  # the UI opens its ML page, not GenAI
SCHEMES = ("sqlite", "http", "https", "file", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc")


# MLflow's limits (mlflow/utils/validation.py): run names 250 characters, param values 6000; tag values 5000 (8000
# since MLflow 2.x's later releases; a server of an older version still refuses more than 5000)
MAX_RUN_NAME = 250
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 5000
MAX_KEY = 250  # metric, param and tag keys (MAX_ENTITY_KEY_LENGTH)
MAX_DATASET_VALUE = 500  # calibrun's bound on each value of a dataset's source (its name: 500, MAX_DATASET_NAME_SIZE)
FULL_VALUES = "full_values"  # artifact folder: the whole text of each value shortened to fit


def shorten_middle(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: cut in the middle (`…`), beginning and end kept."""
    if len(text) <= limit:
        return text
    if limit <= 1:
        return text[:limit]
    head = (limit - 1 + 1) // 2
    tail = limit - 1 - head
    return text[:head] + "…" + (text[len(text) - tail:] if tail else "")


def fit_key(key: str, limit: int = MAX_KEY) -> str:
    """A metric, param or tag key in at most `limit` characters: whole when it fits, else cut in the middle
    (`...`, a character every key may hold) and followed by a short hash of the whole key, so that two long keys
    never become one."""
    if len(key) <= limit:
        return key
    mark = "-" + hashlib.sha256(key.encode()).hexdigest()[:6]
    room = limit - len(mark) - 3
    return key[:(room + 1) // 2] + "..." + key[len(key) - room // 2:] + mark


NAME_VALUE_WIDTH = 60  # characters of one swept value in a run name before it is shortened (in the middle)


def _common_ends(values: list[str]) -> tuple[int, int]:
    """The lengths of the prefix and suffix that every value shares (0, 0 for fewer than two values)."""
    if len(values) < 2:
        return 0, 0
    prefix = len(os.path.commonprefix(values))
    shortest = min(len(v) for v in values)
    suffix = len(os.path.commonprefix([v[::-1] for v in values]))
    suffix = min(suffix, shortest - prefix)
    return prefix, max(suffix, 0)


def faithful(value: str, values: list[str] | None = None, width: int = NAME_VALUE_WIDTH) -> str:
    """`value` as a run name shows it: whole when it fits `width`; else shortened in the middle of what all the
    sweep's `values` of that key share, so that the part that tells them apart stays whole (`.../a/calib.npz`,
    `.../b/calib.npz`). A distinguishing part longer than `width` itself is cut in its middle and marked with a
    short hash of the whole value: two values never get the same text."""
    if len(value) <= width:
        return value
    pool = sorted({*(values or []), value})
    prefix, suffix = _common_ends(pool)
    middle = value[prefix:len(value) - suffix]
    if len(middle) > width:
        tag = "#" + hashlib.sha256(value.encode()).hexdigest()[:6]
        return shorten_middle(middle, width - len(tag)) + tag
    room = width - len(middle)
    tail = value[len(value) - suffix:]
    head = value[:prefix]
    right = tail[:room] if len(tail) <= room else tail[:max(room - 1, 0)] + "…"
    room -= len(right)
    left = head if len(head) <= room else ("…" + head[len(head) - room + 1:] if room > 1 else "…")
    return left + middle + right


def sqlite_file(uri: str) -> Path | None:
    """The database file of a `sqlite:///FILE` tracking URI; None for any other store."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def resolve_uri(configured: str | None) -> str:
    """Config first, then $MLFLOW_TRACKING_URI, then the embedded store sqlite:///mlflow.db (made absolute)."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        uri = prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def http_settings(timeout: float | None = None, retries: int | None = None) -> tuple[int, int]:
    """Bound MLflow's HTTP client (read when each request is made): tracking.http_timeout / http_retries, else
    $MLFLOW_HTTP_REQUEST_TIMEOUT / _MAX_RETRIES when the user set them, else calibrun's short defaults. A dead
    server then costs (retries + 1) x timeout + backoff: 21 s by default instead of MLflow's minutes."""
    env = os.environ
    if timeout is None:
        timeout = env.get("MLFLOW_HTTP_REQUEST_TIMEOUT", HTTP_TIMEOUT)
    timeout = int(math.ceil(float(timeout)))
    retries = retries if retries is not None else int(env.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", HTTP_RETRIES))
    env["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(timeout)
    env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(retries)
    env.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    return timeout, retries


def _retry(call: Callable[[], T], what: str, attempts: int = 8, transient: tuple[str, ...] = ()) -> T:
    """Retry SQLite's 'database is locked' (and the `transient` messages) with exponential backoff (parallel jobs
    share one file)."""
    delay = 0.1
    for attempt in range(attempts):
        try:
            return call()
        except Exception as exc:
            reason = next((m for m in ("database is locked", *transient) if m in str(exc)), None)
            if reason is None or attempt == attempts - 1:
                raise
            log.warning("%s: %s, retrying in %.1fs", what, reason, delay)
            time.sleep(delay * (1 + random.random()))
            delay *= 2
    raise AssertionError("unreachable")


def check_server(uri: str, timeout: float = 5.0) -> None:
    """Fail at once when nothing answers at an http(s) tracking URI, or it accepts and never answers.

    Any HTTP answer passes (MLflow's client judges it); a TLS problem is left to MLflow's certificate settings.
    """
    if not uri.lower().startswith(("http://", "https://")):
        return
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=timeout, allow_redirects=False)
        return
    except requests.exceptions.SSLError:
        return
    except requests.exceptions.ConnectTimeout:
        reason = f"no connection within {timeout:g} s"
    except requests.exceptions.ReadTimeout:
        reason = f"it accepts connections but did not answer within {timeout:g} s"
    except requests.exceptions.ConnectionError as exc:
        reason = "connection refused" if "refused" in str(exc).lower() else one_line(exc)
    except requests.exceptions.RequestException as exc:
        reason = one_line(exc)
    raise CalibrunError(f"MLflow tracking server {uri} is not reachable: {reason}")


def deleted_experiment(name: str, experiment_id) -> CalibrunError:
    return CalibrunError(f"experiment {name!r} (id {experiment_id}) is deleted: restore it (mlflow experiments "
                         f"restore --experiment-id {experiment_id}) or choose another (tracking.experiment=NAME)")


def check_sqlite(db: Path, experiment: str | None = None) -> None:
    """The SQLite store can be opened and written, without MLflow's retries (a read-only folder cost ~110 s of
    warnings): the file is a database file (not a folder, not truncated), or can be created; and `experiment`, when
    given, is not a deleted one (what MLflow would refuse when it opens it: a sweep can then start its jobs before
    the tracking writer has imported MLflow, calibrun.sweep)."""
    if db.exists() and not db.is_file():
        raise CalibrunError(f"{db} is a folder, not a database file")
    if not db.exists():
        if not db.parent.is_dir():
            raise CalibrunError(f"folder {db.parent} does not exist")
        from calibrun.core.files import temp_name

        probe = temp_name(db, ".probe.tmp")
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            probe.unlink()
        except OSError as exc:
            raise CalibrunError(f"cannot create {db}: {exc.strerror or exc}") from None
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=rw", uri=True, timeout=30,
                                                isolation_level=None)) as connection:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and not tables & {"experiments", "runs", "alembic_version"}:  # (a half-created store passes)
                raise CalibrunError(f"{db} is an SQLite database but not an MLflow store")
            problem = connection.execute("PRAGMA quick_check(1)").fetchone()[0]
            if problem != "ok":
                raise CalibrunError(f"{db} is damaged: {problem}")
            if experiment is not None and "experiments" in tables:
                found = connection.execute("SELECT experiment_id, lifecycle_stage FROM experiments WHERE name = ?",
                                           (experiment,)).fetchone()
                if found is not None and found[1] != "active":
                    raise deleted_experiment(experiment, found[0])
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            connection.execute("BEGIN IMMEDIATE")
            try:  # a real write, rolled back: a file or folder this user may not write fails here
                connection.execute(f"PRAGMA user_version={int(version)}")
            finally:
                connection.execute("ROLLBACK")
    except sqlite3.Error as exc:
        raise CalibrunError(f"cannot use {db}: {one_line(exc)}") from None


def check_store(uri: str, timeout: float, experiment: str | None = None) -> None:
    scheme = urlsplit(uri).scheme.lower().split("+")[0]
    if scheme and scheme not in SCHEMES:
        raise CalibrunError(f"unknown URI scheme {scheme!r} (use sqlite:///FILE or http://HOST:PORT)")
    if scheme == "sqlite":
        check_sqlite(Path(uri[len("sqlite:///"):]), experiment)
    check_server(uri, timeout=min(timeout, 5.0))


STORE_LOCK_TIMEOUT = 600  # seconds a process waits for another one creating or migrating the store


def store_lock(db: Path):
    """The cross-process lock (filelock, `DB.lock` beside the store) under which a process creates the SQLite store,
    recreates a half-created one, and opens it (MLflow's schema check, the experiment, the journal mode): two
    processes started together on a new store no longer race on MLflow's migration."""
    from filelock import FileLock

    return FileLock(f"{db}.lock", timeout=STORE_LOCK_TIMEOUT)


def _schema_head() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def half_created(db: Path) -> str | None:
    """Why the SQLite store at `db` is a half-created MLflow store holding nothing (MLflow's table creation and
    migration killed part-way, e.g. by SIGKILL: every later open fails with `table ... already exists`), or None
    when it is complete, holds runs or experiments, or is not MLflow's (left to MLflow and `check_sqlite`)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return "an empty database"
        if not tables & {"experiments", "runs", "alembic_version"}:
            return None  # not MLflow's
        if "runs" in tables and connection.execute("SELECT count(*) FROM runs").fetchone()[0]:
            return None
        if "experiments" in tables and connection.execute(
                "SELECT count(*) FROM experiments WHERE experiment_id != 0").fetchone()[0]:
            return None
        revision = None
        if "alembic_version" in tables:
            row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
            revision = row[0] if row else None
    if revision == _schema_head():
        return None
    return f"its schema is at {revision or 'no'} migration, not {_schema_head()}"


def _create_store(db: Path) -> None:
    """Create and migrate a new MLflow store under a temp name beside `db`, then rename it onto `db`: the store
    appears whole or not at all (a kill leaves only the temp folder, which the next creation removes)."""
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from calibrun.core.files import remove_orphans, temp_name

    remove_orphans(db.parent)  # the temp folder of a creation that was killed
    work = temp_name(db, ".tmp")
    work.mkdir()
    try:
        fresh = work / db.name
        uri = f"sqlite:///{fresh}"
        store = SqlAlchemyStore(uri, DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH)  # MLflow's tables, migrations, Default
        store.engine.dispose()
        SqlAlchemyStore._engine_map.pop(uri, None)
        with open(fresh, "rb+") as handle:
            os.fsync(handle.fileno())
        for suffix in ("-wal", "-shm", "-journal"):  # an old store's journal must not be applied to the new one
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        os.replace(fresh, db)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_store(db: Path) -> None:
    """Under `store_lock`: create the store at `db` when there is none, recreate a half-created one (with a
    warning); leave any other alone."""
    if db.exists():
        reason = half_created(db)
        if reason is None:
            return
        if reason != "an empty database":
            log.warning("MLflow store %s was left half-created (%s) and holds no runs: creating it again", db,
                        reason)
    _create_store(db)


def _write_ahead_log(db: Path) -> bool:
    """SQLite in WAL mode: readers do not block the writer and parallel jobs wait less on 'database is locked'
    (MLflow's calls for a lab sweep: 24-33% less time, bench/lab_overhead.py). The mode is kept in the file.
    Whether the file is in WAL mode now."""
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as connection:
        if connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            connection.execute("PRAGMA journal_mode=WAL")
        return connection.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"


_CONTEXT_TAGS: dict[str, str] = {}


def context_tags() -> dict[str, str]:
    """MLflow's own run context tags (mlflow.user, mlflow.source.name/type, mlflow.source.git.commit where the
    source is in a git checkout), resolved once per process."""
    if not _CONTEXT_TAGS:
        from mlflow.tracking.context.registry import resolve_tags

        _CONTEXT_TAGS.update({k: str(v) for k, v in resolve_tags().items()})
    return dict(_CONTEXT_TAGS)


def yaml_value(value) -> str:
    """A param value as YAML writes it: true/false, null, [a, b], numbers and strings as they are."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def digest(identity: Mapping) -> str:
    """A dataset digest from the data's identity dict (no arrays loaded)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def ui_url(uri: str, experiment_id: str, search: str | None = None, order_by: str | None = None,
           ascending: bool = True) -> str:
    """The experiment's training-runs page in the MLflow UI (the server's address, or `mlflow ui`'s default for a
    local store), the runs filtered by `search` (MLflow's search syntax) and sorted by the metric `order_by`.

    MLflow 3's UI keeps its sidebar's workflow (GenAI or model training) in the browser's storage, GenAI by default,
    and an experiment's page without a tab opens the GenAI overview: the link names the runs tab and
    `workflowType=machine_learning`, which the UI reads before its storage (mlflow/server/js: the workflow type
    provider takes the URL's value; the runs tab reads `searchFilter`, `orderByKey` and `orderByAsc`)."""
    from urllib.parse import quote, urlencode

    base = uri.rstrip("/") if uri.lower().startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    params = {"workflowType": "machine_learning"}
    if search:
        params["searchFilter"] = search
    if order_by:
        params.update(orderByKey=f"metrics.`{order_by}`", orderByAsc="true" if ascending else "false")
    return f"{base}/#/experiments/{experiment_id}/runs?{urlencode(params, quote_via=quote)}"


def run_filter(run_id: str) -> str:
    return f"attributes.run_id = '{run_id}'"


def sweep_filter(sweep_dir: str, parent_id: str) -> str:
    """The sweep's parent and children (by the tag both carry), or its children when the folder's name cannot be
    quoted in MLflow's search syntax."""
    if "'" in sweep_dir or "\\" in sweep_dir:
        return f"tags.`mlflow.parentRunId` = '{parent_id}'"
    return f"tags.`calibrun.sweep_dir` = '{sweep_dir}'"


def link_line(uri: str, experiment_id: str, search: str | None = None, order_by: str | None = None,
              ascending: bool = True) -> str:
    """The line calibrun prints after a tracked run or sweep: its runs on the training-runs page of the MLflow UI
    (and, for a local store, the command that serves it)."""
    link = ui_url(uri, experiment_id, search, order_by, ascending)
    how = "" if link.startswith(uri) else f"`mlflow ui --backend-store-uri {uri}`, then "
    return f"calibrun: MLflow: {how}{link}"


def onnx_signature(path: Path):
    """An MLflow signature from the ONNX graph's inputs and outputs (symbolic axes as -1), and a zero input
    example of one row (no data loaded, nothing run)."""
    import numpy as np
    import onnx
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}

    def spec(value, example: bool):
        tensor = value.type.tensor_type
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        return TensorSpec(dtype, tuple(shape), value.name), (np.zeros([1 if s < 0 else s for s in shape], dtype)
                                                              if example else None)

    inputs = [spec(v, True) for v in model.graph.input if v.name not in initializers]
    outputs = [spec(v, False)[0] for v in model.graph.output]
    signature = ModelSignature(Schema([s for s, _ in inputs]), Schema(outputs))
    example = {s.name: a for s, a in inputs}
    return signature, (example if len(example) > 1 else next(iter(example.values()), None))


def _fit(values: dict[str, str], limit: int) -> tuple[dict[str, str], dict[str, str]]:
    """Values cut to MLflow's `limit` in the middle (keys to MAX_KEY: `fit_key`), and the whole text of those that
    were cut."""
    fitted, full = {}, {}
    for key, value in values.items():
        key = fit_key(key)
        fitted[key] = shorten_middle(value, limit)
        if fitted[key] != value:
            full[key] = value
    return fitted, full


class Tracker:
    """An MLflow experiment on one tracking URI.

    `check=True` (once per sweep or single run, before any work): the store is opened for real (an SQLite file
    checked, a server asked with a short timeout) and any problem becomes one CalibrunError naming the URI.
    """

    def __init__(self, uri: str, experiment: str, check: bool = False, http_timeout: float | None = None,
                 http_retries: int | None = None):
        self.uri = uri
        self._artifacts: dict[str, object] = {}  # run id -> its artifact URI from create_run, or its repository
        timeout, _ = http_settings(http_timeout, http_retries)
        try:
            if check:
                check_store(uri, timeout, experiment)
            db = sqlite_file(uri)
            if db is not None:
                # MLflow's client and SQLite store imported before the lock, which guards the store's file only:
                # imported under it (~1.6 s in a fresh process), they held back every other worker starting with
                # it (two workers' first jobs started 1.7 s apart, bench/parallel.py)
                import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
                from mlflow import MlflowClient  # noqa: F401
                try:
                    lock = store_lock(db)
                    lock.acquire()
                except Exception as exc:
                    raise CalibrunError(f"cannot lock {db}.lock: {getattr(exc, 'strerror', None) or exc}") from None
                try:
                    ensure_store(db)
                    self._open(experiment)
                    if _write_ahead_log(db):
                        patches.commit_without_fsync(self.client)
                finally:
                    lock.release()
            else:
                self._open(experiment)
        except Exception as exc:
            raise CalibrunError(f"MLflow tracking store {uri} is not usable: {one_line(exc)}") from None

    def _open(self, experiment: str) -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = _retry(lambda: self._experiment(experiment), "create experiment")

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            if found.lifecycle_stage != "active":
                raise deleted_experiment(name, found.experiment_id)
            if EXPERIMENT_KIND[0] not in found.tags:
                self.client.set_experiment_tag(found.experiment_id, *EXPERIMENT_KIND)
            return found.experiment_id
        artifact_location = None
        if (db := sqlite_file(self.uri)) is not None:
            # Artifacts beside the database, whatever the working directory of a later `mlflow ui`.
            artifact_location = (db.parent / "mlartifacts").as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=artifact_location,
                                                 tags=dict([EXPERIMENT_KIND]))
        except Exception:
            found = self.client.get_experiment_by_name(name)  # another process created it first
            if found is None:
                raise
            return found.experiment_id

    def start_run(self, name: str, tags: dict[str, str], parent_id: str | None = None) -> str:
        tags = {**context_tags(), **tags}
        if parent_id:
            tags["mlflow.parentRunId"] = parent_id
        tags, full = _fit(tags, MAX_TAG_VALUE)
        name = shorten_middle(name, MAX_RUN_NAME)
        run = _retry(lambda: self.client.create_run(self.experiment_id, tags=tags, run_name=name), "create run")
        self._artifacts[run.info.run_id] = run.info.artifact_uri
        self._keep_full(run.info.run_id, "tags", full)
        return run.info.run_id

    def _keep_full(self, run_id: str, kind: str, full: dict[str, str]) -> None:
        """The whole text of each shortened value, as an artifact of the run: full_values/<kind>/<key>.txt."""
        for key, value in full.items():
            safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in key)[:200]
            _retry(lambda k=safe, v=value: self.client.log_text(run_id, v, f"{FULL_VALUES}/{kind}/{k}.txt"),
                   "log full value")

    def log(self, run_id: str, params: dict | None = None, metrics: dict | None = None,
            tags: dict | None = None, model_id: str | None = None) -> None:
        """Params as YAML-style strings; metrics (linked to the LoggedModel `model_id` when given) that are
        numbers; tags as strings."""
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        params, full_params = _fit({k: yaml_value(v) for k, v in (params or {}).items()}, MAX_PARAM_VALUE)
        tags, full_tags = _fit({k: str(v) for k, v in (tags or {}).items()}, MAX_TAG_VALUE)
        batch_params = [Param(k, v) for k, v in params.items()]
        batch_metrics = [Metric(fit_key(k), float(v), now, 0, model_id=model_id) for k, v in (metrics or {}).items()
                         if isinstance(v, (int, float))]
        batch_tags = [RunTag(k, v) for k, v in tags.items()]
        self._keep_full(run_id, "params", full_params)
        self._keep_full(run_id, "tags", full_tags)
        for start in range(0, max(len(batch_params), len(batch_metrics), len(batch_tags), 1), 100):
            _retry(lambda s=start: self.client.log_batch(run_id, metrics=batch_metrics[s:s + 100],
                                                          params=batch_params[s:s + 100],
                                                          tags=batch_tags[s:s + 100]), "log batch")

    def log_datasets(self, run_id: str, datasets: dict[str, dict]) -> None:
        """Datasets by context (`calibration`, `evaluation`) from their identity dicts: digest, source tags."""
        from mlflow.data.code_dataset_source import CodeDatasetSource
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        inputs = []
        for context, identity in datasets.items():
            source = CodeDatasetSource({k: shorten_middle(yaml_value(v), MAX_DATASET_VALUE)
                                        for k, v in identity.items()})
            name = shorten_middle(f"{context}:{identity.get('source') or identity.get('name') or 'data'}",
                                  MAX_DATASET_VALUE)
            dataset = MetaDataset(source, name=name, digest=digest(identity))
            inputs.append(DatasetInput(dataset._to_mlflow_entity(), [InputTag(MLFLOW_DATASET_CONTEXT, context)]))
        # Two parallel jobs logging the same dataset race on its row (the store looks it up, then inserts it): the
        # loser's transaction fails on the unique constraint and, retried, finds the row.
        _retry(lambda: self.client.log_inputs(run_id, datasets=inputs), "log inputs",
               transient=("UNIQUE constraint failed: datasets",))

    def log_model(self, run_id: str, path: Path, name: str, register: str | None = None) -> str:
        """The int8 model as an MLflow 3 LoggedModel of this run (onnx flavor, signature, input example);
        returns its model id. Kept cheap: explicit pip requirements (no inference), the signature read from the
        graph (nothing run), and no serving check of the input example (`_OnnxFlavor`). With `register`, a
        version of that registered model."""
        import mlflow
        import onnx
        import onnxruntime
        from mlflow.models import Model

        if mlflow.get_tracking_uri() != self.uri:
            mlflow.set_tracking_uri(self.uri)  # Model.log resolves the store from the global URI
        if os.environ.get("MLFLOW_EXPERIMENT_ID") != self.experiment_id:
            # ... and the LoggedModel's experiment from the fluent one (else it lands in 'Default')
            os.environ["MLFLOW_EXPERIMENT_ID"] = self.experiment_id
            mlflow.set_experiment(experiment_id=self.experiment_id)
        signature, example = onnx_signature(path)
        # mlflow.onnx.log_model's call of Model.log, with the flavor that skips the serving check
        info = Model.log(
            artifact_path=None, name=_model_name(name), flavor=_OnnxFlavor, flavor_name="mlflow.onnx",
            validate_serving_input=False,
            onnx_model=onnx.load(str(path)), run_id=run_id, signature=signature, input_example=example,
            pip_requirements=[f"onnx=={onnx.__version__}", f"onnxruntime=={onnxruntime.__version__}"],
            registered_model_name=register, await_registration_for=0, save_as_external_data=False,
            onnx_execution_providers=["CPUExecutionProvider"])
        return info.model_id

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        """A file onto the run. For a run this Tracker started, into its artifact store directly: MlflowClient
        looks the run up to find where its artifacts go (a get_run of the whole run, ~6 ms on SQLite), and
        create_run said so already."""
        repository = self._artifacts.get(run_id)
        if repository is None or Path(path).is_dir():
            self.client.log_artifact(run_id, str(path), artifact_path)
            return
        if isinstance(repository, str):  # its URI, until the first file
            from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

            repository = self._artifacts[run_id] = get_artifact_repository(repository, tracking_uri=self.uri)
        repository.log_artifact(str(path), artifact_path)

    def log_table(self, run_id: str, table: dict[str, list], artifact_file: str) -> None:
        """A table of columns as MlflowClient.log_table logs it (the file in pandas' "split" layout, values that are
        not finite as null, and the run's `mlflow.loggedArtifacts` tag naming it a table: what MLflow's UI and
        `load_table` read), without what that costs besides (a pandas DataFrame, a listing of the run's artifacts
        and a read of the whole run: 13 of its 15 ms on SQLite). calibrun logs one table a run (the job's
        diagnostics), so the tag is set, not merged with an earlier one."""
        import tempfile

        from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

        columns = list(table)
        rows = [[value if not isinstance(value, float) or math.isfinite(value) else None for value in row]
                for row in zip(*(table[c] for c in columns), strict=True)]
        folder, name = os.path.split(artifact_file)
        with tempfile.TemporaryDirectory(prefix="calibrun-table-") as tmp:
            (Path(tmp) / name).write_text(json.dumps({"columns": columns, "data": rows}))
            self.log_artifact(run_id, Path(tmp) / name, folder or None)
        tag = json.dumps([{"path": artifact_file, "type": "table"}])
        _retry(lambda: self.client.set_tag(run_id, MLFLOW_LOGGED_ARTIFACTS, tag), "set tag")

    pipelined = False  # a sweep job waits for its record (calibrun.tracking.writer.RemoteTracker does not)

    def flush(self) -> None:
        """Nothing: every call of this Tracker is done when it returns (the writer's are not)."""

    def resolve(self, value):
        """A run or model id as it is (the tracking writer's ids may be pending: calibrun.tracking.writer)."""
        return value

    def run(self, function: Callable[..., T], *args, **kwargs) -> T:
        """`function(self, *args, **kwargs)`: a step that reads the store (the sweep's summary, a resumed job's earlier
        runs) as one call, which the tracking writer runs where the store is open (calibrun.tracking.writer)."""
        return function(self, *args, **kwargs)

    def later(self, function: Callable[..., None], *args) -> None:
        """`run` without waiting for it (here it is done at once; the writer's errors come with a later call)."""
        function(self, *args)

    def status(self, run_id: str) -> str | None:
        """The run's status, or None when the store does not have it."""
        try:
            return self.client.get_run(run_id).info.status
        except Exception:
            return None

    def reopen(self, run_id: str) -> None:
        _retry(lambda: self.client.update_run(run_id, status="RUNNING"), "reopen run")

    def close_stale(self, parent_id: str) -> list[str]:
        """Mark the RUNNING children of `parent_id` KILLED (a sweep killed with SIGKILL left them); their ids."""
        found = self.client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}' "
                                        "and attributes.status = 'RUNNING'", max_results=10000)
        for run in found:
            self.finish(run.info.run_id, "KILLED")
        return [run.info.run_id for run in found]

    def finish(self, run_id: str, status: str | bool = "FINISHED") -> None:
        """End the run: FINISHED, FAILED or KILLED (`True` means FAILED, for older callers)."""
        if isinstance(status, bool):
            status = "FAILED" if status else "FINISHED"
        _retry(lambda: self.client.set_terminated(run_id, status), "end run")

    def close(self, run_id: str, status: str) -> Exception | None:
        """`finish`, once more after a failure, for the closes that must not raise (a job's run while an error or an
        interrupt goes on up, a sweep's parent run): a store call cut short by an interrupt can spoil the next one
        (a SIGINT'd sweep once left its job's run RUNNING, ~1 in 40). None when the run is closed, else the last
        error; `resume=true` closes what was left RUNNING."""
        error = None
        for _ in range(2):
            try:
                self.finish(run_id, status)
                return None
            except Exception as exc:
                log.debug("MLflow run %s not marked %s: %s", run_id, status, one_line(exc))
                error = exc
        return error


def latest_run(tracker: Tracker, key: str, value: str, also: str = "", parentless: bool = False) -> str | None:
    """The id of the latest run (by start time) of `tracker`'s experiment whose tag `key` is `value` and that meets
    the filter clause `also`; with `parentless`, only runs without a parent of their own (a sweep's parent runs).
    None when there is none."""
    escaped = value.replace("'", "\\'")
    found = [r for r in tracker.client.search_runs([tracker.experiment_id], f"tags.`{key}` = '{escaped}'"
                                                   + (f" and {also}" if also else ""), max_results=10000)
             if not parentless or "mlflow.parentRunId" not in r.data.tags]
    return max(found, key=lambda r: r.info.start_time).info.run_id if found else None


class _OnnxFlavor:
    """mlflow.onnx as Model.log's flavor, without the serving check of the input example.

    Model.log checks an input example by loading the saved model as a pyfunc (a new onnxruntime session, and
    `importlib.metadata` lookups of the pip requirements) and predicting on it: a LoggedModel of the lab took 43 ms
    with the check and 33 ms without, side by side. The int8 model it would check was just run by onnxruntime on
    the evaluation rows. Model.log skips the check for `validate_serving_input=False`, but passes that keyword on
    to the flavor, and mlflow.onnx.save_model hands its extra keywords to onnx.save_model, which refuses it: dropped
    here. The saved model (MLmodel, files, LoggedModel) is the same as mlflow.onnx.log_model's."""

    @staticmethod
    def save_model(validate_serving_input: bool = False, **kwargs) -> None:
        import mlflow.onnx

        patches.check_pins_cheaply()
        mlflow.onnx.save_model(**kwargs)


_OPEN: dict[tuple[str, str], Tracker] = {}


_SQLALCHEMY_LINK = re.compile(r"\s*\(Background on this error at: https?://sqlalche\.me/\S*\)")


def store_message(message: str, uri: str) -> str:
    """A store error's line as the user reads it: SQLAlchemy's link to its error catalogue dropped, and SQLite's
    "database or disk is full" said of the store's file (it had been the last of ~290 lines of MLflow's logged
    tracebacks, naming no file)."""
    message = _SQLALCHEMY_LINK.sub("", message)
    if "database or disk is full" in message and (path := sqlite_file(uri)) is not None:
        return (f"MLflow store {path} is full (database or disk is full): free space on its device and run again "
                "(a sweep: the same command with resume=true)")
    if uri.lower().startswith(("http://", "https://")) and "Max retries exceeded" in message:
        # urllib3's words for a server that went away mid-job, naming whichever endpoint was called last
        reason = _URLLIB3_REASON.search(message)
        return (f"MLflow tracking server {uri} stopped answering ({reason.group(0) if reason else 'no connection'})"
                ": the job's run is left as the server last had it; run again once it is up (a sweep: the same "
                "command with resume=true)")
    return message


_URLLIB3_REASON = re.compile(r"\[Errno -?\d+\] [^\"')]+|Read timed out|Connection aborted|Remote end closed[^\"')]*")


def _not_a_retry(record: logging.LogRecord) -> bool:
    """urllib3's "Retrying (...) after connection broken by ..." warning, one per call while a tracking server is
    down (13 lines before a job's error in a probe): the job's one line says the server stopped answering."""
    return not record.getMessage().startswith("Retrying (")


logging.getLogger("urllib3.connectionpool").addFilter(_not_a_retry)


def open_tracker(uri: str, experiment: str, check: bool = False, http_timeout: float | None = None,
                 http_retries: int | None = None) -> Tracker:
    """A Tracker per (store, experiment) and process: the jobs of a sweep run in the sweep's process (or in a few
    workers) and share one client and experiment lookup instead of one per job. `check=True` always checks.
    Where this process started a tracking writer, the Tracker is the writer's (calibrun.tracking.writer)."""
    from calibrun.tracking import writer

    key = (uri, experiment)
    if check or key not in _OPEN:
        remote = writer.current()
        _OPEN[key] = (Tracker if remote is None else partial(writer.RemoteTracker, remote))(
            uri, experiment, check=check, http_timeout=http_timeout, http_retries=http_retries)
    else:
        http_settings(http_timeout, http_retries)
    return _OPEN[key]


def dispose_stores() -> None:
    """Close MLflow's pooled SQLite connections (the write-ahead log is checkpointed into the database), at exit."""
    store = sys.modules.get("mlflow.store.tracking.sqlalchemy_store")
    engines = getattr(getattr(store, "SqlAlchemyStore", None), "_engine_map", None) or {}
    for engine in list(engines.values()):
        with contextlib.suppress(Exception):  # exiting: nothing left to report it to
            engine.dispose()


def _model_name(name: str) -> str:
    """A LoggedModel name (MLflow forbids / : . % and quotes)."""
    cleaned = "".join("_" if c in "/:.%\"'" else c for c in name).strip()
    return cleaned or "int8"

# --- config: this concept's options (the `tracking` node; calibrun.config assembles the schema) ---

TRACKING = ("local", "server", "off")


@dataclass
class TrackingConf:
    name: str = "local"  # local | server | off
    uri: str | None = None  # local: None means $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working dir
    experiment: str = "calibrun"
    register: str | None = None  # a registered model name: each job's int8 model becomes a version of it
    log_model: bool = True  # the int8 model as an MLflow LoggedModel (False: no model logged)
    http_timeout: float | None = None  # seconds per request to a server (None: $MLFLOW_HTTP_REQUEST_TIMEOUT or 10)
    http_retries: int | None = None  # retries per request (None: $MLFLOW_HTTP_REQUEST_MAX_RETRIES or 1)
