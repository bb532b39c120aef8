"""memory.budget (calibrun.core.memory, docs/memory.md): parsing, `auto`, rows per run, the live-activation estimate
(from the model's structure without its weights' values), MinMax calibration and the analysis' evaluation in runs of
rows (the ranges and metrics of one run of the whole batch)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from calibrun.core import memory
from calibrun.core.errors import CalibrunError
from calibrun.core.memory import MiB
from calibrun.quant.calibrate import CalibrationSpec, run_calibration


@pytest.mark.parametrize(("value", "expected"), [
    ("auto", None), (None, None), (" AUTO ", None), (512, 512 * MiB), ("512", 512 * MiB), ("512MB", 512 * 10**6),
    ("1GiB", 2**30), ("1.5GB", 1_500_000_000), ("64mib", 64 * MiB)])
def test_parse_budget(value, expected):
    assert memory.parse_budget(value) == expected


@pytest.mark.parametrize("value", ["lots", "12XB", "-5", "0", "512KB", True])
def test_parse_budget_refuses_naming_the_key(value):
    with pytest.raises(CalibrunError, match="memory.budget"):
        memory.parse_budget(value)


def test_auto_is_the_floor_or_three_of_the_largest_activation():
    assert memory.resolve(None, {}) == memory.AUTO_FLOOR
    assert memory.resolve(None, {"a": 10 * MiB}) == memory.AUTO_FLOOR
    assert memory.resolve(None, {"a": 100 * MiB, "b": 200 * MiB}) == 600 * MiB
    assert memory.resolve(64 * MiB, {"a": 200 * MiB}) == 64 * MiB  # a set budget is the budget


def test_rows_for_shares_a_batch_evenly():
    assert memory.rows_for(100, 10, 16) == 8  # at most 10 per run: 2 runs of 8
    assert memory.rows_for(100, 1, 16) == 16  # fits: the whole batch
    assert memory.rows_for(100, 500, 16) == 1  # one row over the budget: one at a time
    assert memory.rows_for(100, 0, 16) == 16  # sizes unknown: as before
    assert memory.rows_for(100, 40, 3) == 2  # at most 2 per run: 2 runs, of 2 and 1


def _chain(width: int = 8) -> onnx.ModelProto:
    """x [N, 1, H, W] -> Conv to `width` channels -> Relu -> Conv to 1 channel -> y."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.normal(size=(width, 1, 3, 3)).astype(np.float32), "w1"),
             onnx.numpy_helper.from_array(rng.normal(size=(1, width, 3, 3)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["y"], pads=[1, 1, 1, 1])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, None, None])
    graph = helper.make_graph(nodes, "chain", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_sizes_and_live_bytes_follow_the_real_input_shape():
    model = _chain(width=8)
    feeds = {"x": np.zeros((5, 1, 32, 32), np.float32)}  # 5 rows: the sizes are of one
    sizes = memory.row_bytes(model, feeds)
    plane = 32 * 32 * 4
    assert sizes["a"] == sizes["b"] == 8 * plane
    assert sizes["y"] == plane
    # alive at once at most: x (the caller's feed, never freed) with a and b (a is freed after Relu, b after the
    # second Conv, which adds y: x + b + y is less)
    assert memory.live_bytes(model, feeds) == plane + 8 * plane + 8 * plane
    bigger = {"x": np.zeros((1, 1, 64, 64), np.float32)}
    assert memory.row_bytes(model, bigger)["a"] == 4 * sizes["a"]


def test_row_bytes_of_a_model_shape_inference_cannot_read_is_empty(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    assert memory.row_bytes(tmp_path / "bad.onnx", {"x": np.zeros((1, 3), np.float32)}) == {}


def test_minmax_calibration_in_runs_of_rows_keeps_the_ranges(tmp_path):
    path = tmp_path / "chain.onnx"
    onnx.save(_chain(width=8), str(path))
    rng = np.random.default_rng(1)
    batches = [rng.normal(size=(6, 1, 64, 64)).astype(np.float32) for _ in range(2)]
    whole_used, split_used = {}, {}
    whole, _ = run_calibration(path, batches, "x", CalibrationSpec(), budget=2**30, used=whole_used)
    split, _ = run_calibration(path, batches, "x", CalibrationSpec(), budget=MiB, used=split_used)
    assert whole_used["calibration_rows_per_run"] == 6
    assert split_used["calibration_rows_per_run"] < 6  # ~0.27 MB live per row (x2): 1 MiB holds 1
    assert split_used["budget_bytes"] == MiB
    assert whole.keys() == split.keys()
    for name in whole:  # exact minima and maxima of the same values, up to the kernels' rounding per batch size
        np.testing.assert_allclose(split[name].range_value, whole[name].range_value, rtol=1e-6, atol=1e-6)


def test_structure_keeps_the_graph_and_shapes_without_the_weights_values(tmp_path):
    from calibrun.model.structure import KEEP_BYTES, structure

    path = tmp_path / "chain.onnx"
    wide = _chain(width=256)  # w1 and w2 hold 256*9 floats each (9 KB): above KEEP_BYTES
    onnx.save(wide, str(path))
    hollow = structure(path)
    assert [n.op_type for n in hollow.graph.node] == ["Conv", "Relu", "Conv"]
    for tensor in hollow.graph.initializer:
        assert list(tensor.dims) in ([256, 1, 3, 3], [1, 256, 3, 3])
        assert tensor.ByteSize() < KEEP_BYTES
        assert not tensor.raw_data
        assert not tensor.float_data
    # the sizes are those of shape inference over the whole model
    feeds = {"x": np.zeros((4, 1, 32, 32), np.float32)}
    inferred = onnx.shape_inference.infer_shapes(_with_input_shape(wide, [1, 1, 32, 32]))
    expected = {v.name: int(np.prod([d.dim_value for d in v.type.tensor_type.shape.dim])) * 4
                for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)}
    assert memory.row_bytes(path, feeds) == expected
    # read again when the file changes
    onnx.save(_chain(width=8), str(path))
    assert [list(t.dims) for t in structure(path).graph.initializer] == [[8, 1, 3, 3], [1, 8, 3, 3]]
    assert structure(path).graph.initializer[0].ByteSize() > 8 * 9 * 4  # small: values kept


def _with_input_shape(model: onnx.ModelProto, shape: list[int]) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", TensorProto.FLOAT, shape))
    return copy


def test_evaluator_keeps_a_batch_over_the_budget_as_runs_of_rows(tmp_path):
    """The analysis' Evaluator runs what evaluate runs: a batch whose rows exceed memory.budget in runs of fewer rows
    (one reference file each), with the same metrics up to the kernels' rounding."""
    from calibrun.analysis.evaluate import Evaluator
    from calibrun.data import EvalData

    path = tmp_path / "chain.onnx"
    onnx.save(_chain(width=8), str(path))
    rng = np.random.default_rng(2)
    feeds = {"x": rng.normal(size=(12, 1, 64, 64)).astype(np.float32)}
    labels = np.arange(12)
    noisy = tmp_path / "noisy.onnx"
    model = _chain(width=8)
    for tensor in model.graph.initializer:
        values = onnx.numpy_helper.to_array(tensor)
        tensor.CopyFrom(onnx.numpy_helper.from_array((values * 1.01).astype(np.float32), tensor.name))
    onnx.save(model, str(noisy))
    results = {}
    for budget in (2**30, MiB):
        with Evaluator(path, EvalData.from_arrays(feeds, labels), 6, budget=budget) as ev:
            files = ev.count  # runs stored (each a file, or held in memory when small)
            stored = sum(int(ev.batches.batch(i)[3]) for i in range(ev.count))
            results[budget] = (files, stored, ev.model(noisy))
    assert results[2**30][:2] == (2, 12)  # 12 rows in batches of 6
    assert results[MiB][0] > 2  # ~0.27 MB live per row (x2): 1 MiB holds 1 row a run
    assert results[MiB][1] == 12
    whole, split = results[2**30][2], results[MiB][2]
    assert whole.keys() == split.keys()
    for key in whole:
        assert split[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7)


def test_shape_inference_sees_the_feed_as_it_is_run_not_one_row(monkeypatch):
    """A model whose rows are frames of a sequence (a convolution over them) can be invalid at one row, where onnx's
    shape inference aborted the process (madmom's onset CNN): the inputs are pinned to the feed's own shapes, and
    the sizes divided by its rows."""
    seen = []
    infer = memory.shape_inference.infer_shapes

    def spy(model, **kwargs):
        seen.append([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])
        return infer(model, **kwargs)

    monkeypatch.setattr(memory.shape_inference, "infer_shapes", spy)
    feeds = {"x": np.zeros((5, 1, 32, 32), np.float32)}
    sizes = memory.row_bytes(_chain(width=8), feeds)
    assert seen == [[5, 1, 32, 32]]
    assert sizes["a"] == 8 * 32 * 32 * 4  # one row's
