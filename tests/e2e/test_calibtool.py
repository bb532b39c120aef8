"""The contract CLI (`python calibtool.py ...`) as a subprocess from another working directory.

Every expectation is rebuilt here without calibrun: the data from the docs/lab.md rules, the pinned scale and
the op counts with onnx + numpy_helper, the errors with onnxruntime + numpy float64.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest

from calibrun.quant.quantize import QuantOptions
from tests.conftest import CALIBTOOL, clean_env, run_calibtool
from tests.modelzoo import (
    calibration_batches,
    evaluation_rows,
    int_input_model,
    mlp,
    old_opset_pool,
    pinned_input_quant,
    run_model,
    save,
    unquantised_input_model,
)

pytestmark = pytest.mark.slow  # subprocesses of the CLIs (multi-second each): `pytest -m "not slow"` leaves them out

QUANTIZE_KEYS = {"out", "bytes", "batches", "span", "format", "ops", "input_scale", "input_zero_point"}
SCALES_KEYS = {"input_scale", "input_zero_point", "observed_span", "quantize_nodes", "dequantize_nodes"}
ERROR_KEYS = {"rows", "max_abs_error", "mean_abs_error", "max_abs_output"}
LINEAR_OPS = {"MatMul", "Gemm"}


def one_json(stdout: str) -> dict:
    """stdout holds exactly one JSON object (one line) and nothing else."""
    assert stdout.endswith("\n")
    assert stdout.count("\n") == 1, stdout
    result = json.loads(stdout)
    assert isinstance(result, dict)
    return result


def graph_input(path: Path) -> tuple[str, int]:
    """(name, features) of the model's real input, read with onnx."""
    model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    value = next(v for v in model.graph.input if v.name not in inits)
    return value.name, value.type.tensor_type.shape.dim[-1].dim_value


def op_types(path: Path) -> Counter:
    return Counter(node.op_type for node in onnx.load(str(path)).graph.node)


def listing(folder: Path) -> set[str]:
    return set(os.listdir(folder))


# --- successful runs: quantize, scales, error on several models and both formats ---


@dataclass(frozen=True)
class Case:
    id: str
    model: dict | None  # kwargs of modelzoo.mlp; None: the lab model (calibrun.model.write_lab_model)
    seed: int
    factor: float
    batches: int
    fmt: str | None  # None: the default (qdq)
    eval_seed: int = 777
    rows: int = 256
    extra: dict = field(default_factory=dict)


CASES = [
    Case("lab-default-format", None, 4242, 1.0, 64, None),
    Case("lab-qoperator-narrow", None, 4242, 0.2, 8, "qoperator"),
    Case("f5-input.1-matmul-relu-qdq", {"features": 5, "input_name": "input.1"}, 7, 3.0, 3, "qdq", 5, 33),
    Case("f16-gemm-tanh-qop", {"features": 16, "gemm": True, "activation": "Tanh"}, 0, 2.5, 5, "qoperator", 1, 17),
    Case("f40-gemm-sigmoid-input.1-qdq", {"features": 40, "gemm": True, "activation": "Sigmoid",
                                          "input_name": "input.1"}, 123, 0.5, 2, "qdq", 9, 100),
    Case("f40-matmul-sigmoid-qop", {"features": 40, "activation": "Sigmoid"}, 99, 1.0, 1, "qoperator", 3, 64),
]


@dataclass
class Quantized:
    case: Case
    fp32: Path
    out: Path
    cwd: Path
    cache: Path
    result: dict
    stderr: str


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def quantized(request, tmp_path_factory) -> Quantized:
    """One `calibtool quantize` per case, from a working directory that is not the repository."""
    case: Case = request.param
    root = tmp_path_factory.mktemp(case.id.replace(".", "_"))
    models = root / "models"
    models.mkdir()
    if case.model is None:
        from calibrun.lab.model import write_lab_model

        fp32 = write_lab_model(models / "lab.onnx")
    else:
        fp32 = save(mlp(**case.model), models / "fp32.onnx")
    cwd = root / "cwd"
    (cwd / "out").mkdir(parents=True)
    args = ["quantize", fp32, "out/int8.onnx", case.seed, case.factor, case.batches]
    if case.fmt is not None:
        args.append(case.fmt)
    code, stdout, stderr = run_calibtool(args, cwd, root / "cache")
    assert code == 0, stderr
    return Quantized(case, fp32, cwd / "out" / "int8.onnx", cwd, root / "cache", one_json(stdout), stderr)


def rebuilt_calibration(q: Quantized) -> list[np.ndarray]:
    _, features = graph_input(q.fp32)
    return calibration_batches(q.case.seed, q.case.factor, q.case.batches, features)


def test_quantize_json(quantized: Quantized):
    q, result = quantized, quantized.result
    assert set(result) == QUANTIZE_KEYS
    assert (q.cwd / result["out"]).resolve() == q.out.resolve()
    assert result["bytes"] == q.out.stat().st_size
    assert result["batches"] == q.case.batches
    assert result["format"] == (q.case.fmt or "qdq")
    assert result["ops"] == dict(op_types(q.out))

    arrays = rebuilt_calibration(q)
    every = np.concatenate([a.ravel() for a in arrays])
    assert result["span"] == float(every.max() - every.min())  # max - min of the float32 data, in float32
    hi, lo = float(every.max()), float(every.min())

    scale, zero_point = pinned_input_quant(q.out)
    assert result["input_scale"] == scale
    assert result["input_zero_point"] == zero_point
    assert scale == pytest.approx((max(hi, 0.0) - min(lo, 0.0)) / 255, rel=1e-6)
    # asymmetric int8: rmin maps to -128
    assert abs(zero_point - round(-128 - min(lo, 0.0) / scale)) <= 1


def test_quantize_writes_only_out_and_uses_the_cache_folder(quantized: Quantized):
    assert listing(quantized.cwd) == {"out"}  # no default cache, no temp file in the working directory
    assert listing(quantized.cwd / "out") == {"int8.onnx"}
    assert any(quantized.cache.iterdir())  # CALIBRUN_CACHE was honoured
    onnx.checker.check_model(onnx.load(str(quantized.out)))


def test_quantize_format_shapes_the_graph(quantized: Quantized):
    """The written graph is really QDQ or really QOperator (would fail if the format were ignored)."""
    fp32_ops, ops = op_types(quantized.fp32), op_types(quantized.out)
    linear = sum(fp32_ops[op] for op in LINEAR_OPS)
    assert linear > 0
    model = onnx.load(str(quantized.out))
    producers = {out: node.op_type for node in model.graph.node for out in node.output}
    if (quantized.case.fmt or "qdq") == "qdq":
        assert not [op for op in ops if op.startswith("QLinear") or op == "QGemm"]
        assert sum(ops[op] for op in LINEAR_OPS) == linear
        for node in model.graph.node:
            if node.op_type in LINEAR_OPS:  # float op fed by DequantizeLinear on both operands
                assert producers.get(node.input[0]) == "DequantizeLinear"
                assert producers.get(node.input[1]) == "DequantizeLinear"
        assert ops["DequantizeLinear"] > ops["QuantizeLinear"]
    else:
        assert not [op for op in ops if op in LINEAR_OPS]
        assert ops["QLinearMatMul"] + ops["QGemm"] == linear
        # QOperator dequantises only where a float op or the graph output needs it
        assert ops["DequantizeLinear"] <= 2


def test_scales_json(quantized: Quantized):
    code, stdout, stderr = run_calibtool(["scales", quantized.out], quantized.cwd, quantized.cache)
    assert code == 0, stderr
    result = one_json(stdout)
    assert set(result) == SCALES_KEYS
    scale, zero_point = pinned_input_quant(quantized.out)
    assert result["input_scale"] == scale
    assert result["input_zero_point"] == zero_point
    assert result["observed_span"] == pytest.approx(scale * 255, rel=1e-12)
    ops = op_types(quantized.out)
    assert result["quantize_nodes"] == ops["QuantizeLinear"]
    assert result["dequantize_nodes"] == ops["DequantizeLinear"]
    assert result["quantize_nodes"] >= 1
    # The data straddles zero, so what the graph pinned is the span the data had.
    assert result["observed_span"] == pytest.approx(quantized.result["span"], rel=1e-6)


def test_error_json(quantized: Quantized):
    q = quantized
    args = ["error", q.fp32, q.out, q.case.eval_seed, q.case.rows]
    code, stdout, stderr = run_calibtool(args, q.cwd, q.cache)
    assert code == 0, stderr
    result = one_json(stdout)
    assert set(result) == ERROR_KEYS
    assert result["rows"] == q.case.rows

    name, features = graph_input(q.fp32)
    rows = evaluation_rows(q.case.eval_seed, q.case.rows, features)
    ref = run_model(q.fp32, {name: rows})
    got = run_model(q.out, {name: rows})
    assert len(ref) == len(got) == 1
    ref64, got64 = ref[0].astype(np.float64), got[0].astype(np.float64)
    diff = np.abs(ref64 - got64)
    assert result["max_abs_error"] == pytest.approx(diff.max(), rel=1e-6, abs=1e-9)
    assert result["mean_abs_error"] == pytest.approx(diff.mean(), rel=1e-6, abs=1e-9)
    assert result["max_abs_output"] == pytest.approx(np.abs(ref64).max(), rel=1e-6)
    assert 0 < result["mean_abs_error"] < result["max_abs_error"]
    assert listing(q.cwd) == {"out"}


def test_error_of_a_model_against_itself_is_zero(lab_model, calibtool):
    """Zero, as it should be; and since INT8 holds no quantised operator, one line on stderr says these are the
    errors of two float models (a float file passed as INT8 by mistake otherwise read as a perfect int8 model)."""
    code, stdout, stderr = calibtool("error", lab_model, lab_model, 777, 256)
    assert code == 0, stderr
    assert stderr.strip() == (f"WARNING:calibrun:{lab_model} holds no quantised operator (no QuantizeLinear, QLinear "
                              "or integer op): these are the errors of two float models")
    result = one_json(stdout)
    name, features = graph_input(lab_model)
    expected = np.abs(run_model(lab_model, {name: evaluation_rows(777, 256, features)})[0]).max()
    assert result == {"rows": 256, "max_abs_error": 0.0, "mean_abs_error": 0.0,
                      "max_abs_output": pytest.approx(float(expected), rel=1e-6)}


def test_quantize_same_arguments_twice_is_identical(lab_model, calibtool):
    """The second run is served from the cache and writes the same bytes."""
    first = calibtool("quantize", lab_model, "a.onnx", 4242, 0.2, 16)
    second = calibtool("quantize", lab_model, "b.onnx", 4242, 0.2, 16)
    assert first[0] == second[0] == 0, first[2] + second[2]
    a, b = one_json(first[1]), one_json(second[1])
    assert {k: v for k, v in a.items() if k != "out"} == {k: v for k, v in b.items() if k != "out"}
    assert (calibtool.cwd / "a.onnx").read_bytes() == (calibtool.cwd / "b.onnx").read_bytes()


# --- any float model: what the Hydra runner prepares, calibtool prepares too ---


def _float16_io_mlp() -> onnx.ModelProto:
    """onnxruntime's own float16 converter with the float32 inputs and outputs kept (`keep_io_types`): the graph
    input is read by a Cast, which quantize_static does not quantise (preparation removes it: float32 -> float32
    once the model is widened)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return convert_float_to_float16(mlp(features=6), keep_io_types=True)


def _awkward_models() -> dict:
    from tests.unit import test_prepare as built

    return {"float16": built.float16_net, "float16-io-types-kept": _float16_io_mlp, "ir3-initializer-inputs":
            built.ir3_mlp, "opset9-upsample": built.upsample_opset9, "cos-first": unquantised_input_model}


@pytest.mark.parametrize("name", list(_awkward_models()))
def test_quantize_and_error_work_on_any_float_model(name, tmp_path, calibtool):
    """Float models an outside tool brings, each valid and run by onnxruntime as it is: float16 (quantize_static
    alone writes an int8 model onnxruntime refuses), old IR and opsets, a graph input read first by an op
    onnxruntime does not quantise. quantize writes an int8 model onnxruntime runs; where no QuantizeLinear reads the
    graph input, input_scale and input_zero_point are null and one warning line says why; error compares each
    model fed the lab rows in the type it declares (a float16 model in float16)."""
    fp32 = save(_awkward_models()[name](), tmp_path / f"{name}.onnx")
    code, stdout, stderr = calibtool("quantize", fp32, "int8.onnx", 11, 1.5, 3)
    assert code == 0, stderr
    result = one_json(stdout)
    out = calibtool.cwd / "int8.onnx"
    assert set(result) == QUANTIZE_KEYS
    assert result["ops"] == dict(op_types(out))
    assert result["ops"].get("QuantizeLinear", 0) >= 1
    model = onnx.load(str(fp32))
    inits = {t.name for t in model.graph.initializer}
    (given,) = [i for i in model.graph.input if i.name not in inits]
    shape = [d.dim_value for d in given.type.tensor_type.shape.dim[1:]]
    rng = np.random.default_rng(11)
    every = np.concatenate([(rng.normal(0, 1, (16, *shape)) * 1.5).astype(np.float32).ravel() for _ in range(3)])
    assert result["span"] == float(every.max() - every.min())
    read_by_quantize = [n for n in onnx.load(str(out)).graph.node if n.op_type == "QuantizeLinear"
                        and n.input[0] == given.name]
    # read first by Resize (the converted Upsample) or Cos: ops quantize_static does not quantise; the float16
    # model's float32 input is read by a Cast that preparation removes (a no-op once the model is widened)
    assert bool(read_by_quantize) == (name not in ("opset9-upsample", "cos-first"))
    if read_by_quantize:
        assert (result["input_scale"], result["input_zero_point"]) == pinned_input_quant(out)
        assert "stays float" not in stderr
    else:
        assert result["input_scale"] is None
        assert result["input_zero_point"] is None
        assert f"graph input '{given.name}' stays float" in stderr
        code, stdout, stderr = calibtool("scales", out)
        assert code == 0, stderr
        assert one_json(stdout)["input_scale"] is None
        assert "stays float" in stderr

    code, stdout, stderr = calibtool("error", fp32, out, 5, 40)
    assert code == 0, stderr
    rows = np.random.default_rng(5).normal(0, 1, (40, *shape)).astype(np.float32)
    declared = onnx.helper.tensor_dtype_to_np_dtype(given.type.tensor_type.elem_type)
    ref = run_model(fp32, {given.name: rows.astype(declared)})[0].astype(np.float64)
    got = run_model(out, {given.name: rows})[0].astype(np.float64)
    error = one_json(stdout)
    assert error["max_abs_error"] == pytest.approx(np.abs(ref - got).max(), rel=1e-6)
    assert 0 < error["max_abs_error"] < np.abs(ref).max()  # quantised, and not garbage


def test_a_model_onnxruntime_cannot_load_as_given_is_prepared_not_refused(tmp_path, calibtool):
    """An opset-6 model (AveragePool-1, which onnxruntime no longer runs): quantize prepares it as the runner does
    (opset converted to 13) instead of refusing the file; error measures against that prepared model, said in one
    warning line, and gives the numbers of the same graph written at opset 13 by hand."""
    import onnxruntime as ort

    fp32 = save(old_opset_pool(6), tmp_path / "old.onnx")
    with pytest.raises(Exception, match="AveragePool"):
        ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])  # the premise
    code, stdout, stderr = calibtool("quantize", fp32, "int8.onnx", 2, 1.0, 3)
    assert code == 0, stderr
    out = calibtool.cwd / "int8.onnx"
    assert one_json(stdout)["ops"].get("QuantizeLinear", 0) >= 1
    code, stdout, stderr = calibtool("error", fp32, out, 5, 24)
    assert code == 0, stderr
    assert "onnxruntime cannot load" in stderr
    assert "the error is measured against the model prepared from it" in stderr
    rows = np.random.default_rng(5).normal(0, 1, (24, 1, 8)).astype(np.float32)
    ref = run_model(save(old_opset_pool(13), tmp_path / "same13.onnx"), {"x": rows})[0].astype(np.float64)
    got = run_model(out, {"x": rows})[0].astype(np.float64)
    assert one_json(stdout)["max_abs_error"] == pytest.approx(np.abs(ref - got).max(), rel=1e-6)



def test_a_model_onnxruntime_quantises_nothing_in_goes_through_quantize_scales_and_error(tmp_path, calibtool):
    """A float model none of whose ops quantize_static quantises (here Cos then Sin; luscinia's scikit-learn tree
    ensemble in the zoo): quantize writes onnxruntime's model with one warning line, and scales reads what quantize
    wrote (the same null input fields and no Q/DQ node, the same warning), instead of calling it no quantised model;
    error measures two float models (their error is 0)."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Cos", ["x"], ["c"]), onnx.helper.make_node("Sin", ["c"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 6])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 6])])
    fp32 = save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), tmp_path / "f.onnx")
    code, stdout, stderr = calibtool("quantize", fp32, "int8.onnx", 1, 1.0, 2)
    assert code == 0, stderr
    quantized = one_json(stdout)
    assert (quantized["input_scale"], quantized["input_zero_point"]) == (None, None)
    assert quantized["ops"] == {"Cos": 1, "Sin": 1}
    assert "nothing in the model is quantised" in stderr
    code, stdout, stderr = calibtool("scales", calibtool.cwd / "int8.onnx")
    assert code == 0, stderr
    assert one_json(stdout) == {"input_scale": None, "input_zero_point": None, "observed_span": None,
                                "quantize_nodes": 0, "dequantize_nodes": 0}
    assert "nothing in the model is quantised" in stderr
    code, stdout, stderr = calibtool("scales", fp32)  # the float model itself: still no quantised model
    assert code == 1
    assert "it is not a quantised model" in stderr
    code, stdout, stderr = calibtool("error", fp32, calibtool.cwd / "int8.onnx", 3, 8)
    assert code == 0, stderr
    assert one_json(stdout)["max_abs_error"] == 0.0


# --- exit 2: wrong argument counts ---

USAGE_CASES = {
    "no-arguments": [],
    "unknown-command": ["frobnicate"],
    "unknown-command-with-args": ["frobnicate", "m.onnx", "1"],
    "quantize-0": ["quantize"],
    "quantize-1": ["quantize", "m.onnx"],
    "quantize-2": ["quantize", "m.onnx", "o.onnx"],
    "quantize-3": ["quantize", "m.onnx", "o.onnx", "1"],
    "quantize-4": ["quantize", "m.onnx", "o.onnx", "1", "1.0"],
    "quantize-7": ["quantize", "m.onnx", "o.onnx", "1", "1.0", "8", "qdq", "extra"],
    "scales-0": ["scales"],
    "scales-2": ["scales", "m.onnx", "extra"],
    "error-0": ["error"],
    "error-1": ["error", "m.onnx"],
    "error-2": ["error", "m.onnx", "q.onnx"],
    "error-3": ["error", "m.onnx", "q.onnx", "1"],
    "error-5": ["error", "m.onnx", "q.onnx", "1", "8", "extra"],
}


@pytest.mark.parametrize("args", list(USAGE_CASES.values()), ids=list(USAGE_CASES))
def test_wrong_argument_count_exits_2_with_usage(args, lab_model, calibtool):
    args = [lab_model if a == "m.onnx" else a for a in args]  # a real model: only the count is wrong
    code, stdout, stderr = calibtool(*args)
    assert code == 2
    assert stdout == ""
    assert stderr.splitlines()[0].startswith("usage:")
    assert "calibtool.py quantize" in stderr
    assert "Traceback" not in stderr
    assert listing(calibtool.cwd) == set()


# --- exit 1: bad input, one line, nothing written ---


class Assets:
    """Files shared by the failure cases (outside every output folder)."""

    def __init__(self, root: Path):
        from calibrun.lab.model import write_lab_model
        from calibrun.model import open_float_model
        from calibrun.quant.quantize import quantize_lab

        self.root = root
        self.lab = write_lab_model(root / "lab.onnx")
        self.int8 = root / "int8.onnx"
        quantize_lab(open_float_model(self.lab), self.int8, 1, 1.0, 2)
        other = save(mlp(features=5), root / "f5.onnx")  # same input name "x", 5 features
        self.int8_f5 = root / "int8_f5.onnx"
        quantize_lab(open_float_model(other), self.int8_f5, 1, 1.0, 2)
        self.missing = root / "missing.onnx"
        self.empty = root / "empty.onnx"
        self.empty.write_bytes(b"")
        self.random = root / "random.onnx"
        self.random.write_bytes(np.random.default_rng(0).bytes(4096))
        self.text = root / "text.onnx"
        self.text.write_text("this is not an ONNX model\n" * 20)
        self.int64 = save(int_input_model(), root / "int64.onnx")
        self.folder = root / "a_folder.onnx"
        self.folder.mkdir()
        self.int8_qop = root / "int8_qop.onnx"
        quantize_lab(open_float_model(self.lab), self.int8_qop, 1, 1.0, 2,
                            options=QuantOptions(format="qoperator"))
        from onnxruntime.quantization import quantize_dynamic

        self.dynamic = root / "dynamic.onnx"  # MatMulInteger / DynamicQuantizeLinear
        quantize_dynamic(str(self.lab), str(self.dynamic))
        no_outputs = onnx.load(str(self.lab))
        del no_outputs.graph.output[:]
        self.no_outputs = root / "no_outputs.onnx"
        onnx.save_model(no_outputs, str(self.no_outputs))
        symbolic = onnx.load(str(self.lab))  # the feature axis symbolic: the lab rule cannot size a row
        symbolic.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "F"
        self.symbolic = root / "symbolic.onnx"
        onnx.save_model(symbolic, str(self.symbolic))
        self.unknown_op = _tiny(root / "unknown_op.onnx", "FooBar", ["N", 4])  # no kernel in onnxruntime
        self.scalar = _tiny(root / "scalar.onnx", "Relu", [])  # a rank-0 input: no rows to make
        self.unshaped = _tiny(root / "unshaped.onnx", "Relu", None)  # not even a rank stated
        one_row = onnx.load(str(self.lab))  # exported for one row: a Reshape to [1, 16] traced in front of fc1
        one_row.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 16], np.int64), "one_row_shape"))
        one_row.graph.node.insert(0, onnx.helper.make_node("Reshape", ["x", "one_row_shape"], ["x_one_row"]))
        one_row.graph.node[1].input[0] = "x_one_row"
        self.one_row = root / "one_row.onnx"
        onnx.save_model(one_row, str(self.one_row))
        pinned = onnx.load(str(self.lab))  # one row pinned, and an output onnx's checker refuses (no shape field)
        pinned.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
        pinned.graph.output[0].type.tensor_type.ClearField("shape")
        self.pinned_invalid = root / "pinned_invalid.onnx"
        onnx.save_model(pinned, str(self.pinned_invalid))
        bad = onnx.load(str(self.lab))  # w1 is 16x32; claim the input has 5 features: MatMul cannot work
        bad.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 5
        self.bad_shapes = root / "bad_shapes.onnx"
        onnx.save_model(bad, str(self.bad_shapes))


def _tiny(path: Path, op: str, shape: list) -> Path:
    from onnx import TensorProto, helper

    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "tiny", [value[0]], [value[1]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return path


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Assets:
    return Assets(tmp_path_factory.mktemp("assets"))


def quantize(a: Assets, out: Path, seed="1", factor="1.0", batches="2", *fmt, src=None):
    return ["quantize", src or a.lab, out / "q.onnx", seed, factor, batches, *fmt]


BAD_FILES = {"missing": "not found", "empty": "empty", "random": "not an ONNX model",
             "text": "not an ONNX model", "folder": "not a file"}

# id -> (argv builder (assets, output folder), a word the message must contain)
BAD_CASES = {}
for _kind, _word in BAD_FILES.items():
    BAD_CASES[f"quantize-in-{_kind}"] = (lambda a, o, k=_kind: quantize(a, o, src=getattr(a, k)), _word)
    BAD_CASES[f"scales-{_kind}"] = (lambda a, o, k=_kind: ["scales", getattr(a, k)], _word)
    if _kind != "folder":
        BAD_CASES[f"error-fp32-{_kind}"] = (lambda a, o, k=_kind: ["error", getattr(a, k), a.int8, 1, 8], _word)
        BAD_CASES[f"error-int8-{_kind}"] = (lambda a, o, k=_kind: ["error", a.lab, getattr(a, k), 1, 8], _word)
BAD_CASES.update({
    "quantize-int64-input": (lambda a, o: quantize(a, o, src=a.int64),
                             "INT64; the lab data rule feeds one float input (float32, float16 or double; give your "
                             "data: python -m calibrun data=npy)"),
    "scales-int64-input": (lambda a, o: ["scales", a.int64], "not a quantised model"),
    "error-fp32-int64-input": (lambda a, o: ["error", a.int64, a.int8, 1, 8], "INT64"),
    "error-int8-int64-input": (lambda a, o: ["error", a.lab, a.int64, 1, 8], "no input"),
    "error-int8-of-other-features": (lambda a, o: ["error", a.lab, a.int8_f5, 1, 8], ""),
    "scales-of-fp32-model": (lambda a, o: ["scales", a.lab], "not a quantised model"),
    "seed-word": (lambda a, o: quantize(a, o, seed="abc"), "SEED"),
    "seed-float": (lambda a, o: quantize(a, o, seed="1.5"), "SEED"),
    "seed-negative": (lambda a, o: quantize(a, o, seed="-1"), "seed"),
    "factor-word": (lambda a, o: quantize(a, o, factor="wide"), "FACTOR"),
    "factor-zero": (lambda a, o: quantize(a, o, factor="0"), "factor"),
    "factor-negative": (lambda a, o: quantize(a, o, factor="-1.0"), "factor"),
    "factor-nan": (lambda a, o: quantize(a, o, factor="nan"), "factor"),
    "factor-inf": (lambda a, o: quantize(a, o, factor="inf"), "factor"),
    "factor-minus-inf": (lambda a, o: quantize(a, o, factor="-inf"), "factor"),
    "batches-word": (lambda a, o: quantize(a, o, batches="many"), "BATCHES"),
    "batches-zero": (lambda a, o: quantize(a, o, batches="0"), "batches"),
    "batches-negative": (lambda a, o: quantize(a, o, batches="-4"), "batches"),
    "format-unknown": (lambda a, o: quantize(a, o, "1", "1.0", "2", "int4"), "format"),
    "error-seed-word": (lambda a, o: ["error", a.lab, a.int8, "abc", 8], "SEED"),
    "error-seed-negative": (lambda a, o: ["error", a.lab, a.int8, "-1", 8], "seed"),
    "error-rows-word": (lambda a, o: ["error", a.lab, a.int8, 1, "some"], "ROWS"),
    "error-rows-float": (lambda a, o: ["error", a.lab, a.int8, 1, "8.0"], "ROWS"),
    "error-rows-zero": (lambda a, o: ["error", a.lab, a.int8, 1, "0"], "rows"),
    "error-rows-negative": (lambda a, o: ["error", a.lab, a.int8, 1, "-5"], "rows"),
    "out-folder-missing": (lambda a, o: ["quantize", a.lab, o / "nowhere" / "q.onnx", 1, 1.0, 2], "nowhere"),
    "out-parent-is-a-file": (lambda a, o: ["quantize", a.lab, o / "plain.txt" / "q.onnx", 1, 1, 2], "plain.txt"),
    "out-is-a-folder": (lambda a, o: ["quantize", a.lab, o / "sub", 1, 1.0, 2], "sub"),
    # already quantised, no outputs, nothing the lab rule can size
    "quantize-already-quantised-qdq": (lambda a, o: quantize(a, o, src=a.int8), "already quantised"),
    "quantize-already-quantised-qoperator": (lambda a, o: quantize(a, o, src=a.int8_qop), "already quantised"),
    "quantize-dynamic-quantised": (lambda a, o: quantize(a, o, src=a.dynamic), "MatMulInteger"),
    "scales-dynamic-quantised": (lambda a, o: ["scales", a.dynamic], "is quantised dynamically (DynamicQuantizeLinear"),
    "error-fp32-already-quantised": (lambda a, o: ["error", a.int8, a.int8, 1, 8], "already quantised"),
    "quantize-no-outputs": (lambda a, o: quantize(a, o, src=a.no_outputs), "no graph output"),
    "error-fp32-no-outputs": (lambda a, o: ["error", a.no_outputs, a.int8, 1, 8], "no graph output"),
    "quantize-one-row-export": (lambda a, o: quantize(a, o, src=a.one_row), "exported for one row at a time"),
    "error-one-row-export": (lambda a, o: ["error", a.one_row, a.int8, 1, 8], "exported for one row at a time"),
    # a model that pins one row and fails for another reason keeps its own error (it had been told it was exported
    # for one row at a time, whatever failed): here a file onnx's checker refuses
    "quantize-pinned-row-invalid": (lambda a, o: quantize(a, o, src=a.pinned_invalid), "states no shape, not even its"),
    "quantize-symbolic-features": (lambda a, o: quantize(a, o, src=a.symbolic), "symbolic.onnx: input 'x' axis 1 is "
                                                                                "symbolic"),
    "error-symbolic-features": (lambda a, o: ["error", a.symbolic, a.int8, 1, 8], "symbolic.onnx: input 'x' axis 1 "
                                                                                   "is symbolic"),
    # models onnxruntime cannot run: named as given, not as a temp copy inside the calibration
    "quantize-unknown-op": (lambda a, o: quantize(a, o, src=a.unknown_op), "No Op registered for FooBar"),
    "quantize-inconsistent-shapes": (lambda a, o: quantize(a, o, src=a.bad_shapes), "bad_shapes.onnx"),
    "quantize-rank-0-input": (lambda a, o: quantize(a, o, src=a.scalar), "no known shape (rank 0: a scalar"),
    "quantize-input-without-shape": (lambda a, o: quantize(a, o, src=a.unshaped), "not even its rank"),
    "error-fp32-unknown-op": (lambda a, o: ["error", a.unknown_op, a.int8, 1, 8], ""),
    # numbers past their bounds: one line, no numpy warning before it
    "factor-1e39-overflows-float32": (lambda a, o: quantize(a, o, factor="1e39"), "1e+30"),
    "factor-1e38": (lambda a, o: quantize(a, o, factor="1e38"), "factor"),
    "factor-1e-45": (lambda a, o: quantize(a, o, factor="1e-45"), "factor"),
    "factor-1e400-parses-as-inf": (lambda a, o: quantize(a, o, factor="1e400"), "factor"),
    "factor-hex": (lambda a, o: quantize(a, o, factor="0x10"), "FACTOR"),
    "seed-2**32": (lambda a, o: quantize(a, o, seed=str(2**32)), "4294967295"),
    "seed-5000-digits": (lambda a, o: quantize(a, o, seed="9" * 5000), "SEED"),
    "batches-1e30": (lambda a, o: quantize(a, o, batches="1e30"), "BATCHES"),
    "batches-over-bound": (lambda a, o: quantize(a, o, batches="100001"), "at most 100000"),
    "batches-10**9": (lambda a, o: quantize(a, o, batches=str(10**9)), "at most 100000"),
    "format-empty": (lambda a, o: quantize(a, o, "1", "1.0", "2", ""), "format"),
    "error-rows-over-bound": (lambda a, o: ["error", a.lab, a.int8, 1, "1000001"], "at most 1000000"),
    "error-seed-2**32": (lambda a, o: ["error", a.lab, a.int8, str(2**32), 8], "seed"),
})


@dataclass
class BadRun:
    out: Path
    cwd: Path
    code: int
    stdout: str
    stderr: str


def _snapshot(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


@pytest.fixture(scope="module")
def bad_runs(assets, tmp_path_factory) -> dict[str, BadRun]:
    """Every failure case, each in its own folders, run a few at a time (each is a ~0.3 s process)."""
    root = tmp_path_factory.mktemp("bad")
    before = _snapshot(assets.root)
    folders = {}
    for case in BAD_CASES:
        out, cwd = root / case / "out", root / case / "cwd"
        out.mkdir(parents=True)
        cwd.mkdir()
        (out / "plain.txt").write_text("keep me\n")
        (out / "sub").mkdir()
        folders[case] = (out, cwd)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futures = {
            case: pool.submit(run_calibtool, BAD_CASES[case][0](assets, out), cwd, root / case / "cache")
            for case, (out, cwd) in folders.items()
        }
        runs = {case: BadRun(*folders[case], *future.result()) for case, future in futures.items()}
    assert _snapshot(assets.root) == before  # inputs untouched, nothing written beside them
    return runs


@pytest.mark.parametrize("case", list(BAD_CASES), ids=list(BAD_CASES))
def test_bad_input_exits_1_with_one_line_and_writes_nothing(case, bad_runs, tmp_path_factory):
    run, word = bad_runs[case], BAD_CASES[case][1]
    assert run.code == 1, run.stderr
    assert run.stdout == ""
    assert "Traceback" not in run.stderr
    lines = run.stderr.splitlines()
    assert lines, "no error message"
    assert lines[-1].startswith("calibtool: error: ")
    assert len(lines) == 1, f"noise before the error line:\n{run.stderr}"
    assert word in lines[-1]
    # a message, not an echo of a huge argument (pytest's temp folder does not count: it is longer under xdist)
    assert len(lines[-1].replace(str(tmp_path_factory.getbasetemp()), "")) < 400
    # nothing written: no output and no temp file in the output folder or the working directory
    assert listing(run.out) == {"plain.txt", "sub"}
    assert (run.out / "plain.txt").read_text() == "keep me\n"
    assert listing(run.out / "sub") == set()
    assert listing(run.cwd) == set()


# --- OUT is IN: refused before any work, whatever path names it ---


def _same_file_args(kind: str, folder: Path) -> tuple[list, Path]:
    """(argv, cwd) of a quantize whose OUT is its IN, named in several ways."""
    model = folder / "m.onnx"
    if kind == "same-path":
        return ["quantize", model, model, 1, 1.0, 2], folder
    if kind == "relative":
        return ["quantize", model, "m.onnx", 1, 1.0, 2], folder
    if kind == "dot-dot":
        (folder / "sub").mkdir()
        return ["quantize", "m.onnx", "sub/../m.onnx", 1, 1.0, 2], folder
    if kind == "symlink":
        (folder / "link.onnx").symlink_to(model)
        return ["quantize", model, folder / "link.onnx", 1, 1.0, 2], folder
    if kind == "hardlink":
        os.link(model, folder / "hard.onnx")
        return ["quantize", folder / "hard.onnx", model, 1, 1.0, 2], folder
    if kind == "its-data-file":
        from calibrun.lab.model import build_lab_model

        onnx.save_model(build_lab_model(), str(model), save_as_external_data=True, location="weights.bin",
                        size_threshold=0)
        return ["quantize", model, folder / "weights.bin", 1, 1.0, 2], folder
    if kind == "linked-folder":
        (folder / "alias").symlink_to(folder, target_is_directory=True)
        return ["quantize", model, folder / "alias" / "m.onnx", 1, 1.0, 2], folder
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["same-path", "relative", "dot-dot", "symlink", "hardlink", "linked-folder",
                                  "its-data-file"])
def test_quantize_onto_its_own_input_is_refused(kind, tmp_path):
    from calibrun.lab.model import write_lab_model

    folder = tmp_path / "models"
    folder.mkdir()
    write_lab_model(folder / "m.onnx")
    args, cwd = _same_file_args(kind, folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    listed = listing(folder)
    code, stdout, stderr = run_calibtool(args, cwd, tmp_path / "cache")
    assert code == 1, stderr
    assert stdout == ""
    assert stderr.splitlines() == [stderr.strip()]
    assert stderr.startswith("calibtool: error: cannot write ")
    assert "is the input model" in stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
    assert listing(folder) == listed
    assert not (tmp_path / "cache").exists()  # refused before any work: nothing calibrated


# --- stdout that cannot take the JSON, signals, orphans of killed runs ---


def _calibtool_proc(args, cwd: Path, cache: Path, **kw) -> subprocess.Popen:
    env = clean_env(**{"CALIBRUN_CACHE": cache, **kw.pop("env", {})})
    return subprocess.Popen([sys.executable, str(CALIBTOOL), *map(str, args)], cwd=cwd, env=env,
                            stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("command", ["quantize", "scales"])
def test_stdout_on_a_full_device_is_one_line_and_exit_1(command, lab_model, tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    args = ["quantize", lab_model, tmp_path / "q.onnx", 1, 1.0, 2] if command == "quantize" else ["scales", lab_model]
    if command == "scales":
        from calibrun.model import open_float_model
        from calibrun.quant.quantize import quantize_lab

        quantize_lab(open_float_model(lab_model), tmp_path / "s.onnx", 1, 1.0, 2)
        args = ["scales", tmp_path / "s.onnx"]
    with open("/dev/full", "w") as full:
        proc = _calibtool_proc(args, tmp_path, tmp_path / "cache", stdout=full)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert "Exception ignored" not in stderr
    lines = stderr.splitlines()
    assert lines == ["calibtool: error: cannot write the result to stdout: No space left on device"], stderr


def test_stdout_a_closed_pipe_is_one_line_and_exit_1(lab_model, tmp_path):
    read, write = os.pipe()
    os.close(read)  # nobody will ever read: the first write gets EPIPE
    try:
        proc = _calibtool_proc(["quantize", lab_model, tmp_path / "q.onnx", 1, 1.0, 2], tmp_path, tmp_path / "cache",
                               stdout=write)
    finally:
        os.close(write)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert stderr.splitlines() == ["calibtool: error: cannot write the result to stdout: Broken pipe"], stderr


def ours(folder: Path) -> list[str]:
    """calibrun's entries in a temp dir (onnxruntime's import writes a `.ses` file there: not ours)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("calibrun."))


def _wait_for(predicate, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("signum", "message"), [(signal.SIGTERM, "terminated (SIGTERM)"),
                                                 (signal.SIGINT, "interrupted")], ids=["SIGTERM", "SIGINT"])
def test_signal_mid_calibration_is_one_line_and_leaves_nothing(lab_model, tmp_path, signum, message):
    """Terminated or interrupted while calibrating (its private temp folder exists): one line, exit 1, the temp
    folder and any temp file beside OUT removed on the way out."""
    # a child inherits an ignored or blocked SIGINT (conftest gives the test process SIGINT's default; a test or
    # library that changed it would make this one fail for a reason that is not calibtool's)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signum not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "out").mkdir()
    proc = _calibtool_proc(["quantize", lab_model, tmp_path / "out" / "q.onnx", 1, 1.0, 100000], tmp_path,
                           tmp_path / "cache", stdout=subprocess.PIPE, env={"TMPDIR": str(tmp)})
    try:
        assert _wait_for(lambda: any(p.name.startswith("calibrun.calib.") for p in tmp.iterdir())), \
            "calibration never started"
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr
    assert stdout == ""
    assert stderr.splitlines() == [f"calibtool: error: {message}"], stderr
    assert ours(tmp) == []
    assert list((tmp_path / "out").iterdir()) == []


def test_next_start_removes_what_a_killed_calibtool_left(lab_model, tmp_path):
    """SIGKILL mid-calibration leaves its private temp folder (nothing can run in the process); the next calibtool
    removes it, and the temp files of dead processes beside OUT and in the cache, and leaves live ones alone."""
    from calibrun.core.files import _HOST

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out, cache = tmp_path / "out", tmp_path / "cache"
    out.mkdir()
    cache.mkdir()
    env = {"TMPDIR": str(tmp)}
    proc = _calibtool_proc(["quantize", lab_model, out / "q.onnx", 1, 1.0, 100000], tmp_path, cache,
                           stdout=subprocess.PIPE, env=env)
    try:
        assert _wait_for(lambda: any(p.name.startswith("calibrun.calib.") for p in tmp.iterdir()))
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    left = ours(tmp)
    assert left
    assert all(name.startswith(f"calibrun.calib.{_HOST}.{proc.pid}.") for name in left)
    # what a killed writer leaves beside OUT and in the cache (atomic_path's names), and a live process's
    dead_out = out / f".q.onnx.{_HOST}.{proc.pid}.0123abcd.onnx.tmp"
    dead_cache = cache / f".k.json.{_HOST}.{proc.pid}.89abcdef.tmp"
    live = out / f".other.onnx.{_HOST}.{os.getpid()}.00000000.tmp"
    for path in (dead_out, dead_cache, live):
        path.write_bytes(b"half")
    code, stdout, stderr = run_calibtool_env(["quantize", lab_model, out / "q.onnx", 1, 1.0, 2], tmp_path, cache,
                                             env)
    assert code == 0, stderr
    assert ours(tmp) == []
    assert not dead_out.exists()
    assert not dead_cache.exists()
    assert live.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(["q.onnx", live.name])


def run_calibtool_env(args, cwd: Path, cache: Path, env: dict) -> tuple[int, str, str]:
    return run_calibtool(args, cwd, cache, extra_env=env)



@pytest.mark.parametrize(("args", "message"), [
    (["quantize", "m.onnx", "q.onnx", "1", "wide", "2"], "FACTOR must be a number, got 'wide'"),
    (["error", "a.onnx", "b.onnx", "1", "0"], "rows must be an integer >= 1, got 0"),
], ids=["quantize-factor", "error-rows"])
def test_a_bad_number_is_refused_before_onnx_is_imported(tmp_path, args, message):
    """A mistyped number fails at once: calibrun.core.bounds checks it before numpy, onnx and onnxruntime are
    imported."""
    proc = subprocess.run([sys.executable, "-X", "importtime", str(CALIBTOOL), *args], cwd=tmp_path,
                          env=clean_env(CALIBRUN_CACHE=str(tmp_path / "cache")), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    timings = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert [line for line in proc.stderr.splitlines() if line not in timings] == [f"calibtool: error: {message}"]
    imported = {line.split("|")[-1].strip() for line in timings}
    assert "calibrun.core.bounds" in imported
    assert not {"numpy", "onnx", "onnxruntime"} & imported


# --- issue 25, item 11: --help ---


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_exits_0_and_names_the_command_as_called(flag, tmp_path):
    """`calibtool.py --help` and the installed `calibtool --help`: exit 0, the usage on stdout naming the command
    as it was typed."""
    script = run_calibtool_help([sys.executable, str(CALIBTOOL), flag], tmp_path)
    assert script.returncode == 0, script.stderr
    assert script.stdout.startswith("usage: calibtool.py quantize IN OUT"), script.stdout
    assert "Traceback" not in script.stderr
    installed = Path(sys.executable).parent / "calibtool"
    if installed.exists():
        command = run_calibtool_help([str(installed), flag], tmp_path)
        assert command.returncode == 0, command.stderr
        assert command.stdout.startswith("usage: calibtool quantize IN OUT"), command.stdout
        assert "calibtool.py" not in command.stdout


def run_calibtool_help(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=60)


def test_quantize_makes_the_int8_model_the_hydra_runner_makes(tmp_path, calibtool):
    """One preparation for both faces: `calibtool quantize` of a float16 file and `python -m calibrun model=file` of it
    (matched calibration, its seed, the same batches, QDQ) write the same bytes; the runner's job reuses the
    prepared model and the ranges calibtool left in the shared cache."""
    from calibrun.lab import CALIB_SEED
    from tests.conftest import run_python
    from tests.unit.test_prepare import float16_net

    fp32 = save(float16_net(), tmp_path / "half.onnx")
    code, stdout, stderr = calibtool("quantize", fp32, "int8.onnx", CALIB_SEED, 1.0, 8)
    assert code == 0, stderr
    assert one_json(stdout)["input_scale"] > 0
    run = tmp_path / "run"
    proc = run_python(["-m", "calibrun", "model=file", f"model.path={fp32}", "calibration=match", "batches=8",
                       "tracking=off", "recommend=off", "analysis=none", f"hydra.run.dir={run}",
                       f"cache.dir={calibtool.cache}"], tmp_path, clean_env())
    assert proc.returncode == 0, proc.stderr
    assert (run / "int8.onnx").read_bytes() == (calibtool.cwd / "int8.onnx").read_bytes()
    assert json.loads((run / "result.json").read_text())["metrics"]["cache_hit"] == 1  # the ranges calibtool wrote


@pytest.mark.slow
def test_every_model_of_onnxs_backend_tests_gives_a_json_or_one_line(tmp_path, calibtool):
    """The small models onnx ships for its backend tests (PyTorch exports of single layers, old opsets and IR
    versions, double and int64 inputs, several inputs, sequences, strings; installed with onnx itself): an outside
    tool's model that calibtool cannot quantise gets one line naming why and exit 1, never a traceback; one it
    quantises gives one JSON object and its error is measured (the rows 16 allow the batch a model pins, or one line
    says they do not). Before session 30, 22 of them failed where `python -m calibrun` prepared them: onnxruntime
    could not load their opset as given."""
    import glob

    import onnx.backend.test

    root = Path(onnx.backend.test.__file__).parent / "data"
    models = sorted(p for kind in ("pytorch-converted", "pytorch-operator", "simple")
                    for p in map(Path, glob.glob(str(root / kind / "*" / "model.onnx"))))
    assert len(models) > 100, root
    quantised, problems = 0, []
    for k, model in enumerate(models):
        name = f"{model.parent.parent.name}/{model.parent.name}"
        code, stdout, stderr = calibtool("quantize", model, f"m{k}.onnx", 1, 1.0, 2)
        lines = message_lines_of(stderr)
        if code == 0:
            quantised += 1
            one_json(stdout)
            code, stdout, stderr = calibtool("error", model, calibtool.cwd / f"m{k}.onnx", 3, 24)
            if code == 0:
                error = json.loads(stdout, parse_constant=_not_json)  # strict JSON: no NaN, no Infinity
                assert error["max_abs_error"] is None or error["max_abs_error"] >= 0, name
                assert (error["max_abs_error"] is None) == ("not all finite" in stderr), name  # sqrt of a negative
                continue
            lines = message_lines_of(stderr)
        if code != 1 or "Traceback" in stderr or len(lines) != 1 or stdout:
            problems.append((name, code, stderr[-500:]))
        elif f"onnxruntime cannot load {model}:" in lines[0]:  # as given: refused before the preparation converts it
            problems.append((name, "refused as given", lines[0]))
    assert not problems, problems
    assert quantised > len(models) // 2  # most are float models of one input the lab rule feeds


def _not_json(word: str):
    raise AssertionError(f"{word} is not JSON")


def message_lines_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("calibtool: error:")]
