"""calibrun.model.row_axis: a model that declares no batch axis gets a leading axis of 1 on every input and output
(the copy every stage runs), and its int8 model is turned back into the original's interface. The end-to-end run on
a trained streaming denoiser is tests/e2e/test_row_axis.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from calibrun.core.errors import CalibrunError
from calibrun.model import InputInfo
from calibrun.model.row_axis import add_row_axis, added_nodes, declared_copy, declares_no_batch_axis, is_added
from calibrun.model.sessions import session


def _step_model() -> onnx.ModelProto:
    """A streaming step with no batch axis: frame [4] and state [2, 3] -> out [4] (frame * 2 + the state's mean)
    and new_state [2, 3] (state + 1); `out` is read again inside the graph (out_sq = out * out), and an If's
    branch reads `frame` from the outer graph."""
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    one = numpy_helper.from_array(np.array(1, np.float32), "one")
    flag = numpy_helper.from_array(np.array(True), "flag")
    branch = helper.make_graph([helper.make_node("Identity", ["frame"], ["picked"])], "then",
                               [], [helper.make_tensor_value_info("picked", TensorProto.FLOAT, [4])])
    other = helper.make_graph([helper.make_node("Neg", ["frame"], ["negated"])], "else",
                              [], [helper.make_tensor_value_info("negated", TensorProto.FLOAT, [4])])
    nodes = [
        helper.make_node("ReduceMean", ["state"], ["level"], keepdims=0, name="mean"),
        helper.make_node("Mul", ["frame", "two"], ["scaled"], name="scale"),
        helper.make_node("Add", ["scaled", "level"], ["out"], name="add"),
        helper.make_node("Mul", ["out", "out"], ["out_sq"], name="square"),
        helper.make_node("Add", ["state", "one"], ["new_state"], name="step"),
        helper.make_node("If", ["flag"], ["branched"], then_branch=branch, else_branch=other, name="if"),
    ]
    graph = helper.make_graph(
        nodes, "step",
        [helper.make_tensor_value_info("frame", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
         for name, shape in (("out", [4]), ("new_state", [2, 3]), ("out_sq", [4]), ("branched", [4]))],
        [two, one, flag])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _run(path, feeds):
    return session(path, optimize=False).run(None, feeds)


def test_the_copy_takes_one_row_on_a_new_first_axis_and_computes_the_same(tmp_path):
    model = _step_model()
    onnx.save(model, tmp_path / "step.onnx")
    add_row_axis(model)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, tmp_path / "copy.onnx")
    rng = np.random.default_rng(0)
    frame, state = rng.normal(size=4).astype(np.float32), rng.normal(size=(2, 3)).astype(np.float32)
    want = _run(tmp_path / "step.onnx", {"frame": frame, "state": state})
    got = _run(tmp_path / "copy.onnx", {"frame": frame[None], "state": state[None]})
    assert [i.name for i in model.graph.input] == ["frame", "state"]  # the user's names, fed as before
    assert [o.name for o in model.graph.output] == ["out", "new_state", "out_sq", "branched"]
    for value in (*model.graph.input, *model.graph.output):
        assert value.type.tensor_type.shape.dim[0].dim_value == 1
    for w, g in zip(want, got, strict=True):
        assert g.shape == (1, *w.shape)
        np.testing.assert_array_equal(g[0], w)
    assert sorted(added_nodes(model.graph)) == sorted(
        ["calibrun_row_axis_in0", "calibrun_row_axis_in1"] +
        [f"calibrun_row_axis_out{k}{end}" for k in range(4) for end in ("", "_shape", "_full")])
    # the ends are no Squeeze/Unsqueeze: onnxruntime's QDQ propagation would cross those
    assert {n.op_type for n in model.graph.node if is_added(n.name)} == {"Gather", "Shape", "Concat", "Expand"}

    declared_copy(tmp_path / "copy.onnx", tmp_path / "back.onnx")
    back = onnx.load(str(tmp_path / "back.onnx"))
    onnx.checker.check_model(back, full_check=True)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in (*back.graph.input,
                                                                                     *back.graph.output)}
    assert shapes == {"frame": [4], "state": [2, 3], "out": [4], "new_state": [2, 3], "out_sq": [4], "branched": [4]}
    assert not any(t.name.startswith("calibrun_row_axis") for t in back.graph.initializer)
    assert [n.op_type for n in back.graph.node if is_added(n.name)] == ["Identity"] * 6  # the shape nodes gone
    for w, g in zip(want, _run(tmp_path / "back.onnx", {"frame": frame, "state": state}), strict=True):
        np.testing.assert_array_equal(g, w)


def test_an_output_that_is_an_input_passed_through_or_no_tensor_is_refused():
    model = _step_model()
    model.graph.output.append(helper.make_tensor_value_info("frame", TensorProto.FLOAT, [4]))
    with pytest.raises(CalibrunError, match=r"passes 'frame' straight from an input to an output"):
        add_row_axis(model)
    model = _step_model()  # a scikit-learn classifier's ZipMap: a sequence of maps
    model.graph.output.append(helper.make_value_info("probabilities", helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))))
    with pytest.raises(CalibrunError, match=r"'probabilities' is no tensor \(a sequence or a map\)"):
        add_row_axis(model)


def test_an_output_is_given_its_axis_at_the_rank_it_has_when_it_runs_not_the_declared_one(tmp_path):
    """ddddocr's OCR model declares its output [1, seqlen] and returns [1, 1, 8210]: the axis is added to what runs."""
    model = _step_model()
    dims = model.graph.output[0].type.tensor_type.shape.dim
    dims.add().dim_value = 1  # declared [4, 1], runs [4]
    add_row_axis(model)
    onnx.save(model, tmp_path / "copy.onnx")
    got = _run(tmp_path / "copy.onnx", {"frame": np.ones((1, 4), np.float32), "state": np.ones((1, 2, 3), np.float32)})
    assert got[0].shape == (1, 4)


@pytest.mark.parametrize(("shapes", "expected"), [
    ([(512,), (2, 1, 256)], True),  # a streaming denoiser's frame and states
    ([(), (4,)], True),  # a scalar beside them: no axis either
    ([("N", 512), (32,)], False),  # frames with a batch axis beside a fixed state
    ([(None, 3)], False),  # an unnamed free axis
    ([], False),
])
def test_a_model_declares_no_batch_axis_when_every_axis_of_every_input_is_fixed(shapes, expected):
    inputs = [InputInfo(f"i{k}", TensorProto.FLOAT, shape) for k, shape in enumerate(shapes)]
    assert declares_no_batch_axis(inputs) is expected
    assert not declares_no_batch_axis([InputInfo("x", TensorProto.FLOAT, (), has_shape=False)])


def test_the_input_scale_is_read_through_a_gather_of_the_input_not_one_of_its_indices():
    """The contract's input scale of a copy given a row axis: its input is read at row 0 by a Gather before its
    QuantizeLinear (a Gather selects values of its data input). A Gather whose indices are the input (token ids into
    a table) makes other values: not the input's scale."""
    from calibrun.model.graph import input_quant

    def model(gathered_by_index: bool) -> onnx.ModelProto:
        inits = [numpy_helper.from_array(np.array(0, np.int64), "first"),
                 numpy_helper.from_array(np.ones((5, 4), np.float32), "table"),
                 numpy_helper.from_array(np.array(0.5, np.float32), "s"),
                 numpy_helper.from_array(np.array(3, np.uint8), "z")]
        x = helper.make_tensor_value_info("x", TensorProto.INT64 if gathered_by_index else TensorProto.FLOAT, [1, 4])
        gather = (helper.make_node("Gather", ["table", "x"], ["g"]) if gathered_by_index
                  else helper.make_node("Gather", ["x", "first"], ["g"], axis=0))
        nodes = [gather, helper.make_node("QuantizeLinear", ["g", "s", "z"], ["q"]),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
        graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    found = input_quant(model(False))
    assert (found.scale, found.zero_point) == (0.5, 3)
    with pytest.raises(CalibrunError, match="is not quantised"):
        input_quant(model(True))
