"""memory.budget (calibrun.core.memory, docs/memory.md): parsing, `auto`, rows per run, the live-activation estimate,
and MinMax calibration in runs of rows (the ranges of one run of the whole batch)."""

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
