"""Feeding any input the model declares (calibrun.data.inputs, calibrun.data.rows): declared types, batch axes,
constants, and rows split along the batch axis wherever they are split (calibration runs, evaluation, memory)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto

from calibrun.__main__ import normalise
from calibrun.config import is_setting
from calibrun.core import memory
from calibrun.core.errors import CalibrunError
from calibrun.data import calibration_data, evaluation_data
from calibrun.data.rows import infer_axis, pinned_rows, take
from calibrun.measure.errors import evaluate
from calibrun.model import InputInfo, open_float_model
from calibrun.quant.quantize import quantize_with
from tests.modelzoo import save, stateful_model, typed_inputs_model

ROWS = 40


def npy(path, inputs=None) -> dict:
    return {"name": "npy", "path": str(path), "inputs": inputs or {}}


@pytest.fixture
def stateful(tmp_path):
    """The stateful model and an .npz of 40 rows: `input` [40, 8], `state` [2, 40, 4], `sr` a 0-d int64."""
    fp32 = open_float_model(save(stateful_model(), tmp_path / "m.onnx"))
    rng = np.random.default_rng(0)
    data = tmp_path / "d.npz"
    np.savez(data, input=rng.normal(size=(ROWS, 8)).astype(np.float32),
             state=rng.normal(size=(2, ROWS, 4)).astype(np.float32), sr=np.array(16000))
    return fp32, data


# ---------------------------------------------------------------------------------------------- batch axes


@pytest.mark.parametrize(("shape", "axis"), [
    (("N", 8), 0), ((2, "N", 128), 1), ((2, -1, 4), 1), ((1, 3, 224, 224), 0), (("N", 3, "H", "W"), 0), ((), None),
])
def test_the_batch_axis_is_the_one_free_axis_else_0(shape, axis):
    assert infer_axis(shape) == axis


def test_the_state_rows_are_on_axis_1_and_the_scalar_is_fed_with_every_batch(stateful):
    fp32, path = stateful
    data = calibration_data(npy(path), fp32, 0, 1.0, 3)
    assert data.axes == {"input": 0, "state": 1, "sr": None}
    feeds = list(data)
    assert [f["state"].shape for f in feeds] == [(2, 16, 4), (2, 16, 4), (2, 8, 4)]
    assert all(f["sr"].dtype == np.int64 and f["sr"].shape == () and int(f["sr"]) == 16000 for f in feeds)
    original = np.load(path)["state"]
    np.testing.assert_array_equal(np.concatenate([f["state"] for f in feeds], axis=1), original)


def test_batch_axis_and_constants_enter_the_identity(stateful, tmp_path):
    fp32, path = stateful
    base = calibration_data(npy(path), fp32, 0, 1.0, 2).identity()
    entries = {e["name"]: e for e in base["inputs"]}
    assert entries["state"]["batch_axis"] == 1
    assert entries["sr"]["constant"]["value"] == 16000
    assert "batch_axis" not in entries["input"]
    assert "dtype" not in entries["input"]
    other = calibration_data(npy(path, {"sr": {"value": 8000}}), fp32, 0, 1.0, 2).identity()
    assert other != base
    assert {e["name"]: e for e in other["inputs"]}["sr"]["constant"]["value"] == 8000


def test_a_set_batch_axis_counts_rows_along_it(tmp_path):
    fp32 = open_float_model(save(stateful_model(), tmp_path / "m.onnx"))
    np.savez(tmp_path / "d.npz", input=np.ones((4, 8), np.float32), state=np.ones((2, 4, 4), np.float32))
    data = calibration_data(npy(tmp_path / "d.npz", {"sr": {"value": 16000}, "state": {"batch_axis": -2}}),
                            fp32, 0, 1.0, 1)
    assert data.axes["state"] == 1
    assert data.rows == 4
    with pytest.raises(CalibrunError, match=re.escape("config data.inputs.state.batch_axis: must be an axis of "
                                                      "input 'state' (FLOAT [2, N, 4]) (0..2, or -3..-1 from the "
                                                      "end), got 3")):
        calibration_data(npy(tmp_path / "d.npz", {"sr": {"value": 1}, "state": {"batch_axis": 3}}), fp32, 0, 1.0, 1)


def test_a_row_without_the_batch_axis_is_repeated_to_every_batch(tmp_path):
    fp32 = open_float_model(save(stateful_model(), tmp_path / "m.onnx"))
    row = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.savez(tmp_path / "d.npz", input=np.ones((20, 8), np.float32), state=row, sr=np.array(16000))
    feeds = list(calibration_data(npy(tmp_path / "d.npz"), fp32, 0, 1.0, 2))
    assert [f["state"].shape for f in feeds] == [(2, 16, 4), (2, 4, 4)]
    np.testing.assert_array_equal(feeds[1]["state"][:, 3], row)


def test_pinned_rows_are_read_on_the_batch_axis():
    assert pinned_rows({"input": (4, 8), "state": (2, 4, 128)}, {"input": 0, "state": 1}) == 4
    with pytest.raises(CalibrunError, match="different batch sizes"):
        pinned_rows({"input": (4, 8), "state": (2, 5, 128)}, {"input": 0, "state": 1})
    feeds = {"state": np.zeros((2, 6, 3)), "sr": np.array(1)}
    assert take(feeds, {"state": 1, "sr": None}, 2, 5)["state"].shape == (2, 3, 3)


# ---------------------------------------------------------------------------------------------- constants


def test_a_config_value_feeds_a_scalar_and_wins_over_the_file(stateful):
    fp32, path = stateful
    evaluation = evaluation_data(npy(path, {"sr": {"value": 8000}}), fp32, 0, ROWS)
    feeds, _ = next(evaluation.batches(16))
    assert feeds["sr"].dtype == np.int64
    assert int(feeds["sr"]) == 8000
    assert list(feeds) == ["input", "state", "sr"]  # the model's input order


def test_a_scalar_input_without_a_value_is_one_line_naming_it(tmp_path):
    fp32 = open_float_model(save(stateful_model(), tmp_path / "m.onnx"))
    np.savez(tmp_path / "d.npz", input=np.ones((4, 8), np.float32), state=np.ones((2, 4, 4), np.float32))
    with pytest.raises(CalibrunError, match=re.escape("no array for input 'sr' (INT64 []) (keys: input, state); "
                                                      "or set data.inputs.sr.value=...")):
        calibration_data(npy(tmp_path / "d.npz"), fp32, 0, 1.0, 1)
    # the evaluation file: its hints name eval_data's keys (a probe was told to set data.inputs.sr for its eval file)
    with pytest.raises(CalibrunError, match=re.escape("or set eval_data.inputs.sr.value=...")):
        evaluation_data(npy(tmp_path / "d.npz"), fp32, 0, 4)
    np.savez(tmp_path / "rows0.npz", input=np.ones((4, 8), np.float32), state=np.ones((4, 2, 4), np.float32),
             sr=np.array(16000))
    with pytest.raises(CalibrunError, match=re.escape("set eval_data.inputs.state.batch_axis=0 (and the same under "
                                                      "data.)")):
        evaluation_data(npy(tmp_path / "rows0.npz"), fp32, 0, 4)


def test_unknown_input_names_are_listed_with_the_real_ones(stateful):
    fp32, path = stateful
    with pytest.raises(CalibrunError, match=re.escape("config eval_data.inputs: 'rate' is not an input of the model "
                                                      "(inputs: input, state, sr)")):
        evaluation_data(npy(path, {"rate": {"value": 1}}), fp32, 0, ROWS)


def test_a_float_value_for_an_int_input_is_taken_when_whole_and_refused_else(stateful):
    fp32, path = stateful
    with pytest.raises(CalibrunError, match=re.escape("input 'sr' (INT64 []): config data.inputs.sr.value holds "
                                                      "float64 data that is not whole numbers (16000.5 in row 0), "
                                                      "which does not cast to int64 without loss")):
        calibration_data(npy(path, {"sr": {"value": 16000.5}}), fp32, 0, 1.0, 1)
    feeds = next(iter(calibration_data(npy(path, {"sr": {"value": 16000.0}}), fp32, 0, 1.0, 1)))
    assert feeds["sr"].dtype == np.int64  # a probe's 16000.0 had been refused
    assert int(feeds["sr"]) == 16000
    with pytest.raises(CalibrunError, match=re.escape("input 'sr' (INT64 []): config data.inputs.sr.value is "
                                                      "99999999999999999999, which no numeric type holds")):
        calibration_data(npy(path, {"sr": {"value": 99999999999999999999}}), fp32, 0, 1.0, 1)


# ---------------------------------------------------------------------------------------------- dtypes


@pytest.fixture
def typed(tmp_path):
    return open_float_model(save(typed_inputs_model(), tmp_path / "t.onnx"))


def typed_data(path, **change):
    rng = np.random.default_rng(1)
    arrays = {"a": rng.normal(size=(20, 4)).astype(np.float32), "x": rng.normal(size=(20, 4)),
              "mask": rng.random((20, 4)) > 0.5, "offset": np.arange(20, dtype=np.int64).reshape(20, 1)}
    arrays.update(change)
    np.savez(path, **arrays)
    return path


def test_each_input_is_fed_its_declared_type_and_only_floats_are_scaled(typed, tmp_path):
    path = typed_data(tmp_path / "d.npz")
    (feed, _) = list(calibration_data(npy(path), typed, 0, 2.0, 2))
    assert {k: v.dtype for k, v in feed.items()} == {"a": np.float32, "x": np.float16, "mask": np.bool_,
                                                     "offset": np.int32}
    raw = np.load(path)
    np.testing.assert_array_equal(feed["x"], (raw["x"][:16] * 2.0).astype(np.float16))  # the factor: floats only
    np.testing.assert_array_equal(feed["offset"][:, 0], np.arange(16))
    np.testing.assert_array_equal(feed["mask"], raw["mask"][:16])
    identity = calibration_data(npy(path), typed, 0, 2.0, 2).identity()
    assert {e["name"]: e.get("dtype") for e in identity["inputs"]} == {"a": None, "x": "float16", "mask": "bool",
                                                                      "offset": "int32"}


def test_a_bool_array_feeds_an_integer_input_as_0_and_1(typed, tmp_path):
    """bool casts to any integer type without loss: a probe's bool attention mask into an int64 input had been
    refused."""
    path = typed_data(tmp_path / "b.npz", offset=(np.arange(20) % 2 == 0).reshape(20, 1))
    (feed, _) = list(calibration_data(npy(path), typed, 0, 1.0, 2))
    np.testing.assert_array_equal(feed["offset"][:, 0], np.arange(16) % 2 == 0)
    assert feed["offset"].dtype == np.int32


@pytest.mark.parametrize(("change", "message"), [
    ({"offset": np.zeros((20, 1), np.float32)},
     "input 'offset' (INT32 [N, 1]): {path}['offset'] holds float32 data, which does not cast to int32 without loss"),
    ({"offset": np.full((20, 1), 2**40, np.int64)},
     "input 'offset' (INT32 [N, 1]): {path}['offset'] holds values 1099511627776..1099511627776, outside int32's "
     "range"),
    ({"mask": np.ones((20, 4), np.int64)},
     "input 'mask' (BOOL [N, 4]): {path}['mask'] holds int64 data, which does not cast to bool without loss (if it "
     "holds only 0 and 1, save it as bool: int64_array.astype(bool))"),
    ({"x": np.full((20, 4), 1e6)}, "{path}['x']: row 0 overflows float16"),
    ({"offset": np.zeros((20, 2), np.int64)},
     "input 'offset' (INT32 [N, 1]): {path}['offset'] has shape [20, 2]: axis 1 is 2, the model wants 1"),
])
def test_data_that_cannot_be_fed_is_one_line_naming_input_type_shape_and_file(typed, tmp_path, change, message):
    path = typed_data(tmp_path / "d.npz", **change)
    with pytest.raises(CalibrunError) as err:
        list(calibration_data(npy(path), typed, 0, 1.0, 2))
    assert message.format(path=path) in str(err.value)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------- runs split rows


def test_evaluation_runs_split_the_state_along_its_batch_axis(stateful, tmp_path):
    fp32, path = stateful
    int8 = tmp_path / "int8.onnx"
    calibration = calibration_data(npy(path), fp32, 0, 1.0, 2)
    used: dict = {}
    quantize_with(fp32, int8, calibration, budget=1, used=used)  # 1 byte: one row per calibration run
    assert used["calibration_rows_per_run"] == 1
    whole = tmp_path / "whole.onnx"
    quantize_with(fp32, whole, calibration_data(npy(path), fp32, 0, 1.0, 2))
    assert int8.read_bytes() == whole.read_bytes()  # minima and maxima merged over the runs: the same ranges
    evaluation = evaluation_data(npy(path), fp32, 0, ROWS)
    split: dict = {}
    one = evaluate(fp32.path, int8, evaluation, progress=None, budget=1, used=split)
    full = evaluate(fp32.path, int8, evaluation, progress=None)
    assert split["eval_rows_per_run"] == 1
    assert one["rows"] == ROWS
    assert one["out.stateN.max_abs_error"] == pytest.approx(full["out.stateN.max_abs_error"], rel=1e-6)
    assert one["out.output.sqnr_db"] == pytest.approx(full["out.output.sqnr_db"], rel=1e-6)


def test_diagnostics_split_the_state_along_its_batch_axis(stateful, tmp_path):
    from calibrun.measure.tensor_stats import StreamingDiagnostics

    fp32, path = stateful
    int8, ranges = tmp_path / "int8.onnx", tmp_path / "ranges.json"
    quantize_with(fp32, int8, calibration_data(npy(path), fp32, 0, 1.0, 2), ranges_copy=ranges)
    evaluation = evaluation_data(npy(path), fp32, 0, ROWS)
    found = {}
    for budget in (None, 1):  # 1 byte: one group per tensor, one row per run
        with StreamingDiagnostics(fp32.path, int8, ranges, max_rows=8, budget=budget, axes=evaluation.axes) as diag:
            for feeds, _ in evaluation.batches(16):
                diag.update(feeds)
            found[budget] = {row["tensor"]: row["sqnr_db"] for row in diag.rows()}
            assert diag.rows_seen == 8
    assert len(diag.groups) > 1
    assert diag.rows_per_run == 1
    assert found[1] == pytest.approx(found[None], rel=1e-6)
    assert "s0" in found[1]  # the state's first slice: its rows came from axis 1


def test_memory_sizes_one_row_on_the_batch_axis(tmp_path):
    model = stateful_model()
    feeds = {"input": np.zeros((16, 8), np.float32), "state": np.zeros((2, 16, 4), np.float32),
             "sr": np.array(16000)}
    sizes = memory.row_bytes(model, feeds, {"input": 0, "state": 1, "sr": None})
    assert sizes["state"] == 2 * 1 * 4 * 4
    assert sizes["stateN"] == 2 * 4 * 4
    assert sizes["h"] == 4 * 4


# ---------------------------------------------------------------------------------------------- config keys


def test_input_keys_are_settings_and_set_whether_a_yaml_set_them_or_not():
    assert is_setting("data.inputs.sr.value")
    assert is_setting("eval_data.inputs.state.batch_axis")
    assert not is_setting("data.inputs.sr.bogus")
    assert normalise(["data.inputs.sr.value=16000", "+eval_data.inputs.state.batch_axis=1", "batches=2"]) == [
        "++data.inputs.sr.value=16000", "++eval_data.inputs.state.batch_axis=1", "batches=2"]


def test_the_lab_rule_takes_no_inputs(tmp_path):
    fp32 = open_float_model(save(stateful_model(), tmp_path / "m.onnx"))
    with pytest.raises(CalibrunError, match="lab data rule feeds one float input"):
        calibration_data({"name": "lab", "inputs": {"sr": {"value": 1}}}, fp32, 0, 1.0, 1)


def test_an_unfeedable_input_type_is_named():
    from calibrun.data.inputs import input_dtype

    with pytest.raises(CalibrunError, match=re.escape("input 's' (STRING [N]): calibrun feeds numeric and bool")):
        input_dtype(InputInfo("s", TensorProto.STRING, ("N",)))


def test_a_model_with_float16_bool_and_int_inputs_quantises_and_evaluates(typed, tmp_path):
    path = typed_data(tmp_path / "d.npz")
    int8 = tmp_path / "int8.onnx"
    quantize_with(typed, int8, calibration_data(npy(path), typed, 0, 1.0, 2))
    metrics = evaluate(typed.path, int8, evaluation_data(npy(path), typed, 0, 20), progress=None)
    assert metrics["rows"] == 20
    assert 0 < metrics["out.y.relative_error"] < 0.05
    assert metrics["eval_min"] == pytest.approx(float(np.load(path)["a"].min()))  # the primary input: `a`, float32


# ------------------------------------------------------------------------------- a model exported for one row


def _one_row_model(path, broken=False):
    """x [N, 4] -> Reshape to [1, 4] (a batch traced into a shape constant) -> MatMul -> y [1, 3]; `broken`: the
    Reshape's shape is [1, 5], which no row fits."""
    from onnx import helper, numpy_helper

    shape = numpy_helper.from_array(np.array([1, 5 if broken else 4], np.int64), "shape")
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "w")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [shape, weight])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_model_that_runs_one_row_and_fails_on_two_is_told_apart(tmp_path):
    from calibrun.model.one_row import fails_on_two_rows

    feeds = {"x": np.ones((3, 4), np.float32)}
    error = fails_on_two_rows(_one_row_model(tmp_path / "one.onnx"), feeds, {"x": 0})
    assert error is not None
    assert "Reshape" in error
    assert "\n" not in error
    # one row fails too: broken for another reason; a model that takes two rows; fewer than two rows: None
    assert fails_on_two_rows(_one_row_model(tmp_path / "bad.onnx", broken=True), feeds, {"x": 0}) is None
    assert fails_on_two_rows(save(stateful_model(), tmp_path / "s.onnx"), {
        "input": np.ones((3, 8), np.float32), "state": np.ones((2, 3, 4), np.float32),
        "sr": np.array(16000, np.int64)}, {"input": 0, "state": 1, "sr": None}) is None
    assert fails_on_two_rows(_one_row_model(tmp_path / "one2.onnx"), {"x": feeds["x"][:1]}, {"x": 0}) is None


def test_the_pinned_copy_declares_one_row_on_each_batch_axis_and_nothing_else(tmp_path):
    from calibrun.model.one_row import pinned_copy

    fp32 = open_float_model(save(stateful_model(), tmp_path / "s.onnx"))
    pinned = pinned_copy(fp32, {"input": 0, "state": 1, "sr": None}, tmp_path)
    shapes = {i.name: i.shape for i in pinned.inputs}
    assert shapes["input"] == (1, 8)
    assert shapes["state"] == (2, 1, 4)
    assert shapes["sr"] == {i.name: i.shape for i in fp32.inputs}["sr"]  # a constant keeps its shape
    assert pinned_rows(shapes, {"input": 0, "state": 1, "sr": None}) == 1
    assert pinned.path == tmp_path / "fp32_one_row.onnx"
    assert pinned.sha256 != fp32.sha256


# ------------------------------------------------------------- input names an override key cannot hold as they are


def test_a_dotted_input_name_nested_by_the_config_is_joined_back_and_a_colon_is_spelled_with_an_underscore():
    from calibrun.data.inputs import overrides, spelled

    inputs = [InputInfo("input.1", TensorProto.FLOAT, ("N", 8)), InputInfo("sr:0", TensorProto.INT64, ())]
    # data.inputs.input.1.batch_axis=0 reaches the data source as OmegaConf nests it
    given = overrides({"input": {"1": {"batch_axis": 0}}, "sr_0": {"value": 16000}}, inputs, "data")
    assert given["input.1"]["batch_axis"] == 0
    assert given["sr:0"]["value"] == 16000
    assert spelled("serving_default/input_1:0") == "serving_default_input_1_0"
    with pytest.raises(CalibrunError, match=re.escape("'sr' is not an input of the model (inputs: input.1, sr:0); "
                                                      "an input name with characters a key cannot hold is "
                                                      "written with _ in their place: sr_0 for sr:0")):
        overrides({"sr": {"value": 1}}, inputs, "data")


def test_the_failure_on_two_rows_is_said_short_by_the_node_that_failed():
    from calibrun.model.one_row import failing

    ort = ("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node. Name:'{}' "
           "Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/tensor/reshape_helper.h:91 ...")
    assert failing(ort.format("node_view")) == "its Reshape node 'node_view'"
    assert failing(ort.format("")) == "its Reshape node"
    assert failing("x" * 200) == "x" * 117 + "..."
    assert failing("short") == "short"


def _fixed_state_model(tmp_path):
    """x [N, 4] beside `bias` [4], every axis of it fixed (as an RNN's [25] state beside [T, F] frames)."""
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Add", ["x", "bias"], ["y"])], "fixed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
                               helper.make_tensor_value_info("bias", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return open_float_model(save(model, tmp_path / "fixed.onnx"))


def test_a_value_for_an_input_with_every_axis_fixed_fills_its_shape(tmp_path):
    """madmom's BLSTM: data.inputs.<state>.value=0 for a [25] state was one row repeated to the batch's 16 rows, and
    onnxruntime refused it ("Got: 16 Expected: 25"). An input with no free axis has no rows: the value fills it."""
    import onnxruntime

    fp32 = _fixed_state_model(tmp_path)
    np.savez(tmp_path / "d.npz", x=np.ones((20, 4), np.float32))
    feeds = list(calibration_data(npy(tmp_path / "d.npz", {"bias": {"value": 0.5}}), fp32, 0, 1.0, 2))
    assert [f["bias"].tolist() for f in feeds] == [[0.5] * 4] * 2
    sess = onnxruntime.InferenceSession(str(fp32.path))
    assert sess.run(None, feeds[0])[0].shape == (16, 4)
    np.savez(tmp_path / "e.npz", x=np.ones((20, 4), np.float32), bias=np.zeros(4, np.float32))
    with pytest.raises(CalibrunError, match=re.escape("'bias' declares no free axis: a constant is saved without its "
                                                      "first axis")):
        calibration_data(npy(tmp_path / "e.npz"), fp32, 0, 1.0, 1)


def test_a_batch_axis_for_a_scalar_input_says_it_is_a_constant(stateful):
    fp32, path = stateful
    with pytest.raises(CalibrunError, match=re.escape("config data.inputs.sr.batch_axis: input 'sr' (INT64 []) is a "
                                                      "scalar, with no axis to hold rows; it is a constant "
                                                      "(data.inputs.sr.value=...)")):
        calibration_data(npy(path, {"sr": {"batch_axis": 0}}), fp32, 0, 1.0, 1)


def test_one_number_for_a_state_fills_its_row(stateful):
    """A probe's `data.inputs.state.value=0` for silero's [2, N, 128] state was refused ("has shape []"), the docs
    asking for a [2, 128] nested list typed out. One number for an input whose axes but the batch axis are fixed fills
    that row, repeated along the batch axis (axis 1 here)."""
    fp32, path = stateful
    feeds = list(calibration_data(npy(path, {"state": {"value": 0}}), fp32, 0, 1.0, 2))
    assert [f["state"].shape for f in feeds] == [(2, 16, 4)] * 2
    assert not any(f["state"].any() for f in feeds)
    assert feeds[0]["state"].dtype == np.float32


def _order_model(tmp_path, first):
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Relu", ["feats"], ["y"])], "order",
                              [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [first, "N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [first, "N", 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return open_float_model(save(model, tmp_path / f"order{first}.onnx"))


def test_rows_on_an_axis_the_model_fixes_at_one_are_found_there(tmp_path, caplog):
    """trueocr's reading-order model takes `feats` [1, N, 16] and ddddocr's OCR model [1, 1, 64, W]: a batch pinned
    to one row beside a free axis, which the rule infers as the rows. Data saved as [rows, N, 16] fits only with its
    rows on axis 0, the rule's own fallback: they are fed one at a time there, said in one line (it was refused with
    a hint to set batch_axis=0). A batch_axis that is set is kept, and refused with the hint where the data does not
    fit it."""
    fp32 = _order_model(tmp_path, 1)
    np.savez(tmp_path / "d.npz", feats=np.ones((32, 12, 16), np.float32))
    with caplog.at_level("INFO", logger="calibrun"):
        feeds = list(calibration_data(npy(tmp_path / "d.npz"), fp32, 0, 1.0, 2))
    assert [f["feats"].shape for f in feeds] == [(1, 12, 16), (1, 12, 16)]  # the model pins that axis to one row
    (said,) = [r.getMessage() for r in caplog.records if "which the model fixes at 1" in r.getMessage()]
    assert "holds 32 on axis 0" in said
    assert "data.inputs.feats.batch_axis" in said
    given = list(calibration_data(npy(tmp_path / "d.npz", {"feats": {"batch_axis": 0}}), fp32, 0, 1.0, 2))
    assert [f["feats"].shape for f in given] == [(1, 12, 16), (1, 12, 16)]
    with pytest.raises(CalibrunError, match=re.escape("axis 0 is 32, the model wants 1 (rows are on axis 1); if the "
                                                      "rows are on axis 0, set data.inputs.feats.batch_axis=0")):
        calibration_data(npy(tmp_path / "d.npz", {"feats": {"batch_axis": 1}}), fp32, 0, 1.0, 1)


def test_rows_are_not_moved_onto_an_axis_fixed_at_more_than_one(tmp_path):
    """An axis the model fixes at 4 is no pinned single row: the data's 32 there is refused, with the hint."""
    fp32 = _order_model(tmp_path, 4)
    np.savez(tmp_path / "d.npz", feats=np.ones((32, 12, 16), np.float32))
    with pytest.raises(CalibrunError, match=re.escape("axis 0 is 32, the model wants 4 (rows are on axis 1); if the "
                                                      "rows are on axis 0, set data.inputs.feats.batch_axis=0")):
        calibration_data(npy(tmp_path / "d.npz"), fp32, 0, 1.0, 1)


def test_inputs_sharing_a_named_axis_must_agree_on_it(tmp_path):
    """A text model's ids and mask share `sequence_length`: ids of 24 tokens beside a mask of 20 failed in
    onnxruntime when the batch ran, for an evaluation file after the calibration and the quantisation. Said at
    once, naming both inputs, the axis and the files' sizes; the same sizes are fed."""
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["ids", "mask"], ["y"])], "shared",
        [helper.make_tensor_value_info("ids", TensorProto.FLOAT, ["batch", "sequence_length"]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "sequence_length"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence_length"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    fp32 = open_float_model(save(model, tmp_path / "shared.onnx"))
    np.savez(tmp_path / "bad.npz", ids=np.ones((8, 24), np.float32), mask=np.ones((8, 20), np.float32))
    with pytest.raises(CalibrunError, match=re.escape("inputs 'ids' and 'mask' share the axis the model names "
                                                      "'sequence_length', and the data holds 24 on it in ")):
        evaluation_data(npy(tmp_path / "bad.npz"), fp32, 0, 8)
    np.savez(tmp_path / "good.npz", ids=np.ones((8, 24), np.float32), mask=np.ones((8, 24), np.float32))
    assert evaluation_data(npy(tmp_path / "good.npz"), fp32, 0, 8).rows == 8
