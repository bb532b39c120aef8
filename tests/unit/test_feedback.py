"""A recurrent state fed back in the evaluation (`eval_data.inputs.<name>.from_output`, calibrun.measure.feedback):
the rows run in order, each model feeding its state input its own output of the previous row, in the job's
evaluation, in the analysis' stored batches, and in an analysis Evaluator of its own alike."""

from __future__ import annotations

import numpy as np
import pytest

from calibrun.analysis.evaluate import Evaluator
from calibrun.core.errors import CalibrunError
from calibrun.data import calibration_data, evaluation_data
from calibrun.measure import feedback, verdict
from calibrun.measure.errors import evaluate
from calibrun.model import open_float_model
from calibrun.model.sessions import session
from calibrun.quant.quantize import quantize_with
from tests.modelzoo import save, stateful_model

ROWS = 40
STATE = {"state": {"from_output": "stateN"}, "sr": {"value": 16000}}


def npy(path, inputs=None) -> dict:
    return {"name": "npy", "path": str(path), "inputs": inputs or {}}


@pytest.fixture
def stream(tmp_path):
    """The stateful model, rows of one stream in order (`input` [40, 8]; `state` [2, 40, 4], each row the state
    the fp32 model carried into it from zeros) and an int8 model calibrated on them."""
    fp32 = open_float_model(save(stateful_model(), tmp_path / "m.onnx"))
    rng = np.random.default_rng(3)
    x = rng.normal(0, 2, size=(ROWS, 8)).astype(np.float32)
    sess, state, states = session(fp32.path), np.zeros((2, 1, 4), np.float32), []
    for row in x:
        states.append(state)
        state = sess.run(None, {"input": row[None], "state": state, "sr": np.array(16000)})[1]
    data = tmp_path / "d.npz"
    np.savez(data, input=x, state=np.concatenate(states, axis=1))
    int8 = tmp_path / "int8.onnx"
    quantize_with(fp32, int8, calibration_data(npy(data, {"sr": {"value": 16000}}), fp32, 0, 1.0, 3))
    return fp32, data, int8


def _closed_loop(path, x, first_state) -> tuple[np.ndarray, np.ndarray]:
    """The model streamed by hand: each row fed the state its own previous row gave."""
    sess, state, outs, states = session(path), first_state, [], []
    for row in x:
        out, state = sess.run(None, {"input": row[None], "state": state, "sr": np.array(16000)})
        outs.append(out)
        states.append(state)
    return np.concatenate(outs), np.concatenate(states, axis=1)


def _sqnr(ref, got) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - got) ** 2)))


def test_the_evaluation_streams_each_model_on_its_own_state(stream):
    fp32, data, int8 = stream
    arrays = np.load(data)
    ref, ref_state = _closed_loop(fp32.path, arrays["input"], arrays["state"][:, :1])
    got, got_state = _closed_loop(int8, arrays["input"], arrays["state"][:, :1])
    evaluation = evaluation_data(npy(data, STATE), fp32, 0, ROWS)
    assert evaluation.state == {"state": "stateN"}
    used: dict = {}
    fed = evaluate(fp32.path, int8, evaluation, progress=None, batch_size=16, used=used)
    assert used["eval_rows_per_run"] == 1
    assert fed["out.output.sqnr_db"] == pytest.approx(_sqnr(ref, got), rel=1e-5)
    assert fed["out.stateN.sqnr_db"] == pytest.approx(_sqnr(ref_state, got_state), rel=1e-5)
    # fed the recorded (fp32) state instead, the int8 model's own state error never reaches a later row
    forced = evaluate(fp32.path, int8, evaluation_data(npy(data, {"sr": {"value": 16000}}), fp32, 0, ROWS),
                      progress=None, batch_size=16)
    assert forced["out.output.sqnr_db"] != pytest.approx(fed["out.output.sqnr_db"], rel=1e-3)


def test_the_analysis_measures_every_candidate_on_its_own_state(stream):
    """The stored batches of the job's evaluation (`kept`) and an Evaluator's own fp32 pass give the int8 model the
    metrics the job's evaluation gave it: each candidate streams its own state from the first row's."""
    fp32, data, int8 = stream
    evaluation = evaluation_data(npy(data, STATE), fp32, 0, ROWS)
    kept = Evaluator.kept(fp32.path, state=evaluation.state)
    with kept:
        job = evaluate(fp32.path, int8, evaluation, progress=None, batch_size=16, keep=kept)
        assert kept.count == ROWS  # a run per row
        from_kept = kept.model(int8)
    with Evaluator(fp32.path, evaluation, 16) as own:
        from_own = own.model(int8)
        assert own.batches.state == {"state": "stateN"}
    for metrics in (from_kept, from_own):
        for key in ("out.output.sqnr_db", "out.stateN.sqnr_db", "max_abs_error"):
            assert metrics[key] == pytest.approx(job[key], rel=1e-6), key


def test_only_the_evaluation_feeds_a_state_back(stream):
    fp32, data, _ = stream
    with pytest.raises(CalibrunError, match=r"^config data\.inputs\.state\.from_output: is read by the evaluation "
                                            r"only \(eval_data\.inputs\.state\.from_output\)"):
        calibration_data(npy(data, STATE), fp32, 0, 1.0, 3)


@pytest.mark.parametrize(("inputs", "message"), [
    ({"state": {"from_output": "stateM"}}, r"'stateM' is not an output of the model \(outputs: output, stateN\)"),
    ({"sr": {"value": 16000, "from_output": "output"}}, r"output 'output' is FLOAT, input 'sr' \(INT64 \[\]\) takes "
                                                         r"INT64"),
    ({"input": {"from_output": "output"}}, r"output 'output' \[\?, 3\] does not fit input 'input' \(FLOAT \[N, 8\]\)"),
])
def test_a_state_the_model_cannot_take_back_is_one_line(stream, inputs, message):
    fp32, data, _ = stream
    with pytest.raises(CalibrunError, match=message):
        evaluation_data(npy(data, {"sr": {"value": 16000}, **inputs}), fp32, 0, ROWS)


def test_a_state_whose_row_does_not_fit_or_a_batch_pinned_past_one_row_is_refused():
    carried = feedback.Carried({"state": 1}, ["out", "stateN"])
    feeds = {"x": np.zeros((1, 2), np.float32), "state": np.zeros((2, 1, 4), np.float32)}
    assert carried.feeds(feeds)["state"] is feeds["state"]  # the first row: the data's state
    carried.took([np.zeros(1), np.ones((2, 1, 3), np.float32)])
    with pytest.raises(CalibrunError, match=r"output 'stateN' gives float32 \[2, 1, 3\] on a row, input 'state' "
                                            r"takes float32 \[2, 1, 4\]"):
        carried.feeds(feeds)
    carried.took([np.zeros(1), np.full((2, 1, 4), 7, np.float32)])
    assert (carried.feeds(feeds)["state"] == 7).all()
    assert feedback.rows_per_run({"state": "stateN"}, None) == feedback.rows_per_run({"state": "stateN"}, 1) == 1
    with pytest.raises(CalibrunError, match="pins its batch at 4 rows"):
        feedback.rows_per_run({"state": "stateN"}, 4)


def test_the_verdict_says_the_rows_ran_in_order_and_where_a_broken_state_went():
    metrics = {"task.dice": 0.97, "out.mask.sqnr_db": 30.0, "out.state.sqnr_db": 2.0}
    assert "(235 evaluation rows, in order, each model feeding back its own state)" in \
        verdict.decide(metrics, rows=235, streamed=("state",))["because"]
    assert "(235 evaluation rows)" in verdict.decide(metrics, rows=235)["because"]
    key, value = verdict.unread_output(metrics, "mask")
    told = verdict.unread_note(key, value, fed_back={"state_in": "state"})
    assert "fed back as input 'state_in' on every next row, so that error is in the task's metric" in told
    untold = verdict.unread_note(key, value, look_alike={"state": "state_in"})
    assert "if the model takes it back as input 'state_in' on its next call" in untold
    assert "eval_data.inputs.state_in.from_output=state measures that" in untold
    # no input looks like its state (CenterFace's centre offsets beside its heatmap): no word of a state
    plain = verdict.unread_note(key, value)
    assert plain == "; output 'state', which the task's metric does not read, is at 2.0 dB SQNR"


def test_an_input_with_an_outputs_type_and_shape_is_hinted_as_a_state_and_the_primary_input_never():
    import onnx
    from onnx import TensorProto, helper

    from calibrun.model import graph_inputs

    model = stateful_model()
    assert feedback.look_alike(list(graph_inputs(model)), model.graph.output) == [("state", "stateN")]
    # a denoiser's output has its input's shape: the primary input is never a state; nor is an integer input
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["ids"], ["ids_out"]),
         helper.make_node("Identity", ["h"], ["h_next"]), helper.make_node("Identity", ["h"], ["hn"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 8]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, "N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8]),
         helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["N", 8]),
         helper.make_tensor_value_info("h_next", TensorProto.FLOAT, [2, "N", 3]),
         helper.make_tensor_value_info("hn", TensorProto.FLOAT, [None, "N", 4])])
    model = helper.make_model(graph)
    onnx.checker.check_model(model)
    assert feedback.look_alike(list(graph_inputs(model)), model.graph.output) == [("h", "hn")]
    # Robust Video Matting: four states whose every axis is free fit each 4-D output; the names pair them (r1i ->
    # r1o), not the outputs' order (r1i had been paired with the foreground colour `fgr`, r2i with the alpha)
    free, frame = ["N", "C", "H", "W"], ["N", 3, "H", "W"]
    names = ["fgr", "pha", "r1o", "r2o"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["src"], ["fgr"]), helper.make_node("ReduceMean", ["src"], ["pha"], axes=[1]),
         helper.make_node("Identity", ["r1i"], ["r1o"]), helper.make_node("Identity", ["r2i"], ["r2o"])], "rvm",
        [helper.make_tensor_value_info("src", TensorProto.FLOAT, frame),
         *(helper.make_tensor_value_info(n, TensorProto.FLOAT, free) for n in ("r1i", "r2i"))],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", c, "H", "W"])
         for n, c in zip(names, (3, 1, 16, 20), strict=True)])
    model = helper.make_model(graph)
    assert feedback.look_alike(list(graph_inputs(model)), model.graph.output) == [("r1i", "r1o"), ("r2i", "r2o")]
    # DeepFilterNet 3 streamed a frame a call: its states' outputs are `new_<state>`, which share no start with the
    # state; the audio frame out has a state's shape too. Each state pairs with its own new value, not the frame
    # (by the start alone: analysis_mem -> the frame, synthesis_mem -> new_analysis_mem)
    states = ["analysis_mem", "synthesis_mem", "erb_norm_state"]
    outs = ["enhanced_audio_frame", *(f"new_{n}" for n in states)]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input_frame"], ["enhanced_audio_frame"]),
         *(helper.make_node("Identity", [n], [f"new_{n}"]) for n in states)], "dfn",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [512 if n != "erb_norm_state" else 32])
         for n in ("input_frame", *states)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [512 if n != "new_erb_norm_state" else 32]) for n in outs])
    model = helper.make_model(graph)
    assert feedback.look_alike(list(graph_inputs(model)), model.graph.output) == \
        [(n, f"new_{n}") for n in states]


def test_a_state_fed_back_is_read_through_the_outputs_it_feeds_not_twice():
    metrics = {"out.y.sqnr_db": 25.0, "out.y.rows_under_20db": 0.0, "out.state.sqnr_db": 2.0,
               "out.state.concat0.sqnr_db": 0.5, "out.state.concat1.sqnr_db": 9.0, "out.state.rows_under_20db": 1.0}
    alone = verdict.decide(metrics, rows=100)
    assert (alone["status"], alone["metric"]) == ("broken", "out.state.concat0.sqnr_db")
    streamed = verdict.decide(metrics, rows=100, streamed=("state",))
    assert (streamed["status"], streamed["metric"], streamed["value"]) == ("ok", "out.y.sqnr_db", 25.0)
    assert streamed["because"].endswith("; the state fed back (output 'state' (the part its Concat's input 0 fills) "
                                        "at 0.5 dB on its own) is read through the outputs it feeds on every later row")
    rule = verdict.rule_for(metrics, streamed=("state",))
    # a candidate's metrics: the rule re-finds its worst output among the outputs it reads
    assert rule.value({**metrics, "out.y.sqnr_db": 12.0}) == 12.0
    assert rule.status(22.0, {**metrics, "out.y.rows_under_20db": 0.5}) == "degraded"  # the rows' share of y only
    only_state = {k: v for k, v in metrics.items() if k.startswith("out.state")}
    assert verdict.decide(only_state, streamed=("state",))["metric"] == "out.state.concat0.sqnr_db"  # nothing else


def test_a_constant_state_is_the_first_rows_and_every_later_row_takes_the_models_own(stream, tmp_path):
    """Only the inputs in the files (`input`); the state a config value (zeros, one row [2, 4]): the stream starts
    from it, as a package starts from its zero state."""
    fp32, data, int8 = stream
    x = np.load(data)["input"]
    only_x = tmp_path / "x.npz"
    np.savez(only_x, input=x)
    zeros = np.zeros((2, 1, 4), np.float32)
    ref, _ = _closed_loop(fp32.path, x, zeros)
    got, _ = _closed_loop(int8, x, zeros)
    inputs = {"state": {"from_output": "stateN", "value": [[0.0] * 4] * 2}, "sr": {"value": 16000}}
    fed = evaluate(fp32.path, int8, evaluation_data(npy(only_x, inputs), fp32, 0, ROWS), progress=None)
    assert fed["out.output.sqnr_db"] == pytest.approx(_sqnr(ref, got), rel=1e-5)


def test_the_per_call_view_measures_the_stored_runs_each_fed_the_recorded_state(stream):
    """Evaluator.per_call (what the sensitivity ranking measures with a state fed back): the same stored runs, each row
    fed the state fp32 carried, as an evaluation without the state fed back; the evaluator itself still streams."""
    fp32, data, int8 = stream
    recorded = npy(data, {"sr": {"value": 16000}})
    with Evaluator(fp32.path, evaluation_data(npy(data, STATE), fp32, 0, ROWS), 16) as fed, \
            Evaluator(fp32.path, evaluation_data(recorded, fp32, 0, ROWS), 16) as plain:
        view = fed.per_call()
        assert view.batches.state == {}
        assert fed.batches.state == {"state": "stateN"}
        per_call, streamed, forced = view.model(int8), fed.model(int8), plain.model(int8)
    assert per_call["out.output.sqnr_db"] == pytest.approx(forced["out.output.sqnr_db"], rel=1e-6)
    assert per_call["out.output.sqnr_db"] != pytest.approx(streamed["out.output.sqnr_db"], rel=1e-3)
