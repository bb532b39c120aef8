"""End-to-end: real Hydra multiruns in tmp dirs, a real MLflow SQLite store, real onnxruntime.

The full lab sweep runs once per module; each test reads a different face of it. Every number in the
report files is recomputed here independently from the bundled model files and the data rule.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mlflow import MlflowClient
from onnx import numpy_helper

from tests.conftest import Proc, clean_env, run_python
from tests.stores import fresh_mlflow_store

REPO = Path(__file__).resolve().parents[2]
CHILD_PARAMS = {"calibration.name", "calibration.factor", "calibration.seed", "batches", "format.name", "method.name",
                "model.name", "model.sha256", "eval.seed", "eval.rows", "quant.per_channel", "onnxruntime_version",
                "onnx_version"}
CHILD_METRICS = {"input.calibrated_span", "input_scale", "input_zero_point", "input.int8_grid_span", "max_abs_error",
                 "mean_abs_error",
                 "max_abs_output", "calibration_seconds", "quantization_seconds", "model_bytes", "cache_hit"}
SECTIONS = ["## Narrow calibration — it gets clipped", "## Wide calibration — it gets squashed",
            "## What cannot be fixed by the number of samples", "## The same computation, a different shape"]
FACTORS = {"narrow": 0.2, "match": 1.0, "wide": 10.0}

pytestmark = pytest.mark.slow


def calibrun(tmp: Path, *overrides: str, module: str = "calibrun", track: bool = True) -> Proc:
    """Run `python -m calibrun ...` from tmp (not the repo), with the store and cache inside tmp."""
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    if track and not (tmp / "mlflow.db").exists():
        uri = fresh_mlflow_store(tmp)
    extra = [] if module != "calibrun" else [f"cache.dir={tmp / 'cache'}"]
    return run_python(["-m", module, *overrides, *extra], tmp, clean_env(MLFLOW_TRACKING_URI=uri), timeout=600)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    sweep = tmp / "sweep"
    proc = calibrun(tmp, "-m", "+experiment=lab", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp, sweep, proc


# --- independent recomputation -------------------------------------------------------------------------------

def graph_input_scale(path: Path) -> tuple[float, int]:
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    name = next(i.name for i in model.graph.input if i.name not in inits)
    node = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == name)
    return float(inits[node.input[1]]), int(inits[node.input[2]])


def outputs(path: Path, rows: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([o.astype(np.float64).ravel() for o in sess.run(None, {sess.get_inputs()[0].name: rows})])


def eval_rows(features: int, seed: int = 777, rows: int = 256) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (rows, features)).astype(np.float32)


def lab_span(factor: float, batches: int, features: int, seed: int = 4242) -> float:
    rng = np.random.default_rng(seed)
    data = [(rng.normal(0, 1, (16, features)) * factor).astype(np.float32) for _ in range(batches)]
    return float(max(a.max() for a in data) - min(a.min() for a in data))


def features_of(path: Path) -> int:
    return onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[-1].dim_value


def max_error(fp32: Path, int8: Path) -> float:
    rows = eval_rows(features_of(fp32))
    return float(np.abs(outputs(fp32, rows) - outputs(int8, rows)).max())


# --- the full lab ---------------------------------------------------------------------------------------------

def test_lab_report_files_recompute_from_bundle(lab):
    _, sweep, _ = lab
    report = sweep / "report"
    bundle = report / "bundle"
    fp32 = bundle / "fp32.onnx"
    features = features_of(fp32)
    calib = json.loads((report / "calib_report.json").read_text())
    assert calib["eval"] == {"seed": 777, "rows": 256}
    errors = {}
    for name, factor in FACTORS.items():
        model = bundle / f"int8_{name}.onnx"
        scale, _ = graph_input_scale(model)
        entry = calib[name]
        assert entry["input_scale"] == scale
        assert entry["observed_span"] == pytest.approx(scale * 255, rel=1e-12)
        assert entry["span"] == lab_span(factor, 64, features)
        assert entry["max_abs_error"] == max_error(fp32, model)
        errors[name] = entry["max_abs_error"]
    assert calib["best"] == min(errors, key=errors.get)
    assert calib["clipping_worse_than_coarse"] == (errors["narrow"] > errors["wide"])

    match = json.loads((report / "match.json").read_text())
    model = onnx.load(str(bundle / "int8_match.onnx"))
    ops = Counter(n.op_type for n in model.graph.node)
    assert (match["input_scale"], match["input_zero_point"]) == graph_input_scale(bundle / "int8_match.onnx")
    assert match["quantize_nodes"] == ops["QuantizeLinear"]
    assert match["dequantize_nodes"] == ops["DequantizeLinear"]
    assert match["batches"] == 64
    for name in ("narrow", "wide"):
        side = json.loads((report / f"{name}.json").read_text())
        assert side["max_abs_error"] == errors[name]
        assert side["match_max_abs_error"] == errors["match"]
        assert side["batches"] == 64


def test_lab_samples_recompute_from_bundle(lab):
    _, sweep, _ = lab
    report, bundle = sweep / "report", sweep / "report" / "bundle"
    fp32 = bundle / "fp32.onnx"
    features = features_of(fp32)
    samples = json.loads((report / "samples.json").read_text())
    assert [r["batches"] for r in samples["narrow_runs"]] == [1, 8, 64, 512]
    for row in samples["narrow_runs"]:
        model = bundle / "samples" / f"narrow_n{row['batches']}.onnx"
        assert row["input_scale"] == graph_input_scale(model)[0]
        assert row["span"] == lab_span(0.2, row["batches"], features)
        assert row["max_abs_error"] == max_error(fp32, model)
    small = samples["match_small"]
    assert small["batches"] == 8
    assert small["max_abs_error"] == max_error(fp32, bundle / "samples" / "match_n8.onnx")
    narrow_errors = [r["max_abs_error"] for r in samples["narrow_runs"]]
    assert samples["narrow_best"] == min(narrow_errors)
    assert samples["narrow_gain"] == pytest.approx(narrow_errors[0] / min(narrow_errors), rel=1e-12)
    assert samples["beats_narrow"] == (small["max_abs_error"] < narrow_errors[-1])
    assert samples["beats_narrow"] is True  # the lab's lesson: a skewed set is not fixed by more of it


def test_lab_format_recomputes_from_bundle(lab):
    _, sweep, _ = lab
    report, bundle = sweep / "report", sweep / "report" / "bundle"
    fmt = json.loads((report / "format.json").read_text())
    qdq, qop = bundle / "int8_match.onnx", bundle / "int8_qop.onnx"
    for key, path in (("qdq", qdq), ("qoperator", qop)):
        assert fmt[key]["bytes"] == path.stat().st_size
        assert fmt[key]["ops"] == dict(Counter(n.op_type for n in onnx.load(str(path)).graph.node))
        assert fmt[key]["max_abs_error"] == max_error(bundle / "fp32.onnx", path)
    assert "QLinearMatMul" in fmt["qoperator"]["ops"]
    assert "QLinearMatMul" not in fmt["qdq"]["ops"]
    assert fmt["same_input_scale"] == (graph_input_scale(qdq)[0] == graph_input_scale(qop)[0])
    rows = eval_rows(features_of(bundle / "fp32.onnx"))
    difference = float(np.abs(outputs(qdq, rows) - outputs(qop, rows)).max())
    assert fmt["max_abs_difference"] == difference
    assert fmt["difference_vs_error"] == pytest.approx(difference / fmt["qdq"]["max_abs_error"], rel=1e-12)


def test_lab_report_md_and_plots(lab):
    _, sweep, _ = lab
    report = sweep / "report"
    text = (report / "report.md").read_text()
    positions = [text.index(title) for title in SECTIONS]
    assert positions == sorted(positions)
    calib = json.loads((report / "calib_report.json").read_text())
    assert f"{calib['narrow']['max_abs_error']:.4g}" in text
    for plot in ("error_vs_factor.png", "error_vs_batches.png"):
        assert (report / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({plot})" in text


def test_lab_mlflow_parent_with_24_children(lab):
    tmp, sweep, proc = lab
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("calibrun")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI's ML page, not GenAI
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1
    assert len(children) == 24
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["calibrun.sweep_dir"] == str(sweep.resolve())
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert all(c.info.status == "FINISHED" for c in children)
    combos = {(c.data.params["calibration.name"], c.data.params["batches"], c.data.params["format.name"])
              for c in children}
    assert len(combos) == 24
    for child in children:
        assert set(child.data.params) >= CHILD_PARAMS
        assert set(child.data.metrics) >= CHILD_METRICS
        assert child.data.params["onnxruntime_version"] == ort.__version__
        assert child.data.params["quant.per_channel"] == "false"  # YAML, not Python's False
        assert child.data.params["quant.op_types_to_quantize"] == "null"
        assert not any("/" in v for k, v in child.data.params.items() if k != "cache.dir")  # no per-job path
        assert child.data.tags["calibrun.sweep_dir"] == str(sweep.resolve())
        assert child.data.tags["mlflow.user"]
        assert child.data.tags["mlflow.source.name"].endswith("__main__.py")
        job_dir = Path(child.data.tags["calibrun.job_dir"])
        assert child.data.tags["calibrun.model_file"] == str(job_dir / "fp32.onnx")
        result = json.loads((job_dir / "result.json").read_text())
        assert result["mlflow"]["run_id"] == child.info.run_id
        assert child.data.metrics["max_abs_error"] == result["metrics"]["max_abs_error"]
        swept = {k: child.data.tags[f"calibrun.swept.{k}"] for k in ("calibration", "batches", "format")}
        assert child.info.run_name == f"{swept['calibration']} batches={swept['batches']} {swept['format']}"
    assert len({c.info.run_name for c in children}) == 24
    assert len({c.data.tags["calibrun.worker"] for c in children}) == 1  # the basic launcher: the sweep's own process
    # the sweep's parent: its overrides, the params all jobs share, the best run, best error per swept value
    assert parent.info.run_name == "sweep experiment=lab calibration=narrow,match,wide batches=1,8,64,512 " \
        "format=qdq,qoperator"
    assert parent.data.params["sweep.batches"] == "1,8,64,512"
    assert parent.data.params["eval.seed"] == "777"
    assert "calibration.name" not in parent.data.params
    # qdq and qoperator jobs tie: one rule (calibrun.report.aggregate.best_of), the first job of the sweep on a tie
    best = min(children, key=lambda c: (c.data.metrics["max_abs_error"], int(c.data.tags["calibrun.job_num"])))
    assert parent.data.tags["calibrun.best_run_id"] == best.info.run_id
    assert parent.data.metrics["best_max_abs_error"] == best.data.metrics["max_abs_error"]
    narrow = min(c.data.metrics["max_abs_error"] for c in children if c.data.params["calibration.name"] == "narrow")
    assert parent.data.metrics["best_max_abs_error/calibration:narrow"] == narrow
    assert f"/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning&searchFilter=" \
        in proc.stderr
    artifacts = {a.path for a in client.list_artifacts(children[0].info.run_id)}
    assert {"result.json", "config_resolved.yaml", "ranges.json"} <= artifacts
    diagnosed = next(c for c in children
                     if "diagnostics.json" in {a.path for a in client.list_artifacts(c.info.run_id)})
    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(client.tracking_uri)  # load_table finds the runs through the global store
    try:
        table = client.load_table(experiment.experiment_id, "diagnostics.json", run_ids=[diagnosed.info.run_id])
    finally:
        mlflow.set_tracking_uri(before)
    written = json.loads((Path(diagnosed.data.tags["calibrun.job_dir"]) / "diagnostics.json").read_text())
    assert list(table.columns)[:len(written)] == list(written)  # (load_table adds the run_id column)
    assert table["tensor"].tolist() == written["tensor"]
    assert table["sqnr_db"].tolist() == written["sqnr_db"]
    report_artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/calib_report.json", "report/report.md", "report/error_vs_factor.png"} <= report_artifacts
    # 24 jobs, 12 calibrations: format is post-calibration, so every second job is a cache hit.
    hits = sum(int(c.data.metrics["cache_hit"]) for c in children)
    assert hits == 12
    assert len([p for p in (tmp / "cache" / "ranges").glob("*.json") if not p.name.endswith(".key.json")]) == 12


def test_lab_int8_models_are_logged_models_with_metrics_and_datasets(lab):
    tmp, _, _ = lab
    import mlflow
    from mlflow.entities import LoggedModelStatus

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("calibrun")
    mlflow.set_tracking_uri(uri)
    models = mlflow.search_logged_models(experiment_ids=[experiment.experiment_id], output_format="list")
    children = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id], max_results=1000)
                if "mlflow.parentRunId" in r.data.tags}
    assert len(models) == 24
    assert {m.source_run_id for m in models} == set(children)
    for model in models:
        run = children[model.source_run_id]
        assert model.status == LoggedModelStatus.READY
        linked = {m.key: m.value for m in model.metrics}
        assert linked["max_abs_error"] == run.data.metrics["max_abs_error"]
        result = json.loads((Path(run.data.tags["calibrun.job_dir"]) / "result.json").read_text())
        assert result["mlflow"]["model_id"] == model.model_id
        local = Path(mlflow.artifacts.download_artifacts(f"models:/{model.model_id}",
                                                         dst_path=str(tmp / "dl" / model.model_id)))
        int8 = Path(run.data.tags["calibrun.job_dir"]) / "int8.onnx"
        assert onnx.load(str(local / "model.onnx")) == onnx.load(str(int8))
        mlmodel = (local / "MLmodel").read_text()
        assert "signature:" in mlmodel
        assert "saved_input_example_info" in mlmodel
        contexts = {d.dataset.name: [t.value for t in d.tags] for d in run.inputs.dataset_inputs}
        assert contexts == {"calibration:lab": ["calibration"], "evaluation:lab": ["evaluation"]}
    digests = {r.data.params["calibration.factor"] + "/" + r.data.params["batches"]:
               next(d.dataset.digest for d in r.inputs.dataset_inputs if d.dataset.name == "calibration:lab")
               for r in children.values()}
    assert len(set(digests.values())) == 12  # one calibration set per (factor, batches), shared by both formats


def test_standalone_aggregator_rebuilds_the_same_files(lab):
    tmp, sweep, _ = lab
    other = tmp / "rebuilt"
    proc = calibrun(tmp, str(sweep), f"report.dir={other}", module="calibrun.report.aggregate")
    assert proc.returncode == 0, proc.stderr
    for name in ("calib_report.json", "match.json", "narrow.json", "wide.json", "samples.json", "format.json"):
        assert json.loads((other / name).read_text()) == json.loads((sweep / "report" / name).read_text()), name
    assert (other / "bundle" / "samples" / "narrow_n512.onnx").read_bytes() == \
        (sweep / "report" / "bundle" / "samples" / "narrow_n512.onnx").read_bytes()


# --- partial sweeps, failures, config errors ------------------------------------------------------------------

def test_partial_sweep_writes_what_it_can_and_names_the_missing_runs(tmp_path):
    sweep = tmp_path / "sweep"
    # tracking=off: the report is the subject (the tracked lab sweep above has every run in MLflow)
    proc = calibrun(tmp_path, "-m", "calibration=narrow,match,wide", f"hydra.sweep.dir={sweep}", "tracking=off",
                    track=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = sweep / "report"
    for name in ("calib_report.json", "match.json", "narrow.json", "wide.json", "report.md"):
        assert (report / name).is_file(), name
    assert not (report / "samples.json").exists()
    assert not (report / "format.json").exists()
    assert "skipping samples.json" in proc.stderr
    assert "calibration=narrow batches=512 format=qdq" in proc.stderr
    assert "skipping format.json" in proc.stderr
    assert "calibration=match batches=64 format=qoperator" in proc.stderr
    text = (report / "report.md").read_text()
    assert all(title in text for title in SECTIONS)
    assert "missing runs: calibration=match batches=64 format=qoperator" in text
    assert sorted(p.name for p in (report / "bundle").iterdir()) == [
        "fp32.onnx", "int8_match.onnx", "int8_narrow.onnx", "int8_wide.onnx"]


def test_failing_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    sweep = tmp_path / "sweep"
    proc = calibrun(tmp_path, "-m", "batches=0,8", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 1
    assert "config batches: must be in 1..100000, got 0" in proc.stderr
    assert "Traceback" not in proc.stderr
    results = {r["params"]["batches"]: r for r in (json.loads(p.read_text()) for p in sweep.glob("*/result.json"))}
    assert results[0]["status"] == "failed"
    assert "batches" in results[0]["error"]
    assert results[8]["status"] == "ok"
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("calibrun").experiment_id])
    statuses = Counter(r.info.status for r in runs if "mlflow.parentRunId" in r.data.tags)
    assert statuses == {"FAILED": 1, "FINISHED": 1}
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert parent.info.status == "FAILED"


def test_lab_diagnosis_names_the_cause(lab):
    _, sweep, _ = lab
    diagnosis = json.loads((sweep / "report" / "diagnosis.json").read_text())
    verdicts = {name: diagnosis["runs"][f"calibration={name} batches=64 format=qdq"]["verdict"] for name in FACTORS}
    assert verdicts == {"narrow": "clipping", "match": "sound", "wide": "coarse"}
    narrow = diagnosis["runs"]["calibration=narrow batches=64 format=qdq"]["input"]
    params = {p.parent: json.loads(p.read_text())["params"] for p in sweep.glob("*/result.json")}
    job = next(d for d, p in params.items() if (p["calibration"], p["batches"], p["format"]) == ("narrow", 64, "qdq"))
    scale, zero_point = graph_input_scale(job / "int8.onnx")
    rows = eval_rows(16)
    outside = (rows < scale * (-128 - zero_point)) | (rows > scale * (127 - zero_point))
    assert narrow["clipped_fraction"] == pytest.approx(outside.mean(), abs=1e-12)
    # the sample study: narrow's range will not grow to the real one; match's already covers it
    assert diagnosis["samples"]["narrow"]["more_samples_help"] is False
    assert diagnosis["samples"]["narrow"]["verdict"] == "distribution is off"
    assert diagnosis["samples"]["match"]["more_samples_help"] is False
    assert diagnosis["samples"]["match"]["verdict"] == "covered"
    text = (sweep / "report" / "report.md").read_text()
    assert "## Diagnosis" in text
    assert "distribution is off" in text


def test_single_run_registers_its_int8_model(tmp_path):
    run_dir = tmp_path / "run"
    proc = calibrun(tmp_path, "batches=2", "tracking.register=lab-int8", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (version,) = client.search_model_versions("name = 'lab-int8'")
    assert version.source == f"models:/{result['mlflow']['model_id']}"
    assert version.run_id == result["mlflow"]["run_id"]
    run = client.get_run(result["mlflow"]["run_id"])
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "match batches=2 qdq minmax"
    assert "mlflow.parentRunId" not in run.data.tags
