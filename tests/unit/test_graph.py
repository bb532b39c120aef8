"""calibrun.model.graph's look-ups on a float graph: the tensor a per-output metric is computed on, and what feeds
it (the recommendations' nodes_to_exclude candidate keeps the culprits upstream of the verdict's metric)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from calibrun.core.errors import CalibrunError
from tests.unit.test_segments import _model


def test_a_part_metric_is_computed_from_its_concat_input_and_what_feeds_it(tmp_path):
    """calibrun.model.graph.metric_tensor / upstream: `out.y.concat1.sqnr_db` is the Concat's second input (through
    a Transpose), and only the nodes feeding it are upstream of it; a task metric names no tensor."""
    from calibrun.measure.errors import metric_key
    from calibrun.model.graph import metric_tensor, part_carriers, upstream

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Neg", ["x"], ["b"], name="neg"),
             helper.make_node("Abs", ["b"], ["c"], name="abs"),
             helper.make_node("Concat", ["a", "c"], ["cat"], name="concat", axis=1),
             helper.make_node("Transpose", ["cat"], ["y/out"], name="t", perm=[1, 0])]
    model = onnx.load(str(_model(tmp_path, nodes, ["y/out"])))
    key = metric_key("y/out")
    assert metric_tensor(model, f"out.{key}.concat1.sqnr_db", metric_key) == "c"
    assert metric_tensor(model, f"out.{key}.concat0.sqnr_db", metric_key) == "a"
    assert metric_tensor(model, f"out.{key}.sqnr_db", metric_key) == "y/out"
    assert metric_tensor(model, f"out.{key}.ch1.sqnr_db", metric_key) == "y/out"  # a channel: the whole output
    assert metric_tensor(model, "task.top1_agreement", metric_key) is None
    assert upstream(model.graph, "c") == {"c", "b", "x"}
    assert upstream(model.graph, "y/out") == {"y/out", "cat", "a", "c", "b", "x"}
    # the part's values go on through the Concat and the Transpose, whose pairs round them on the parts' shared scale
    assert part_carriers(model, f"out.{key}.concat1.sqnr_db", metric_key) == {"cat", "y/out"}
    assert part_carriers(model, f"out.{key}.sqnr_db", metric_key) == set()  # the whole output: upstream holds it
    assert part_carriers(model, "task.top1_agreement", metric_key) == set()


def test_weights_dequantised_once_are_onnxruntimes_dequantizelinear_to_the_bit():
    """fold_weight_dequantize replaces each DequantizeLinear of initializers (per tensor and per channel, int8, uint8,
    int16, int32 biases, with and without a zero point) by the float initializer onnxruntime's kernel computes, bit
    for bit; a DequantizeLinear of an activation and one whose output is a graph output stay."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, numpy_helper

    from calibrun.model.graph import fold_weight_dequantize

    rng = np.random.default_rng(3)
    weights = {
        "w8": (rng.integers(-128, 128, (6, 5)).astype(np.int8), np.float32(0.0123), np.int8(-3), None),
        "wu8": (rng.integers(0, 256, (4, 3)).astype(np.uint8), np.float32(0.731), np.uint8(128), None),
        "w16": (rng.integers(-32768, 32768, (3, 7)).astype(np.int16), np.float32(1.7e-5), np.int16(11), None),
        "wch": (rng.integers(-127, 128, (4, 2, 3)).astype(np.int8), (rng.random(4) * 0.1 + 1e-3).astype(np.float32),
                np.zeros(4, np.int8), 0),
        "wax": (rng.integers(-127, 128, (2, 5)).astype(np.int8), (rng.random(5) * 0.1).astype(np.float32), None, 1),
        "bias": (rng.integers(-2**20, 2**20, 6).astype(np.int32), np.float32(3.1e-6), None, None),
    }
    nodes, initializers, outputs = [], [], []
    for name, (q, scale, zero, axis) in weights.items():
        initializers += [numpy_helper.from_array(q, f"{name}_q"),
                         numpy_helper.from_array(np.asarray(scale), f"{name}_s")]
        inputs = [f"{name}_q", f"{name}_s"]
        if zero is not None:
            initializers.append(numpy_helper.from_array(np.asarray(zero), f"{name}_z"))
            inputs.append(f"{name}_z")
        nodes.append(helper.make_node("DequantizeLinear", inputs, [name], **({} if axis is None else {"axis": axis})))
        nodes.append(helper.make_node("Identity", [name], [f"{name}_out"]))
        outputs.append(f"{name}_out")
    nodes.append(helper.make_node("QuantizeLinear", ["x", "w8_s", "w8_z"], ["xq"]))
    nodes.append(helper.make_node("DequantizeLinear", ["xq", "w8_s", "w8_z"], ["x_dq"]))  # an activation's
    nodes.append(helper.make_node("DequantizeLinear", ["w8_q", "w8_s"], ["shown"]))  # a graph output itself
    outputs += ["x_dq", "shown"]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)  # int16: opset 21

    def run(m):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run(outputs, {"x": np.array([0.1, -0.2, 0.3], np.float32)})

    before = run(model)
    floats = 4 * sum(q.size for q, *_ in weights.values())  # float32 each
    nodes = len(model.graph.node)
    assert fold_weight_dequantize(model, limit=floats - 1) == 0  # over the limit: nothing folded
    assert len(model.graph.node) == nodes
    assert fold_weight_dequantize(model, limit=floats) == len(weights)
    assert [n.op_type for n in model.graph.node].count("DequantizeLinear") == 2
    assert {t.name for t in model.graph.initializer} >= set(weights)
    assert "wu8_q" not in {t.name for t in model.graph.initializer}  # read by nothing now: dropped
    for got, want in zip(run(model), before, strict=True):
        assert got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()


def _with_input(elem: int, quantised: bool) -> onnx.ModelProto:
    """Token ids (or floats) read by a Gather of an embedding, whose rows a QuantizeLinear reads when `quantised`."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"])]
    if quantised:
        nodes += [helper.make_node("QuantizeLinear", ["rows", "s", "z"], ["q"]),
                  helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    else:
        nodes += [helper.make_node("Identity", ["rows"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", elem, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((10, 3), np.float32), "table"),
         numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z")])
    return helper.make_model(graph)


def test_scales_of_a_model_with_integer_ids_says_the_input_is_an_integer_not_that_it_stays_float():
    from calibrun.model.graph import input_stays_float, scales_summary

    model = _with_input(TensorProto.INT64, quantised=True)
    assert scales_summary(model)["input_scale"] is None
    line = input_stays_float(model, "m.onnx")
    assert "graph input 'ids' is int64 (read by Gather)" in line
    assert "stays float" not in line
    assert "stays float" in input_stays_float(_with_input(TensorProto.FLOAT, quantised=True), "m.onnx")
    assert "quantisation starts further in" in line
    # a model with nothing quantised (luscinia's tree ensemble): no "further in" to start from
    line = input_stays_float(_with_input(TensorProto.FLOAT, quantised=False), "m.onnx")
    assert ("stays float (read by Gather, not by a QuantizeLinear or QLinear op: nothing in the model is "
            "quantised)") in line


def test_scales_of_a_model_without_any_quantisation_says_it_is_not_a_quantised_model():
    from calibrun.model.graph import scales_summary

    with pytest.raises(CalibrunError, match="m.onnx has no QuantizeLinear and no QLinear op: it is not a quantised"):
        scales_summary(_with_input(TensorProto.INT64, quantised=False), "m.onnx")


def test_scales_of_a_model_onnxruntimes_quantiser_quantised_nothing_in_is_nulls_not_an_error():
    """What `calibtool.py quantize` writes for a model none of whose ops onnxruntime quantises (a tree ensemble):
    quantize_static's model, its producer `onnx.quantize`, with no quantised op. scales reads it (every input field
    null, no Q/DQ node), as quantize's own JSON said; the same graph from another producer is no quantised model."""
    from calibrun.model.graph import QUANTIZER, scales_summary

    model = _with_input(TensorProto.FLOAT, quantised=False)
    model.producer_name = QUANTIZER
    assert scales_summary(model, "m.onnx") == {"input_scale": None, "input_zero_point": None, "observed_span": None,
                                               "quantize_nodes": 0, "dequantize_nodes": 0}
    model.producer_name = "pytorch"
    with pytest.raises(CalibrunError, match="it is not a quantised model"):
        scales_summary(model, "m.onnx")
