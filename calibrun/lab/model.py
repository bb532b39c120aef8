"""The lab model (docs/lab.md): an MLP built with onnx.helper, checked, and run once after saving.

`python -m calibrun.model OUT.onnx` writes it (calibrun/model/__main__.py). Its sizes are calibrun.lab's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from calibrun.core.errors import CalibrunError
from calibrun.core.files import atomic_path
from calibrun.lab import LAB_FEATURES, LAB_HIDDEN, LAB_INPUT, LAB_OPSET, LAB_OUTPUTS, LAB_WEIGHT_SEED


def build_lab_model() -> onnx.ModelProto:
    """The lab MLP: MatMul, Add, Relu, MatMul, Add with a symbolic first axis "N"."""
    rng = np.random.default_rng(LAB_WEIGHT_SEED)
    w1 = (rng.normal(0, 1, (LAB_FEATURES, LAB_HIDDEN)) / np.sqrt(LAB_FEATURES)).astype(np.float32)
    b1 = rng.normal(0, 0.1, LAB_HIDDEN).astype(np.float32)
    w2 = (rng.normal(0, 1, (LAB_HIDDEN, LAB_OUTPUTS)) / np.sqrt(LAB_HIDDEN)).astype(np.float32)
    b2 = rng.normal(0, 0.1, LAB_OUTPUTS).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", [LAB_INPUT, "w1"], ["h_mm"], name="fc1_matmul"),
        helper.make_node("Add", ["h_mm", "b1"], ["h_add"], name="fc1_add"),
        helper.make_node("Relu", ["h_add"], ["h"], name="relu"),
        helper.make_node("MatMul", ["h", "w2"], ["y_mm"], name="fc2_matmul"),
        helper.make_node("Add", ["y_mm", "b2"], ["y"], name="fc2_add"),
    ]
    graph = helper.make_graph(
        nodes,
        "calibrun_lab_mlp",
        [helper.make_tensor_value_info(LAB_INPUT, TensorProto.FLOAT, ["N", LAB_FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", LAB_OUTPUTS])],
        initializer=[
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(b2, "b2"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", LAB_OPSET)], producer_name="calibrun")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def write_lab_model(path: str | Path) -> Path:
    """Write the lab model atomically and run it once with onnxruntime to prove it loads."""
    from calibrun.model.sessions import session

    path = Path(path)
    model = build_lab_model()
    with atomic_path(path) as tmp:
        onnx.save_model(model, tmp)
        sess = session(tmp)
        out = sess.run(None, {LAB_INPUT: np.zeros((2, LAB_FEATURES), np.float32)})[0]
        if out.shape != (2, LAB_OUTPUTS):
            raise RuntimeError(f"lab model produced shape {out.shape}")
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m calibrun.model OUT.onnx", file=sys.stderr)
        return 2
    try:
        out = write_lab_model(argv[0])
    except CalibrunError as exc:
        print(f"calibrun.model: error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0
