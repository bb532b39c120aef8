"""calibrun.model.graph's look-ups on a float graph: the tensor a per-output metric is computed on, and what feeds
it (the recommendations' nodes_to_exclude candidate keeps the culprits upstream of the verdict's metric)."""

from __future__ import annotations

import onnx
from onnx import helper

from tests.unit.test_segments import _model


def test_a_part_metric_is_computed_from_its_concat_input_and_what_feeds_it(tmp_path):
    """calibrun.model.graph.metric_tensor / upstream: `out.y.concat1.sqnr_db` is the Concat's second input (through
    a Transpose), and only the nodes feeding it are upstream of it; a task metric names no tensor."""
    from calibrun.measure.errors import metric_key
    from calibrun.model.graph import metric_tensor, upstream

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
