"""The calibration session's outputs written into reused buffers (calibrun.model.sessions.ReusedOutputs).

The reference is onnxruntime's own path: its histogram calibrator's `collect_data` on the plain session, where
every batch's outputs are fresh arrays from `InferenceSession.run`, with the same collector (calibrun's) and the
same chunks. Every range and histogram must be bit-identical, on the lab model for entropy, percentile and
distribution, chunk 1 and 2, with a last smaller batch (a shape change); the trained detector's case (real photos)
is in tests/e2e/test_histogram_trained.py. No mocks: real onnxruntime sessions throughout.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper
from onnxruntime.quantization.calibrate import create_calibrator

from calibrun.model import open_float_model, private_model_copy
from calibrun.model.sessions import ReusedOutputs
from calibrun.quant.calibrate import (
    CalibrationSpec,
    _fast_collector,
    _lean_session,
    run_calibration,
)

METHODS = ("entropy", "percentile", "distribution")


def lab_data(features: int, rows=(16, 16, 16, 16, 7), seed: int = 4242) -> list[np.ndarray]:
    """Lab-like batches; the last one smaller (its outputs have other shapes: the buffers must be rebound)."""
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 1, (n, features)).astype(np.float32) for n in rows]


def reference(model: Path, batches, input_name: str, spec: CalibrationSpec, tmp: Path) -> dict:
    """onnxruntime's collect_data on the plain session (fresh outputs per batch), calibrun's collector, by chunks."""
    calibrator = create_calibrator(private_model_copy(model, tmp), spec.op_types_calibrated(),
                                   augmented_model_path=str(tmp / "reference.onnx"),
                                   calibrate_method=spec.calibrate_method, extra_options=spec.calibrator_options())
    _lean_session(calibrator, 0)
    _fast_collector(calibrator, 0)
    assert not isinstance(calibrator.infer_session, ReusedOutputs)

    class Reader:
        def __init__(self):
            self.pos, self.end = 0, 0

        def get_next(self):
            if self.pos >= self.end:
                return None
            self.pos += 1
            return {input_name: batches[self.pos - 1]}

    reader = Reader()
    chunk = spec.batches_per_collect
    for start in range(0, len(batches), chunk):
        reader.pos, reader.end = start, min(start + chunk, len(batches))
        calibrator.collect_data(reader)
    return dict(calibrator.compute_data().items())


def assert_identical(ours: dict, theirs: dict) -> None:
    """Every attribute onnxruntime's TensorData holds (range, histogram and edges, avg/std), bit for bit."""
    assert sorted(ours) == sorted(theirs)
    for name, data in theirs.items():
        mine = ours[name]
        assert mine._attrs == data._attrs, name
        assert {"lowest", "highest"} <= set(data._attrs), name
        for attr in data._attrs:
            assert np.array_equal(getattr(mine, attr), getattr(data, attr), equal_nan=True), (name, attr)


@pytest.mark.parametrize("chunk", [1, 2])
@pytest.mark.parametrize("method", METHODS)
def test_lab_ranges_identical_to_fresh_outputs(lab_model, tmp_path, method, chunk):
    spec = CalibrationSpec(method=method, chunk=chunk)
    features = open_float_model(lab_model).inputs[0].shape[-1]
    batches = lab_data(features)
    ours, _ = run_calibration(lab_model, batches, "x", spec)
    theirs = reference(lab_model, batches, "x", spec, tmp_path)
    assert len(theirs) >= 4  # the graph input, both MatMuls' outputs, ...
    assert_identical(dict(ours.items()), theirs)


def lab_session(lab_model: Path, tmp: Path):
    """The lab's augmented histogram session (every calibrated tensor, the graph input among them, an output)."""
    spec = CalibrationSpec(method="entropy")
    calibrator = create_calibrator(private_model_copy(lab_model, tmp), spec.op_types_calibrated(),
                                   augmented_model_path=str(tmp / "augmented.onnx"),
                                   calibrate_method=spec.calibrate_method, extra_options=spec.calibrator_options())
    _lean_session(calibrator, 0)
    return calibrator.infer_session


def test_buffers_are_reused_and_hold_each_batch(lab_model, tmp_path):
    session = lab_session(lab_model, tmp_path)
    names = [o.name for o in session.get_outputs()]
    assert "x" in names  # the graph input is a calibrated output: onnxruntime does not write a bound buffer there
    reused = ReusedOutputs(session)
    a, b, small = lab_data(open_float_model(lab_model).inputs[0].shape[-1], rows=(16, 16, 5))
    first = reused.run(None, {"x": a})
    first_ids = [id(v) for v in first]
    first_ptrs = [v.ctypes.data for n, v in zip(names, first, strict=True) if n != "x"]
    second = reused.run(None, {"x": b})
    for name, mine, fresh in zip(names, second, session.run(None, {"x": b}), strict=True):
        assert np.array_equal(mine, fresh), name
    assert [v.ctypes.data for n, v in zip(names, second, strict=True) if n != "x"] == first_ptrs  # no new arrays
    assert second[names.index("x")] is not first[names.index("x")]
    assert np.array_equal(second[names.index("x")], b)
    # a smaller batch: new buffers of its shapes, then reused for it
    third = reused.run(None, {"x": small})
    for name, mine, fresh in zip(names, third, session.run(None, {"x": small}), strict=True):
        assert mine.shape == fresh.shape, name
        assert np.array_equal(mine, fresh), name
    fourth = reused.run(None, {"x": small[::-1].copy()})
    assert [id(v) for n, v in zip(names, fourth, strict=True) if n != "x"] == \
        [id(v) for n, v in zip(names, third, strict=True) if n != "x"]
    assert len(reused.held) == 1  # one buffer set: memory does not grow with batches
    assert first_ids != [id(v) for v in third]


def test_buffer_sets_alternate_for_a_chunk(lab_model, tmp_path):
    """chunk 2: onnxruntime holds both batches' outputs until the chunk ends, so they must not share buffers."""
    session = lab_session(lab_model, tmp_path)
    names = [o.name for o in session.get_outputs()]
    reused = ReusedOutputs(session, sets=2)
    a, b, c = lab_data(open_float_model(lab_model).inputs[0].shape[-1], rows=(16, 16, 16))
    out_a = reused.run(None, {"x": a})
    out_b = reused.run(None, {"x": b})
    for name, mine, fresh in zip(names, out_a, session.run(None, {"x": a}), strict=True):
        assert np.array_equal(mine, fresh), name  # still batch a's values after batch b ran
    reused.rewind()
    out_c = reused.run(None, {"x": c})
    relu = next(i for i, n in enumerate(names) if n != "x")
    assert out_c[relu] is out_a[relu]
    assert out_c[relu] is not out_b[relu]
    assert np.array_equal(out_c[relu], session.run(None, {"x": c})[relu])


def test_collector_keeps_no_reference_to_the_buffers(lab_model, tmp_path):
    spec = CalibrationSpec(method="percentile")
    calibrator = create_calibrator(private_model_copy(lab_model, tmp_path), spec.op_types_calibrated(),
                                   augmented_model_path=str(tmp_path / "augmented.onnx"),
                                   calibrate_method=spec.calibrate_method, extra_options=spec.calibrator_options())
    _lean_session(calibrator, 0)
    _fast_collector(calibrator, 0)
    reused = calibrator.infer_session = ReusedOutputs(calibrator.infer_session)
    batches = lab_data(open_float_model(lab_model).inputs[0].shape[-1], rows=(16, 16))

    class Reader:
        def __init__(self, batch):
            self.items = [{"x": batch}]

        def get_next(self):
            return self.items.pop() if self.items else None

    for batch in batches:
        calibrator.collect_data(Reader(batch))
    buffers = [v for v in reused.held[0][2]]
    assert calibrator.intermediate_outputs == []
    kept = [v for entry in calibrator.collector.histogram_dict.values() for v in entry if isinstance(v, np.ndarray)]
    assert kept
    assert not any(np.shares_memory(k, b) for k in kept for b in buffers)


def test_data_dependent_output_shape_falls_back_to_fresh_outputs(tmp_path):
    """An output whose shape follows the data (NonZero): a bound run would fail; the batch runs `session.run`
    instead, and so do the later ones, with the same outputs as the plain session."""
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Relu", ["x"], ["r"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("nz", TensorProto.INT64, [1, None]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    reused = ReusedOutputs(session)
    feeds = [np.array(v, np.float32) for v in ([1, 0, 2, -1], [0, 0, 3, 4], [5, 6, 7, 0], [0, 0, 0, 1])]
    for x in feeds:
        got = reused.run(None, {"x": x})
        for mine, fresh in zip(got, session.run(None, {"x": x}), strict=True):
            assert np.array_equal(mine, fresh)
    assert reused.reuse is False
