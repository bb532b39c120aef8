"""Sensitivity analysis, automatic fp32 fallback, exclusions that cannot silently fail, Optuna search (issue 11).

In-process on the lab MLP with real onnxruntime; the end-to-end runs of `python -m calibrun` (the lab, a trained
YOLOX detector with real photos) are in tests/e2e/test_analysis_runs.py.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from calibrun import config as calibrun_config
from calibrun.analysis import qdq
from calibrun.analysis.evaluate import Evaluator
from calibrun.analysis.sensitivity import fallback, rank
from calibrun.core.errors import CalibrunError
from calibrun.data import EvalData
from calibrun.lab.data import lab_batches
from calibrun.measure import errors as measure
from calibrun.measure.tasks import Custom, load_function
from calibrun.model import open_float_model
from calibrun.model.pairs import find_pairs
from calibrun.quant.calibrate import CalibrationCache, CalibrationSpec, calibrated
from calibrun.quant.quantize import QuantOptions, check_exclusions, quantize, quantize_lab

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------ exclusion checks


def lab_onnx(lab_model: Path) -> onnx.ModelProto:
    return onnx.load(str(lab_model))


def test_node_names_pass_unchanged(lab_model):
    resolved = check_exclusions(lab_onnx(lab_model), QuantOptions(nodes_to_exclude=("fc2_matmul", "relu")))
    assert resolved.nodes == ("fc2_matmul", "relu")
    assert resolved.mapped == {}


def test_unknown_node_name_names_the_closest_nodes(lab_model):
    with pytest.raises(CalibrunError) as err:
        check_exclusions(lab_onnx(lab_model), QuantOptions(nodes_to_exclude=("fc2_matmull",)))
    message = str(err.value)
    assert "no node named 'fc2_matmull'" in message
    assert "fc2_matmul" in message.split("closest node names:")[1]


def test_tensor_name_is_mapped_to_its_producer(lab_model):
    resolved = check_exclusions(lab_onnx(lab_model), QuantOptions(nodes_to_exclude=("y_mm", "relu")))
    assert resolved.nodes == ("fc2_matmul", "relu")
    assert resolved.mapped == {"y_mm": "fc2_matmul"}


def test_graph_input_names_its_readers(lab_model):
    with pytest.raises(CalibrunError, match=r"'x' is a graph input or initializer, not a node.*fc1_matmul"):
        check_exclusions(lab_onnx(lab_model), QuantOptions(nodes_to_exclude=("x",)))


@pytest.mark.parametrize("name", ["", "  "])
def test_empty_node_name_is_a_clear_error(lab_model, name):
    with pytest.raises(CalibrunError, match="empty node name"):
        check_exclusions(lab_onnx(lab_model), QuantOptions(nodes_to_exclude=(name,)))


def test_unnamed_producer_cannot_be_excluded(lab_model):
    model = lab_onnx(lab_model)
    model.graph.node[2].name = ""  # the Relu writes tensor "h"
    with pytest.raises(CalibrunError, match="produced by an unnamed Relu node"):
        check_exclusions(model, QuantOptions(nodes_to_exclude=("h",)))


def test_unknown_op_type_names_the_closest(lab_model):
    with pytest.raises(CalibrunError, match=r"no 'Matmul' node in the model \(closest: \['MatMul'\]\)"):
        check_exclusions(lab_onnx(lab_model), QuantOptions(op_types_to_quantize=("Matmul",)))
    assert check_exclusions(lab_onnx(lab_model), QuantOptions(op_types_to_quantize=("MatMul",))).nodes == ()


# ------------------------------------------------------------------------------------ QDQ graph edits


def test_a_bias_given_a_type_of_its_own_is_warned_about(caplog):
    """onnxruntime keeps biases int32; quant.tensor_types on one makes it quantise the bias as a weight: a warning
    names the bias and its node, other tensors pass quietly."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")]
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [1], [0.5]) for n in ("w", "b")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    with caplog.at_level("WARNING", logger="calibrun"):
        check_exclusions(helper.make_model(graph), QuantOptions(tensor_types={"b": "QInt16", "w": "QInt16"}))
    assert [r.getMessage() for r in caplog.records] == [
        "quant.tensor_types: 'b' is the bias of node 'conv'; onnxruntime keeps biases in int32 (scale input x "
        "weight) and with a type of its own quantises it as a weight, on a coarser grid"]


@pytest.fixture
def narrow(tmp_path, lab_model):
    """The lab model quantised on narrow calibration (factor 0.2, 8 batches), with its ranges kept."""
    return narrow_lab(tmp_path, lab_model)


def narrow_lab(tmp_path: Path, lab_model: Path):
    fp32 = open_float_model(lab_model)
    int8 = tmp_path / "int8.onnx"
    ranges = tmp_path / "ranges.json"
    quantize_lab(fp32, int8, 4242, 0.2, 8, cache=CalibrationCache(tmp_path / "cache"), ranges_copy=ranges)
    feeds = measure.lab_feeds(fp32, 777, 64)
    return fp32, int8, ranges, feeds


def plain_session(model, optimize: bool = False):
    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])


def test_pairs_cover_input_activations_and_weights(narrow):
    fp32, int8, _, _ = narrow
    pairs = {p.tensor: p for p in find_pairs(onnx.load(str(int8)), onnx.load(str(fp32.path)))}
    assert pairs["x"].kind == "activation"
    assert pairs["x"].nodes == ["fc1_matmul"]  # nothing writes the input: its reader is the node to exclude
    assert pairs["h"].node == "relu" or pairs["h"].node == "fc1_add"  # Relu may be fused into the pair
    assert {"w1", "w2"} <= {t for t, p in pairs.items() if p.kind == "weight"}
    assert pairs["w1"].nodes == ["fc1_matmul"]


def test_switch_model_matches_int8_fp32_and_single_pair_edits(narrow):
    fp32, int8, _, feeds = narrow
    int8_model, fp32_model = onnx.load(str(int8)), onnx.load(str(fp32.path))
    pairs = find_pairs(int8_model, fp32_model)
    switched = plain_session(qdq.switch_model(int8_model, fp32_model, pairs))
    n = len(pairs)
    ref_int8 = plain_session(int8).run(None, feeds)[0]
    ref_fp32 = plain_session(fp32.path).run(None, feeds)[0]
    assert np.abs(ref_int8 - ref_fp32).max() > 0.1  # narrow calibration really hurts
    all_in = switched.run(None, {**feeds, **qdq.switches(n)})[0]
    np.testing.assert_allclose(all_in, ref_int8, rtol=0, atol=1e-5)
    all_out = switched.run(None, {**feeds, **qdq.switches(n, set(range(n)))})[0]
    np.testing.assert_allclose(all_out, ref_fp32, rtol=0, atol=1e-5)
    for i, pair in enumerate(pairs):  # one switch == that pair removed from the graph
        one = switched.run(None, {**feeds, **qdq.switches(n, i)})[0]
        edited = plain_session(qdq.without_pair(int8_model, fp32_model, pair)).run(None, feeds)[0]
        np.testing.assert_allclose(one, edited, rtol=0, atol=1e-5, err_msg=pair.tensor)


# ------------------------------------------------------------------------------------ metrics


def two_output_task(fp32_outputs, int8_outputs, labels):
    (name,) = fp32_outputs
    return {"sign_agreement": float(np.mean(np.sign(fp32_outputs[name]) == np.sign(int8_outputs[name]))),
            "rows": float(len(labels)) if labels is not None else -1.0}


def masked_task(fp32_outputs, int8_outputs, labels, inputs):
    """A metric over the rows an input marks (a masked language model's masked positions): the sign agreement on the
    rows whose first input value is positive, and what it was fed."""
    (name,) = fp32_outputs
    (feed,) = inputs.values()
    marked = feed[:, 0] > 0
    agree = np.sign(fp32_outputs[name][marked]) == np.sign(int8_outputs[name][marked])
    return {"marked_sign_agreement": float(agree.mean()) if marked.any() else 1.0, "fed_sum": float(feed.sum())}


def failing_in_workers_task(fp32_outputs, int8_outputs, labels):
    """two_output_task in the test's process; an error in a worker (which does not see CALIBRUN_TEST_DRIVER)."""
    if "CALIBRUN_TEST_DRIVER" not in os.environ:
        raise CalibrunError("the task failed in a worker")
    return two_output_task(fp32_outputs, int8_outputs, labels)


@pytest.mark.parametrize("held", [True, False], ids=["held", "written"])
def test_evaluator_streams_batches_and_matches_whole_set_numbers(narrow, monkeypatch, held):
    """The same metrics whether the evaluation's runs are held in memory (small ones) or written, one file each."""
    from calibrun.analysis import evaluate

    if not held:
        monkeypatch.setattr(evaluate, "HELD_RUN_BYTES", 0)
    fp32, int8, _, feeds = narrow
    ref = plain_session(fp32.path, True).run(None, feeds)[0].astype(np.float64)
    got = plain_session(int8, True).run(None, feeds)[0].astype(np.float64)
    labels = np.arange(64)
    with Evaluator(fp32.path, EvalData.from_arrays(feeds, labels), 10,
                   task=Custom("tests.unit.test_analysis:two_output_task")) as ev:
        metrics = ev.model(int8)
        assert ev.count == 7  # 64 rows in batches of 10: one run each
        assert len(list(ev._tmp.iterdir())) == (0 if held else 7)
        assert len(ev.batches.held) == (7 if held else 0)
    assert metrics["max_abs_error"] == pytest.approx(np.abs(ref - got).max(), rel=1e-9)
    assert metrics["mean_abs_error"] == pytest.approx(np.abs(ref - got).mean(), rel=1e-9)
    sqnr = 10 * math.log10(np.square(ref).sum() / np.square(ref - got).sum())
    assert metrics["out.y.sqnr_db"] == pytest.approx(sqnr, rel=1e-9)
    assert metrics["task.sign_agreement"] == pytest.approx(np.mean(np.sign(ref) == np.sign(got)), rel=1e-9)
    # the task value is a row-weighted mean of the per-batch values: 6 batches of 10 rows and one of 4
    assert metrics["task.rows"] == pytest.approx((6 * 10 * 10 + 4 * 4) / 64)


def test_the_evaluations_own_fp32_outputs_measure_the_int8_model_as_the_evaluation_did(narrow):
    """A single run's recommendations measure against the fp32 outputs its evaluation computed (`keep`) instead of a
    second fp32 pass: the int8 model measured against them gives the evaluation's numbers, bit for bit, labels and
    task included, and the store is gone once closed."""
    fp32, int8, _, feeds = narrow
    labels = np.arange(64)
    data = EvalData.from_arrays(feeds, labels)
    kept = Evaluator.kept(fp32.path, task=Custom("tests.unit.test_analysis:two_output_task"))
    evaluated = measure.evaluate(fp32.path, int8, data, Custom("tests.unit.test_analysis:two_output_task"),
                                 batch_size=10, progress=None, keep=kept)
    with kept as ev:
        assert ev.count == 7  # one file per run of the evaluation: 64 rows in runs of 10
        folder = ev._tmp
        again = ev.model(int8)
    assert not folder.exists()
    for key in ("max_abs_error", "mean_abs_error", "out.y.sqnr_db", "task.sign_agreement", "task.rows"):
        assert again[key] == evaluated[key], key
    with pytest.raises(CalibrunError, match="at least one evaluation batch"):
        Evaluator.kept(fp32.path).ready()


def test_a_task_function_that_takes_the_inputs_gets_each_runs_feeds(narrow):
    """`fn(fp32, int8, labels, inputs)`: the batch's inputs as fp32 was fed them, for a metric over the positions an
    input marks (an unseen character BERT's masked letters); the evaluation, and the kept reference's re-measure,
    give it the same feeds."""
    from calibrun.measure.tasks import takes_inputs

    assert takes_inputs(masked_task)
    assert not takes_inputs(two_output_task)
    assert takes_inputs(lambda fp32, int8, labels, *rest: {})
    assert takes_inputs(lambda a, b, c, inputs=None: {})
    fp32, int8, _, feeds = narrow
    (name,) = feeds
    ref = plain_session(fp32.path, True).run(None, feeds)[0]
    got = plain_session(int8, True).run(None, feeds)[0]
    marked = feeds[name][:, 0] > 0
    data = EvalData.from_arrays(feeds)
    kept = Evaluator.kept(fp32.path, task=Custom("tests.unit.test_analysis:masked_task"))
    evaluated = measure.evaluate(fp32.path, int8, data, Custom("tests.unit.test_analysis:masked_task"),
                                 batch_size=10, progress=None, keep=kept)
    with kept as ev:
        again = ev.model(int8)
    assert 0 < marked.sum() < len(marked)
    # a row-weighted mean of per-batch values: the fed sum over 64 rows in 6 runs of 10 and one of 4
    sums = [float(feeds[name][i:i + 10].sum()) * len(feeds[name][i:i + 10]) for i in range(0, 64, 10)]
    assert evaluated["task.fed_sum"] == pytest.approx(sum(sums) / 64, rel=1e-6)
    per_run = [np.mean(np.sign(ref[i:i + 10][marked[i:i + 10]]) == np.sign(got[i:i + 10][marked[i:i + 10]]))
               if marked[i:i + 10].any() else 1.0 for i in range(0, 64, 10)]
    weights = [len(marked[i:i + 10]) for i in range(0, 64, 10)]
    assert evaluated["task.marked_sign_agreement"] == pytest.approx(np.average(per_run, weights=weights), rel=1e-9)
    for key in ("task.marked_sign_agreement", "task.fed_sum"):
        assert again[key] == evaluated[key], key


def test_task_fn_spec_errors_are_clear():
    with pytest.raises(CalibrunError, match="must be module:function"):
        load_function("tests.detection")
    with pytest.raises(CalibrunError, match="cannot import 'no_such_module_xyz'"):
        load_function("no_such_module_xyz:f")
    with pytest.raises(CalibrunError, match="has no function 'nope'"):
        load_function("tests.detection:nope")
    assert load_function("tests.detection:yolov8_agreement") is not None


# ------------------------------------------------------------------------------------ sensitivity, fallback


@pytest.mark.parametrize("strategy", ["switch", "edit"])
def test_narrow_lab_ranks_the_input_first(narrow, strategy):
    fp32, int8, _, feeds = narrow
    with Evaluator(fp32.path, EvalData.from_arrays(feeds), 16) as ev:
        result = rank(fp32.path, int8, ev, "mean_abs_error", "min", strategy)
        int8_error = ev.model(int8)["mean_abs_error"]
    top = result["ranking"][0]
    assert top["tensor"] == "x"
    assert top["nodes"] == ["fc1_matmul"]
    assert top["gain"] > 2 * result["ranking"][1]["gain"] > 0  # clipping at the input costs the most
    gains = [r["gain"] for r in result["ranking"]]
    assert gains == sorted(gains, reverse=True)
    assert result["tensors"] == len(result["ranking"]) >= 6
    assert result["seconds_per_tensor"] > 0
    if strategy == "edit":  # every other pair fused as usual: the baseline is the int8 model itself
        assert result["baseline"] == pytest.approx(int8_error, rel=1e-9)
    else:  # simulated quantisation, same scales: close to the real int8 kernels
        assert result["baseline"] == pytest.approx(int8_error, rel=0.02)
        assert result["all_pairs_removed"] == pytest.approx(0, abs=1e-6)  # every pair out: the fp32 model


def test_confirmed_top_is_measured_on_the_int8_model_itself(narrow):
    """analysis.confirm=N: the switch ranking's top N measured again on the int8 model with that pair removed (the
    edit strategy's trial), against the int8 model's own metric: baseline and those values are the edit strategy's
    to the last bit; the switch values that put them there stay beside them; the rest keep the switch ranking."""
    fp32, int8, _, feeds = narrow
    with Evaluator(fp32.path, EvalData.from_arrays(feeds), 16) as ev:
        int8_metrics = ev.model(int8)
        plain = rank(fp32.path, int8, ev, "mean_abs_error", "min", "switch")
        confirmed = rank(fp32.path, int8, ev, "mean_abs_error", "min", "switch", confirm=3, int8_metrics=int8_metrics)
        edit = rank(fp32.path, int8, ev, "mean_abs_error", "min", "edit")
    assert plain["baseline_on"] == "switch"
    assert plain["confirmed"] == 0
    # fake-quantised arithmetic: close to the int8 kernels' (equal to the last bit on some CPUs, not on others)
    assert plain["baseline"] == pytest.approx(int8_metrics["mean_abs_error"], rel=0.02)
    assert confirmed["baseline_on"] == "int8"
    assert confirmed["confirmed"] == 3
    assert confirmed["baseline"] == int8_metrics["mean_abs_error"] == edit["baseline"]
    assert confirmed["switch_baseline"] == plain["baseline"]
    top3 = {r["tensor"] for r in plain["ranking"][:3]}
    head, rest = confirmed["ranking"][:3], confirmed["ranking"][3:]
    assert {r["tensor"] for r in head} == top3
    on_edit = {r["tensor"]: r for r in edit["ranking"]}
    on_switch = {r["tensor"]: r for r in plain["ranking"]}
    for r in head:
        assert r["measured_on"] == "int8"
        assert (r["metric"], r["gain"]) == (on_edit[r["tensor"]]["metric"], on_edit[r["tensor"]]["gain"])
        assert (r["switch_metric"], r["switch_gain"]) == (on_switch[r["tensor"]]["metric"],
                                                          on_switch[r["tensor"]]["gain"])
    assert [r["gain"] for r in head] == sorted((r["gain"] for r in head), reverse=True)
    assert [r["tensor"] for r in rest] == [r["tensor"] for r in plain["ranking"][3:]]
    assert all(r["measured_on"] == "switch" and r["gain"] == on_switch[r["tensor"]]["gain"] for r in rest)


def test_only_the_named_tensors_are_ranked(narrow):
    """analysis.tensors: the ranking holds exactly the named tensors' pairs (of the analysed kinds); a name that
    carries no such pair is an error naming it."""
    fp32, int8, _, feeds = narrow
    with Evaluator(fp32.path, EvalData.from_arrays(feeds), 64) as ev:
        everything = rank(fp32.path, int8, ev, "mean_abs_error", "min", kinds=("activation",))
        names = [r["tensor"] for r in everything["ranking"]]
        chosen = {names[0], names[-1]}
        some = rank(fp32.path, int8, ev, "mean_abs_error", "min", kinds=("activation",), only=chosen)
        with pytest.raises(CalibrunError, match=r"analysis.tensors: \['fc1.weight'\]"):
            rank(fp32.path, int8, ev, "mean_abs_error", "min", kinds=("activation",), only={"x", "fc1.weight"})
    assert len(names) > 2
    assert {r["tensor"] for r in some["ranking"]} == chosen
    assert some["tensors"] == 2
    gains = {r["tensor"]: r["gain"] for r in everything["ranking"]}
    for row in some["ranking"]:  # the same trial as in the full ranking
        assert row["gain"] == pytest.approx(gains[row["tensor"]], rel=1e-12)


def test_goal_max_ranks_by_sqnr(narrow):
    fp32, int8, _, feeds = narrow
    with Evaluator(fp32.path, EvalData.from_arrays(feeds), 64) as ev:
        result = rank(fp32.path, int8, ev, "out.y.sqnr_db", "max", "switch", kinds=("activation",))
    assert {r["kind"] for r in result["ranking"]} == {"activation"}
    assert result["ranking"][0]["tensor"] == "x"
    assert result["ranking"][0]["metric"] > result["baseline"]


def test_group_prepass_measures_alone_only_the_groups_that_help(narrow):
    fp32, int8, _, feeds = narrow
    with Evaluator(fp32.path, EvalData.from_arrays(feeds), 16) as ev:
        full = rank(fp32.path, int8, ev, "mean_abs_error", "min", "switch")
        coarse = rank(fp32.path, int8, ev, "mean_abs_error", "min", "switch", groups=3)
        with pytest.raises(CalibrunError, match="needs analysis.strategy=switch"):
            rank(fp32.path, int8, ev, "mean_abs_error", "min", "edit", groups=3)
    assert "groups" not in full
    assert full["trials"] == full["tensors"]
    assert [g["size"] for g in coarse["groups"]]
    assert sum(g["size"] for g in coarse["groups"]) == coarse["tensors"]
    helped = {g["group"] for g in coarse["groups"] if g["gain"] > 0}
    assert helped  # narrow calibration: taking the group with the input out helps
    exact = {r["tensor"]: r["metric"] for r in full["ranking"]}
    for entry in coarse["ranking"]:
        if entry["group"] in helped:  # measured alone: the same trial as the full ranking's
            assert entry["metric"] == exact[entry["tensor"]]
        else:
            assert entry["metric"] is None
            assert entry["gain"] is None
    assert coarse["measured_alone"] == sum(g["size"] for g in coarse["groups"] if g["group"] in helped)
    assert coarse["trials"] == coarse["measured_alone"] + 3
    assert coarse["ranking"][0]["tensor"] == "x"


def _serial_and_parallel(narrow, groups: int, backend: str) -> tuple[dict, dict]:
    fp32, int8, _, feeds = narrow
    task = Custom("tests.unit.test_analysis:two_output_task")
    with Evaluator(fp32.path, EvalData.from_arrays(feeds), 16, threads=1, task=task) as ev:
        serial = rank(fp32.path, int8, ev, "mean_abs_error", "min", "switch", threads=1, groups=groups)
        parallel = rank(fp32.path, int8, ev, "mean_abs_error", "min", "switch", threads=2, groups=groups,
                        workers=2, backend=backend)
    assert (serial["workers"], serial["backend"]) == (1, None)
    return serial, parallel


def _same_ranking(serial: dict, parallel: dict) -> None:
    assert parallel["tensors"] == serial["tensors"] > 2
    assert parallel["trials"] == serial["trials"]
    strip = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in strip} for r in parallel["ranking"]] == \
        [{k: v for k, v in r.items() if k not in strip} for r in serial["ranking"]]
    assert parallel["baseline"] == serial["baseline"]


@pytest.mark.parametrize("groups", [0, 3])
def test_trials_in_two_worker_processes_give_the_serial_ranking(narrow, groups):
    """analysis.workers=2: the same trials in two processes, each with its own session of the switch model (and a
    custom task pickled to them): every metric equal to the serial run's, to the last bit."""
    serial, parallel = _serial_and_parallel(narrow, groups, "auto")  # auto outside Ray: local processes
    assert (parallel["workers"], parallel["backend"]) == (2, "processes")
    _same_ranking(serial, parallel)


def test_group_prepass_that_finds_no_helping_group_measures_every_pair():
    from calibrun.analysis.sensitivity import _prepass

    taken_out = []

    def trial(members):  # a metric that no group improves (every group makes it worse)
        taken_out.append(sorted(members))
        return {"m": 1.0 + len(members)}

    def measure(sets):
        return [trial(members) for members in sets]

    chosen, group_of, gains, _ = _prepass(10, 3, measure, "m", "min", 1.0)
    assert taken_out == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]]
    assert gains == [-3.0, -4.0, -3.0]
    assert chosen == set(range(10))
    assert group_of == {i: 0 if i < 3 else 1 if i < 7 else 2 for i in range(10)}
    assert _prepass(10, 0, measure, "m", "min", 1.0)[0] == set(range(10))
    assert len(taken_out) == 3  # groups=0: no group trial


def test_fallback_list_reproduces_its_metric_with_quantize_static(narrow, tmp_path):
    fp32, int8, ranges, feeds = narrow
    data = lab_batches(fp32.lab_input(), 4242, 0.2, 8)
    with Evaluator(fp32.path, EvalData.from_arrays(feeds), 16) as ev, \
            calibrated(fp32.path, fp32.sha256, data, "x", CalibrationSpec(),
                       CalibrationCache(tmp_path / "cache")) as cal:
        assert cal.hit
        ranked = rank(fp32.path, int8, ev, "mean_abs_error", "min")
        target = ranked["baseline"] * 0.93
        done = fallback(fp32.path, cal, QuantOptions(), ranked["ranking"], ev.model, "mean_abs_error", "min", target,
                        tmp_path / "fallback.onnx")
        assert done["reached"]
        assert done["metric"] <= target < done["steps"][0]["metric"]
        assert 1 <= len(done["nodes_to_exclude"]) <= 2
        # pasted into quant.nodes_to_exclude: quantize_static from the same ranges gives the same model and metric
        again = tmp_path / "again.onnx"
        quantize(fp32.path, again, cal, QuantOptions(nodes_to_exclude=tuple(done["nodes_to_exclude"])))
        assert ev.model(again)["mean_abs_error"] == done["metric"]
    assert again.read_bytes() == (tmp_path / "fallback.onnx").read_bytes()
    # every step re-measured; pruning only removed what the target did not need
    assert [s["step"] for s in done["steps"]] == list(range(len(done["steps"])))


def test_fallback_from_the_jobs_model_quantises_each_model_once_with_the_same_result(narrow, tmp_path, monkeypatch):
    """`start` (the job's int8 model and its metrics) replaces step 0's quantisation; the final model is the kept
    trial's file: the record and the model are those of a fallback from scratch, with one quantisation a trial."""
    from calibrun.analysis import sensitivity

    fp32, int8, _, feeds = narrow
    data = lab_batches(fp32.lab_input(), 4242, 0.2, 8)
    quantised = []
    real = sensitivity.quantize
    monkeypatch.setattr(sensitivity, "quantize", lambda *a, **k: quantised.append(a[1]) or real(*a, **k))
    with Evaluator(fp32.path, EvalData.from_arrays(feeds), 16) as ev, \
            calibrated(fp32.path, fp32.sha256, data, "x", CalibrationSpec(),
                       CalibrationCache(tmp_path / "cache")) as cal:
        ranked = rank(fp32.path, int8, ev, "mean_abs_error", "min")
        args = (fp32.path, cal, QuantOptions(), ranked["ranking"], ev.model, "mean_abs_error", "min",
                ranked["baseline"] * 0.93)
        scratch = fallback(*args, tmp_path / "scratch.onnx")
        from_scratch = len(quantised)
        started = fallback(*args, tmp_path / "started.onnx", start=(int8, ev.model(int8)))
    assert started == scratch
    assert scratch["reached"]
    assert scratch["pruned"] == []
    assert len(scratch["steps"]) >= 2
    assert (tmp_path / "started.onnx").read_bytes() == (tmp_path / "scratch.onnx").read_bytes()
    trials = len(scratch["steps"]) + len(scratch["nodes_to_exclude"])  # the steps and one pruning try per node
    assert from_scratch == trials
    assert len(quantised) - from_scratch == trials - 1
    assert tmp_path / "scratch.onnx" not in quantised  # copied from its trial, not quantised again


def test_fallback_warns_when_the_analysed_kinds_cannot_reach_the_target(narrow, tmp_path):
    fp32, int8, _, feeds = narrow
    data = lab_batches(fp32.lab_input(), 4242, 0.2, 8)
    with Evaluator(fp32.path, EvalData.from_arrays(feeds), 16) as ev, \
            calibrated(fp32.path, fp32.sha256, data, "x", CalibrationSpec(),
                       CalibrationCache(tmp_path / "cache")) as cal:
        ranked = rank(fp32.path, int8, ev, "mean_abs_error", "min", kinds=("weight",))
        # narrow calibration clips activations: every weight in fp32 leaves most of the error
        assert ranked["all_pairs_removed"] > 0.5 * ranked["baseline"]
        # (a target no list reaches: excluding a weight's node also keeps that node's activations in fp32)
        done = fallback(fp32.path, cal, QuantOptions(), ranked["ranking"], ev.model, "mean_abs_error", "min", -1.0,
                        tmp_path / "fallback.onnx", best_possible=ranked["all_pairs_removed"])
    assert done["out_of_reach"]
    assert not done["reached"]
    assert done["metric"] >= 0
    assert len(done["steps"]) > 1  # a task metric need not be monotone: the greedy steps still ran
    kept = [s for s in done["steps"][1:] if s["kept"]]
    assert done["nodes_to_exclude"] == [n for s in kept for n in s["added"]]  # only steps that did not make it worse
    assert all(done["steps"][0]["metric"] >= s["metric"] for s in kept)


# ------------------------------------------------------------------------------------ config


@pytest.fixture
def hydra_ctx():
    calibrun_config.register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        yield


def test_analysis_defaults_and_group(hydra_ctx):
    cfg = compose(config_name="config")
    assert cfg.analysis.name == "none"
    calibrun_config.validate(cfg)
    cfg = compose(config_name="config", overrides=["analysis=sensitivity", "analysis.target=0.1"])
    assert cfg.analysis.name == "sensitivity"
    calibrun_config.validate(cfg)


@pytest.mark.parametrize(("overrides", "key"), [
    (["analysis=sensitivity", "analysis.goal=lowest"], "analysis.goal"),
    (["analysis=sensitivity", "format=qoperator"], "analysis.name"),
    (["analysis.target=0.1"], "analysis.target"),
    (["analysis=sensitivity", "analysis.kinds=[bias]"], "analysis.kinds"),
    (["analysis=sensitivity", "analysis.strategy=fast"], "analysis.strategy"),
    (["analysis=sensitivity", "analysis.groups=-1"], "analysis.groups"),
    (["analysis=sensitivity", "analysis.strategy=edit", "analysis.groups=10"], "analysis.groups"),
    (["analysis=sensitivity", "analysis.workers=0"], "analysis.workers"),
    (["analysis=sensitivity", "analysis.strategy=edit", "analysis.workers=2"], "analysis.workers"),
    (["task=custom", "task.fn=nomodule_xyz:f"], "task.fn"),
])
def test_bad_analysis_values_fail_naming_the_key(hydra_ctx, overrides, key):
    cfg = compose(config_name="config", overrides=overrides)
    with pytest.raises(CalibrunError, match=key.replace(".", r"\.")):
        calibrun_config.validate(cfg)


def test_search_preset_composes(hydra_ctx):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="the `search` extra")
    cfg = compose(config_name="config", overrides=["experiment=search"], return_hydra_config=True)
    assert cfg.analysis.objective is True
    assert cfg.hydra.sweeper.direction == "minimize"
    assert set(cfg.hydra.sweeper.params) == {"method", "method.percentile", "quant.per_channel", "method.symmetric",
                                             "batches"}


def test_fallback_prunes_the_steps_that_left_the_metric_as_it_was_in_one_trial(tmp_path, monkeypatch):
    """The prune tries the nodes of every neutral step (kept because they did no harm) together first, then each
    node left on its own: the same minimal list as node by node, with fewer trials. A mocked quantiser and metric
    (a pure unit: the metric is 1 per needed node in fp32)."""
    from calibrun.analysis import sensitivity

    needed = {"a", "d"}
    trials = []

    def quantize(fp32_path, path, calibration, options):
        trials.append(tuple(options.nodes_to_exclude))
        path.write_text(",".join(options.nodes_to_exclude))

    def measure(path):
        return {"m": float(len(needed & set(path.read_text().split(","))))}

    monkeypatch.setattr(sensitivity, "quantize", quantize)
    ranking = [{"tensor": t, "nodes": [t]} for t in ("a", "b", "c", "d", "e")]  # b, c: neutral; e after the target
    done = fallback(tmp_path / "fp32.onnx", None, QuantOptions(), ranking, measure, "m", "max", 2.0,
                    tmp_path / "out.onnx")
    assert done["reached"]
    assert done["nodes_to_exclude"] == ["a", "d"]
    assert [s["metric"] for s in done["steps"]] == [0.0, 1.0, 1.0, 1.0, 2.0]
    assert done["pruned"] == ["b", "c"]
    assert trials[5] == ("a", "d")  # after 5 steps: b and c out in one trial
    assert trials[6:] == [("a",), ("d",)]  # then each node left on its own (both needed)
    assert (tmp_path / "out.onnx").read_text() == "a,d"


class _FakeRay:
    """Ray's `wait` and `cluster_resources` as _Actors reads them: each actor's ready ref answers after the
    seconds given (None: never, Ray cannot place it)."""

    def __init__(self, cpus: float, starts: list[float | None]):
        self.cpus, self.starts, self.waited = cpus, starts, []

    def cluster_resources(self):
        return {"CPU": self.cpus}

    def wait(self, refs, num_returns, timeout):
        self.waited.append(timeout)
        placeable = sorted((r for r in refs if self.starts[r] is not None and self.starts[r] <= timeout),
                           key=lambda r: self.starts[r])
        done = placeable[:num_returns]
        return done, [r for r in refs if r not in done]


@pytest.mark.parametrize(("cpus", "per", "starts", "ready", "why"), [
    (2, 1, [0.1, 0.2, None], 2, "Ray's 2 CPUs cannot hold another of 1 CPUs"),  # not waited for: no CPU left
    (4, 2, [0.1, None, None], 1, "Ray had no free CPU for the others within 60 s"),  # CPUs held by others
    (1, 2, [None, None], 0, "Ray's 1 CPUs cannot hold another of 2 CPUs"),  # larger than the cluster
    (4, 1, [0.3, 0.1, 0.2], 3, ""),
])
def test_ray_actors_are_waited_for_only_while_the_cluster_can_place_them(cpus, per, starts, ready, why):
    from calibrun.analysis.trials import READY_SECONDS, _Actors

    actors = _Actors.__new__(_Actors)  # no Ray: the waiting rule alone
    actors.ray, actors.per = _FakeRay(cpus, starts), per
    actors.waiting = {i: f"actor {i}" for i in range(len(starts))}
    got, late, reason = actors._wait()
    assert (len(got), len(late), reason) == (ready, len(starts) - ready, why)
    assert all(0 < t <= READY_SECONDS for t in actors.ray.waited)
