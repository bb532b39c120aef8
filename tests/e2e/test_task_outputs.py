"""task=auto on trained models with several outputs (issue 29): which output holds the classes, and why.

- MTCNN's last stage (ONet, tests/trained.py `mtcnn_onet`): box regression `dense_5` [N, 4] first, landmarks
  `dense_6` [N, 10], face / not-face `softmax_2` [N, 2] last. On real face and non-face crops of scikit-image's
  photos (labels 1 / 0), auto measures `softmax_2` (its Softmax), names the other two as not class scores, and the
  fp32 accuracy is the detector's real one. Labels 0..9, which fit no output's classes, are refused before
  calibration, naming the labels file, the row and the value.
- MTCNN's first stage (PNet, `mtcnn_pnet`, fully convolutional): a box map and a Softmax face map [N, W, H, 2];
  every position is a prediction, so per-crop labels give no accuracy (said in the pick's line), agreement is
  measured over the positions.
- scikit-learn classifiers converted with skl2onnx, trained on sklearn's bundled real data: a breast-cancer
  pipeline (StandardScaler + binary MLP, outputs `label` int64 [N] then `probabilities` [N, 2] from a Sigmoid and a
  Concat, no Softmax) and a digits MLP with a ZipMap output. The probabilities are the class output, the integer
  `label` is the predicted class compared with the labels directly.
- The rules on trained models they were not developed on (in process, no quantisation): PP-OCR's classifier,
  recogniser and text detector (a segmentation net), the YOLO detectors, a converted random forest.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from mlflow import MlflowClient

from calibrun.measure.task_pick import resolve
from calibrun.measure.tasks import TaskSpec
from tests.conftest import Proc, clean_env, run_python
from tests.stores import fresh_mlflow_store
from tests.trained import model_path

ROOT = Path(__file__).resolve().parents[2]


def calibrun(tmp: Path, *overrides: str, tracked: bool = False) -> Proc:
    env = clean_env(MLFLOW_TRACKING_URI=fresh_mlflow_store(tmp)) if tracked else clean_env()
    extra = () if tracked else ("tracking=off",)
    return run_python(["-m", "calibrun", *overrides, *extra, "recommend=off", f"cache.dir={tmp / 'cache'}"], tmp,
                      env, 900)


def npy_data(path: Path, name: str, rows: np.ndarray, labels: np.ndarray | None) -> list[str]:
    """Save the rows (and labels) as one npz; the overrides that calibrate and evaluate on it."""
    np.savez(path, **{name: rows}, **({} if labels is None else {"labels": labels}))
    return ["data=npy", f"data.path={path}", "eval_data=npy", f"eval_data.path={path}", f"eval.rows={len(rows)}"]


def result_of(tmp: Path, run: Proc, name: str) -> dict:
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    return json.loads((tmp / name / "result.json").read_text())


def picks(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "task=auto picked" in line]


def task_metrics(metrics: dict) -> set[str]:
    return {k for k in metrics if k.startswith("task.") or k in ("top1_agreement", "fp32_accuracy", "int8_accuracy")}


# ------------------------------------------------------------------------------------------------ MTCNN


@pytest.fixture(scope="module")
def face_crops():
    """48 x 48 crops as MTCNN feeds them (BGR, (x - 127.5) / 128, width and height swapped): 18 of the astronaut's
    face (three sizes, small shifts) labelled 1, 24 of other places and photos (a cup, a rocket, a cat, the
    astronaut's suit and background) labelled 0."""
    from skimage import data, transform

    def crop(image, y, x, size):
        patch = transform.resize(image[y : y + size, x : x + size].astype(np.float64), (48, 48), anti_aliasing=True,
                                 preserve_range=True)[:, :, ::-1]
        return np.transpose((patch - 127.5) / 128, (1, 0, 2)).astype(np.float32)

    astronaut = data.astronaut()
    faces = [crop(astronaut, y, x, s) for s in (100, 110, 120) for y in (65, 75, 85) for x in (170, 180)]
    others = []
    for image in (data.coffee(), data.rocket(), data.chelsea(), astronaut):
        height, width = image.shape[:2]
        for y in np.linspace(0, height - 100, 3).astype(int):
            for x in np.linspace(0, width - 100, 2).astype(int):
                if image is astronaut and y < 200 and 100 < x < 300:
                    continue  # the face
                others.append(crop(image, y, x, 100))
    return np.stack(faces + others), np.array([1] * len(faces) + [0] * len(others), np.int64)


@pytest.mark.slow
def test_onet_measures_the_softmax_head_not_the_boxes(tmp_path, face_crops):
    rows, labels = face_crops
    data = npy_data(tmp_path / "faces.npz", "input_3", rows, labels)
    run = calibrun(tmp_path, "model=file", f"model.path={model_path('mtcnn_onet')}", *data, "batches=2",
                   "hydra.run.dir=onet", tracked=True)
    result = result_of(tmp_path, run, "onet")
    task, m = result["task"], result["metrics"]
    assert (task["name"], task["output"], task["axis"]) == ("classification", "softmax_2", 1)
    assert "'softmax_2' comes from Softmax" in task["reason"]
    assert "not class scores: 'dense_5'" in task["reason"]
    assert "'dense_6'" in task["reason"]
    assert len(picks(run.stderr)) == 1
    # the face detector's real accuracy on real crops (box coordinates as classes gave 0.09)
    assert m["task.fp32_accuracy"] >= 0.9
    assert m["task.int8_accuracy"] >= 0.8
    assert "task.top5_agreement" not in m  # 2 classes
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (mlflow_run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert mlflow_run.data.metrics["task.fp32_accuracy"] == pytest.approx(m["task.fp32_accuracy"])


@pytest.mark.slow
def test_onet_labels_that_fit_no_output_are_refused_naming_the_file(tmp_path, face_crops):
    """Labels 0..9 (not face / not-face): the Softmax head has 2 classes, so the labels are not this model's
    classes: a data error, refused before calibration in one line naming the labels file, the row and the value;
    the tracked run ends FAILED with that line."""
    rows, _ = face_crops
    data = npy_data(tmp_path / "faces.npz", "input_3", rows, np.arange(len(rows)) % 10)
    run = calibrun(tmp_path, "model=file", f"model.path={model_path('mtcnn_onet')}", *data, "batches=1",
                   "diagnostics=off", "hydra.run.dir=onet", tracked=True)
    assert run.returncode == 1
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("calibrun: error:")]
    assert "faces.npz" in line
    assert "label 2 (row 2) is not a class of output 'softmax_2', which has 2 classes (0..1)" in line
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "onet" / "int8.onnx").exists()  # refused before calibration
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (mlflow_run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert mlflow_run.info.status == "FAILED"
    assert "label 2 (row 2)" in mlflow_run.data.tags["calibrun.error"]


@pytest.mark.slow
def test_pnet_face_map_agreement_per_position(tmp_path, face_crops):
    rows, labels = face_crops
    data = npy_data(tmp_path / "faces.npz", "input_1", rows, labels)
    run = calibrun(tmp_path, "model=file", f"model.path={model_path('mtcnn_pnet')}", *data, "batches=2",
                   "diagnostics=off", "hydra.run.dir=pnet")
    result = result_of(tmp_path, run, "pnet")
    task, m = result["task"], result["metrics"]
    assert (task["name"], task["output"], task["axis"]) == ("classification", "softmax", 3)
    assert "'conv2d_4'" in task["reason"]
    assert "accuracy not measured" in task["reason"]
    assert len(picks(run.stderr)) == 1
    assert "predictions for" not in run.stderr  # said once, in the pick's line
    assert 0.5 <= m["task.top1_agreement"] <= 1.0
    assert "task.fp32_accuracy" not in m
    # the verdict reads the Dice of the face positions (class 1; fp32's most frequent class is 0, not a face),
    # recomputed here from both models' maps
    import onnxruntime as ort

    ref, got = (ort.InferenceSession(str(path)).run(["softmax"], {"input_1": rows})[0].argmax(axis=3).ravel()
                for path in (model_path("mtcnn_pnet"), tmp_path / "pnet" / "int8.onnx"))
    assert np.count_nonzero(ref == 0) > np.count_nonzero(ref == 1) > 0
    dice = 2 * np.count_nonzero((ref == 1) & (got == 1)) / (np.count_nonzero(ref == 1) + np.count_nonzero(got == 1))
    assert m["task.class_dice"] == pytest.approx(dice)
    verdict = result["verdict"]
    assert (verdict["metric"], verdict["value"]) == ("task.class_dice", m["task.class_dice"])
    assert verdict["status"] == ("ok" if verdict["value"] >= 0.95 else "broken" if verdict["value"] < 0.8
                                 else "degraded")


# ---------------------------------------------------------------------------------------------- skl2onnx


def converted(model, rows: np.ndarray, path: Path, zipmap: bool) -> Path:
    from skl2onnx import to_onnx

    path.write_bytes(to_onnx(model, rows[:1], options={"zipmap": zipmap},
                             target_opset={"": 17, "ai.onnx.ml": 3}).SerializeToString())
    return path


@pytest.fixture(scope="module")
def sklearn_split():
    pytest.importorskip("skl2onnx", reason="skl2onnx is not installed (the `test` extra has it)")
    from sklearn.model_selection import train_test_split

    def split(loader):
        x, y = loader(return_X_y=True)
        return train_test_split(x.astype(np.float32), y.astype(np.int64), test_size=0.3, random_state=0, stratify=y)

    return split


@pytest.mark.slow
def test_sklearn_pipeline_label_and_probabilities(tmp_path, sklearn_split):
    """The issue's case: `label` int64 [N] first, `probabilities` [N, 2] (no Softmax: a Sigmoid and 1 - p)."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    train_x, test_x, train_y, test_y = sklearn_split(load_breast_cancer)
    model = make_pipeline(StandardScaler(), MLPClassifier((16,), max_iter=500, random_state=0)).fit(train_x, train_y)
    path = converted(model, train_x, tmp_path / "cancer.onnx", zipmap=False)
    data = npy_data(tmp_path / "test.npz", "X", test_x, test_y)
    result = result_of(tmp_path, calibrun(tmp_path, "model=file", f"model.path={path}", *data, "batches=2",
                                          "hydra.run.dir=cancer"), "cancer")
    task, m = result["task"], result["metrics"]
    assert (task["output"], task["axis"], task["predicted"]) == ("probabilities", 1, "label")
    assert "integer output 'label' takes the ArgMax of" in task["reason"]
    assert m["task.fp32_accuracy"] == pytest.approx(model.score(test_x, test_y), abs=1 / len(test_y))
    assert m["task.fp32_accuracy"] > 0.9
    assert 0.9 <= m["task.top1_agreement"] <= 1.0
    assert m["task.int8_accuracy"] > 0.85


@pytest.mark.slow
def test_sklearn_classifier_with_string_labels(tmp_path, sklearn_split):
    """Class names as labels (skl2onnx writes them as a STRING output `label` beside `probabilities`): the job used to
    fail converting 'setosa' to a float. The label output is compared as equal or not (out.label.agreement, as
    computed here from both models' labels), the probabilities give the task."""
    from sklearn.datasets import load_iris
    from sklearn.neural_network import MLPClassifier

    train_x, test_x, train_y, _ = sklearn_split(load_iris)
    names = np.array(["setosa", "versicolor", "virginica"])
    model = MLPClassifier((32,), max_iter=2000, random_state=0).fit(train_x, names[train_y])
    path = converted(model, train_x, tmp_path / "iris.onnx", zipmap=False)
    assert onnx.load(str(path)).graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.STRING
    data = npy_data(tmp_path / "test.npz", "X", test_x, None)
    result = result_of(tmp_path, calibrun(tmp_path, "model=file", f"model.path={path}", *data, "batches=2",
                                          "hydra.run.dir=iris"), "iris")
    assert result["task"]["output"] == "probabilities"
    import onnxruntime as ort

    labels = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(["label"], {"X": test_x})[0]
              for p in (path, tmp_path / "iris" / "int8.onnx")]
    assert result["metrics"]["out.label.agreement"] == pytest.approx(float(np.mean(labels[0] == labels[1])))
    assert set(labels[0]) <= set(names)


@pytest.mark.slow
def test_sklearn_linear_regressor_that_imports_its_opset_twice(tmp_path):
    """skl2onnx writes a Ridge regressor as one ai.onnx.ml LinearRegressor and imports the ai.onnx opset twice:
    quantize_static failed ('Failed to find proper ai.onnx domain'). The job now runs: one import, nothing
    quantised, and the warning says why (ai.onnx.ml operators only); the int8 model equals fp32 (200 dB)."""
    pytest.importorskip("skl2onnx", reason="skl2onnx is not installed (the `test` extra has it)")
    from skl2onnx import to_onnx
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import Ridge

    x, y = load_diabetes(return_X_y=True)
    x = x.astype(np.float32)
    path = tmp_path / "ridge.onnx"
    path.write_bytes(to_onnx(Ridge().fit(x, y), x[:1], target_opset={"": 17, "ai.onnx.ml": 3}).SerializeToString())
    assert [o.domain for o in onnx.load(str(path)).opset_import].count("") == 2
    data = npy_data(tmp_path / "rows.npz", "X", x, None)
    run = calibrun(tmp_path, "model=file", f"model.path={path}", *data, "batches=2", "hydra.run.dir=ridge")
    result = result_of(tmp_path, run, "ridge")
    assert any(step.startswith("imported the ai.onnx opset once") for step in result["preparation"])
    assert "its operators are all of other domains (ai.onnx.ml.LinearRegressor)" in run.stderr
    assert result["metrics"]["max_abs_error"] == 0.0


@pytest.mark.slow
def test_sklearn_zipmap_output_is_the_class_output(tmp_path, sklearn_split):
    """A digits MLP converted with its ZipMap ({class: probability} per row): read as [N, 10], measured."""
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    train_x, test_x, train_y, test_y = sklearn_split(load_digits)
    model = MLPClassifier((32,), max_iter=500, random_state=0).fit(train_x, train_y)
    path = converted(model, train_x, tmp_path / "digits.onnx", zipmap=True)
    data = npy_data(tmp_path / "test.npz", "X", test_x[:128], test_y[:128])
    result = result_of(tmp_path, calibrun(tmp_path, "model=file", f"model.path={path}", *data, "batches=2",
                                          "hydra.run.dir=digits"), "digits")
    task, m = result["task"], result["metrics"]
    assert (task["output"], task["predicted"]) == ("output_probability", "output_label")
    assert "ZipMap" in task["reason"]
    assert m["task.fp32_accuracy"] > 0.9
    assert "task.top5_agreement" in m  # 10 classes
    assert "out.output_probability.sqnr_db" in m  # the ZipMap's probabilities are compared as an array too


# ------------------------------------------------------------------- models the rules were not developed on


@pytest.mark.slow
def test_rules_on_other_trained_models(tmp_path, sklearn_split):
    from sklearn.datasets import load_iris
    from sklearn.ensemble import RandomForestClassifier

    expected = {"ocr_cls": ("classification", 1), "ocr_rec": ("classification", 2), "ocr_det": ("dense", 1),
                "det_yolox": ("none", None), "nudenet": ("none", None)}
    for name, (kind, axis) in expected.items():
        task = resolve(TaskSpec("auto"), model_path(name))
        assert task.name == kind, (name, task.reason)
        assert getattr(task, "axis", None) == axis, (name, task.reason)
    train_x, _, train_y, _ = sklearn_split(load_iris)
    forest = RandomForestClassifier(5, random_state=0).fit(train_x, train_y)
    path = converted(forest, train_x, tmp_path / "forest.onnx", zipmap=False)
    task = resolve(TaskSpec("auto"), path, labels=train_y)
    assert (task.output, task.predicted) == ("probabilities", "label")
    assert "TreeEnsembleClassifier" in task.reason


def _three_channel_map(tmp_path, name: str, after_conv: list, out_shape: list, *overrides: str) -> dict:
    """A Conv of 3 filters over [N, 1, 16, 16], the nodes `after_conv` (reading "c", writing "y"; none: the Conv's
    map is "y"), run by a default job on 32 rows of N(0, 1): its result.json."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(size=(3, 1, 3, 3)).astype(np.float32), "w")
    conv = helper.make_node("Conv", ["x", "w"], ["c" if after_conv else "y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph([conv, *after_conv], name,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / f"{name}.onnx")
    data = npy_data(tmp_path / "rows.npz", "x", rng.normal(size=(32, 1, 16, 16)).astype(np.float32), None)
    run = calibrun(tmp_path, "model=file", f"model.path={tmp_path / f'{name}.onnx'}", *data, *overrides,
                   f"hydra.run.dir={name}")
    return result_of(tmp_path, run, name)


def test_a_dense_map_of_several_channels_is_decided_by_its_worst_channel(tmp_path):
    """task=dense on an [N, 3, H, W] output (trueocr's detector: a text core beside two distance channels): each
    channel's IoU and Dice are metrics, the worst is `task.iou` / `task.dice`, and the verdict's sentence names the
    worst channel by the Dice it decides by."""
    result = _three_channel_map(tmp_path, "map", [], ["N", 3, 16, 16], "task=dense", "task.threshold=0")
    channels = {k: v for k, v in result["metrics"].items() if k.startswith("task.iou.ch")}
    assert sorted(channels) == ["task.iou.ch0", "task.iou.ch1", "task.iou.ch2"]
    assert result["metrics"]["task.iou"] == min(channels.values())
    dice = {k: v for k, v in result["metrics"].items() if k.startswith("task.dice.ch")}
    assert sorted(dice) == ["task.dice.ch0", "task.dice.ch1", "task.dice.ch2"]
    assert result["verdict"]["metric"] == "task.dice"
    assert result["verdict"]["value"] == result["metrics"]["task.dice"] == min(dice.values())
    worst = min(dice, key=dice.get)
    assert result["verdict"]["because"].endswith(f"; the worst of the map's 3 channels ({worst})")


def test_a_channels_last_map_is_found_and_measured_per_channel(tmp_path):
    """A Keras model exported by tf2onnx ends `Conv -> Sigmoid -> Transpose(0, 2, 3, 1)`: task=auto finds the map
    [N, 16, 16, 3] with its channels on axis 3 (the Conv's axis 1 carried through the Transpose) and measures each of
    the 3 channels, not each of the 16 rows of pixels."""
    from onnx import helper

    result = _three_channel_map(tmp_path, "keras", [helper.make_node("Sigmoid", ["c"], ["s"]),
                                                    helper.make_node("Transpose", ["s"], ["y"], perm=[0, 2, 3, 1])],
                                ["N", 16, 16, 3])
    assert result["task"]["name"] == "dense"
    assert result["task"]["channel_axis"] == 3
    assert "channels on axis 3: Conv's channels carried through Sigmoid -> Transpose" in result["task"]["reason"]
    dice = {k: v for k, v in result["metrics"].items() if k.startswith("task.dice.ch")}
    assert sorted(dice) == ["task.dice.ch0", "task.dice.ch1", "task.dice.ch2"]
    assert result["verdict"]["value"] == result["metrics"]["task.dice"] == min(dice.values())


def test_a_softmax_reshaped_to_unknown_shapes_is_measured_on_the_axis_its_probabilities_sum_over(tmp_path):
    """paddle2onnx's recogniser ending: the logits flattened to [-1, classes], a Softmax, reshaped back to the logits'
    own shape, nothing known of the shapes between (PP-OCRv4's prepared graph). The job finds the class axis on the
    first batch (2: 7 classes at 6 positions a row), measures each position's class, and the verdict reads it."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(size=(5, 7)).astype(np.float32), "w")
    flat = numpy_helper.from_array(np.array([-1, 7], np.int64), "flat")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Reshape", ["logits", "flat"], ["f"]),
             helper.make_node("Softmax", ["f"], ["p"], axis=-1), helper.make_node("Shape", ["logits"], ["shape"]),
             helper.make_node("Reshape", ["p", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "rec", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", "C"])],
                              [weight, flat])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "rec.onnx")
    data = npy_data(tmp_path / "rows.npz", "x", rng.normal(size=(32, 6, 5)).astype(np.float32), None)
    run = calibrun(tmp_path, "model=file", f"model.path={tmp_path / 'rec.onnx'}", *data, "hydra.run.dir=rec")
    result = result_of(tmp_path, run, "rec")
    assert result["task"]["name"] == "classification"
    assert result["task"]["axis"] == 2
    assert "sum to 1" in result["task"]["axis_found"]
    assert "holds its classes on axis 2 (7 classes)" in run.stderr
    assert result["verdict"]["metric"] == "task.class_dice"
    assert 0 <= result["metrics"]["task.class_dice"] <= 1
