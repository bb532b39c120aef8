"""Trained models from the package index (tests/trained.py) on scikit-image's real photos: do the measurements
tell a working int8 model from a broken one, and do the verdicts point at the real culprits?

- In process (diagnostics API): the text-direction classifier ocr_cls calibrated 5x too narrow clips at its
  input, 10x too wide is coarse there, matched is neither; the text detector ocr_det quantised per tensor has
  weights whose channels differ widely (-> quant.per_channel=true), per channel it has none.
- End to end (`python -m calibrun`, real Hydra, onnxruntime and MLflow): ocr_det (a dense probability map:
  task=auto picks dense) and det_yolox (one output made of boxes, objectness and class score: the Concat that
  joins them is named as a mixed-range culprit; excluding that node makes the objectness part better), with the
  README's custom task.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from mlflow import MlflowClient

from calibrun.analysis.recommend import culprits_upstream, diagnosed_rows
from calibrun.data.images import ImageTransform, image_calibration, image_evaluation
from calibrun.measure.diagnosis import classify, classify_model, float_nodes
from calibrun.measure.tensor_stats import tensor_diagnostics
from calibrun.model import FloatModel, file_sha256, open_float_model
from calibrun.model.prepare import prepare_model
from calibrun.quant.calibrate import CalibrationCache
from calibrun.quant.quantize import quantize_with
from tests.conftest import Proc, clean_env, run_python
from tests.stores import fresh_mlflow_store
from tests.trained import PHOTOS, TEXT_PHOTOS, image_overrides, model_path, photo_folder

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    return photo_folder(folder / "all", PHOTOS + TEXT_PHOTOS)


def _prepared(model: str, tmp: Path) -> FloatModel:
    """The model as calibrun prepares it (constants folded, opset >= 13), as the runner would measure it."""
    target = tmp / f"{model}.prepared.onnx"
    if not target.is_file():
        prepare_model(model_path(model), target)
    return open_float_model(target)


def _diagnose(model: str, photos: Path, factor: float, size: int, tmp: Path, per_channel: bool = False, rows=4):
    fp32 = _prepared(model, tmp)
    transform = ImageTransform(resize=size, crop=size)
    data = image_calibration(photos, fp32.inputs, 1, factor, transform)
    out = tmp / f"{model}_{factor}_{per_channel}.onnx"
    from calibrun.quant.quantize import QuantOptions

    quant = quantize_with(fp32, out, data, options=QuantOptions(per_channel=per_channel),
                                 cache=CalibrationCache(tmp / "cache"), ranges_copy=tmp / f"{out.stem}.json")
    evaluation = image_evaluation(photos, fp32.inputs, rows, transform)
    diag_feeds = (feeds for feeds, _ in evaluation.batches(2))
    from calibrun.measure.tensor_stats import StreamingDiagnostics

    with StreamingDiagnostics(fp32.path, out, tmp / f"{out.stem}.json") as diag:
        for feeds in diag_feeds:
            diag.update(feeds)
        rows_ = diag.rows()
        weights = diag.weights
    return quant, rows_, weights


def test_ocr_cls_input_verdicts_follow_the_calibration(photos, tmp_path):
    verdicts = {}
    for name, factor in (("narrow", 0.2), ("match", 1.0), ("wide", 10.0)):
        _, rows, weights = _diagnose("ocr_cls", photos, factor, 48, tmp_path)
        model = classify_model(rows, weights)
        verdicts[name] = model["input"]
        x = next(r for r in rows if r["role"] == "input")
        if name == "narrow":
            assert x["clip_cost"] > 1
            assert model["overall"] == "clipping"  # the clipped input carries most of the noise
        if name == "match":
            assert x["clip_cost"] == 0  # same photos: nothing beyond half a step
        # every culprit names the node that produces it, as the fp32 graph has it
        nodes = {n.name for n in onnx.load(str(tmp_path / "ocr_cls.prepared.onnx")).graph.node}
        assert all(c["node"] in nodes for c in model["culprits"] if c["tensor"] != x["tensor"])
        assert sum(r["noise_share"] for r in rows) == pytest.approx(1.0)
    assert verdicts == {"narrow": "clipping", "match": "sound", "wide": "coarse"}


def test_ocr_det_weights_want_per_channel(photos, tmp_path):
    _, rows, per_tensor = _diagnose("ocr_det", photos, 1.0, 64, tmp_path, rows=2)
    flagged = [w for w in per_tensor if w["verdict"] == "mixed"]
    assert flagged, "ocr_det's per-tensor weights: some channels' ranges differ widely"
    assert classify_model(rows, per_tensor)["mixed_weights"]  # the explanation a per-channel candidate follows
    _, rows_pc, per_channel = _diagnose("ocr_det", photos, 1.0, 64, tmp_path, per_channel=True, rows=2)
    assert per_channel
    assert all(w["per_channel"] for w in per_channel if w["channels"] > 1)  # one channel: one scale anyway
    assert not [w for w in per_channel if w["verdict"] == "mixed"]
    assert not classify_model(rows_pc, per_channel)["mixed_weights"]


def test_diagnostics_of_a_list_of_feeds_is_the_api_of_old(photos, tmp_path):
    """tensor_diagnostics(feeds) still takes any iterable of feed dicts (one pass, one batch at a time)."""
    fp32 = _prepared("ocr_cls", tmp_path)
    transform = ImageTransform(resize=48, crop=48)
    data = image_calibration(photos, fp32.inputs, 1, 1.0, transform)
    out = tmp_path / "cls.onnx"
    quantize_with(fp32, out, data, ranges_copy=tmp_path / "r.json")
    feeds = (f for f, _ in image_evaluation(photos, fp32.inputs, 4, transform).batches(2))
    rows = tensor_diagnostics(fp32.path, out, tmp_path / "r.json", feeds)
    assert rows[0]["elements"] == 4 * 3 * 48 * 48
    assert all(classify(r) in ("clipping", "mixed", "coarse", "sound") for r in rows)


# ------------------------------------------------------------------------------------------ end to end


def calibrun(tmp: Path, *overrides: str) -> Proc:
    uri = f"sqlite:///{tmp / 'mlflow.db'}" if (tmp / "mlflow.db").exists() else fresh_mlflow_store(tmp)
    env = clean_env(MLFLOW_TRACKING_URI=uri, PYTHONPATH=str(ROOT))  # task functions imported from the repository
    return run_python(["-m", "calibrun", *overrides, f"cache.dir={tmp / 'cache'}"], tmp, env, 900)


def _result(tmp: Path, run: Proc, name: str) -> dict:
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((tmp / name / "result.json").read_text())


def _measured(job_dir: Path) -> list[dict]:
    """Every candidate calibrun.analysis.recommend measured, better or not (recommendations.json)."""
    return json.loads((job_dir / "recommendations.json").read_text())["measured"]


def _mlflow_run(tmp: Path, job_dir: Path):
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return next(r for r in runs if r.data.tags.get("calibrun.job_dir") == str(job_dir.resolve()))


@pytest.mark.slow
def test_ocr_det_end_to_end_dense(photos, tmp_path):
    model = model_path("ocr_det")
    run = calibrun(tmp_path, "model=file", f"model.path={model}", *image_overrides(photos, 128), "batches=1",
                   "eval.rows=6", "eval.batch_size=4", "recommend=off", "hydra.run.dir=det")
    result = _result(tmp_path, run, "det")
    m = result["metrics"]
    assert "task=auto picked dense" in run.stderr
    assert result["task"]["name"] == "dense"
    assert 0 <= m["task.iou"] <= 1
    assert 0 <= m["task.pixel_agreement"] <= 1
    out = "out.sigmoid_0.tmp_0."
    assert {out + k for k in ("max_abs_error", "mean_abs_error", "relative_error", "sqnr_db", "cosine")} <= set(m)
    assert m[out + "max_abs_error"] == m["max_abs_error"]  # one output: the pooled maximum is its maximum
    # what was used: 6 rows in batches of 4 and 2; the user's file and its hash beside the prepared copy's
    used = result["used"]
    assert (used["eval_rows"], used["eval_batches"], used["eval_batch_size"]) == (6, 2, 4)
    assert used["calibration_rows"] == 12
    assert used["eval_source"]["transform"]["crop"] == 128
    assert result["params"]["source_model_sha256"] == file_sha256(model)
    assert result["params"]["model_sha256"] != result["params"]["source_model_sha256"]  # prepared (opset 13)
    # the evaluation span of the input, from the photos themselves
    fp32 = open_float_model(tmp_path / "det" / result["files"]["fp32"])  # absolute when in the cache
    rows = image_evaluation(photos, fp32.inputs, 6, ImageTransform(resize=128, crop=128)).feeds["x"]
    assert m["eval_span"] == pytest.approx(float(rows.max() - rows.min()), rel=1e-6)
    # the diagnosis names nodes of the prepared model, and MLflow has the same numbers, FINISHED
    diagnosis = result["diagnosis"]
    nodes = {n.name for n in onnx.load(str(fp32.path), load_external_data=False).graph.node}
    assert diagnosis["culprits"]
    assert all(c["node"] in nodes for c in diagnosis["culprits"])
    mlflow_run = _mlflow_run(tmp_path, tmp_path / "det")
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.metrics[out + "sqnr_db"] == pytest.approx(m[out + "sqnr_db"])
    assert mlflow_run.data.metrics["task.iou"] == pytest.approx(m["task.iou"])


@pytest.mark.slow
def test_det_yolox_names_the_mixed_concat_and_excluding_it_helps(photos, tmp_path):
    model = model_path("det_yolox")
    common = ["model=file", f"model.path={model}", *image_overrides(photos, 416), "batches=2", "eval.rows=2",
              "task=custom", "task.fn=tests.example_task:detections"]
    result = _result(tmp_path, calibrun(tmp_path, *common, "hydra.run.dir=first", "tracking=off"), "first")
    m, diagnosis = result["metrics"], result["diagnosis"]
    assert result["used"]["eval_batch_size"] == 1  # the model pins batch 1
    # every part of the [1, 3549, 6] output is measured on its own: the objectness (entry 4) hides in the pool
    parts = {k: m[f"out.output.ch{k}.sqnr_db"] for k in range(6)}
    assert min(parts.values()) < m["out.output.sqnr_db"]
    assert "task.kept_agreement" in m
    assert "task.objectness_max_error" in m
    mixed = [c for c in diagnosis["culprits"] if c["verdict"] == "mixed"]
    assert mixed, diagnosis["culprits"]
    node = mixed[0]["node"]
    assert mixed[0]["op_type"] == "Concat"
    assert node
    # the measured recommendation that keeps culprits in float (calibrun.analysis.recommend) names those upstream
    # of the verdict's metric (one Concat input of the output): keeping a tensor in float changes nothing else
    metric = result["verdict"]["metric"]
    assert metric.startswith("out.output.concat")
    advice = next(r["change"] for r in [*result["recommendations"], *_measured(tmp_path / "first")]
                  if r["change"].startswith("quant.nodes_to_exclude=["))
    excluded = advice[len("quant.nodes_to_exclude=[") : advice.index("]")].split(",")
    first = tmp_path / "first"
    upstream = culprits_upstream(diagnosed_rows(first / "diagnostics.json"), first / result["files"]["fp32"], metric)
    assert excluded == float_nodes(upstream[:3])  # recommend.culprits: the top three of them
    # the remedy the diagnosis names for its top mixed culprit works: that part of the output gets better
    nodes = float_nodes(mixed[:1])
    assert node in nodes
    assert set(mixed[0]["consumers"]) <= set(nodes)  # the producer and its consumers: the tensor stays float
    worst = min(parts, key=parts.get)
    fixed = _result(tmp_path, calibrun(tmp_path, *common, f"quant.nodes_to_exclude=[{','.join(nodes)}]",
                                       "hydra.run.dir=fixed", "tracking=off", "recommend=off"), "fixed")
    assert fixed["metrics"][f"out.output.ch{worst}.sqnr_db"] > parts[worst]
    assert node not in [c["node"] for c in fixed["diagnosis"]["culprits"] if c["verdict"] == "mixed"]
