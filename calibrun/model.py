"""The lab model; loading a user's model with clear errors; its graph inputs, external data files and sha256.

`python -m calibrun.model OUT.onnx` writes the lab model.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from calibrun.errors import CalibrunError, one_line
from calibrun.files import atomic_path

# The lab's sizes live here and nowhere else.
LAB_FEATURES = 16
LAB_HIDDEN = 32
LAB_OUTPUTS = 8
LAB_WEIGHT_SEED = 0
LAB_OPSET = 17
LAB_INPUT = "x"


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
    import onnxruntime as ort

    path = Path(path)
    model = build_lab_model()
    with atomic_path(path) as tmp:
        onnx.save_model(model, tmp)
        sess = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        out = sess.run(None, {LAB_INPUT: np.zeros((2, LAB_FEATURES), np.float32)})[0]
        if out.shape != (2, LAB_OUTPUTS):
            raise RuntimeError(f"lab model produced shape {out.shape}")
    return path


@dataclass(frozen=True)
class InputInfo:
    """The model's real graph input: name, element type and shape (ints, or str/None for symbolic axes)."""

    name: str
    elem_type: int
    shape: tuple[int | str | None, ...]

    @property
    def is_float(self) -> bool:
        return self.elem_type == TensorProto.FLOAT


def check_model_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise CalibrunError(f"model file not found: {path}")
    if not path.is_file():
        raise CalibrunError(f"model path is not a file: {path}")
    return path


def load_model(path: str | Path) -> onnx.ModelProto:
    """Load an ONNX file (external data included) or raise a one-line CalibrunError."""
    path = check_model_file(path)
    if path.stat().st_size == 0:
        raise CalibrunError(f"model file is empty: {path}")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError, ValueError, ... on non-ONNX bytes
        raise CalibrunError(f"not an ONNX model: {path} ({one_line(exc)})") from exc
    if not model.graph.node:
        raise CalibrunError(f"not an ONNX model: {path} (no graph nodes)")
    return model


def graph_inputs(model: onnx.ModelProto) -> list[InputInfo]:
    """The real graph inputs: old models also list initializers as inputs; those are skipped."""
    initializers = {init.name for init in model.graph.initializer}
    infos = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        ttype = value.type.tensor_type
        dims: list[int | str | None] = []
        for dim in ttype.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        infos.append(InputInfo(value.name, ttype.elem_type, tuple(dims)))
    return infos


def float_input(model: onnx.ModelProto, path: str | Path = "model") -> InputInfo:
    """The first real graph input, which must be float32 (the data rule only makes float data)."""
    inputs = graph_inputs(model)
    if not inputs:
        raise CalibrunError(f"{path} has no graph input")
    first = inputs[0]
    if not first.is_float:
        type_name = TensorProto.DataType.Name(first.elem_type) if first.elem_type else "unknown"
        raise CalibrunError(f"{path}: input {first.name!r} is {type_name}, calibrun needs a float32 input")
    if not first.shape:
        raise CalibrunError(f"{path}: input {first.name!r} has no known shape (rank 0 or missing)")
    return first


# Ops that only a quantised graph holds (QDQ, QOperator, dynamic and integer-arithmetic forms).
QUANTISED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                           "ConvInteger", "QGemm", "QAttention", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM",
                           "MatMulIntegerToFloat", "QEmbedLayerNormalization", "MatMulNBits"})


def quantised_ops(model: onnx.ModelProto) -> dict[str, int]:
    """op type -> count of the nodes of `model` (top graph) that only a quantised model holds."""
    found: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in QUANTISED_OPS or node.op_type.startswith(("QLinear", "QOrdered")):
            found[node.op_type] = found.get(node.op_type, 0) + 1
    return dict(sorted(found.items()))


def check_not_quantised(model: onnx.ModelProto, path: str | Path = "model") -> None:
    """Refuse a model that is already quantised: calibrating it again would quantise its quantisation."""
    found = quantised_ops(model)
    if found:
        ops = ", ".join(f"{op} x{n}" for op, n in found.items())
        raise CalibrunError(f"{path} is already quantised ({ops}); give the float32 model it was made from")


def check_outputs(model: onnx.ModelProto, path: str | Path = "model") -> None:
    """Refuse a model without graph outputs: there would be nothing to measure."""
    if not model.graph.output:
        raise CalibrunError(f"{path} has no graph output: there is nothing to compare fp32 and int8 on")


def external_files(path: str | Path) -> list[Path]:
    """The external data files an ONNX file refers to (top graph initializers), resolved beside it."""
    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # unreadable: load_model reports it
        return []
    names = {entry.value for tensor in model.graph.initializer if tensor.data_location == TensorProto.EXTERNAL
             for entry in tensor.external_data if entry.key == "location"}
    return [path.parent / name for name in sorted(names)]


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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


if __name__ == "__main__":
    sys.exit(main())
