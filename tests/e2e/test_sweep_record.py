"""Issue 25: a tracked sweep over paths, as a new user runs it, and what MLflow holds for comparing it.

One real tracked multirun (Hydra's basic launcher, onnxruntime, a real SQLite MLflow store) over two copies of the
lab model and two copies of one calibration file: `model.path=A/lab.onnx,B/lab.onnx data.path=A/calib.npy,B/...`.
The copies are byte-identical, so the four jobs tie on every metric: the report and the parent run must still
name the same best run. The printed link is opened in a real headless Chromium with empty storage against
`mlflow ui` on 127.0.0.1 (skipped when Chromium is not installed).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from html import unescape
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import clean_env, run_python
from tests.stores import fresh_mlflow_store

pytestmark = pytest.mark.slow

CHEAP = ["batches=2", "eval.rows=32", "diagnostics=off"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from calibrun.lab.model import write_lab_model

    tmp = tmp_path_factory.mktemp("record")
    rows = np.random.default_rng(5).normal(0, 1, (64, 16)).astype(np.float32)
    for folder in ("A", "B"):
        (tmp / folder).mkdir()
        write_lab_model(tmp / folder / "lab.onnx")
        np.save(tmp / folder / "calib.npy", rows)
    uri = fresh_mlflow_store(tmp)
    proc = run_python(["-m", "calibrun", "-m", "model=file", "model.path=A/lab.onnx,B/lab.onnx", "data=npy",
                       "data.path=A/calib.npy,B/calib.npy", *CHEAP, f"hydra.sweep.dir={tmp / 'sweep'}",
                       f"cache.dir={tmp / 'cache'}", f"tracking.uri={uri}"], tmp, timeout=300)
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("calibrun")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    parent = next((r for r in runs if "mlflow.parentRunId" not in r.data.tags), None)
    children = sorted((r for r in runs if "mlflow.parentRunId" in r.data.tags),
                      key=lambda r: int(r.data.tags["calibrun.job_num"]))
    return {"tmp": tmp, "uri": uri, "proc": proc, "client": client, "experiment": experiment, "parent": parent,
            "children": children}


def test_a_sweep_over_model_and_data_paths_runs_every_job(sweep):
    """Item 1: `data.path=a,b` / `model.path=A,B` are not refused by a check on the sweep's own config."""
    proc = sweep["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in sorted((sweep["tmp"] / "sweep").glob("*/result.json"))]
    assert [r["status"] for r in results] == ["ok"] * 4
    assert sweep["parent"].info.status == "FINISHED"
    assert [c.info.status for c in sweep["children"]] == ["FINISHED"] * 4


def test_run_names_keep_what_tells_the_runs_apart(sweep):
    """Item 5: paths stay paths (not their shared file name), data.path and model.path are named."""
    names = [c.info.run_name for c in sweep["children"]]
    assert names == [f"model.path={m}/lab.onnx data.path={d}/calib.npy" for m in "AB" for d in "AB"]


def test_the_report_and_the_parent_run_name_the_same_best_run_on_a_tie(sweep):
    """Item 6: four equal errors; one rule (the first job of the sweep) in runs.json and on the parent run."""
    children = sweep["children"]
    assert len({c.data.metrics["max_abs_error"] for c in children}) == 1  # a real tie
    table = json.loads((sweep["tmp"] / "sweep" / "report" / "runs.json").read_text())
    first = next(row for row in table["runs"] if row["job"] == "0")
    assert table["best"] == first["label"]
    assert sweep["parent"].data.tags["calibrun.best_run_id"] == children[0].info.run_id
    assert sweep["parent"].data.tags["calibrun.best_run"] == children[0].info.run_name


def test_the_parent_run_describes_the_sweep_in_markdown(sweep):
    """Item 8: mlflow.note.content (the run page's description) sums the sweep up, by the runs' verdict metric: a
    user's file (the lab's network, not the lab model) is ranked by its worst output's SQNR."""
    note = sweep["parent"].data.tags["mlflow.note.content"]
    assert note.startswith("## calibrun sweep")
    assert "4 job(s) finished, 0 failed." in note
    assert "Headline metric: **worst_output_sqnr_db** (higher is better)" in note
    assert f"Best run: **{sweep['children'][0].info.run_name}** (job 0)" in note  # A and B tie: the first job
    assert "| rank | run | job | worst_output_sqnr_db |" in note
    assert "| `model.path` | best worst_output_sqnr_db |" in note
    child = sweep["children"][0].data.metrics
    assert {"input.calibrated_span", "input.int8_grid_span"} <= set(child)
    assert "span" not in child
    assert "observed_span" not in child


def test_a_sweep_shows_its_progress(sweep):
    """Item 10: jobs done / total with the time left, by tqdm."""
    stderr = sweep["proc"].stderr
    assert re.search(r"calibrun: sweep:  25%\|[#\d ]+\| 1/4 \[\d\d:\d\d<\d\d:\d\d", stderr), stderr[-3000:]
    assert "calibrun: sweep: 100%|##########| 4/4 [" in stderr


# --- item 9: the printed links land on the training-runs page, in a real browser with empty storage -----------


def _link(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if line.startswith("calibrun: MLflow: ")]
    return re.search(r"http://127\.0\.0\.1:5000/\S+", line).group(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _page_text(url: str) -> str:
    """The page's visible text after its scripts ran, in headless Chromium with a new, empty profile."""
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              f"--user-data-dir={profile}", "--virtual-time-budget=20000", "--dump-dom", url],
                             capture_output=True, text=True, timeout=180)
    body = re.sub(r"<script.*?</script>|<style.*?</style>", " ", out.stdout, flags=re.S)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", body)))


@pytest.fixture(scope="module")
def mlflow_ui(sweep):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    port = _free_port()
    mlflow = Path(sys.executable).parent / "mlflow"
    server = subprocess.Popen([str(mlflow), "ui", "--backend-store-uri", sweep["uri"], "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "1"], cwd=sweep["tmp"], env=clean_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError("mlflow ui did not start") from None
                time.sleep(0.5)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


def _on_the_training_runs_page(text: str) -> None:
    assert "Runs - Experiment" in text, text[:1500]  # the runs tab, not the GenAI overview
    assert "Model registry" in text  # the model-training sidebar ...
    assert "Observability" not in text  # ... not the GenAI one
    assert "Token Usage" not in text


def test_the_sweeps_link_opens_its_runs_sorted_by_the_headline(sweep, mlflow_ui):
    link = _link(sweep["proc"].stderr)
    assert link.startswith(f"http://127.0.0.1:5000/#/experiments/{sweep['experiment'].experiment_id}/runs?")
    text = _page_text(link.replace(":5000/", f":{mlflow_ui}/"))
    _on_the_training_runs_page(text)
    assert "Sort: worst_output_sqnr_db" in text
    assert "5 matching runs" in text  # the parent and its four children, nothing else
    for child in sweep["children"]:
        assert child.info.run_name in text


def test_a_single_run_prints_its_link_to_that_run_on_the_training_runs_page(sweep):
    """Item 8: a single tracked run prints its UI link too: the same page as the sweep's (checked in the browser
    above), filtered to the run."""
    tmp = sweep["tmp"]
    proc = run_python(["-m", "calibrun", *CHEAP, f"hydra.run.dir={tmp / 'single'}", f"cache.dir={tmp / 'cache'}",
                       f"tracking.uri={sweep['uri']}"], tmp, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    link = _link(proc.stderr)
    run_id = json.loads((tmp / "single" / "result.json").read_text())["mlflow"]["run_id"]
    experiment = sweep["experiment"].experiment_id
    assert link == (f"http://127.0.0.1:5000/#/experiments/{experiment}/runs?workflowType=machine_learning"
                    f"&searchFilter=attributes.run_id%20%3D%20%27{run_id}%27")
    assert sweep["client"].search_runs([experiment], f"attributes.run_id = '{run_id}'")[0].info.run_id == run_id


# --- item 11: onnxruntime's advice once per sweep; no lab-file messages for a sweep that is not the lab -------


def test_a_sweep_gives_onnxruntimes_advice_once_and_no_lab_file_messages(tmp_path):
    """No job of this sweep is a lab run (2 batches, 32 rows): the lab's files are not its business, and the
    report says nothing about them at info level (a sweep that holds some lab runs names the missing ones:
    tests/e2e/test_sweep.py)."""
    proc = run_python(["-m", "calibrun", "-m", "format=qoperator", "calibration=narrow,match", *CHEAP,
                       "tracking=off", f"hydra.sweep.dir={tmp_path / 'sweep'}", f"cache.dir={tmp_path / 'cache'}"],
                      tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("Please use QuantFormat.QDQ") == 1, proc.stderr[-3000:]
    assert "skipping" not in proc.stderr
    assert "samples.json" not in proc.stderr
    assert "not written" not in proc.stderr
