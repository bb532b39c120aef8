"""Candidates screened on a spread of the evaluation rows, the best measured again on every row
(calibrun.analysis.recommend.screen_rows / confirmed, calibrun.analysis.evaluate.Evaluator.subset)."""

import numpy as np
import pytest

from calibrun.analysis.evaluate import Evaluator
from calibrun.analysis.recommend import SCREEN_MIN_ROWS, confirmed, energy, screen_rows
from calibrun.measure import verdict


def test_a_ratio_of_energies_is_screened_on_a_share_of_the_rows_and_a_count_of_decisions_on_all():
    assert screen_rows(None, 256, 6, energy=True) == 43  # six candidates: about one pass over the 256 rows in all
    assert screen_rows(None, 48, 6, energy=True) == SCREEN_MIN_ROWS  # never fewer than one evaluation batch
    assert screen_rows(None, 12, 6, energy=True) == 12  # nor more than there are
    assert screen_rows(None, 256, 6, energy=False) == 256  # decisions: every row
    assert screen_rows(5, 256, 6, energy=False) == 5  # recommend.rows set: the user's, either way
    assert screen_rows(500, 256, 6, energy=True) == 256
    assert (energy(verdict.IMAGE_PSNR), energy(verdict.AGREEMENT), energy(verdict.DICE)) == (True, False, False)
    assert energy(verdict.Rule("out.y.sqnr_db", "max", 20.0, 10.0, "{value}", worst=True))


def _entry(change, status, after):
    return {"change": change, "metric": "m", "before": 10.0, "after": after, "status_after": status, "helps": True,
            "rows": 16}


def test_the_best_screened_is_measured_on_every_row_and_one_that_no_longer_helps_there_is_not_offered():
    offered = [_entry("a", "ok", 40.0), _entry("b", "ok", 30.0), _entry("c", "degraded", 15.0)]
    on_every_row = {"a": {"after": 9.0, "status_after": "broken", "helps": False},  # worse than 12.0 on every row
                    "b": {"after": 25.0, "status_after": "ok", "helps": True}}
    asked = []

    def measure(entry):
        asked.append(entry["change"])
        return on_every_row[entry["change"]]

    found = confirmed(offered, measure, 12.0, 90, 1.0)
    assert asked == ["a", "b"]  # best first, until one still helps
    assert [e["change"] for e in found] == ["b", "c"]  # "a" made it worse on every row: no longer offered
    b, c = found
    assert (b["before"], b["after"], b["rows"], b["status_after"]) == (12.0, 25.0, 90, "ok")
    assert b["screened"] == {"rows": 16, "before": 10.0, "after": 30.0, "status_after": "ok"}
    assert (c["rows"], "screened" in c) == (16, False)  # left as screened, and says so
    assert (offered[0]["helps"], offered[0]["screened"]["after"]) == (False, 40.0)  # recommendations.json keeps it


def test_at_most_two_are_measured_again():
    offered = [_entry(name, "ok", 40.0 - i) for i, name in enumerate("abcd")]
    asked = []

    def measure(entry):
        asked.append(entry["change"])
        return {"after": 1.0, "status_after": "broken", "helps": False}

    assert [e["change"] for e in confirmed(offered, measure, 12.0, 90, 1.0)] == ["c", "d"]
    assert asked == ["a", "b"]


def test_one_that_drops_a_status_on_every_row_sends_the_next_to_be_measured_there():
    """16-bit weights screened ok and degraded on every row, both 16-bit changes screened ok: the second is measured
    on every row too, and ok there, it is the best."""
    offered = [_entry("w16", "ok", 23.6), _entry("both", "ok", 29.1), _entry("pc", "broken", 4.2)]
    on_every_row = {"w16": {"after": 25.2, "status_after": "degraded", "helps": True},
                    "both": {"after": 31.5, "status_after": "ok", "helps": True}}
    found = confirmed(offered, lambda e: on_every_row[e["change"]], 0.0, 36, 1.0)
    assert [(e["change"], e["rows"], e["status_after"]) for e in found] == [
        ("both", 36, "ok"), ("w16", 36, "degraded"), ("pc", 16, "broken")]


class _Store(Evaluator):
    """An Evaluator's bookkeeping of stored runs, no model."""

    def __init__(self, run_rows, state=None):
        self.run_rows, self.count, self.indices = list(run_rows), len(run_rows), None
        self.state = dict(state or {})


def test_a_subset_is_whole_runs_spread_over_the_store_or_the_first_ones_of_a_stream():
    store = _Store([16] * 16)  # 256 rows
    part = store.subset(43)
    assert (part.indices, part.rows, store.indices) == ([0, 8, 15], 48, None)  # a view
    assert store.subset(256) is store
    assert store.subset(1000) is store
    assert _Store([16, 2]).subset(16).indices == [0]
    assert _Store([16, 2]).subset(17) is not None  # both runs: itself
    stream = _Store([1] * 100, state={"h": "hn"})
    assert stream.subset(16).indices == list(range(16))  # a state is carried run to run: in order from the first
    uneven = _Store([3, 1, 1, 1, 10])
    assert uneven.subset(5).rows >= 5


def test_a_subset_measures_only_its_runs(tmp_path):
    """The subset's metrics are those of its runs alone: the same model measured on the view and on a store of just
    those rows agree."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    from calibrun.data.batches import EvalData

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    noisy = tmp_path / "noisy.onnx"
    add = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "c"], ["y"])],
                            "g", graph.input, graph.output,
                            [helper.make_tensor("c", TensorProto.FLOAT, [1], [0.01])])
    onnx.save(helper.make_model(add, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(noisy))
    with Evaluator(path, EvalData.from_arrays({"x": x}), 16) as everything:
        part = everything.subset(16)
        assert (part.indices, part.rows) == ([0], 16)
        on_part = part.model(noisy)
    with Evaluator(path, EvalData.from_arrays({"x": x[:16]}), 16) as first:
        alone = first.model(noisy)
    assert on_part["out.y.sqnr_db"] == pytest.approx(alone["out.y.sqnr_db"], rel=1e-12)
