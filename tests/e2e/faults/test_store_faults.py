"""A tracking store that cannot be used stops a sweep (or a single run) at once: one line naming the URI and the
cause, exit 1, no job launched, nothing written. Each case is a real `python -m calibrun` process."""

from __future__ import annotations

import contextlib
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.e2e.faults.record import SMALL, env_for, one_line_error, run, store

pytestmark = pytest.mark.slow

FAST = 60  # seconds, start-up included, on a loaded 2-core machine (MLflow alone: 110 s to 10 min)


@contextlib.contextmanager
def silent_server():
    """A loopback socket that accepts connections and never answers (a hung tracking server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        server.close()


def overrides(multirun: bool) -> tuple[str, ...]:
    return SMALL if multirun else ("calibration=narrow",)


def nothing_launched(tmp: Path) -> None:
    assert not (tmp / "sweep").exists()  # not even an empty sweep folder is left
    assert not (tmp / "cache").exists()  # no calibration ran


def folder_store(tmp: Path) -> str:
    (tmp / "mlflow.db").mkdir()
    return f"sqlite:///{tmp / 'mlflow.db'}"


def truncated_store(tmp: Path) -> str:
    uri = store(tmp)
    MlflowClient(uri).create_experiment("calibrun")
    db = tmp / "mlflow.db"
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 3])
    return uri


def deleted_experiment(tmp: Path) -> str:
    uri = store(tmp)
    client = MlflowClient(uri)
    client.delete_experiment(client.create_experiment("calibrun"))
    return uri


def not_mlflow(tmp: Path) -> str:
    with contextlib.closing(sqlite3.connect(tmp / "mlflow.db")) as connection:
        connection.execute("CREATE TABLE notes (text)")
        connection.commit()
    return f"sqlite:///{tmp / 'mlflow.db'}"


STORES = {
    "a folder": (folder_store, "is a folder, not a database file"),
    "truncated": (truncated_store, "database disk image is malformed"),
    "deleted experiment": (deleted_experiment, "experiment 'calibrun' (id 1) is deleted"),
    "not an MLflow store": (not_mlflow, "is an SQLite database but not an MLflow store"),
    "unknown scheme": (lambda tmp: "bogus://somewhere/store", "unknown URI scheme 'bogus'"),
    "missing folder": (lambda tmp: f"sqlite:///{tmp / 'nowhere' / 'mlflow.db'}", "does not exist"),
}


CASES = [(case, True) for case in sorted(STORES)] + [("a folder", False), ("unknown scheme", False)]


def store_case(tmp: Path, case: str, multirun: bool) -> dict:
    make, _ = STORES[case]
    uri = make(tmp)
    before = (tmp / "mlflow.db").read_bytes() if (tmp / "mlflow.db").is_file() else None
    proc, seconds = run(tmp, *overrides(multirun), f"tracking.uri={uri}", sweep=tmp / "sweep", multirun=multirun,
                        env=env_for(tmp, "sqlite:///unused.db"))
    return {"tmp": tmp, "uri": uri, "before": before, "proc": proc, "seconds": seconds}


def server_case(tmp: Path, multirun: bool) -> dict:
    with silent_server() as uri:
        proc, seconds = run(tmp, *overrides(multirun), "tracking=server", f"tracking.uri={uri}", sweep=tmp / "sweep",
                            multirun=multirun)
    return {"tmp": tmp, "uri": uri, "proc": proc, "seconds": seconds}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    """Every case as its own calibrun process, two at a time (each is mostly Python start-up)."""
    tasks = {(case, multirun): (store_case, case, multirun) for case, multirun in CASES}
    tasks.update({("silent server", multirun): (server_case, multirun) for multirun in (True, False)})
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {key: pool.submit(fn, tmp_path_factory.mktemp("store"), *args) for key, (fn, *args) in tasks.items()}
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.parametrize(("case", "multirun"), CASES, ids=[f"{c}-{'sweep' if m else 'single'}" for c, m in CASES])
def test_unusable_store_stops_before_any_job(outcomes, case, multirun):
    o = outcomes[(case, multirun)]
    proc, tmp = o["proc"], o["tmp"]
    line = one_line_error(proc)
    assert proc.returncode == 1
    assert f"MLflow tracking store {o['uri']} is not usable" in line
    assert STORES[case][1] in line
    assert o["seconds"] < FAST
    nothing_launched(tmp)
    assert not list(tmp.glob("outputs/*/*/result.json"))
    if o["before"] is not None:
        assert (tmp / "mlflow.db").read_bytes() == o["before"]  # the store was not touched
    assert not (tmp / "unused.db").exists()


@pytest.mark.parametrize("multirun", [True, False], ids=["sweep", "single"])
def test_server_that_never_answers_is_reported_within_seconds(outcomes, multirun):
    o = outcomes[("silent server", multirun)]
    line = one_line_error(o["proc"])
    assert f"MLflow tracking server {o['uri']} is not reachable: it accepts connections but did not answer" in line
    assert o["seconds"] < FAST
    nothing_launched(o["tmp"])


# --- read-only places: root ignores file modes, so these run calibrun as `nobody` (setpriv) -------------------

def as_nobody() -> tuple[str, ...]:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed: no way to drop root here")
    probe = subprocess.run([setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot drop to nobody: {probe.stderr.decode()[:200]}")
    return (setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--")


def open_folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path


@pytest.mark.parametrize("existing", [False, True], ids=["no store yet", "store of another user"])
def test_read_only_working_directory(tmp_path, existing):
    prefix = as_nobody()
    root = Path(tmp_path)
    for parent in [root, *root.parents]:  # nobody must reach the folder (pytest's tmp is 0700)
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o005)
    cwd = root / "readonly"
    cwd.mkdir(mode=0o755)
    writable = open_folder(root / "writable")
    if existing:
        store(cwd)  # a store nobody may read but not write
    env = env_for(tmp_path)
    env.pop("MLFLOW_TRACKING_URI")
    env["HOME"] = str(writable)
    start = time.monotonic()
    proc = subprocess.run([*prefix, *run_argv(writable)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    seconds = time.monotonic() - start
    line = one_line_error(proc)
    assert f"MLflow tracking store sqlite:///{cwd / 'mlflow.db'} is not usable" in line
    assert ("attempt to write a readonly database" if existing else "Permission denied") in line
    assert seconds < FAST
    assert not list(writable.glob("sweep/[0-9]*"))
    assert sorted(p.name for p in cwd.iterdir()) == (["mlflow.db"] if existing else [])


def run_argv(writable: Path) -> list[str]:
    return [sys.executable, "-m", "calibrun", "-m", *SMALL, f"hydra.sweep.dir={writable / 'sweep'}",
            f"cache.dir={writable / 'cache'}"]
