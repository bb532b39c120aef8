"""The calibration stage: the content-addressed range cache, hits and misses, corrupt files, chunking, races.

Everything runs real onnxruntime on the tiny lab model. The only thing patched is a spy around
`create_calibrator` / `InferenceSession` that counts calls, and on a cache hit asserts they are never made.
Expected values (spans, ranges) are rebuilt here from the lab data rule, not copied from a run.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto

from calibrun.core.errors import CalibrunError
from calibrun.lab.data import lab_batches
from calibrun.lab.model import write_lab_model
from calibrun.model import InputInfo, open_float_model
from calibrun.quant import calibrate
from calibrun.quant.cache import key_of as cache_key
from calibrun.quant.calibrate import (
    CalibrationCache,
    CalibrationSpec,
    cache_record,
    run_calibration,
)
from calibrun.quant.quantize import QuantOptions, quantize_lab

SEED, FACTOR, BATCHES = 4242, 1.0, 4
LAB_ROWS = 16  # docs/lab.md: one calibration batch is 16 rows
# max - min may be taken in float32 or float64 (both read "max(all batches) - min(all batches)"); anything
# wrong with the data itself (a batch missed, a value scaled) is far outside this.
SPAN_REL = 1e-6


# ---------------------------------------------------------------------------------------------- helpers


def model_input(path: Path) -> tuple[str, list]:
    """The graph input's name and dims, read with onnx (not through calibrun)."""
    model = onnx.load(str(path))
    value = model.graph.input[0]
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]
    return value.name, dims


def lab_arrays(model_path: Path, seed: int, factor: float, batches: int) -> list[np.ndarray]:
    """The lab calibration rule of docs/lab.md, rebuilt independently."""
    _, dims = model_input(model_path)
    features = dims[-1]
    rng = np.random.default_rng(seed)
    return [(rng.normal(0, 1, (LAB_ROWS, features)) * factor).astype(np.float32) for _ in range(batches)]


def lab_span(model_path: Path, seed: int, factor: float, batches: int) -> float:
    arrays = lab_arrays(model_path, seed, factor, batches)
    return float(max(a.max() for a in arrays)) - float(min(a.min() for a in arrays))


def ranges_of(tensors) -> dict[str, tuple[list, list]]:
    """TensorsData -> {tensor: (lowest, highest)} as plain lists, for exact comparison."""
    out = {}
    for name, data in tensors.items():
        lo, hi = data.range_value
        out[name] = (np.asarray(lo, dtype=np.float64).tolist(), np.asarray(hi, dtype=np.float64).tolist())
    return out


def cache_entries(folder: Path) -> list[str]:
    """Every entry of the cache folder, hidden temp files included."""
    return sorted(os.listdir(folder))


def calibrun_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "calibrun.quant.calibrate" and r.levelname == "WARNING"]


class CalibrationSpy:
    """Counts calibration passes (calibrun's create_calibrator) and inference sessions; can forbid them.

    quantize_static is always handed a cache file by calibrun, so its own calibration path must never run.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.calibrators = 0
        self.sessions = 0
        self.forbidden = False
        spy = self
        real_create = calibrate.create_calibrator

        def create_calibrator(*args, **kwargs):
            if spy.forbidden:
                raise AssertionError("create_calibrator was called on a cache hit")
            spy.calibrators += 1
            return real_create(*args, **kwargs)

        def ort_own_calibration(*args, **kwargs):
            raise AssertionError("quantize_static ran its own calibration pass")

        real_session = onnxruntime.InferenceSession

        class Session(real_session):
            def __init__(self, *args, **kwargs):
                if spy.forbidden:
                    raise AssertionError("an inference session was created on a cache hit")
                spy.sessions += 1
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(calibrate, "create_calibrator", create_calibrator)
        ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")
        monkeypatch.setattr(ort_quantize, "create_calibrator", ort_own_calibration)
        monkeypatch.setattr(onnxruntime, "InferenceSession", Session)

    def forbid(self) -> None:
        self.forbidden = True


@pytest.fixture
def spy(monkeypatch):
    return CalibrationSpy(monkeypatch)


@pytest.fixture(scope="module")
def lab_model(tmp_path_factory) -> Path:
    return write_lab_model(tmp_path_factory.mktemp("lab") / "fp32.onnx")


@pytest.fixture(scope="module")
def fp32(lab_model):
    return open_float_model(lab_model)


@pytest.fixture(scope="module")
def clean(fp32, tmp_path_factory) -> dict:
    """A clean miss run into a fresh cache: the reference every other run is compared with."""
    folder = tmp_path_factory.mktemp("clean")
    cache = CalibrationCache(folder / "cache")
    result = quantize_lab(fp32, folder / "int8.onnx", SEED, FACTOR, BATCHES, cache=cache)
    assert result["cache_hit"] is False
    return {
        "result": result,
        "model": (folder / "int8.onnx").read_bytes(),
        "key": result["cache_key"],
        "text": cache.path(result["cache_key"]).read_text(),
    }


def key_of(
    sha: str = "0" * 64,
    info: InputInfo | None = None,
    seed: int = SEED,
    factor: float = FACTOR,
    batches: int = BATCHES,
    spec: CalibrationSpec | None = None,
) -> str:
    info = info or InputInfo("x", TensorProto.FLOAT, ("N", 16))
    data = lab_batches(info, seed, factor, batches)
    return cache_key(cache_record(sha, data.identity(), info.name, spec or CalibrationSpec()))


# ------------------------------------------------------------------------------------- key sensitivity

DATA_CHANGES = {
    "model_bytes": {"sha": "1" * 64},
    "seed": {"seed": SEED + 1},
    "factor": {"factor": 0.2},
    "batches": {"batches": BATCHES + 1},
    "rows_per_batch": {"info": InputInfo("x", TensorProto.FLOAT, (4, 16))},
    "features": {"info": InputInfo("x", TensorProto.FLOAT, ("N", 8))},
    "input_name": {"info": InputInfo("input", TensorProto.FLOAT, ("N", 16))},
}


@pytest.mark.parametrize("change", DATA_CHANGES.values(), ids=DATA_CHANGES.keys())
def test_key_changes_with_model_and_data(change):
    assert key_of(**change) != key_of()


# (spec the base run used, spec of the second run): every pair must give a different key.
SPEC_CHANGES = {
    "method_entropy": ({}, {"method": "entropy"}),
    "method_percentile": ({}, {"method": "percentile"}),
    "method_distribution": ({}, {"method": "distribution"}),
    "symmetric_minmax": ({}, {"symmetric": True}),
    "symmetric_percentile": ({"method": "percentile"}, {"method": "percentile", "symmetric": False}),
    "symmetric_entropy": ({"method": "entropy"}, {"method": "entropy", "symmetric": True}),
    "moving_average": ({}, {"moving_average": True}),
    "averaging_constant": ({"moving_average": True}, {"moving_average": True, "averaging_constant": 0.5}),
    "percentile": ({"method": "percentile"}, {"method": "percentile", "percentile": 99.9}),
    "num_bins_entropy": ({"method": "entropy"}, {"method": "entropy", "num_bins": 256}),
    "num_bins_percentile": ({"method": "percentile"}, {"method": "percentile", "num_bins": 512}),
    "num_quantized_bins": ({"method": "entropy"}, {"method": "entropy", "num_quantized_bins": 64}),
    "scenario": ({"method": "distribution"}, {"method": "distribution", "scenario": "p3"}),
    "op_types": ({}, {"op_types": ("MatMul",)}),
    "op_types_subset": ({"op_types": ("MatMul", "Add")}, {"op_types": ("MatMul",)}),
    "chunk": ({}, {"chunk": 3}),
}


@pytest.mark.parametrize(("base", "changed"), SPEC_CHANGES.values(), ids=SPEC_CHANGES.keys())
def test_key_changes_with_calibration_options(base, changed):
    assert key_of(spec=CalibrationSpec(**changed)) != key_of(spec=CalibrationSpec(**base))


# Options that do not apply to the method (or do not change the data): the key must not move.
SPEC_SAME = {
    "percentile_under_minmax": ({}, {"percentile": 50.0}),
    "num_bins_under_minmax": ({}, {"num_bins": 7}),
    "num_quantized_bins_under_minmax": ({}, {"num_quantized_bins": 9}),
    "scenario_under_minmax": ({}, {"scenario": "p3"}),
    "averaging_constant_without_moving_average": ({}, {"averaging_constant": 0.5}),
    "moving_average_under_entropy": ({"method": "entropy"}, {"method": "entropy", "moving_average": True}),
    "percentile_under_entropy": ({"method": "entropy"}, {"method": "entropy", "percentile": 50.0}),
    "num_quantized_bins_under_percentile": (
        {"method": "percentile"},
        {"method": "percentile", "num_quantized_bins": 9},
    ),
    "symmetric_under_distribution": (
        {"method": "distribution"},
        {"method": "distribution", "symmetric": True},
    ),
    "op_types_order": ({"op_types": ("MatMul", "Add")}, {"op_types": ("Add", "MatMul")}),
    # unset options and onnxruntime's defaults give the same ranges, so the same key
    "symmetric_default_minmax": ({"method": "minmax"}, {"method": "minmax", "symmetric": False}),
    "symmetric_default_percentile": ({"method": "percentile"}, {"method": "percentile", "symmetric": True}),
    "bins_default_entropy": ({"method": "entropy"}, {"method": "entropy", "num_bins": 2048}),
    "bins_default_percentile": ({"method": "percentile"}, {"method": "percentile", "num_bins": 2048}),
    "bins_default_distribution": ({"method": "distribution"}, {"method": "distribution", "num_bins": 2048}),
}


@pytest.mark.parametrize(("base", "same"), SPEC_SAME.values(), ids=SPEC_SAME.keys())
def test_key_ignores_options_that_do_not_apply(base, same):
    assert key_of(spec=CalibrationSpec(**same)) == key_of(spec=CalibrationSpec(**base))


def test_key_ignores_how_the_factor_is_spelled():
    assert key_of(factor=1) == key_of(factor=1.0)


def test_key_changes_with_onnxruntime_version(monkeypatch):
    before = key_of()
    assert key_of() == before  # deterministic
    monkeypatch.setattr(calibrate.onnxruntime, "__version__", f"{onnxruntime.__version__}+other")
    assert key_of() != before


def test_key_file_records_what_went_into_the_key(tmp_path, fp32, lab_model):
    cache = CalibrationCache(tmp_path / "cache")
    result = quantize_lab(fp32, tmp_path / "int8.onnx", SEED, 0.2, BATCHES, cache=cache)
    key = result["cache_key"]
    key_file = cache.folder / f"{key}.key.json"
    text = key_file.read_text()
    assert "\n  " in text  # indented: readable by a person
    recorded = json.loads(text)
    assert recorded["key"] == key
    assert recorded["model_sha256"] == hashlib.sha256(lab_model.read_bytes()).hexdigest()
    name, dims = model_input(lab_model)
    assert recorded["data"]["seed"] == SEED
    assert recorded["data"]["factor"] == 0.2
    assert recorded["data"]["batches"] == BATCHES
    assert recorded["data"]["rows_per_batch"] == LAB_ROWS
    assert recorded["data"]["batch_shape"] == [LAB_ROWS, *dims[1:]]
    assert recorded["data"]["input"] == name
    assert recorded["calibration"]["method"] == "minmax"
    assert recorded["onnxruntime"] == onnxruntime.__version__
    # The key is the hash of exactly that record (minus the two fields added beside it).
    record = {k: v for k, v in recorded.items() if k not in {"key", "span"}}
    assert cache_key(record) == key
    assert record == json.loads(cache.path(key).read_text())["calibrun"]["record"]


# --------------------------------------------------------------------------- hits and misses via the engine


def test_second_call_is_a_hit_with_identical_results(tmp_path, fp32, spy):
    nocache = quantize_lab(fp32, tmp_path / "nocache.onnx", SEED, FACTOR, BATCHES, cache=None)
    assert nocache["cache_hit"] is False
    cache = CalibrationCache(tmp_path / "cache")
    miss = quantize_lab(fp32, tmp_path / "miss.onnx", SEED, FACTOR, BATCHES, cache=cache)
    assert miss["cache_hit"] is False
    assert spy.calibrators == 2  # the spy is wired: both runs above calibrated
    assert spy.sessions >= 2
    key = miss["cache_key"]
    assert cache_entries(cache.folder) == sorted([f"{key}.json", f"{key}.key.json", f"{key}.lock"])

    spy.forbid()
    hit = quantize_lab(fp32, tmp_path / "hit.onnx", SEED, FACTOR, BATCHES, cache=cache)
    assert hit["cache_hit"] is True
    assert hit["cache_key"] == miss["cache_key"] == nocache["cache_key"]
    for field in ("input_scale", "input_zero_point", "span", "batches", "ops", "bytes"):
        assert hit[field] == miss[field] == nocache[field], field
    miss_bytes = (tmp_path / "miss.onnx").read_bytes()
    assert (tmp_path / "hit.onnx").read_bytes() == miss_bytes
    assert (tmp_path / "nocache.onnx").read_bytes() == miss_bytes


def test_cached_input_range_is_what_the_graph_pins(tmp_path, fp32, lab_model):
    cache = CalibrationCache(tmp_path / "cache")
    result = quantize_lab(fp32, tmp_path / "int8.onnx", SEED, FACTOR, BATCHES, cache=cache)
    raw = json.loads(cache.path(result["cache_key"]).read_text())
    name, _ = model_input(lab_model)
    lo = raw["data"][name]["lowest"]["data"][0]
    hi = raw["data"][name]["highest"]["data"][0]
    arrays = lab_arrays(lab_model, SEED, FACTOR, BATCHES)
    assert lo == float(min(a.min() for a in arrays))
    assert hi == float(max(a.max() for a in arrays))
    # QInt8 asymmetric over a range straddling zero: scale = (hi - lo) / 255.
    assert result["input_scale"] == pytest.approx((hi - lo) / 255, rel=1e-6)


def test_a_tensors_own_range_replaces_the_calibrated_one(tmp_path, fp32, lab_model):
    """quant.tensor_ranges: onnxruntime's TensorQuantOverrides rmin/rmax, from the same cached ranges (no calibration):
    the graph pins the range given; a name the model lacks, a bad range and QOperator are one-line errors."""
    from calibrun.quant.quantize import check_exclusions

    cache = CalibrationCache(tmp_path / "cache")
    name, _ = model_input(lab_model)
    wide = quantize_lab(fp32, tmp_path / "int8.onnx", SEED, FACTOR, BATCHES, cache=cache,
                        options=QuantOptions(tensor_ranges={name: [-3.0, 5.0]}))
    assert wide["cache_hit"] is False
    assert wide["input_scale"] == pytest.approx(8.0 / 255, rel=1e-6)
    again = quantize_lab(fp32, tmp_path / "again.onnx", SEED, FACTOR, BATCHES, cache=cache,
                         options=QuantOptions(tensor_ranges={name: [-1.5, 2.5]}))
    assert again["cache_hit"] is True  # a post-calibration option
    assert again["input_scale"] == pytest.approx(4.0 / 255, rel=1e-6)
    with pytest.raises(CalibrunError, match=r"quant.tensor_ranges: no tensor named 'xx' in the model \(closest"):
        check_exclusions(onnx.load(str(lab_model)), QuantOptions(tensor_ranges={"xx": [-1, 1]}))
    with pytest.raises(CalibrunError, match="tensor_ranges: 'x': must be \\[low, high\\], two finite numbers"):
        QuantOptions(tensor_ranges={"x": [1, float("inf")]})
    with pytest.raises(CalibrunError, match="tensor_ranges needs format=qdq"):
        QuantOptions(format="qoperator", tensor_ranges={"x": [-1, 1]})


QUANT_VARIANTS = {
    "format": QuantOptions(format="qoperator"),
    "weight_type": QuantOptions(weight_type="QInt16"),
    "per_channel": QuantOptions(per_channel=True),
    "nodes_to_exclude": QuantOptions(nodes_to_exclude=("fc2_matmul",)),
    "reduce_range": QuantOptions(reduce_range=True),
    "weight_symmetric": QuantOptions(weight_symmetric=False),
}


@pytest.mark.parametrize("options", QUANT_VARIANTS.values(), ids=QUANT_VARIANTS.keys())
def test_quant_options_reuse_the_calibration(tmp_path, fp32, spy, options):
    reference = quantize_lab(fp32, tmp_path / "ref.onnx", SEED, FACTOR, BATCHES, options=options,
                                    cache=None)
    cache = CalibrationCache(tmp_path / "cache")
    first = quantize_lab(fp32, tmp_path / "default.onnx", SEED, FACTOR, BATCHES, cache=cache)
    assert first["cache_hit"] is False

    spy.forbid()
    second = quantize_lab(fp32, tmp_path / "variant.onnx", SEED, FACTOR, BATCHES, options=options,
                                 cache=cache)
    assert second["cache_hit"] is True
    assert second["cache_key"] == first["cache_key"] == reference["cache_key"]
    variant = (tmp_path / "variant.onnx").read_bytes()
    assert variant != (tmp_path / "default.onnx").read_bytes()  # the option really changed the model
    assert variant == (tmp_path / "ref.onnx").read_bytes()  # ... exactly as an uncached run would
    assert second["input_scale"] == reference["input_scale"]


SIXTEEN = {
    "activations": QuantOptions(activation_type="QInt16"),
    "weights": QuantOptions(weight_type="QInt16"),
    "both, per channel": QuantOptions(activation_type="QInt16", weight_type="QInt16", per_channel=True),
    "a tensor": QuantOptions(tensor_types={"h": "QInt16"}),
}


@pytest.mark.parametrize("options", SIXTEEN.values(), ids=SIXTEEN.keys())
def test_sixteen_bits_raise_the_opset_on_the_graph_alone(tmp_path, fp32, monkeypatch, options):
    """16-bit types need opset 21: calibrun converts the private copy's graph (weights in its external data file)
    before quantize_static, which then converts nothing; the model is the one quantize_static's own conversion of
    the whole model gives (ResNet-50: 880 -> 520 MB at a 16-bit candidate, docs/memory.md)."""
    from calibrun.quant import quantize as quantize_module

    cache = CalibrationCache(tmp_path / "cache")
    quantize_lab(fp32, tmp_path / "default.onnx", SEED, FACTOR, BATCHES, cache=cache)
    converted = []
    real = onnx.version_converter.convert_version

    def recording(model, version):
        converted.append(max((len(t.raw_data) + 4 * len(t.float_data) for t in model.graph.initializer), default=0))
        return real(model, version)

    monkeypatch.setattr(onnx.version_converter, "convert_version", recording)
    ours = quantize_lab(fp32, tmp_path / "ours.onnx", SEED, FACTOR, BATCHES, options=options, cache=cache)
    assert converted, "no conversion to opset 21"
    assert max(converted) <= 1024  # only the small tensors the external data file does not take came along
    assert ours["cache_hit"] is True
    converted.clear()
    monkeypatch.setattr(quantize_module, "_opset_for_sixteen_bit", lambda path: None)
    quantize_lab(fp32, tmp_path / "theirs.onnx", SEED, FACTOR, BATCHES, options=options, cache=cache)
    assert max(converted) > 1024  # onnxruntime converts the model with its weights
    written = onnx.load(str(tmp_path / "ours.onnx"))
    assert next(o.version for o in written.opset_import if o.domain in ("", "ai.onnx")) == 21
    assert (tmp_path / "ours.onnx").read_bytes() == (tmp_path / "theirs.onnx").read_bytes()


MISSES = {
    "seed": {"seed": SEED + 1},
    "factor": {"factor": 0.2},
    "batches": {"batches": BATCHES + 1},
    "method": {"spec": CalibrationSpec(method="entropy")},
    "symmetric": {"spec": CalibrationSpec(symmetric=True)},
    "op_types": {"spec": CalibrationSpec(op_types=("MatMul",))},
    "chunk": {"spec": CalibrationSpec(chunk=1)},
}


@pytest.mark.parametrize("change", MISSES.values(), ids=MISSES.keys())
def test_changing_a_key_input_is_a_miss(tmp_path, fp32, spy, change):
    cache = CalibrationCache(tmp_path / "cache")
    args = {"seed": SEED, "factor": FACTOR, "batches": BATCHES}
    base = quantize_lab(fp32, tmp_path / "base.onnx", **args, cache=cache)
    other = quantize_lab(fp32, tmp_path / "other.onnx", **{**args, **change}, cache=cache)
    assert other["cache_hit"] is False
    assert other["cache_key"] != base["cache_key"]
    assert spy.calibrators == 2
    assert cache.path(other["cache_key"]).is_file()
    assert cache.path(base["cache_key"]).is_file()  # a miss for one key leaves the other alone
    spy.forbid()
    again = quantize_lab(fp32, tmp_path / "again.onnx", **args, cache=cache)
    assert again["cache_hit"] is True


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_calibrating_a_subset_of_op_types_quantises_only_those(tmp_path, fp32, fmt):
    spec = CalibrationSpec(op_types=("MatMul",))
    cache = CalibrationCache(tmp_path / "cache")
    result = quantize_lab(fp32, tmp_path / "a.onnx", SEED, FACTOR, BATCHES, spec=spec,
                                 options=QuantOptions(format=fmt), cache=cache)
    explicit = quantize_lab(fp32, tmp_path / "b.onnx", SEED, FACTOR, BATCHES, spec=spec,
                                   options=QuantOptions(format=fmt, op_types_to_quantize=("MatMul",)), cache=cache)
    assert explicit["cache_hit"] is True
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    ranges = json.loads(cache.path(result["cache_key"]).read_text())["data"]
    assert "y" not in ranges  # the final Add's output was not calibrated ...
    full = quantize_lab(fp32, tmp_path / "full.onnx", SEED, FACTOR, BATCHES,
                               options=QuantOptions(format=fmt), cache=None)
    assert result["ops"] != full["ops"]  # ... and only MatMul was quantised:
    assert result["ops"]["Add"] == full["ops"].get("Add", 0) + full["ops"].get("QLinearAdd", 0)  # Adds stay float
    assert {op for op in result["ops"] if op.startswith("QLinear")} <= {"QLinearMatMul"}
    assert result["input_scale"] == full["input_scale"]


def test_quantising_op_types_that_were_not_calibrated_is_a_clear_error(tmp_path, fp32):
    spec = CalibrationSpec(op_types=("MatMul",))
    options = QuantOptions(op_types_to_quantize=("MatMul", "Add"))
    with pytest.raises(CalibrunError, match="not calibrated"):
        quantize_lab(fp32, tmp_path / "a.onnx", SEED, FACTOR, BATCHES, spec=spec, options=options)
    assert not (tmp_path / "a.onnx").exists()


def test_model_bytes_decide_the_key_not_the_path(tmp_path, lab_model, spy):
    cache = CalibrationCache(tmp_path / "cache")
    copy = tmp_path / "copy.onnx"
    copy.write_bytes(lab_model.read_bytes())
    variant = tmp_path / "variant.onnx"
    model = onnx.load(str(lab_model))
    model.doc_string = "same graph, other bytes"
    onnx.save(model, str(variant))

    first = quantize_lab(open_float_model(lab_model), tmp_path / "a.onnx", SEED, FACTOR, BATCHES,
                                cache=cache)
    other = quantize_lab(open_float_model(variant), tmp_path / "b.onnx", SEED, FACTOR, BATCHES,
                                cache=cache)
    assert other["cache_hit"] is False
    assert other["cache_key"] != first["cache_key"]
    spy.forbid()
    same = quantize_lab(open_float_model(copy), tmp_path / "c.onnx", SEED, FACTOR, BATCHES,
                               cache=cache)
    assert same["cache_hit"] is True
    assert same["cache_key"] == first["cache_key"]


def test_onnxruntime_version_change_is_a_miss(tmp_path, fp32, monkeypatch):
    cache = CalibrationCache(tmp_path / "cache")
    first = quantize_lab(fp32, tmp_path / "a.onnx", SEED, FACTOR, BATCHES, cache=cache)
    other_version = f"{onnxruntime.__version__}+other"
    monkeypatch.setattr(calibrate.onnxruntime, "__version__", other_version)
    second = quantize_lab(fp32, tmp_path / "b.onnx", SEED, FACTOR, BATCHES, cache=cache)
    assert second["cache_hit"] is False
    assert second["cache_key"] != first["cache_key"]
    recorded = json.loads((cache.folder / f"{second['cache_key']}.key.json").read_text())
    assert recorded["onnxruntime"] == other_version


# ------------------------------------------------------------------------------------------- the span


@pytest.mark.parametrize(("seed", "factor", "batches"), [(SEED, 0.2, 3), (SEED, 10.0, 8), (7, 1.0, 1)])
def test_cached_span_is_the_lab_data_span(tmp_path, fp32, lab_model, spy, seed, factor, batches):
    expected = lab_span(lab_model, seed, factor, batches)
    cache = CalibrationCache(tmp_path / "cache")
    miss = quantize_lab(fp32, tmp_path / "a.onnx", seed, factor, batches, cache=cache)
    key = miss["cache_key"]
    assert miss["span"] == pytest.approx(expected, rel=SPAN_REL)
    assert json.loads(cache.path(key).read_text())["calibrun"]["span"] == pytest.approx(expected, rel=SPAN_REL)
    assert json.loads((cache.folder / f"{key}.key.json").read_text())["span"] == pytest.approx(
        expected, rel=SPAN_REL
    )
    record = json.loads(cache.path(key).read_text())["calibrun"]["record"]
    assert cache.load(key, record, "minmax") == pytest.approx(expected, rel=SPAN_REL)
    spy.forbid()
    hit = quantize_lab(fp32, tmp_path / "b.onnx", seed, factor, batches, cache=cache)
    assert hit["cache_hit"] is True
    assert hit["span"] == miss["span"]  # the cache returns exactly what it stored


# ---------------------------------------------------------------------------------------- corrupt files


def _edit(mutate):
    def corrupt(text: str) -> str:
        raw = json.loads(text)
        mutate(raw)
        return json.dumps(raw)  # NaN / Infinity are written as such, like a hand-edited file would be

    return corrupt


def _set(path: tuple, value):
    def mutate(raw):
        target = raw
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return _edit(mutate)


def _scale_x_lowest(raw):
    raw["data"]["x"]["lowest"]["data"] = [v * 0.5 for v in raw["data"]["x"]["lowest"]["data"]]


def _swap_x(raw):
    x = raw["data"]["x"]
    x["lowest"], x["highest"] = x["highest"], x["lowest"]


def _bump_seed(raw):
    raw["calibrun"]["record"]["data"]["seed"] += 1


CORRUPTIONS = {
    "truncated": lambda text: text[: len(text) // 2],
    "truncated_at_end": lambda text: text[:-1],
    "empty": lambda text: "",
    "binary": lambda text: "\x00\x01garbage\x7f",
    "json_list": lambda text: "[1, 2, 3]",
    "json_string": lambda text: '"ranges"',
    "json_null": lambda text: "null",
    "plain_onnxruntime_cache": _edit(lambda raw: raw.pop("calibrun")),
    "calibrun_block_not_a_dict": _set(("calibrun",), []),
    "wrong_method": _set(("calibration_method", "value"), "CalibrationMethod.Entropy"),
    "unknown_method": _set(("calibration_method", "value"), "CalibrationMethod.Bogus"),
    "nan_in_range": _set(("data", "x", "lowest", "data"), [math.nan]),
    "inf_in_range": _set(("data", "x", "highest", "data"), [math.inf]),
    "inverted_range": _edit(_swap_x),
    "no_ranges": _set(("data",), {}),
    "record_mismatch": _edit(_bump_seed),
    "record_other_onnxruntime": _set(("calibrun", "record", "onnxruntime"), "0.0.0"),
    "negative_span": _set(("calibrun", "span"), -1.0),
    "span_not_a_number": _set(("calibrun", "span"), "wide"),
    # Files that look fine to a shallow check but would crash quantize_static or pin wrong ranges:
    "smooth_quant_flag": _set(("smooth_quant",), True),
    "missing_tensor": _edit(lambda raw: raw["data"].pop("h")),
    "edited_range_value": _edit(_scale_x_lowest),
    "range_wrong_shape": _set(("data", "x", "lowest", "data"), [[-1.0, -2.0]]),
    "range_empty": _set(("data", "x", "lowest", "data"), []),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_corrupt_cache_file_warns_recomputes_and_is_replaced(tmp_path, fp32, clean, spy, caplog, corrupt):
    cache = CalibrationCache(tmp_path / "cache")
    cache.folder.mkdir(parents=True)
    path = cache.path(clean["key"])
    bad = corrupt(clean["text"])
    assert bad != clean["text"]
    path.write_text(bad)

    caplog.set_level("WARNING", logger="calibrun.quant.calibrate")
    result = quantize_lab(fp32, tmp_path / "int8.onnx", SEED, FACTOR, BATCHES, cache=cache)

    warnings = calibrun_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert path.name in warnings[0]
    assert result["cache_hit"] is False
    assert spy.calibrators == 1  # recomputed
    assert result["cache_key"] == clean["key"]
    assert result["input_scale"] == clean["result"]["input_scale"]
    assert result["span"] == clean["result"]["span"]
    assert (tmp_path / "int8.onnx").read_bytes() == clean["model"]
    # Replaced by a valid file: the same one a clean run writes, and the next run is a quiet hit.
    assert path.read_text() == clean["text"]
    assert cache_entries(cache.folder) == sorted([path.name, f"{clean['key']}.key.json", f"{clean['key']}.lock"])
    caplog.clear()
    spy.forbid()
    again = quantize_lab(fp32, tmp_path / "again.onnx", SEED, FACTOR, BATCHES, cache=cache)
    assert again["cache_hit"] is True
    assert calibrun_warnings(caplog) == []


def test_a_read_only_cache_serves_its_hits_and_calibrates_a_miss_without_storing(tmp_path, fp32, clean, spy,
                                                                                  caplog, monkeypatch):
    """A probe's read-only cache.dir: a miss calibrated, then failed writing the ranges, the work lost. Now a miss is
    calibrated into a temp folder and not stored, said once; the same model as a writable cache's; a hit is read.
    (os.access is mocked: this suite runs as root, whom file modes do not stop, and a read-only mount needs root.)"""
    from calibrun.quant import calibrate as calibrate_module

    cache = CalibrationCache(tmp_path / "cache")
    cache.folder.mkdir(parents=True)
    monkeypatch.setattr(calibrate_module.os, "access", lambda path, mode: False)
    caplog.set_level("WARNING", logger="calibrun.quant.calibrate")
    result = quantize_lab(fp32, tmp_path / "int8.onnx", SEED, FACTOR, BATCHES, cache=cache)
    assert result["cache_hit"] is False
    assert spy.calibrators == 1
    assert (tmp_path / "int8.onnx").read_bytes() == clean["model"]
    assert cache_entries(cache.folder) == []  # nothing written, no lock either
    assert [w for w in calibrun_warnings(caplog) if "is not writable" in w] == [
        f"calibration cache {cache.folder} is not writable: calibrating without storing these ranges"]
    cache.path(clean["key"]).write_text(clean["text"])  # a hit is read as from any cache
    spy.forbid()
    assert quantize_lab(fp32, tmp_path / "again.onnx", SEED, FACTOR, BATCHES, cache=cache)["cache_hit"] is True


def test_clean_cache_file_loads_without_warning(tmp_path, clean, caplog):
    cache = CalibrationCache(tmp_path)
    cache.folder.mkdir()
    cache.path(clean["key"]).write_text(clean["text"])
    record = json.loads(clean["text"])["calibrun"]["record"]
    caplog.set_level("WARNING", logger="calibrun.quant.calibrate")
    assert cache.load(clean["key"], record, "minmax") == clean["result"]["span"]
    assert cache.load(clean["key"], record, "entropy") is None  # asked for another method: unusable
    assert cache.load("0" * 32, record, "minmax") is None  # absent: a plain miss
    assert len(calibrun_warnings(caplog)) == 1


# ------------------------------------------------------------------------------------------- chunking


def test_chunked_minmax_equals_one_pass(lab_model):
    batches = 10
    name, _ = model_input(lab_model)
    info = open_float_model(lab_model).info
    data = lab_batches(info, SEED, FACTOR, batches)
    one_pass, span = run_calibration(lab_model, data, name, CalibrationSpec(chunk=batches))
    reference = ranges_of(one_pass)
    arrays = lab_arrays(lab_model, SEED, FACTOR, batches)
    assert reference[name] == ([float(min(a.min() for a in arrays))], [float(max(a.max() for a in arrays))])
    assert span == pytest.approx(lab_span(lab_model, SEED, FACTOR, batches), rel=SPAN_REL)
    for chunk in (1, 3, 64):
        tensors, chunk_span = run_calibration(lab_model, data, name, CalibrationSpec(chunk=chunk))
        assert ranges_of(tensors) == reference, chunk
        assert chunk_span == span


@pytest.mark.parametrize("method", ["entropy", "percentile", "distribution"])
@pytest.mark.parametrize("chunk", [3, 64])
def test_histogram_methods_are_deterministic_per_chunk(lab_model, method, chunk):
    info = open_float_model(lab_model).info
    data = lab_batches(info, SEED, FACTOR, 7)
    spec = CalibrationSpec(method=method, chunk=chunk)
    first, _ = run_calibration(lab_model, data, info.name, spec)
    second, _ = run_calibration(lab_model, data, info.name, spec)
    assert first.calibration_method == calibrate.METHODS[method]
    assert ranges_of(first) == ranges_of(second)
    assert info.name in ranges_of(first)
    for lo, hi in ranges_of(first).values():
        assert np.all(np.isfinite(lo))
        assert np.all(np.isfinite(hi))
        assert np.all(np.asarray(lo) <= np.asarray(hi))


@pytest.mark.parametrize("method", ["entropy", "percentile", "distribution"])
def test_histogram_methods_through_the_cache(tmp_path, fp32, spy, method):
    cache = CalibrationCache(tmp_path / "cache")
    spec = CalibrationSpec(method=method, chunk=2)
    miss = quantize_lab(fp32, tmp_path / "a.onnx", SEED, FACTOR, BATCHES, spec=spec, cache=cache)
    spy.forbid()
    hit = quantize_lab(fp32, tmp_path / "b.onnx", SEED, FACTOR, BATCHES, spec=spec, cache=cache)
    assert (miss["cache_hit"], hit["cache_hit"]) == (False, True)
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


# ---------------------------------------------------------------------------------------------- races

def test_nothing_is_written_beside_the_users_model(tmp_path, lab_model):
    """onnxruntime's shape inference writes and deletes `<model>-inferred.onnx` beside the path it is given;
    calibrun must hand it a private copy (else parallel jobs on one model delete each other's file)."""
    folder = tmp_path / "models"
    folder.mkdir()
    model = folder / "fp32.onnx"
    model.write_bytes(lab_model.read_bytes())
    sentinel = folder / "fp32-inferred.onnx"
    sentinel.write_text("a file of the user's")
    before = cache_entries(folder)
    for method in ("minmax", "entropy"):
        quantize_lab(open_float_model(model), tmp_path / f"{method}.onnx", SEED, FACTOR, BATCHES,
                            spec=CalibrationSpec(method=method), cache=CalibrationCache(tmp_path / "cache"))
    assert cache_entries(folder) == before
    assert sentinel.read_text() == "a file of the user's"




@pytest.mark.parametrize(("symmetric", "zero"), [(None, True), (True, True), (False, False)])
def test_weight_symmetric_sets_the_weights_zero_points(tmp_path, fp32, symmetric, zero):
    """quant.weight_symmetric: null is onnxruntime's default (symmetric QInt8 weights: zero point 0), false gives
    each weight its own [min, max] (a zero point off 0 for the lab's weights, whose ranges are not centred)."""
    import onnx
    from onnx import numpy_helper

    out = tmp_path / "int8.onnx"
    quantize_lab(fp32, out, SEED, FACTOR, BATCHES, options=QuantOptions(weight_symmetric=symmetric), cache=None)
    model = onnx.load(str(out))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    weights = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and inits.get(n.input[0]) is not None
               and inits[n.input[0]].dtype == np.int8 and inits[n.input[0]].ndim == 2]
    assert weights
    points = [int(inits[n.input[2]].reshape(-1)[0]) for n in weights]
    assert all(p == 0 for p in points) == zero, points


def test_quantisations_in_a_row_reuse_one_private_copy_per_type_width_and_write_the_same_models(tmp_path, fp32,
                                                                                                 monkeypatch):
    """Within reusing_copies (the recommendations, the repair, the fallback) quantize() copies a model once for 8-bit
    and once for 16-bit types, however many quantisations follow; each model is the one a fresh copy gives, and a
    changed model file gets a copy of its own."""
    from calibrun.quant import quantize as quantize_module

    cache = CalibrationCache(tmp_path / "cache")
    quantize_lab(fp32, tmp_path / "default.onnx", SEED, FACTOR, BATCHES, cache=cache)
    runs = [QuantOptions(), QuantOptions(activation_type="QInt16"), QuantOptions(per_channel=True),
            QuantOptions(weight_type="QInt16"), QuantOptions()]
    alone = []
    for i, options in enumerate(runs):
        quantize_lab(fp32, tmp_path / f"alone{i}.onnx", SEED, FACTOR, BATCHES, options=options, cache=cache)
        alone.append((tmp_path / f"alone{i}.onnx").read_bytes())
    copies = []
    real = quantize_module.private_model_copy

    def counted(path, folder):
        copies.append(Path(path).name)
        return real(path, folder)

    monkeypatch.setattr(quantize_module, "private_model_copy", counted)
    with quantize_module.reusing_copies():
        for i, options in enumerate(runs):
            quantize_lab(fp32, tmp_path / f"reused{i}.onnx", SEED, FACTOR, BATCHES, options=options, cache=cache)
            assert (tmp_path / f"reused{i}.onnx").read_bytes() == alone[i]
        assert len(copies) == 2  # one 8-bit copy, one 16-bit copy
        os.utime(fp32.path, ns=(time.time_ns(), time.time_ns() + 10**9))  # the file changed: a new copy
        quantize_lab(fp32, tmp_path / "again.onnx", SEED, FACTOR, BATCHES, cache=cache)
        assert len(copies) == 3
    assert quantize_module._COPIES is None


def _x_to_y(tmp_path, nodes) -> Path:
    """A model of `nodes` from input x [N, 2] to output y [N, 2], saved as tmp_path/m.onnx."""
    from onnx import helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), str(model))
    return model


def test_a_range_never_filled_is_said_to_be_empty_and_an_infinite_one_a_mask(tmp_path, caplog):
    """Both stay in float, but the line names each cause: a tensor that held no value (an empty pad: its range stays
    lowest +inf, highest -inf, as OpenSpindleNet's output stage's was) is not an attention mask's -inf. And the cache
    keeps both: neither is a damaged file."""
    from onnx import helper
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

    from calibrun.quant import quantize

    model = _x_to_y(tmp_path, [helper.make_node("Relu", ["x"], ["pad"], name="pad_node"),
                                helper.make_node("Add", ["pad", "x"], ["mask"], name="mask_node"),
                                helper.make_node("Relu", ["mask"], ["y"], name="out")])
    f = np.float32
    tensors = TensorsData(CalibrationMethod.MinMax, {
        "x": TensorData(lowest=np.array(-1, f), highest=np.array(1, f)),
        "pad": TensorData(lowest=np.array(np.inf, f), highest=np.array(-np.inf, f)),
        "mask": TensorData(lowest=np.array(-np.inf, f), highest=np.array(0, f))})
    cache = CalibrationCache(tmp_path)
    cache.folder.mkdir(parents=True)
    ranges = calibrate.write_ranges(cache.path("k" * 32), tensors, {"r": 1}, 2.0)
    with caplog.at_level("WARNING", logger="calibrun"):
        # both are measurements, not damage: the cache is used again (an empty tensor's range made every later job
        # recalibrate, "range ... is NaN or not ordered")
        assert cache.load("k" * 32, {"r": 1}, "minmax") == 2.0
        assert caplog.records == []
        nodes_kept = quantize.unbounded_nodes(onnx.load(str(model)).graph, ranges)
    assert set(nodes_kept) == {"pad_node", "mask_node", "out"}
    line = " ".join(r.getMessage() for r in caplog.records)
    assert ("1 tensor(s) have a calibrated range that is not finite (mask: a mask's -inf? attention, a masked "
            "pooling)") in line
    assert "1 tensor(s) held no value in calibration (pad: empty, as a pad of length 0 is)" in line
    assert "the 3 node(s) that read or write them stay in float" in line


def test_an_input_whose_data_reaches_infinitys_stand_in_is_called_an_outlier_not_a_mask(tmp_path, caplog):
    """A probe's image classifier calibrated on data with one value of 1e38: the line blamed an attention mask. The
    graph's input itself is named as the data holding such values; a computed tensor keeps the mask's question."""
    from onnx import helper
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

    from calibrun.quant import quantize

    model = _x_to_y(tmp_path, [helper.make_node("Relu", ["x"], ["h"], name="relu"),
                               helper.make_node("Relu", ["h"], ["y"], name="out")])
    f = np.float32
    tensors = TensorsData(CalibrationMethod.MinMax, {
        "x": TensorData(lowest=np.array(-1, f), highest=np.array(1e38, f)),
        "h": TensorData(lowest=np.array(0, f), highest=np.array(3e38, f))})
    ranges = calibrate.write_ranges(tmp_path / ("o" * 32 + ".json"), tensors, {"r": 1}, 2.0)
    with caplog.at_level("WARNING", logger="calibrun"):
        quantize.unbounded_nodes(onnx.load(str(model)).graph, ranges)
    line = " ".join(r.getMessage() for r in caplog.records)
    assert "1 tensor(s) have a calibrated range that reaches 1.7e+38 or beyond, infinity's stand-in (h: the " \
           "calibration data of input(s) x reaches 1e+38: an outlier in the data?)" in line
    assert "attention mask" not in line


def test_an_input_calibrated_on_one_value_is_said_but_not_a_constant_or_a_fed_back_state(tmp_path, caplog):
    """Calibration rows of silence (an unseen voice detector's log-mel windows, all 0): the input's range is empty
    and onnxruntime takes scale 1.0; the job says the rows held one value. A constant input and a state the job
    feeds back from an output are not the data's rows: nothing said of them. Token ids of padding only (an unseen
    character BERT) are said too, read from the rows where no calibrated input varied, and rows that are one row
    repeated (black frames, one value a channel after normalisation: an unseen classifier)."""
    from types import SimpleNamespace

    from onnx import TensorProto
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

    from calibrun.job import say_flat_inputs
    from calibrun.model import InputInfo

    f = np.float32
    tensors = TensorsData(CalibrationMethod.MinMax, {
        name: TensorData(lowest=np.array(low, f), highest=np.array(high, f))
        for name, low, high in (("mel", 0, 0), ("gain", 2.5, 2.5), ("sr", 16000, 16000), ("state", 0, 0),
                                ("x", -1, 1))})
    ranges = calibrate.write_ranges(tmp_path / ("r" * 32 + ".json"), tensors, {"r": 1}, 2.0)
    inputs = [InputInfo(name, TensorProto.FLOAT, ("n", 4)) for name in ("mel", "gain", "sr", "state", "x")]
    data = SimpleNamespace(constants={"sr": object()}, state={"state": "state_out"})
    with caplog.at_level("WARNING", logger="calibrun"):
        assert say_flat_inputs(ranges, inputs, data) == ["mel", "gain"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("calibration data: input 'mel' is 0 in every calibration row: no variation of it was "
                               "calibrated (silence? a blank image? padding?), so its scale (onnxruntime's 1.0 for an "
                               "empty range) and the ranges after it come from that one value")
    assert lines[1].startswith("calibration data: input 'gain' is 2.5 in every calibration row")
    assert "1.0 for an empty range" not in lines[1]
    # token ids (not calibrated: read from the rows), only where no calibrated input varied
    batches = {"ids": [np.zeros((2, 4), np.int64), np.zeros((1, 4), np.int64)],
               "lens": [np.full(2, 4, np.int64), np.array([3])]}
    rows = SimpleNamespace(constants={}, state={}, columns=batches, arrays=lambda name: iter(batches[name]))
    ids = [InputInfo(name, TensorProto.INT64, ("n", 4)) for name in ("ids", "lens")]
    caplog.clear()
    with caplog.at_level("WARNING", logger="calibrun"):
        assert say_flat_inputs(ranges, [ids[0], inputs[0]], rows) == ["mel", "ids"]  # mel is flat too: read them
        assert say_flat_inputs(ranges, [*ids, inputs[0]], rows) == ["mel"]  # lens varies: ids one value beside it
        assert say_flat_inputs(ranges, [ids[0], inputs[-1]], rows) == []  # x varied: ids are not read
        assert say_flat_inputs(ranges, ids[:1], rows) == ["ids"]
    assert [r.getMessage().split(": no variation")[0] for r in caplog.records][-1] == \
        "calibration data: input 'ids' is 0 in every calibration row"
    assert "so the ranges after it come from that one value" in caplog.records[-1].getMessage()
    # black frames after a mean/std normalisation: one value a channel, so the range is not empty, but every row is
    # the same row (an unseen classifier's calibration); rows on axis 1 compared along it; a varying input is silent
    black = np.array([-2.118, -2.036, -1.804], np.float32)[:, None]  # [3 channels, 1 pixel]
    frames = {"img": [np.repeat(black[None], 2, 0), np.repeat(black[None], 3, 0)],
              "seq": [np.stack([np.zeros(3), np.ones(3)], 1), np.zeros((3, 1))]}  # [3, rows]: rows on axis 1
    frame_ranges = calibrate.write_ranges(tmp_path / ("f" * 32 + ".json"), TensorsData(CalibrationMethod.MinMax, {
        "img": TensorData(lowest=np.array(-2.118, f), highest=np.array(-1.804, f)),
        "seq": TensorData(lowest=np.array(0, f), highest=np.array(1, f))}), {"r": 1}, 2.0)
    source = SimpleNamespace(constants={}, state={}, columns=frames, axes={"img": 0, "seq": 1},
                             arrays=lambda name: iter(frames[name]))
    images = [InputInfo("img", TensorProto.FLOAT, ("n", 3, 1)), InputInfo("seq", TensorProto.FLOAT, (3, "n"))]
    caplog.clear()
    with caplog.at_level("WARNING", logger="calibrun"):
        assert say_flat_inputs(frame_ranges, images, source) == ["img"]
    assert caplog.records[-1].getMessage().startswith(
        "calibration data: every calibration row of input 'img' is the same row: no variation of it was calibrated "
        "(a blank image? one frame repeated?), so its scale and the ranges after it come from that one row")


def test_nodes_computing_in_float64_are_kept_in_float():
    """Calibration ranges float32 tensors only: a node reading or writing a float64 tensor has no range to be
    quantised with (swift-f0's Cast to float64, Softmax, Mul, ReduceSum and Exp)."""
    from onnx import helper

    from calibrun.quant.quantize import double_nodes

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Cast", ["r"], ["d"], to=TensorProto.DOUBLE, name="widen"),
         helper.make_node("Softmax", ["d"], ["p"], name="softmax")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("p", TensorProto.DOUBLE, [1, 4])],
        value_info=[helper.make_tensor_value_info("d", TensorProto.DOUBLE, [1, 4])])
    assert double_nodes(graph) == ["widen", "softmax"]
    graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    graph.value_info[0].type.tensor_type.elem_type = TensorProto.FLOAT
    assert double_nodes(graph) == []


def test_the_producers_of_tensors_onnxruntime_left_unwritten_are_read_from_its_error():
    """quantize_static's QOperator form of swift-f0 read two tensors no node wrote; their producers (not those already
    excluded) are kept in float on the next try; another error names none."""
    from onnx import helper

    from calibrun.quant.quantize import dangling_producers

    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["v429"], name="Transpose_333"),
         helper.make_node("Sigmoid", ["x"], ["v462"], name="Sigmoid_356"),
         helper.make_node("Relu", ["x"], ["v1"], name="Relu_1")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])], [])
    error = RuntimeError("Invalid model with unknown initializers/tensors.{'v429', 'v462'}")
    assert dangling_producers(graph, error, ()) == ["Transpose_333", "Sigmoid_356"]
    assert dangling_producers(graph, error, ("Sigmoid_356",)) == ["Transpose_333"]
    assert dangling_producers(graph, RuntimeError("something else"), ()) == []
    assert dangling_producers(graph, None, ()) == []


def test_a_range_calibrated_as_nan_is_refused_in_one_line_after_the_data_was_said(tmp_path):
    """fp32 computes NaN on every calibration row (x - x divided by itself: 0 / 0, as a masked mean over a row of
    padding only is): onnxruntime's MinMax gives the tensor a NaN range, and quantize_static stopped with
    "compute_scale_zp: scale issue", naming nothing. The job's line names the first NaN tensor in the graph's order,
    its op and the tensors after it; what the job says of its calibration data (`calibrated_said`) is said first;
    nothing is written; and the cache keeps the NaN range (a measurement, not damage) for the next run's same line."""
    from onnx import helper

    from calibrun.quant.quantize import quantize_with

    model = _x_to_y(tmp_path, [helper.make_node("Sub", ["x", "x"], ["zero"], name="zero"),
                                helper.make_node("Div", ["zero", "zero"], ["nan"], name="nan"),
                                helper.make_node("Add", ["nan", "x"], ["y"], name="out")])
    fp32 = open_float_model(model)
    cache = CalibrationCache(tmp_path / "cache")
    written = []
    for _attempt in range(2):
        said = []
        with pytest.raises(CalibrunError) as caught:
            quantize_with(fp32, tmp_path / "int8.onnx", lab_batches(fp32.lab_input(), 1, 1.0, 2), cache=cache,
                          calibrated_said=said.append)
        assert str(caught.value).startswith(
            "the calibrated range of tensor 'nan' (written by Div node 'nan') is NaN, and so is that of 1 tensor(s) "
            "after it (y): the fp32 model computes NaN there on the calibration rows")
        assert len(said) == 1  # the ranges, handed over before quantising
        assert said[0].is_file()
        assert not (tmp_path / "int8.onnx").exists()
        written.append({p.name: p.stat().st_mtime_ns for p in cache.folder.glob("*.json")})
    assert len(written[0]) == 2  # the ranges and their key record, calibrated once: the second attempt read them
    assert written[1] == written[0]
