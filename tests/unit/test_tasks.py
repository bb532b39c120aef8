"""Task metrics (calibrun.measure.tasks): the accumulators on arrays with known answers, and what task=auto picks from
real graphs (Softmax -> Flatten, Softmax -> Reshape, a one-channel map, a multi-part detector output)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from calibrun.errors import CalibrunError
from calibrun.measure import tasks
from calibrun.measure.tasks import Classification, Custom, Dense, TaskSpec, resolve


def batch_metric(fp32, int8, labels):
    """A custom task: the fraction of rows whose first output's argmax agrees, and a constant."""
    ref, got = next(iter(fp32.values())), next(iter(int8.values()))
    return {"agree": float(np.mean(ref.argmax(-1) == got.argmax(-1))), "rows_seen": float(len(ref))}


def not_a_dict(fp32, int8, labels):
    return 3.0


def test_classification_counts():
    task = Classification("p", axis=1, top_k=2)
    ref = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]])
    got = np.array([[0.1, 0.6, 0.3], [0.3, 0.5, 0.2], [0.6, 0.1, 0.3], [0.2, 0.3, 0.5]])
    labels = np.array([1, 0, 0, 2])
    task.update({"p": ref[:2]}, {"p": got[:2]}, labels[:2])
    task.update({"p": ref[2:]}, {"p": got[2:]}, labels[2:])
    m = task.metrics()
    assert m["task.top1_agreement"] == pytest.approx(2 / 4)  # rows 0 and 3 agree
    # top-2 of int8: row1 {1, 0} holds fp32's 0; row2 {0, 2} holds fp32's 2
    assert m["task.top2_agreement"] == pytest.approx(4 / 4)
    assert m["task.fp32_accuracy"] == pytest.approx(3 / 4)
    assert m["task.int8_accuracy"] == pytest.approx(3 / 4)  # int8 argmax 1, 1, 0, 2: rows 0, 2, 3 right
    assert tasks.legacy(m) == {"top1_agreement": 0.5, "fp32_accuracy": 0.75, "int8_accuracy": 0.75}


def test_classification_other_axis_counts_every_position():
    """[N, T, C] with the classes on axis 2: every time step is one prediction; labels per row do not apply."""
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(3, 5, 7))
    got = ref.copy()
    got[0, 0] = -got[0, 0]  # flips that step's argmax
    task = Classification("p", axis=2)
    task.update({"p": ref}, {"p": got}, np.array([0, 1, 2]))
    m = task.metrics()
    assert m["task.top1_agreement"] == pytest.approx(14 / 15)
    assert "task.fp32_accuracy" not in m
    assert "task.top5_agreement" in m  # 7 classes > 5


def test_dense_iou_and_agreement():
    ref = np.array([[0.9, 0.9, 0.1, 0.1]])
    got = np.array([[0.9, 0.2, 0.8, 0.1]])
    task = Dense("m", threshold=0.5)
    task.update({"m": ref}, {"m": got}, None)
    m = task.metrics()
    assert m["task.iou"] == pytest.approx(1 / 3)
    assert m["task.pixel_agreement"] == pytest.approx(2 / 4)
    assert m["task.fp32_positive"] == pytest.approx(0.5)
    empty = Dense("m")
    empty.update({"m": np.zeros((2, 3))}, {"m": np.zeros((2, 3))}, None)
    assert empty.metrics()["task.iou"] == 1.0
    assert empty.metrics()["task.fp32_positive"] == 0.0


def test_custom_weighted_by_rows():
    task = Custom("tests.unit.test_tasks:batch_metric")
    ref = np.eye(3)[[0, 1, 2, 0]]
    got = np.eye(3)[[0, 1, 1, 1]]
    task.update({"y": ref[:1]}, {"y": got[:1]}, None)  # 1 row, agree 1.0
    task.update({"y": ref[1:]}, {"y": got[1:]}, None)  # 3 rows, agree 1/3
    m = task.metrics()
    assert m["task.agree"] == pytest.approx((1 * 1.0 + 3 * (1 / 3)) / 4)
    assert m["task.rows_seen"] == pytest.approx((1 * 1 + 3 * 3) / 4)


@pytest.mark.parametrize(("fn", "message"), [("tests.unit.test_tasks:absent", "no function"),
                                             ("no_such_module_xyz:f", "cannot import"),
                                             ("nocolon", "module:function")])
def test_custom_bad_function(fn, message):
    with pytest.raises(CalibrunError, match=message):
        Custom(fn)


def test_custom_must_return_a_dict():
    task = Custom("tests.unit.test_tasks:not_a_dict")
    with pytest.raises(CalibrunError, match="dict of floats"):
        task.update({"y": np.zeros((1, 2))}, {"y": np.zeros((1, 2))}, None)


def _save(tmp_path, nodes, inputs, outputs, name="m.onnx", inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model)
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def test_auto_finds_softmax_behind_flatten(tmp_path):
    """Softmax over axis 1 of [N, 10, 1, 1], then Flatten: the classes are axis 1 of the [N, 10] output."""
    path = _save(tmp_path, [helper.make_node("Softmax", ["x"], ["s"], axis=1),
                            helper.make_node("Flatten", ["s"], ["y"], axis=1)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 10, 1, 1])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])])
    task = resolve(TaskSpec("auto"), path)
    assert isinstance(task, Classification)
    assert task.axis == 1
    assert "Softmax -> Flatten" in task.reason


def test_softmax_behind_reshape_that_cannot_be_told(tmp_path):
    """Softmax over a 4-class axis reshaped to [N, 4, 4]: two axes of size 4, so the class axis is ambiguous:
    task=classification says so and asks for task.axis; auto says so and measures no task; task.axis decides."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [-1, 4, 4])
    path = _save(tmp_path, [helper.make_node("Softmax", ["x"], ["s"], axis=-1),
                            helper.make_node("Reshape", ["s", "shape"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 4])], inits=[shape])
    with pytest.raises(CalibrunError, match="set task.axis"):
        resolve(TaskSpec("classification"), path)
    assert resolve(TaskSpec("auto"), path).name == "none"
    chosen = resolve(TaskSpec("classification", axis=2), path)
    assert isinstance(chosen, Classification)
    assert chosen.axis == 2


def test_auto_dense_for_a_one_channel_map_and_none_for_boxes(tmp_path):
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 3, 1, 1], [0.1, 0.2, 0.3])
    dense = _save(tmp_path, [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 8, 8])], "dense.onnx", [w])
    assert isinstance(resolve(TaskSpec("auto"), dense), Dense)
    boxes = _save(tmp_path, [helper.make_node("Concat", ["a", "b"], ["y"], axis=2)],
                  [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 10, 4]),
                   helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 10, 2])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10, 6])], "boxes.onnx")
    picked = resolve(TaskSpec("auto"), boxes)
    assert picked.name == "none"
    assert "Concat" in picked.reason
    # labels make auto measure classification even without a Softmax (the last axis, said in the reason)
    assert resolve(TaskSpec("auto"), boxes, labels=True).name == "classification"
    with pytest.raises(CalibrunError, match="not a model output"):
        resolve(TaskSpec("dense", output="nope"), boxes)


# --- issue 25, item 3: labels out of range ---


def test_labels_outside_the_classes_are_refused_naming_file_row_and_value():
    import numpy as np

    from calibrun.data.batches import EvalData
    from calibrun.errors import CalibrunError
    from calibrun.measure.tasks import Classification

    rows = np.zeros((6, 4), np.float32)
    for labels, value in (([0, 1, 2, 3, 99, 0], 99), ([0, -1, 2, 3, 1, 0], -1)):
        data = EvalData.from_arrays({"x": rows}, labels=np.array(labels, np.int64))
        data.label_sources = [(0, "a.npz['labels']"), (3, "b.npz['labels']")]
        with pytest.raises(CalibrunError) as info:
            data.check_labels(4, "y")
        message = str(info.value)
        row = labels.index(value)
        assert message.startswith("a.npz" if row < 3 else "b.npz"), message
        assert f"label {value} (row {row})" in message
        assert "4 classes" in message
        task = Classification("y", -1)  # the classes are known only when the model runs: refused in update
        task.evaluation = data
        scores = np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0, 1]]
        with pytest.raises(CalibrunError, match=f"label {value} "):
            task.update({"y": scores}, {"y": scores}, np.array(labels))
    ok = EvalData.from_arrays({"x": rows}, labels=np.array([0, 1, 2, 3, 3, 0]))
    ok.check_labels(4, "y")  # every label a class: nothing to say
