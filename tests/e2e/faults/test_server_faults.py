"""A real MLflow tracking server (`mlflow server`, SQLite backend, on loopback) behind a fault-injecting proxy in
this process: the server drops the connection just after marking a job's run FINISHED (then is down for the rest
of the sweep), or answers 500 to every `runs/log-batch` while `runs/update` works. After each, the record must
hold: no RUNNING run, one FINISHED run per job (issue 27 items 3 and 4)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from mlflow import MlflowClient

from tests.conftest import clean_env
from tests.e2e.faults.record import one_line_error, results, run
from tests.stores import fresh_mlflow_store

pytestmark = pytest.mark.slow

QUICK = ("calibration=narrow", "batches=2", "eval.rows=32", "diagnostics=off", "tracking=server")
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` of this installation on a free loopback port; stopped (its whole group) at the end."""
    folder = tmp_path_factory.mktemp("server")
    uri = fresh_mlflow_store(folder)
    probe = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = probe.server_address[1]
    probe.server_close()
    mlflow = Path(sys.executable).with_name("mlflow")
    with open(folder / "server.log", "w") as log:
        proc = subprocess.Popen([str(mlflow), "server", "--backend-store-uri", uri, "--artifacts-destination",
                                 str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
                                 "--workers", "1"], cwd=folder, env=clean_env(**QUIET), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        end = time.monotonic() + 120
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                    break
            assert proc.poll() is None, (folder / "server.log").read_text()[-3000:]
            assert time.monotonic() < end, "mlflow server did not start in 120 s"
            time.sleep(0.2)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Proxy:
    """Forwards every request to the server, except what `fault(method, path, body)` says: "500" (answered 500
    without forwarding), "drop" (forwarded, then the connection is closed unanswered and the server counts as
    down: every later connection is closed unanswered until `down` is reset)."""

    def __init__(self, upstream: int, fault):
        self.upstream, self.fault, self.down, self.seen = upstream, fault, False, []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def handle_request(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.down:
                    self.close_connection = True
                    return
                action = proxy.fault(self.command, self.path, body)
                proxy.seen.append((self.command, self.path, action))
                if action == "500":
                    data = json.dumps({"error_code": "INTERNAL_ERROR", "message": "injected fault"}).encode()
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                connection = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=60)
                skip = {"host", "connection", "keep-alive", "content-length", "transfer-encoding"}
                connection.request(self.command, self.path, body=body,
                                   headers={k: v for k, v in self.headers.items() if k.lower() not in skip})
                answer = connection.getresponse()
                data = answer.read()
                connection.close()
                if action == "drop":
                    proxy.down = True
                    self.close_connection = True
                    return
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in skip | {"date", "server"}:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_request

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.uri = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def proxy(upstream: int, fault):
    p = Proxy(upstream, fault)
    try:
        yield p
    finally:
        p.close()


def runs_in(port: int, experiment: str) -> list:
    client = MlflowClient(f"http://127.0.0.1:{port}")
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else list(client.search_runs([found.experiment_id], max_results=1000))


def test_server_dropped_while_a_run_is_marked_finished_resume_leaves_one_finished_run(tmp_path, server):
    """The server marks job 0's run FINISHED and drops the connection before answering (the client sees the
    connection cut), then stays down for the rest of the sweep; back up, resume=true."""
    finished = []

    def drop_first_finish(method, path, body):
        if path.endswith("/runs/update") and b'"FINISHED"' in body and not finished:
            finished.append(json.loads(body)["run_id"])
            return "drop"
        return "forward"

    sweep = tmp_path / "sweep"
    with proxy(server, drop_first_finish) as p:
        options = (*QUICK, f"tracking.uri={p.uri}", "tracking.experiment=dropped", "tracking.http_timeout=5")
        first, _ = run(tmp_path, *options, "tracking.http_retries=0", sweep=sweep)  # no retries: the same, faster
        assert finished, p.seen
        p.down, p.fault = False, lambda *a: "forward"  # the server is back
        resumed, _ = run(tmp_path, *options, "resume=true", sweep=sweep)
    assert first.returncode == 1, first.stderr[-3000:]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    runs = runs_in(server, "dropped")
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    job0 = [r for r in children if r.data.tags["calibrun.job_num"] == "0"]
    assert [r.info.status for r in job0].count("FINISHED") == 1, [(r.info.run_id, r.info.status) for r in job0]
    result = results(sweep)[0]
    assert result["status"] == "ok"
    current = next(r for r in job0 if r.info.status == "FINISHED")
    assert result["mlflow"]["run_id"] == current.info.run_id
    earlier = next(r for r in job0 if r.info.run_id == finished[0])
    assert earlier.info.status == "FAILED"
    assert earlier.data.tags.get("calibrun.superseded") == "true"
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [r.info.status for r in parents] == ["FINISHED"]


def test_log_batch_answered_500_leaves_no_parent_run_running(tmp_path, server):
    """`runs/log-batch` answered 500 while `runs/update` works: the sweep stops in one line and its parent run is
    closed FAILED."""

    def fail_log_batch(method, path, body):
        return "500" if path.endswith("/runs/log-batch") else "forward"

    with proxy(server, fail_log_batch) as p:
        proc, _ = run(tmp_path, *QUICK, f"tracking.uri={p.uri}", "tracking.experiment=log-batch-500",
                      "tracking.http_timeout=5", "tracking.http_retries=0", sweep=tmp_path / "sweep")
    runs = runs_in(server, "log-batch-500")
    assert [r.info.status for r in runs] == ["FAILED"]  # the parent; no job ran
    line = one_line_error(proc)
    assert proc.returncode == 1
    # the server's answer named: its status (MLflow 3.17: "... failed with error code 500 ...") or, from 3.18 on,
    # the error code and message of its JSON body (INTERNAL_ERROR: injected fault)
    assert "500" in line or "INTERNAL_ERROR: injected fault" in line, line
    assert "MLflow parent run FAILED" in line, line
    assert not list((tmp_path / "sweep").glob("*/result.json"))
