"""The headline verdict and the measured recommendations, end to end on trained models (`python -m calibrun`,
real onnxruntime, Hydra and MLflow): each path that decides a verdict, and a recommendation that is what it says.

- The text detector ocr_det (PP-OCRv4, a dense map) at 160x160 on pages of text: its int8 map is broken (task.dice);
  the measured recommendations are better than before, best first, and the best one, appended to the command line
  as it is written, gives the model it measured.
- scikit-learn's digits classifier on the real test split: ok (task.top1_agreement).
- NudeNet's YOLOv8n on photos, no task: its class scores, one Concat input of output0, are crushed on the boxes'
  int8 grid: broken on that part's SQNR, though the whole output's SQNR looks fine. Tracked: the MLflow tags; in a
  sweep with 16-bit activations, both runs ranked by the worst output's SQNR (the report, the parent run).
- det_yolox with the README's custom detection task: `verdict.metric` decides with its thresholds.
- The lab model kept all in float: its metric at its best, no recommendation is measured.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient

from calibrun.analysis.recommend import changes_of, headroom
from tests.conftest import Proc, clean_env, run_python
from tests.stores import fresh_mlflow_store
from tests.trained import PHOTOS, TEXT_PHOTOS, image_overrides, model_path, photo_folder

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return photo_folder(tmp_path_factory.mktemp("photos"), PHOTOS)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    return photo_folder(tmp_path_factory.mktemp("pages"), TEXT_PHOTOS)


def calibrun(tmp: Path, *overrides: str, store: str | None = None) -> Proc:
    env = clean_env(PYTHONPATH=str(ROOT))  # the custom task is imported from the repository
    if store:
        env["MLFLOW_TRACKING_URI"] = store
    else:
        overrides = (*overrides, "tracking=off")
    return run_python(["-m", "calibrun", *overrides, f"cache.dir={tmp / 'cache'}"], tmp, env, 900)


def _done(tmp: Path, run: Proc, name: str) -> dict:
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((tmp / name / "result.json").read_text())


def _last_line(run: Proc) -> str:
    lines = [line for line in run.stderr.splitlines() if "[calibrun]" in line]
    return lines[-1].split(" - ", 1)[1]


def test_a_broken_detector_gets_measured_recommendations_and_the_best_one_is_what_it_says(pages, tmp_path):
    common = ["model=file", f"model.path={model_path('ocr_det')}", *image_overrides(pages, 160), "batches=4"]
    first = calibrun(tmp_path, *common, "recommend.methods=[entropy]", "hydra.run.dir=first")  # + another method
    result = _done(tmp_path, first, "first")
    verdict = result["verdict"]
    assert (verdict["status"], verdict["metric"]) == ("broken", "task.dice")
    assert verdict["value"] == result["metrics"]["task.dice"] < 0.8
    iou = result["metrics"]["task.iou"]
    assert verdict["value"] == pytest.approx(2 * iou / (1 + iou))  # one set of pixels: Dice = 2 IoU / (1 + IoU)
    assert _last_line(first) == f"verdict: BROKEN: {verdict['because']}"
    offered = result["recommendations"]
    assert offered, "no candidate helped"
    assert all(r["after"] > r["before"] == verdict["value"] for r in offered)  # only what is better is offered
    rank = {"ok": 0, "degraded": 1, "broken": 2}  # best first: the best status, then (ok) the fewest changes and the
    keys = [(rank[r["status_after"]], *((len(r["change"].split(" ")), -r["after"]) if r["status_after"] == "ok"
                                        else (-r["after"], len(r["change"].split(" "))))) for r in offered]  # value
    assert keys == sorted(keys)
    measured = json.loads((tmp_path / "first" / "recommendations.json").read_text())["measured"]
    assert len(measured) == result["used"]["recommend"]["candidates"] > len(offered)  # entropy: worse here
    assert "method=entropy" in [e["change"] for e in measured]
    # two single candidates measured at once (their sessions fit memory.budget together); the best one's value is
    # what a run with its change measures on its own (below), to 1e-9
    assert result["used"]["recommend"]["at_once"] == 2
    for entry in measured:  # every candidate measured, the ones not offered among them, and why
        assert (entry["change"] in [r["change"] for r in offered]) == bool(entry.get("helps")), entry
        if entry.get("helps") is False:
            assert entry["after"] <= entry["before"]
    # a combination with more changes than an offered ok change is not measured: it could not rank first
    record = json.loads((tmp_path / "first" / "recommendations.json").read_text())
    fewest_ok = min((len(r["change"].split(" ")) for r in offered if r["status_after"] == "ok"), default=None)
    assert len(record["not_measured"]) == result["used"]["recommend"]["not_measured"]
    for change in record["not_measured"]:
        assert fewest_ok is not None
        assert len(change.split(" ")) > fewest_ok
    best = offered[0]
    again = calibrun(tmp_path, *common, *changes_of(best), "recommend=off", "hydra.run.dir=best")
    redone = _done(tmp_path, again, "best")
    assert redone["verdict"]["value"] == pytest.approx(best["after"], abs=1e-9)
    assert redone["verdict"]["status"] == best["status_after"]
    assert "recommendations" not in redone  # recommend=off


def test_a_sound_classifier_is_ok(tmp_path):
    pytest.importorskip("sklearn", reason="the digits model needs scikit-learn (the `test` extra has it)")
    digits = tmp_path / "cache" / "digits"
    run = calibrun(tmp_path, "model=digits", "data=npy", "eval_data=npy", f"data.path={digits / 'calib.npz'}",
                   f"eval_data.path={digits / 'eval.npz'}", "batches=25", "eval.rows=397", "recommend=off",
                   "hydra.run.dir=digits")
    verdict = _done(tmp_path, run, "digits")["verdict"]
    assert (verdict["status"], verdict["metric"]) == ("ok", "task.top1_agreement")
    assert verdict["value"] >= 0.95
    assert "397 evaluation rows" in verdict["because"]


def test_a_qoperator_job_measures_16_bits_in_qdq_form_and_the_change_gives_what_it_measured(tmp_path):
    """onnxruntime's QLinear ops are 8-bit only: a QOperator job's 16-bit candidates are `format=qdq` with them (the
    same computation in its other form), measured like any other; pasted on a shell after the command, the change
    gives the QDQ model it measured."""
    pytest.importorskip("sklearn", reason="the digits model needs scikit-learn (the `test` extra has it)")
    digits = tmp_path / "cache" / "digits"
    common = ["model=digits", "data=npy", "eval_data=npy", f"data.path={digits / 'calib.npz'}",
              f"eval_data.path={digits / 'eval.npz'}", "batches=25", "task=none", "format=qoperator"]
    result = _done(tmp_path, calibrun(tmp_path, *common, "hydra.run.dir=qop"), "qop")
    measured = json.loads((tmp_path / "qop" / "recommendations.json").read_text())["measured"]
    by = {e["change"]: e for e in measured}
    assert {"format=qdq quant.activation_type=QInt16", "format=qdq quant.weight_type=QInt16",
            "format=qdq quant.activation_type=QInt16 quant.weight_type=QInt16"} <= set(by)
    both = by["format=qdq quant.activation_type=QInt16 quant.weight_type=QInt16"]
    assert both["after"] > result["verdict"]["value"] + 10  # 16 bits on both: rounding error all but gone
    pasted = subprocess.run(["sh", "-c", f"printf '%s\\n' {both.get('shell', both['change'])}"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    again = _done(tmp_path, calibrun(tmp_path, *common, *pasted, "recommend=off", "hydra.run.dir=qdq"), "qdq")
    assert again["params"]["format"] == "qdq"
    assert again["ops"].get("QuantizeLinear")
    assert not any(op.startswith("QLinear") for op in again["ops"])
    assert again["verdict"]["value"] == pytest.approx(both["after"], abs=1e-9)


def test_no_candidate_is_measured_where_int8_already_computes_as_fp32(tmp_path):
    """The lab model with every node kept in float: its output is fp32's exactly (SQNR at its cap), so no change can
    make it better and none is measured; the same job quantised measures its candidates."""
    nodes = "quant.nodes_to_exclude=[fc1_matmul,fc1_add,relu,fc2_matmul,fc2_add]"
    run = calibrun(tmp_path, nodes, "hydra.run.dir=float")
    result = _done(tmp_path, run, "float")
    assert result["verdict"]["value"] == 200.0  # calibrun.measure.verdict.SQNR_CAP: no error at all
    assert result["recommendations"] == []
    assert result["used"]["recommend"]["candidates"] == 0
    written = json.loads((tmp_path / "float" / "recommendations.json").read_text())
    assert written["measured"] == []
    assert written["why"] == "out.y.sqnr_db is at its best (200)"
    assert "recommend: none measured: out.y.sqnr_db is 200, its best" in run.stderr
    quantised = _done(tmp_path, calibrun(tmp_path, "hydra.run.dir=int8"), "int8")
    assert quantised["verdict"]["value"] < 200.0
    assert quantised["used"]["recommend"]["candidates"] >= 4

def test_a_clipped_calibration_gets_headroom_measured_and_the_override_gives_what_it_measured(tmp_path):
    """The lab calibrated narrow: its diagnosis is clipping, which no precision change reaches; the headroom
    candidate (the clipping culprits' calibrated ranges, each end the rows crossed twice as far from zero and at
    least as far as the evaluation rows reached; the output y, which clips too) is measured from the same ranges and
    is better; pasted on a shell after the command as the log prints it, it gives the model it measured."""
    run = calibrun(tmp_path, "calibration=narrow", "hydra.run.dir=narrow")
    result = _done(tmp_path, run, "narrow")
    assert result["diagnosis"]["overall"] == "clipping"
    measured = json.loads((tmp_path / "narrow" / "recommendations.json").read_text())["measured"]
    widened = [e for e in measured if changes_of(e)[0].startswith("quant.tensor_ranges=") and len(changes_of(e)) == 1]
    assert len(widened) == 1, [e["change"] for e in measured]
    entry = widened[0]
    assert entry["helps"]
    assert entry["after"] > entry["before"] + 0.5
    sixteen = next(e for e in measured if e["change"] == "quant.activation_type=QInt16")
    assert sixteen["after"] < entry["after"]  # precision does not reach clipping
    ranges = json.loads((tmp_path / "narrow" / "ranges.json").read_text())["data"]["x"]
    low, high = ranges["lowest"]["data"][0], ranges["highest"]["data"][0]
    table = json.loads((tmp_path / "narrow" / "diagnostics.json").read_text())
    row = table["tensor"].index("x")
    reach_low, reach_high = table["eval_min"][row], table["eval_max"][row]
    assert reach_low < 2 * low  # narrow: the rows reach past twice the calibrated range, on both sides
    assert reach_high > 2 * high
    wide_low, wide_high = headroom(low, high, (reach_low, reach_high))  # the reach, to 6 digits rounded outward
    assert wide_low <= reach_low < wide_low + 1e-4
    assert wide_high >= reach_high > wide_high - 1e-4
    assert f"x:[{wide_low!r},{wide_high!r}]" in entry["change"]
    assert ",y:[" in entry["change"]  # the clipping output, widened too
    assert f"recommend: {entry['shell']}: " in run.stderr  # the braces quoted: bash would expand them
    pasted = subprocess.run(["sh", "-c", f"printf '%s\\n' {entry['shell']}"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    assert pasted == [entry["change"]]
    again = calibrun(tmp_path, "calibration=narrow", *pasted, "recommend=off", "hydra.run.dir=again")
    redone = _done(tmp_path, again, "again")
    assert redone["verdict"]["value"] == pytest.approx(entry["after"], abs=1e-9)
    assert redone["params"]["quant.tensor_ranges"]


def test_a_detector_whose_scores_are_crushed_is_broken_on_that_part_and_tagged(photos, tmp_path):
    """Tracked, in a sweep with 16-bit activations beside (which lifts the scores' part): each run's verdict tags,
    and the sweep ranks its runs by the worst output's SQNR that judged them (the report and the parent run), not
    by max_abs_error over boxes in pixels and scores."""
    store = fresh_mlflow_store(tmp_path)
    run = calibrun(tmp_path, "-m", "model=file", f"model.path={model_path('nudenet')}", *image_overrides(photos, 320),
                   "batches=1", "eval.rows=8", "recommend=off", "diagnostics=off", "quant.activation_type=QInt8,QInt16",
                   f"hydra.sweep.dir={tmp_path / 'nude'}", store=store)
    assert run.returncode == 0, run.stderr[-3000:]
    result, sixteen = (_done(tmp_path, run, f"nude/{job}") for job in (0, 1))
    verdict, m = result["verdict"], result["metrics"]
    assert result["task"]["name"] == "none"
    assert verdict["metric"] == "out.output0.concat1.sqnr_db"  # the Sigmoid class scores, output0[:, 4:22]
    assert (verdict["status"], verdict["goal"]) == ("broken", "max")
    assert m["out.output0.sqnr_db"] > m["out.output0.concat1.sqnr_db"] + 10  # the whole tensor hides it
    for each in (result, sixteen):  # the worst output's SQNR, whichever output or part it was, under one name
        assert each["metrics"]["worst_output_sqnr_db"] == each["verdict"]["value"]
    assert sixteen["verdict"]["value"] > verdict["value"] + 10
    client = MlflowClient(store)
    tags = client.get_run(result["mlflow"]["run_id"]).data.tags
    assert tags["calibrun.verdict"] == "broken"
    assert tags["calibrun.verdict.because"] == verdict["because"]
    assert (tags["calibrun.verdict.headline"], tags["calibrun.verdict.better"]) == ("worst_output_sqnr_db", "higher")
    runs = json.loads((tmp_path / "nude" / "report" / "runs.json").read_text())
    assert runs["headline"] == {"metric": "worst_output_sqnr_db", "better": "higher"}
    assert runs["best"] == "quant.activation_type=QInt16"
    assert result["metrics"]["max_abs_error"] != sixteen["metrics"]["max_abs_error"]  # a ranking it no longer sets
    parent = client.get_run(client.get_run(result["mlflow"]["run_id"]).data.tags["mlflow.parentRunId"]).data
    assert parent.tags["calibrun.headline"] == "worst_output_sqnr_db (higher is better)"
    assert parent.tags["calibrun.best_run_id"] == sixteen["mlflow"]["run_id"]
    assert parent.metrics["best_worst_output_sqnr_db"] == sixteen["verdict"]["value"]


def test_a_custom_task_decides_with_its_own_metric_and_thresholds(photos, tmp_path):
    common = ["model=file", f"model.path={model_path('det_yolox')}", *image_overrides(photos, 416), "batches=2",
              "eval.rows=2", "task=custom", "task.fn=tests.example_task:detections", "recommend=off", "diagnostics=off"]
    run = calibrun(tmp_path, *common, "verdict.metric=task.kept_agreement", "verdict.ok=0.9", "verdict.broken=0.5",
                   "hydra.run.dir=custom")
    result = _done(tmp_path, run, "custom")
    verdict = result["verdict"]
    value = result["metrics"]["task.kept_agreement"]
    assert (verdict["metric"], verdict["value"]) == ("task.kept_agreement", value)
    assert verdict["status"] == ("ok" if value >= 0.9 else "broken" if value < 0.5 else "degraded")
    assert "set by verdict.metric" in verdict["because"]
    wrong = calibrun(tmp_path, *common, "verdict.metric=task.kept_agreemnt", "verdict.ok=0.9", "verdict.broken=0.5",
                     "hydra.run.dir=wrong")
    assert wrong.returncode == 1
    assert wrong.stderr.strip().splitlines()[-1] == ("calibrun: error: config verdict.metric: 'task.kept_agreemnt' is "
                                                     "not a metric of this run; did you mean task.kept_agreement?")
