"""End-to-end: the shared tracking server (scripts/tracking_server.sh: PostgreSQL backend store, local artifact
root served by `mlflow server`, both on loopback), a real sweep sent to it with `tracking=server`, and the runs
read back through the server. Both servers are stopped at the end, also when a test fails.

Skipped only when the PostgreSQL server binaries are not installed (.ci/run installs them).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import Proc, clean_env, run_python

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "tracking_server.sh"
CALIBRATIONS = ("narrow", "match", "wide")
CHILD_PARAMS = {"calibration.name", "calibration.factor", "calibration.seed", "batches", "format.name", "method.name",
                "model.sha256", "onnxruntime_version"}
CHILD_METRICS = {"input.calibrated_span", "input_scale", "input_zero_point", "input.int8_grid_span", "max_abs_error",
                 "mean_abs_error"}
RESULT_NAME = {"input.calibrated_span": "span", "input.int8_grid_span": "observed_span"}  # result.json's names

# the servers and sweeps started here talk to loopback only: no MLflow usage telemetry
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}

pytestmark = pytest.mark.slow


def pg_bin() -> Path | None:
    """The folder with PostgreSQL's server binaries, found the way the script finds it."""
    candidates = [os.environ.get("PG_BIN")]
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    candidates += [str(p) for p in sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                                          key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
                                          reverse=True)]
    for folder in filter(None, candidates):
        if all((Path(folder) / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres", "psql")):
            return Path(folder)
    return None


def free_ports(count: int) -> list[int]:
    """Distinct ports that are free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def listen_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on `port` (Linux /proc/net/tcp{,6})."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                if len(address) == 8:
                    found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(address)[::-1]))
                else:
                    words = bytes.fromhex(address)
                    raw = b"".join(words[i:i + 4][::-1] for i in range(0, 16, 4))
                    found.add(socket.inet_ntop(socket.AF_INET6, raw))
    return found


def script(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    env = {**os.environ, **QUIET, "TRACKING_SERVER_WORKERS": "1", "TRACKING_SERVER_TIMEOUT": "90"}
    mlflow = Path(sys.executable).with_name("mlflow")
    if mlflow.is_file():
        env["MLFLOW"] = str(mlflow)  # the server runs on the same installation as the tests
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


def calibrun(cwd: Path, *overrides: str, timeout: float = 300) -> Proc:
    return run_python(["-m", "calibrun", *overrides], cwd, clean_env(**QUIET), timeout)


class Server:
    def __init__(self, folder: Path, pg_port: int, mlflow_port: int):
        self.folder, self.pg_port, self.mlflow_port = folder, pg_port, mlflow_port
        self.uri = f"http://127.0.0.1:{mlflow_port}"

    def stop(self) -> subprocess.CompletedProcess:
        return script("stop", str(self.folder), timeout=120)

    def ports_closed(self, wait: float = 15) -> bool:
        deadline = time.monotonic() + wait
        while port_open(self.pg_port) or port_open(self.mlflow_port):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True


@pytest.fixture(scope="module")
def server():
    if pg_bin() is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl, postgres) are not installed: "
                    "apt-get install postgresql (.ci/run does it)")
    # Not under pytest's basetemp: that is private to its owner (0700), and as root PostgreSQL runs as the
    # postgres user, which must be able to enter the folder.
    base = Path(tempfile.mkdtemp(prefix="calibrun-tracking-"))
    base.chmod(0o711)
    srv = Server(base / "server", *free_ports(2))

    try:  # stopped whatever happens, a half-started server too
        started = time.monotonic()
        proc = script("start", str(srv.folder), str(srv.pg_port), str(srv.mlflow_port))
        assert proc.returncode == 0, f"start failed:\n{proc.stderr[-3000:]}"
        srv.start_output, srv.start_seconds = proc, time.monotonic() - started
        yield srv
    finally:
        proc = srv.stop()
        closed = srv.ports_closed()
        shutil.rmtree(base, ignore_errors=True)
        assert proc.returncode == 0, proc.stderr
        assert closed, f"ports {srv.pg_port}/{srv.mlflow_port} still open after stop"


@pytest.fixture(scope="module")
def sweep(server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server_sweep")
    folder = tmp / "sweep"
    proc = calibrun(tmp, "-m", f"calibration={','.join(CALIBRATIONS)}", "tracking=server",
                    f"tracking.uri={server.uri}", f"hydra.sweep.dir={folder}", f"cache.dir={tmp / 'cache'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp, folder


@pytest.fixture(scope="module")
def runs(server, sweep):
    """(client, parent run, {calibration: child run}) read back through the tracking server."""
    client = MlflowClient(tracking_uri=server.uri)
    experiment = client.get_experiment_by_name("calibrun")
    assert experiment is not None
    found = list(client.search_runs([experiment.experiment_id], max_results=100))
    parents = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in found]
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(found) == 1 + len(CALIBRATIONS)
    return client, parents[0], {r.data.params["calibration.name"]: r for r in children}


def test_start_prints_the_uri_and_binds_loopback_only(server):
    assert server.start_output.stdout.strip() == server.uri  # the only line on stdout
    for port in (server.pg_port, server.mlflow_port):
        assert port_open(port)
        assert listen_addresses(port) == {"127.0.0.1"}, port
    health = subprocess.run(["bash", str(SCRIPT), "status", str(server.folder)], capture_output=True, text=True,
                            timeout=30)
    assert health.returncode == 0
    assert health.stdout.strip() == server.uri
    assert oct((server.folder / "pgpass").stat().st_mode & 0o777) == "0o600"


def test_sweep_runs_read_back_through_the_server(sweep, runs):
    tmp, folder = sweep
    _, parent, children = runs
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["calibrun.sweep_dir"] == str(folder.resolve())
    assert parent.data.metrics["jobs_ok"] == len(CALIBRATIONS)
    assert sorted(children) == sorted(CALIBRATIONS)
    for name, run in children.items():
        assert run.info.status == "FINISHED", name
        assert set(run.data.params) >= CHILD_PARAMS, name
        assert set(run.data.metrics) >= CHILD_METRICS, name
        result = json.loads((Path(run.data.tags["calibrun.job_dir"]) / "result.json").read_text())
        assert result["status"] == "ok"
        for key in CHILD_METRICS:
            expected = result["metrics"][RESULT_NAME.get(key, key)]
            assert run.data.metrics[key] == pytest.approx(expected, rel=1e-12), (name, key)
    # nothing fell back to a local store in the working directory
    assert not (tmp / "mlflow.db").exists()
    assert not (tmp / "mlruns").exists()


def test_artifacts_come_back_through_the_server(server, runs, tmp_path):
    client, parent, children = runs
    child = children["match"]
    assert child.info.artifact_uri.startswith("mlflow-artifacts:"), child.info.artifact_uri  # proxied, not a path
    names = {f.path for f in client.list_artifacts(child.info.run_id)}
    assert {"result.json", "config_resolved.yaml", "ranges.json"} <= names
    (model,) = client.search_logged_models([child.info.experiment_id],
                                           filter_string=f"source_run_id = '{child.info.run_id}'")
    assert {f.path for f in client.list_logged_model_artifacts(model.model_id)} >= {"MLmodel", "model.onnx"}
    local = client.download_artifacts(child.info.run_id, "result.json", str(tmp_path))
    job_result = Path(child.data.tags["calibrun.job_dir"]) / "result.json"
    assert Path(local).read_bytes() == job_result.read_bytes()
    report = client.download_artifacts(parent.info.run_id, "report/calib_report.json", str(tmp_path))
    assert json.loads(Path(report).read_text())["best"] in CALIBRATIONS
    # stored under the server's artifact folder, not in the job's
    assert any(server.folder.joinpath("artifacts").rglob(f"{child.info.run_id}/artifacts/result.json"))


def test_runs_are_stored_in_postgresql(server, runs):
    _, parent, children = runs
    env = {**os.environ, "PGPASSFILE": str(server.folder / "pgpass"), "PGCONNECT_TIMEOUT": "5"}
    proc = subprocess.run([str(pg_bin() / "psql"), "-X", "-tA", "-h", "127.0.0.1", "-p", str(server.pg_port),
                           "-U", "calibrun", "-d", "mlflow", "-c", "SELECT run_uuid, status FROM runs"],
                          capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode == 0, proc.stderr
    stored = dict(line.split("|") for line in proc.stdout.split())
    expected = [parent.info.run_id, *(r.info.run_id for r in children.values())]
    assert stored == dict.fromkeys(expected, "FINISHED")


def test_a_sweep_over_long_absolute_paths_fits_the_servers_columns(server, tmp_path):
    """PostgreSQL enforces MLflow's column sizes (SQLite does not): a sweep whose overrides are long absolute paths
    (the parent run's name once joined them all: `value too long for type character varying(250)`) ends with every
    run FINISHED, names within 250 characters, and the paths told apart in the names and the parent's metrics."""
    import numpy as np

    from calibrun.lab.model import write_lab_model

    folder = tmp_path.joinpath(*["a_rather_long_folder_name_for_calibration_datasets"] * 4)
    folder.mkdir(parents=True)
    model = write_lab_model(folder / "lab_model_with_a_long_descriptive_file_name.onnx")
    rows = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    paths = [folder / f"{split}_split_calibration_rows.npy" for split in ("train", "validation")]
    for i, path in enumerate(paths):
        np.save(path, rows * (1 + i))
    np.save(folder / "held_out_evaluation_rows.npy", rows[:32])
    assert all(len(str(p)) > 250 for p in paths)
    proc = calibrun(tmp_path, "-m", "model=file", f"model.path={model}", "data=npy",
                    f"data.path={','.join(map(str, paths))}", "eval_data=npy",
                    f"eval_data.path={folder / 'held_out_evaluation_rows.npy'}", "eval.rows=32", "batches=2",
                    "method=minmax,entropy", "tracking=server", f"tracking.uri={server.uri}",
                    "tracking.experiment=long_paths", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                    f"cache.dir={tmp_path / 'cache'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=server.uri)
    experiment = client.get_experiment_by_name("long_paths")
    found = list(client.search_runs([experiment.experiment_id], max_results=100))
    assert len(found) == 5
    assert {r.info.status for r in found} == {"FINISHED"}
    assert all(len(r.info.run_name) <= 250 for r in found)
    (parent,) = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in found if r is not parent]
    assert len({r.info.run_name for r in children}) == 4
    for run in children:  # the split's name shown, the whole path in the tag
        path = run.data.tags["calibrun.swept.data.path"]
        assert path in map(str, paths)
        assert Path(path).name in run.info.run_name, run.info.run_name
    assert "train_split" in parent.info.run_name
    assert "validation_split" in parent.info.run_name
    # a user's file (the lab's network) is ranked by its verdict's metric, the worst output's SQNR
    best = [k for k in parent.data.metrics if k.startswith("best_worst_output_sqnr_db/data.path:")]
    assert len(best) == 2, sorted(parent.data.metrics)
    assert all(str(p) in parent.data.params["overrides"] for p in paths)  # the overrides whole, as a param


def test_stop_closes_both_ports(server):
    proc = server.stop()
    assert proc.returncode == 0, proc.stderr
    assert server.ports_closed()
    status = subprocess.run(["bash", str(SCRIPT), "status", str(server.folder)], capture_output=True, text=True,
                            timeout=30)
    assert status.returncode == 1
    assert not (server.folder / "pgdata" / "postmaster.pid").exists()


def test_unreachable_server_fails_fast_with_one_line(tmp_path):
    """A closed port fails in seconds (MLflow's client alone retries for about four minutes)."""
    (port,) = free_ports(1)
    uri = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    proc = calibrun(tmp_path, "tracking=server", f"tracking.uri={uri}", f"cache.dir={tmp_path / 'cache'}",
                    f"hydra.run.dir={tmp_path / 'run'}", timeout=120)
    seconds = time.monotonic() - started
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("calibrun: error:")
    assert f"{uri} is not reachable" in lines[0]
    assert seconds < 30
