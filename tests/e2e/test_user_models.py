"""End-to-end: bring your own model and data. Real Hydra runs, real onnxruntime, real MLflow SQLite store.

A small conv classifier exported the old way (IR 3 style: initializers listed as graph inputs, opset 11,
fixed batch 1, Softmax output) is calibrated on an .npz file and evaluated on another with labels; a
two-input model is fed from an .npz with one key per input; and the digits example runs the lab on real data.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import Proc, clean_env, run_python
from tests.stores import fresh_mlflow_store

pytestmark = pytest.mark.slow


def calibrun(tmp: Path, *overrides: str) -> Proc:
    uri = f"sqlite:///{tmp / 'mlflow.db'}" if (tmp / "mlflow.db").exists() else fresh_mlflow_store(tmp)
    return run_python(["-m", "calibrun", *overrides, "recommend=off", f"cache.dir={tmp / 'cache'}"], tmp,
                      clean_env(MLFLOW_TRACKING_URI=uri), 600)


def conv_classifier(path: Path) -> Path:
    """Conv -> BatchNormalization -> Relu -> MaxPool -> GlobalAveragePool -> Flatten -> Gemm -> Softmax,
    input [1, 3, 8, 8] (batch pinned to 1), opset 11, initializers also listed as graph inputs."""
    rng = np.random.default_rng(0)
    inits = {
        "w": (rng.normal(0, 1, (8, 3, 3, 3)) / np.sqrt(27)).astype(np.float32),
        "cb": rng.normal(0, 0.1, 8).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, 8).astype(np.float32),
        "bias": rng.normal(0, 0.1, 8).astype(np.float32),
        "mean": rng.normal(0, 0.1, 8).astype(np.float32),
        "var": rng.uniform(0.5, 1.5, 8).astype(np.float32),
        "fw": (rng.normal(0, 1, (4, 8)) / np.sqrt(8)).astype(np.float32),
        "fb": rng.normal(0, 0.1, 4).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["image", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    graph_inputs = [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])]
    graph_inputs += [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in inits.items()]
    graph = helper.make_graph(nodes, "old_conv", graph_inputs,
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 4])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 6
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path


def two_input_model(path: Path) -> Path:
    """a [N, 4] and b [N, 4] -> MatMul each -> Add -> Relu -> MatMul."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, 6)).astype(np.float32), "wa"),
             numpy_helper.from_array(rng.normal(0, 0.5, (4, 6)).astype(np.float32), "wb"),
             numpy_helper.from_array(rng.normal(0, 0.5, (6, 3)).astype(np.float32), "wo")]
    nodes = [helper.make_node("MatMul", ["a", "wa"], ["ha"]), helper.make_node("MatMul", ["b", "wb"], ["hb"]),
             helper.make_node("Add", ["ha", "hb"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "wo"], ["y"])]
    graph = helper.make_graph(nodes, "two_inputs",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("a", "b")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return path


def test_old_conv_classifier_with_npy_data(tmp_path):
    model = conv_classifier(tmp_path / "old.onnx")
    rng = np.random.default_rng(5)
    np.savez(tmp_path / "calib.npz", image=rng.normal(0, 1, (48, 3, 8, 8)).astype(np.float32))
    images = rng.normal(0, 1, (40, 3, 8, 8)).astype(np.float32)
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    labels = np.array([sess.run(None, {"image": im[None]})[0].argmax() for im in images])
    np.savez(tmp_path / "eval.npz", image=images, labels=labels)
    run_dir = tmp_path / "run"
    proc = calibrun(tmp_path, "model=file", f"model.path={model}", "data=npy", f"data.path={tmp_path / 'calib.npz'}",
                    "eval_data=npy", f"eval_data.path={tmp_path / 'eval.npz'}", "batches=100",
                    f"hydra.run.dir={run_dir}", "tracking=off")  # tracking is test_sweep.py's subject
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok"
    # preparation: the initializer inputs were stripped and the opset raised; the prepared model is in the cache
    steps = " ".join(result["preparation"])
    assert "initializer" in steps
    assert "opset" in steps
    prepared = onnx.load(result["params"]["model_file"])
    assert [i.name for i in prepared.graph.input] == ["image"]
    assert prepared.opset_import[0].version >= 13
    # data: 48 rows at batch 1 -> 48 batches (fewer than asked for), span of the real calibration rows
    assert result["params"]["rows_per_batch"] == 1
    calib = np.load(tmp_path / "calib.npz")["image"]
    assert result["metrics"]["span"] == float(calib.max() - calib.min())
    # task metrics: labels are the fp32 model's own predictions, so fp32 accuracy is exactly 1
    assert result["metrics"]["fp32_accuracy"] == 1.0
    assert result["metrics"]["int8_accuracy"] == result["metrics"]["top1_agreement"]
    assert 0.5 <= result["metrics"]["top1_agreement"] <= 1.0
    # per-tensor diagnostics for every quantised activation
    table = json.loads((run_dir / "diagnostics.json").read_text())
    assert "image" in table["tensor"]
    assert set(table["verdict"]) <= {"clipping", "coarse", "sound"}
    assert result["diagnosis"]["input_tensor"] == "image"


def test_two_inputs_need_a_source_for_each(tmp_path):
    model = two_input_model(tmp_path / "two.onnx")
    rng = np.random.default_rng(2)
    np.savez(tmp_path / "calib.npz", a=rng.normal(0, 1, (64, 4)).astype(np.float32),
             b=rng.normal(0, 1, (64, 4)).astype(np.float32))
    np.savez(tmp_path / "eval.npz", a=rng.normal(0, 1, (32, 4)).astype(np.float32),
             b=rng.normal(0, 1, (32, 4)).astype(np.float32))
    run_dir = tmp_path / "run"
    lab = calibrun(tmp_path, "model=file", f"model.path={model}", f"hydra.run.dir={tmp_path / 'lab'}", "tracking=off")
    assert lab.returncode == 1
    assert "the lab data rule serves a single float input" in lab.stderr
    proc = calibrun(tmp_path, "model=file", f"model.path={model}", "data=npy", f"data.path={tmp_path / 'calib.npz'}",
                    "eval_data=npy", f"eval_data.path={tmp_path / 'eval.npz'}", f"hydra.run.dir={run_dir}",
                    "tracking=off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["metrics"]["max_abs_error"] > 0
    assert "top1_agreement" not in result["metrics"]  # no Softmax, no labels: not a classifier


def test_post_calibration_options_reuse_the_cache(tmp_path):
    # tracking=off: the cache is the subject (a tracked lab job is tested in tests/e2e/test_sweep.py)
    first = calibrun(tmp_path, f"hydra.run.dir={tmp_path / 'a'}", "tracking=off")
    second = calibrun(tmp_path, "quant.per_channel=true", "quant.reduce_range=true", "format=qoperator",
                      "quant.nodes_to_exclude=[fc2_matmul]", f"hydra.run.dir={tmp_path / 'b'}", "tracking=off")
    third = calibrun(tmp_path, "method=entropy", f"hydra.run.dir={tmp_path / 'c'}", "tracking=off")
    for proc in (first, second, third):
        assert proc.returncode == 0, proc.stderr[-3000:]
    hits = [json.loads((tmp_path / d / "result.json").read_text())["metrics"]["cache_hit"] for d in "abc"]
    assert hits == [0, 1, 0]
    excluded = onnx.load(str(tmp_path / "b" / "int8.onnx"))
    assert any(n.op_type == "MatMul" and n.name == "fc2_matmul" for n in excluded.graph.node)


def test_digits_example_reports_accuracy_per_calibration(tmp_path):
    pytest.importorskip("sklearn", reason="the digits example needs the `digits` extra (scikit-learn)")
    sweep = tmp_path / "sweep"
    # tracking=off: the task metrics and the report are the subject (tracked sweeps: tests/e2e/test_sweep.py)
    proc = calibrun(tmp_path, "-m", "+experiment=digits", f"hydra.sweep.dir={sweep}", "tracking=off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {}
    for path in sweep.glob("*/result.json"):
        result = json.loads(path.read_text())
        results[result["params"]["calibration"]] = result["metrics"]
    assert set(results) == {"narrow", "match", "wide"}
    for metrics in results.values():
        assert metrics["fp32_accuracy"] > 0.9  # the classifier really learned the digits
    assert results["match"]["int8_accuracy"] >= results["narrow"]["int8_accuracy"]
    text = (sweep / "report" / "report.md").read_text()
    assert "## Task accuracy" in text
    assert f"{results['match']['int8_accuracy']:.2%}" in text
    diagnosis = json.loads((sweep / "report" / "diagnosis.json").read_text())
    verdicts = {run["calibration"]: run["verdict"] for run in diagnosis["runs"].values()}
    assert verdicts["narrow"] == "clipping"
    assert verdicts["match"] == "sound"


def test_a_model_onnxruntime_quantises_nothing_in_says_so_and_is_measured(tmp_path):
    """openWakeWord's VAD keeps its network inside an If, where quantize_static quantises nothing: the job used to
    fail in the per-tensor diagnostics. Here the only quantisable node is excluded: the job says the model computes
    in float, skips the diagnostics, and its verdict says why it is ok."""
    from tests.modelzoo import save, unquantised_input_model

    model = save(unquantised_input_model(), tmp_path / "cos.onnx")
    run = calibrun(tmp_path, "model=file", f"model.path={model}", "quant.nodes_to_exclude=[matmul]", "batches=2",
                   "tracking=off", "hydra.run.dir=run")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "onnxruntime quantised nothing in this model" in run.stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["metrics"]["quantize_nodes"] == 0
    assert "diagnostics" not in result["files"]
    assert result["verdict"]["status"] == "ok"
    assert result["verdict"]["because"].endswith("onnxruntime quantised nothing: the model computes in float")
