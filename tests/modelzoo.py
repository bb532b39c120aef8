"""Small ONNX models for tests, built with onnx.helper and checked with onnx.checker.

    from tests.modelzoo import mlp, int_input_model, save
    save(mlp(features=5, input_name="input.1", activation="Sigmoid", gemm=True), tmp_path / "m.onnx")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu")


def _weights(rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    w = (rng.normal(0, 1, (rows, cols)) / np.sqrt(rows)).astype(np.float32)
    b = rng.normal(0, 0.1, cols).astype(np.float32)
    return w, b


def _finish(nodes, name, inputs, outputs, initializers, opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def mlp(
    features: int = 16,
    hidden: int = 32,
    outputs: int = 8,
    input_name: str = "x",
    output_name: str = "y",
    activation: str = "Relu",
    gemm: bool = False,
    seed: int = 0,
    batch: int | str = "N",
    opset: int = OPSET,
) -> onnx.ModelProto:
    """Linear -> activation -> Linear; each Linear is MatMul+Add, or one Gemm when `gemm`."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    rng = np.random.default_rng(seed)
    w1, b1 = _weights(rng, features, hidden)
    w2, b2 = _weights(rng, hidden, outputs)
    if gemm:
        nodes = [
            helper.make_node("Gemm", [input_name, "w1", "b1"], ["h_pre"], name="fc1"),
            helper.make_node(activation, ["h_pre"], ["h"], name="act"),
            helper.make_node("Gemm", ["h", "w2", "b2"], [output_name], name="fc2"),
        ]
    else:
        nodes = [
            helper.make_node("MatMul", [input_name, "w1"], ["h_mm"], name="fc1_matmul"),
            helper.make_node("Add", ["h_mm", "b1"], ["h_pre"], name="fc1_add"),
            helper.make_node(activation, ["h_pre"], ["h"], name="act"),
            helper.make_node("MatMul", ["h", "w2"], ["y_mm"], name="fc2_matmul"),
            helper.make_node("Add", ["y_mm", "b2"], [output_name], name="fc2_add"),
        ]
    arrays = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
    initializers = [numpy_helper.from_array(a, n) for n, a in arrays.items()]
    return _finish(
        nodes,
        "tests_mlp",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [batch, features])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [batch, outputs])],
        initializers,
        opset,
    )


def int_input_model(features: int = 4, outputs: int = 3, input_name: str = "ids") -> onnx.ModelProto:
    """A model whose only input is int64 (Cast -> MatMul): no float input to calibrate."""
    w = np.random.default_rng(1).normal(0, 1, (features, outputs)).astype(np.float32)
    nodes = [
        helper.make_node("Cast", [input_name], ["xf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("MatMul", ["xf", "w"], ["y"], name="matmul"),
    ]
    return _finish(
        nodes,
        "tests_int_input",
        [helper.make_tensor_value_info(input_name, TensorProto.INT64, ["N", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", outputs])],
        [numpy_helper.from_array(w, "w")],
        OPSET,
    )


def unquantised_input_model(features: int = 4, outputs: int = 3, op: str = "Cos") -> onnx.ModelProto:
    """Float input read first by an op onnxruntime does not quantise (Cos -> MatMul): the graph input
    gets no QuantizeLinear, whatever the format."""
    w = np.random.default_rng(2).normal(0, 1, (features, outputs)).astype(np.float32)
    nodes = [
        helper.make_node(op, ["x"], ["xc"], name="first"),
        helper.make_node("MatMul", ["xc", "w"], ["y"], name="matmul"),
    ]
    return _finish(
        nodes,
        "tests_unquantised_input",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", outputs])],
        [numpy_helper.from_array(w, "w")],
        OPSET,
    )

def stateful_model(features: int = 8, hidden: int = 4, outputs: int = 3) -> onnx.ModelProto:
    """A recurrent step as Silero VAD's: `input` [N, features] float32, `state` [2, N, hidden] float32 (rows on
    axis 1), `sr` an int64 scalar (the sample rate, scaling the step by sr / 16000) -> `output` [N, outputs] and
    `stateN` [2, N, hidden]."""
    rng = np.random.default_rng(5)
    w = (rng.normal(0, 1, (features, hidden)) / np.sqrt(features)).astype(np.float32)
    u = (rng.normal(0, 1, (hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    v = (rng.normal(0, 1, (hidden, outputs)) / np.sqrt(hidden)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["input", "w"], ["xw"], name="input_proj"),
        helper.make_node("Gather", ["state", "zero"], ["s0"], axis=0, name="state_first"),
        helper.make_node("MatMul", ["s0", "u"], ["su"], name="state_proj"),
        helper.make_node("Add", ["xw", "su"], ["pre"], name="add"),
        helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT, name="sr_cast"),
        helper.make_node("Div", ["srf", "base"], ["scale"], name="sr_scale"),
        helper.make_node("Mul", ["pre", "scale"], ["scaled"], name="scale"),
        helper.make_node("Tanh", ["scaled"], ["h"], name="tanh"),
        helper.make_node("MatMul", ["h", "v"], ["output"], name="head"),
        helper.make_node("Unsqueeze", ["h", "axis0"], ["hu"], name="unsqueeze"),
        helper.make_node("Concat", ["hu", "hu"], ["stateN"], axis=0, name="new_state"),
    ]
    return _finish(
        nodes,
        "tests_stateful",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", features]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "N", hidden]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", outputs]),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "N", hidden])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(u, "u"), numpy_helper.from_array(v, "v"),
         numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.float32(16000), "base"),
         numpy_helper.from_array(np.array([0], np.int64), "axis0")],
        OPSET,
    )


def typed_inputs_model(features: int = 4, outputs: int = 3) -> onnx.ModelProto:
    """Inputs of four types: `a` float32 [N, features], `x` float16 [N, features], `mask` bool [N, features],
    `offset` int32 [N, 1]; the output is MatMul(a + float(x) * float(mask) + float(offset), w)."""
    w = np.random.default_rng(6).normal(0, 1, (features, outputs)).astype(np.float32)
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT, name="x_cast"),
        helper.make_node("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT, name="mask_cast"),
        helper.make_node("Cast", ["offset"], ["of"], to=TensorProto.FLOAT, name="offset_cast"),
        helper.make_node("Mul", ["xf", "mf"], ["masked"], name="mask"),
        helper.make_node("Add", ["masked", "of"], ["shifted"], name="shift"),
        helper.make_node("Add", ["shifted", "a"], ["summed"], name="sum"),
        helper.make_node("MatMul", ["summed", "w"], ["y"], name="matmul"),
    ]
    return _finish(
        nodes,
        "tests_typed_inputs",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", features]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["N", features]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, ["N", features]),
         helper.make_tensor_value_info("offset", TensorProto.INT32, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", outputs])],
        [numpy_helper.from_array(w, "w")],
        OPSET,
    )


def masked_attention(dim: int = 16, seed: int = 0, fill: float = float(np.finfo(np.float32).min)) -> onnx.ModelProto:
    """One attention head as a PyTorch export of a Hugging Face encoder writes its mask: the int64 attention_mask
    [batch, seq] cast to float, (1 - mask) * `fill` (float32's lowest, -3.4e38; -1e4 in older exports) added to the
    scaled scores before the Softmax; x [batch, seq, dim] -> y [batch, seq, dim] (the attended values, projected).
    Random weights: a mechanism, not a trained model (the trained ones are in the bench's zoo)."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array((rng.normal(0, 1, (dim, dim)) / np.sqrt(dim)).astype(np.float32), name)
               for name in ("wq", "wk", "wv", "wo")]
    constants = [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                 numpy_helper.from_array(np.array(fill, np.float32), "fill"),
                 numpy_helper.from_array(np.array(np.sqrt(dim), np.float32), "root"),
                 numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    nodes = [
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Unsqueeze", ["mask_f", "axis1"], ["mask_3d"], name="unsqueeze"),
        helper.make_node("Sub", ["one", "mask_3d"], ["inverted"], name="invert"),
        helper.make_node("Mul", ["inverted", "fill"], ["bias"], name="fill_mask"),
        *(helper.make_node("MatMul", ["x", w], [o], name=n) for w, o, n in (("wq", "q", "query"), ("wk", "k", "key"),
                                                                            ("wv", "v", "value"))),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="key_t"),
        helper.make_node("MatMul", ["q", "kt"], ["raw"], name="scores"),
        helper.make_node("Div", ["raw", "root"], ["scaled"], name="scale"),
        helper.make_node("Add", ["scaled", "bias"], ["masked"], name="add_mask"),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["probs", "v"], ["context"], name="context"),
        helper.make_node("MatMul", ["context", "wo"], ["y"], name="project"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", dim]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", dim])]
    return _finish(nodes, "masked_attention", inputs, outputs, [*weights, *constants], OPSET)


def padded_rows(path: str | Path, rows: int, seed: int, seq: int = 12, dim: int = 16, outlier: float = 30.0) -> Path:
    """masked_attention's feeds as an npz: x with one channel `outlier` times the others (a residual stream's outlier
    channel), each row's mask padded from a random length (4..seq) on."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, seq, dim)).astype(np.float32)
    x[..., 0] *= outlier
    mask = np.ones((rows, seq), np.int64)
    for row in range(rows):
        mask[row, rng.integers(4, seq + 1):] = 0
    np.savez(path, x=x, attention_mask=mask)
    return Path(path)


def frame_conv(features: int = 8, channels: int = 4, width: int = 5, seed: int = 0) -> onnx.ModelProto:
    """A model whose rows are frames of one sequence, as madmom's audio CNNs are exported: x [T, F] (no batch axis)
    -> a convolution over `width` frames -> y [T - width + 1, channels] (a Sigmoid per frame). It cannot run fewer
    than `width` rows."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.normal(0, 0.5, (channels, 1, width, features)).astype(np.float32), "w")
    axes = numpy_helper.from_array(np.array([0, 1], np.int64), "axes")
    squeeze = numpy_helper.from_array(np.array([0, 3], np.int64), "squeeze_axes")
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["x4"], name="to_image"),
             helper.make_node("Conv", ["x4", "w"], ["c"], name="conv"),
             helper.make_node("Squeeze", ["c", "squeeze_axes"], ["s"], name="squeeze"),
             helper.make_node("Transpose", ["s"], ["t"], perm=[1, 0], name="frames_first"),
             helper.make_node("Sigmoid", ["t"], ["y"], name="sigmoid")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["frames", features])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["out_frames", channels])]
    return _finish(nodes, "frame_conv", inputs, outputs, [weight, axes, squeeze], OPSET)


def width_conv(height: int = 8, channels: int = 4, width: int = 3, seed: int = 0) -> onnx.ModelProto:
    """A text-line model exported as ddddocr's reader is: x [1, 1, height, W] (its batch pinned, its width free) ->
    a convolution `width` columns wide -> y [1, channels, 1, W - width + 1]. Its one free axis is the width, which
    calibrun infers as the batch axis unless told otherwise."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.normal(0, 0.5, (channels, 1, height, width)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, height, "W"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 1, "out_width"])]
    return _finish(nodes, "width_conv", inputs, outputs, [weight], OPSET)


def old_opset_pool(opset: int = 6) -> onnx.ModelProto:
    """Conv -> AveragePool over [N, 1, 8] at `opset` (IR 3, the weight also listed as a graph input): at opset 6
    onnxruntime cannot load the file as it is (it has no kernel for AveragePool-1, only 7 and later); at 13 it is the
    same computation onnxruntime runs, the reference a test compares with."""
    weight = np.random.default_rng(3).normal(0, 0.5, (2, 1, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1], name="conv"),
             helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[2], strides=[2], name="pool")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8])]
    if opset < 9:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 1, 3]))
    graph = helper.make_graph(nodes, "old_pool", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                        ["N", 2, 4])],
                              initializer=[numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.ir_version = 3 if opset < 9 else IR_VERSION
    onnx.checker.check_model(model)
    return model


def save(model: onnx.ModelProto, path: str | Path) -> Path:
    """Save `model` to `path` (parent folders created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def save_mlp(path: str | Path, **kwargs) -> Path:
    return save(mlp(**kwargs), path)


# --- The docs/lab.md data rules and graph reading, rebuilt without calibrun (for independent expectations) ---

ROWS_PER_BATCH = 16


def calibration_batches(seed: int, factor: float, batches: int, features: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(0, 1, (ROWS_PER_BATCH, features)) * factor).astype(np.float32) for _ in range(batches)
    ]


def evaluation_rows(seed: int, rows: int, features: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (rows, features)).astype(np.float32)


def pinned_input_quant(path: str | Path) -> tuple[float, int]:
    """(scale, zero_point) of the QuantizeLinear that reads the graph input, from its initializers."""
    model = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    readers = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == names[0]]
    assert len(readers) == 1, f"expected one QuantizeLinear on the graph input, found {len(readers)}"
    scale = inits[readers[0].input[1]]
    zero_point = inits[readers[0].input[2]]
    assert scale.size == 1
    assert zero_point.size == 1
    return float(scale.reshape(-1)[0]), int(zero_point.reshape(-1)[0])


def run_model(path: str | Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)
