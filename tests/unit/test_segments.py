"""calibrun.model.segments: a model run in pieces, one per group of wanted tensors, gives the tensors one run of the
whole model gives, each node run once."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from calibrun.model import private_model_copy
from calibrun.model.segments import SegmentError, Segments
from tests.modelzoo import IR_VERSION, OPSET

F = TensorProto.FLOAT


def _model(tmp_path, nodes, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["n", 4]),
                                           helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info(name, F, None) for name in outputs], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    path = tmp_path / "src.onnx"
    onnx.save(model, str(path))
    folder = tmp_path / "pieces"
    folder.mkdir()
    return private_model_copy(path, folder)


def _whole(path, names, feeds):
    model = onnx.load(str(path))
    present = {o.name for o in model.graph.output}
    model.graph.output.extend(helper.make_tensor_value_info(n, F, None) for n in names if n not in present)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feeds), strict=True))


def test_pieces_give_the_whole_models_tensors_each_node_once(tmp_path):
    then = helper.make_graph([helper.make_node("Neg", ["a"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, None)])
    other = helper.make_graph([helper.make_node("Identity", ["b"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, None)])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Mul", ["x", "w"], ["b"], name="mul"),
             helper.make_node("If", ["flag"], ["r"], name="if", then_branch=then, else_branch=other),
             helper.make_node("Add", ["r", "a"], ["y"], name="add"),
             helper.make_node("Tanh", ["y"], ["z"], name="tanh"),
             helper.make_node("Sigmoid", ["z"], ["unused"], name="past_every_group")]
    path = _model(tmp_path, nodes, ["unused"], [numpy_helper.from_array(np.full(4, 2.0, np.float32), "w")])
    opened = []

    def open_session(piece):
        opened.append(len(onnx.load(str(piece), load_external_data=False).graph.node))
        return ort.InferenceSession(str(piece), providers=["CPUExecutionProvider"])

    groups = [["a"], ["y", "x"], ["z"]]
    pieces = Segments(path, groups, open_session)
    feeds = {"x": np.arange(-4, 4, dtype=np.float32).reshape(2, 4), "flag": np.array(True)}
    for flag in (True, False):
        feeds["flag"] = np.array(flag)
        whole = _whole(path, ["a", "y", "x", "z"], feeds)
        got = list(pieces.run(feeds))
        assert [sorted(g) for g in got] == [["a"], ["x", "y"], ["z"]]
        for group in got:
            for name, value in group.items():
                np.testing.assert_array_equal(value, whole[name])
    assert opened[:3] == [1, 3, 1]  # relu; mul, if (its branch reads `a`, carried), add; tanh; not the sigmoid
    assert pieces.pieces[1][1] == ["a", "flag", "x"]  # what piece 1 reads from outside it


def test_a_carried_tensor_of_unknown_type_cannot_be_cut(tmp_path):
    nodes = [helper.make_node("Foo", ["x"], ["f"], name="custom", domain="com.example"),
             helper.make_node("Relu", ["f"], ["y"], name="relu")]
    path = _model(tmp_path, nodes, ["y"])
    model = onnx.load(str(path))
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data")
    with pytest.raises(SegmentError, match="no element type for \\['f'\\]"):
        Segments(path, [["f"], ["y"]], lambda piece: None)


def test_a_piece_onnxruntime_cannot_load_is_found_before_any_run(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("Neg", ["a"], ["y"], name="neg")]
    path = _model(tmp_path, nodes, ["y"])

    def refuses(piece):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Load model failed\nwith detail")

    with pytest.raises(SegmentError, match="onnxruntime cannot load piece 0: .*Load model failed with detail"):
        Segments(path, [["a"], ["y"]], refuses)


def test_shape_inference_that_fails_is_a_segment_error(tmp_path, monkeypatch):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("Neg", ["a"], ["y"], name="neg")]
    path = _model(tmp_path, nodes, ["y"])

    def fails(model, strict_mode=False):
        raise onnx.shape_inference.InferenceError("[ShapeInferenceError] something\\nelse")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", fails)
    with pytest.raises(SegmentError, match="onnx shape inference failed: .*ShapeInferenceError"):
        Segments(path, [["a"], ["y"]], lambda piece: None)
