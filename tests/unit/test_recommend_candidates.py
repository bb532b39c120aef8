"""Which changes calibrun.analysis.recommend measures, written as the overrides a user types."""

import math
import threading
from types import SimpleNamespace

import pytest

from calibrun.analysis.recommend import (
    RUN_SECONDS,
    Candidate,
    _each,
    candidates,
    changes_of,
    combined,
    combined_members,
)
from calibrun.quant.quantize import QuantOptions

CONF = SimpleNamespace(methods=["percentile", "entropy"], culprits=2)
DIAGNOSIS = {"culprits": [{"tensor": "a", "node": "Concat_1", "float_nodes": ["Reshape_2"]},
                          {"tensor": "b", "node": "Conv_3", "consumers": ["Relu_4"]},
                          {"tensor": "c", "node": "Conv_9", "float_nodes": []}]}


def typed(names):
    """Quantised nodes as quantised_nodes gives them: name -> op type (read off the name here)."""
    return {name: name.split("_")[0] for name in names}


NODES = typed({"Concat_1", "Reshape_2", "Conv_3", "Relu_4", *(f"Conv_{i}" for i in range(10, 106))})  # 100


def changes(found):
    return [c.change for c in found]


def test_qdq_candidates_from_the_same_ranges_and_other_methods():
    found = candidates(QuantOptions(), "qdq", "minmax", DIAGNOSIS, CONF, quantised=NODES)
    assert changes(found) == ["quant.per_channel=true", "quant.activation_type=QInt16", "quant.weight_type=QInt16",
                              "quant.activation_type=QInt16 quant.weight_type=QInt16",
                              "quant.nodes_to_exclude=[Concat_1,Reshape_2,Conv_3,Relu_4]",
                              "quant.op_types_to_quantize=[Conv]", "method=percentile", "method=entropy"]
    assert found[1].options.activation_type == "QInt16"
    assert found[1].method is None
    # both 16-bit changes as one candidate: either alone is bounded by the other's rounding error
    assert found[3].options == QuantOptions(activation_type="QInt16", weight_type="QInt16")
    assert found[4].options.nodes_to_exclude == ("Concat_1", "Reshape_2", "Conv_3", "Relu_4")
    assert found[3].masked
    assert not any(c.masked for c in found[:3])
    assert found[5].options == QuantOptions(op_types_to_quantize=("Conv",))
    assert found[6].method == "percentile"
    assert found[6].options == QuantOptions()


def test_a_job_calibrated_with_another_method_measures_the_default_minmax_once():
    """An unseen protein classifier calibrated with entropy (its narrower ranges clip) was offered 74 widened ranges,
    degraded, where `method=minmax` with both 16-bit types made it ok: the default method is a candidate wherever the
    job chose another, whatever recommend.methods says, and never twice nor for a MinMax job."""
    def methods(method, listed):
        found = candidates(QuantOptions(), "qdq", method, None, SimpleNamespace(methods=listed, culprits=2),
                           quantised=NODES)
        return [c.method for c in found if c.method is not None]

    assert methods("entropy", []) == ["minmax"]
    assert methods("percentile", ["entropy"]) == ["entropy", "minmax"]
    assert methods("entropy", ["minmax", "percentile"]) == ["minmax", "percentile"]
    assert methods("minmax", []) == []
    assert methods("minmax", ["entropy"]) == ["entropy"]


def test_the_matrix_ops_alone_only_where_other_ops_are_quantised_and_the_user_set_no_op_types():
    def matrix(options, quantised):
        return [c for c in changes(candidates(options, "qdq", "minmax", None, CONF, quantised=quantised))
                if c.startswith("quant.op_types_to_quantize")]

    mixed = typed({"MatMul_1", "Gemm_2", "Add_3", "Softmax_4", "ConvTranspose_5"})
    assert matrix(QuantOptions(), mixed) == ["quant.op_types_to_quantize=[ConvTranspose,Gemm,MatMul]"]
    assert matrix(QuantOptions(), typed({"MatMul_1", "Conv_2"})) == []  # nothing else is quantised
    assert matrix(QuantOptions(), typed({"Add_1", "Mul_2"})) == []  # no matrix op
    assert matrix(QuantOptions(op_types_to_quantize=("MatMul", "Add")), mixed) == []  # the user's choice
    qop = candidates(QuantOptions(format="qoperator"), "qoperator", "minmax", None, CONF, quantised=mixed)
    matrix_qdq = [c for c in qop if "quant.op_types_to_quantize" in c.change]  # a QOperator job's: in QDQ form
    assert [c.change for c in matrix_qdq] == ["format=qdq quant.op_types_to_quantize=[ConvTranspose,Gemm,MatMul]"]
    assert matrix_qdq[0].options == QuantOptions(format="qdq", op_types_to_quantize=("ConvTranspose", "Gemm",
                                                                                     "MatMul"))


def test_qoperator_gets_16_bit_as_qdq_and_a_set_option_is_not_proposed_again():
    """onnxruntime's QLinear ops are 8-bit only: a QOperator job's 16-bit candidates are the same computation in QDQ
    form (`format=qdq` with them; three unseen models' QOperator jobs had per-channel weights alone to try), and a
    combination with them keeps that format."""
    options = QuantOptions(format="qoperator", per_channel=True)
    found = candidates(options, "qoperator", "entropy", DIAGNOSIS, CONF, quantised=NODES)
    assert changes(found) == ["format=qdq quant.activation_type=QInt16", "format=qdq quant.weight_type=QInt16",
                              "format=qdq quant.activation_type=QInt16 quant.weight_type=QInt16",
                              "format=qdq quant.op_types_to_quantize=[Conv]", "method=percentile",
                              "method=minmax"]  # (an entropy job's: the default method too)
    assert found[0].options == QuantOptions(format="qdq", per_channel=True, activation_type="QInt16")
    assert found[2].masked
    assert changes_of({"change": found[2].change}) == ["format=qdq", "quant.activation_type=QInt16",
                                                       "quant.weight_type=QInt16"]
    plain = candidates(QuantOptions(format="qoperator"), "qoperator", "minmax", None, CONF, quantised=NODES)
    both = combined([plain[0], plain[1]], QuantOptions(format="qoperator"))  # per-channel with QDQ 16-bit weights...
    assert both.change == "quant.per_channel=true format=qdq quant.activation_type=QInt16"
    assert both.options == QuantOptions(format="qdq", per_channel=True, activation_type="QInt16")  # ...in QDQ
    uint = candidates(QuantOptions(activation_type="QUInt8"), "qdq", "minmax", None, CONF, quantised=NODES)
    assert "quant.activation_type=QUInt16" in changes(uint)


def test_reduce_range_is_a_candidate_only_where_the_int8_kernels_can_saturate():
    plain = changes(candidates(QuantOptions(), "qdq", "minmax", None, CONF, quantised=NODES))
    assert "quant.reduce_range=true" not in plain
    found = candidates(QuantOptions(), "qoperator", "minmax", None, CONF, quantised=NODES, saturates=True)
    assert changes(found)[:2] == ["quant.per_channel=true", "quant.reduce_range=true"]
    assert found[1].options == QuantOptions(reduce_range=True)
    already = candidates(QuantOptions(reduce_range=True), "qdq", "minmax", None, CONF, quantised=NODES,
                         saturates=True)
    assert "quant.reduce_range=true" not in changes(already)
    both = combined([found[1], found[0]], QuantOptions())
    assert both.change == "quant.reduce_range=true quant.per_channel=true"
    assert both.options == QuantOptions(reduce_range=True, per_channel=True)


def test_user_exclusions_are_kept_and_a_model_that_would_be_mostly_float_gets_no_exclusion():
    options = QuantOptions(nodes_to_exclude=("Conv_3",))
    found = candidates(options, "qdq", "minmax", DIAGNOSIS, CONF, quantised=NODES)
    assert "quant.nodes_to_exclude=[Conv_3,Concat_1,Reshape_2,Relu_4]" in changes(found)
    few = typed({"Concat_1", "Reshape_2", "Conv_3", "Relu_4", "Conv_10", "Conv_11", "Conv_12", "Conv_13"})
    small = candidates(QuantOptions(), "qdq", "minmax", DIAGNOSIS, CONF, quantised=few)  # 4 of 8 nodes: half
    assert not [c for c in changes(small) if c.startswith("quant.nodes_to_exclude")]
    # a recurrent export: quantize_static quantised only the two ops around its LSTMs; the culprits' nodes are both
    # (their float consumers are not quantised: only the quantised ones count)
    rnn = candidates(QuantOptions(), "qdq", "minmax", DIAGNOSIS, CONF, quantised=typed({"Concat_1", "Conv_3"}))
    assert not [c for c in changes(rnn) if c.startswith("quant.nodes_to_exclude")]
    many = typed({"Concat_1", "Conv_3", *(f"Conv_{i}" for i in range(10, 16))})  # 2 of 8 quantised: a quarter
    assert "quant.nodes_to_exclude=[Concat_1,Reshape_2,Conv_3,Relu_4]" in changes(
        candidates(QuantOptions(), "qdq", "minmax", DIAGNOSIS, CONF, quantised=many))


def test_the_changes_that_helped_are_measured_together():
    found = candidates(QuantOptions(), "qdq", "minmax", DIAGNOSIS, CONF, quantised=NODES)
    by = {c.change: c for c in found}
    helped = [by["method=entropy"], by["quant.activation_type=QInt16"], by["method=percentile"],
              by["quant.per_channel=true"]]  # best first
    both = combined(helped, QuantOptions())
    assert both.change == "method=entropy quant.activation_type=QInt16 quant.per_channel=true"
    assert both.method == "entropy"
    assert both.options == QuantOptions(activation_type="QInt16", per_channel=True)
    assert combined(helped[:1], QuantOptions()) is None
    overlapping = combined([by["quant.activation_type=QInt16 quant.weight_type=QInt16"],
                            by["quant.activation_type=QInt16"]], QuantOptions())
    assert overlapping.change == "quant.activation_type=QInt16 quant.weight_type=QInt16"  # each change once
    matrix = combined([by["quant.op_types_to_quantize=[Conv]"],
                       by["quant.activation_type=QInt16 quant.weight_type=QInt16"]], QuantOptions())
    assert matrix.options == QuantOptions(op_types_to_quantize=("Conv",), activation_type="QInt16",
                                          weight_type="QInt16")  # every option a member changes is carried


def test_best_first_is_the_best_status_then_fewest_changes_when_ok_and_the_best_value_short_of_it():
    from calibrun.analysis.recommend import _keeps, _rank

    def change(letters):  # one override per letter, as a change joins them
        return " ".join(f"quant.{c}=1" for c in letters.split())

    entries = [{"change": change(c), "status_after": s, "after": v} for c, s, v in (
        ("a b c", "ok", 0.99), ("a b", "ok", 0.97), ("d", "degraded", 0.93), ("e", "degraded", 0.94),
        ("f g", "degraded", 0.945), ("h", "broken", 0.5), ("h i", "broken", 0.7))]
    assert [e["change"] for e in sorted(entries, key=lambda e: _rank(e, 1.0))] == \
        [change(c) for c in ("a b", "a b c", "f g", "e", "d", "h i", "h")]
    ok, fuller = {**entries[1], "helps": True}, {**entries[0], "helps": True}
    assert _keeps(ok, fuller, 1.0)  # any ok is ok: one change fewer wins
    worse = {"change": "x", "status_after": "degraded", "after": 0.9, "helps": True}
    assert not _keeps(worse, {**worse, "after": 0.91}, 1.0)  # short of ok, every bit counts
    assert _keeps({**worse, "after": 0.92}, {**worse, "after": 0.91}, 1.0)
    assert not _keeps({**ok, "helps": False}, fuller, 1.0)
    # values compared as the verdict shows them: 0.0003 dB is no reason for a sixth change
    from calibrun.measure.verdict import _sqnr_rule

    shown = _sqnr_rule("out.y.sqnr_db").shown
    five = {"change": change("a b c d e"), "status_after": "degraded", "after": 11.2611, "helps": True}
    six = {"change": change("a b c d e f"), "status_after": "degraded", "after": 11.2614, "helps": True}
    assert sorted([six, five], key=lambda e: _rank(e, 1.0))[0] is six  # every bit
    assert sorted([six, five], key=lambda e: _rank(e, 1.0, shown))[0] is five
    assert _keeps(five, six, 1.0, shown)
    assert not _keeps({**five, "after": 11.19}, six, 1.0, shown)


def test_the_exclusion_candidate_keeps_the_culprits_upstream_of_the_verdicts_metric(tmp_path):
    """Keeping a tensor in float changes only what is computed from it: for a metric on a Concat's input the
    culprits are the diagnosed tensors feeding that input and the Concat's output that carries it, by noise share; a
    task metric keeps the model's."""
    import json

    from onnx import helper

    from calibrun.analysis.recommend import culprits_upstream, diagnosed_rows
    from calibrun.measure.errors import metric_key
    from tests.unit.test_segments import _model

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Neg", ["x"], ["b"], name="neg"),
             helper.make_node("Abs", ["b"], ["c"], name="abs"),
             helper.make_node("Concat", ["a", "c"], ["y"], name="concat", axis=1)]
    path = _model(tmp_path, nodes, ["y"])
    table = tmp_path / "diagnostics.json"
    table.write_text(json.dumps({"tensor": ["x", "a", "b", "c", "y"], "node": [None, "relu", "neg", "abs", "concat"],
                                 "noise_share": [0.1, 0.5, 0.15, 0.05, 0.2]}))
    rows = culprits_upstream(diagnosed_rows(table), path, f"out.{metric_key('y')}.concat1.sqnr_db")
    # `a`, the largest share, feeds the other input; `y`, the Concat's output, rounds the part on the scale it shares
    # with `a` (a YOLOv8's boxes beside its scores)
    assert [r["tensor"] for r in rows] == ["y", "b", "x", "c"]
    table = diagnosed_rows(table)
    assert [r["tensor"] for r in culprits_upstream(table, path, "out.y.sqnr_db")] == ["a", "y", "b", "x", "c"]
    assert culprits_upstream(table, path, "task.top1_agreement") is None


def test_a_decision_metric_leaves_out_the_sound_tail_it_is_read_through(tmp_path):
    """An argmax or a threshold read from an output is the same read from the logits and probabilities behind it
    (order-keeping ops), and rounding them to a grid keeps the order: a sound one of them is no culprit of a
    decision metric, whatever its noise share. A clipped one stays (clipping puts the top values on one level), as
    does everything before the tail; only tensors upstream of the task's output count."""
    import json

    import onnx
    from onnx import helper

    from calibrun.analysis.recommend import culprits_upstream, diagnosed_rows
    from calibrun.measure.task_pick import order_kept_tail
    from tests.unit.test_segments import _model

    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("Neg", ["h"], ["logits"], name="fc"),
             helper.make_node("Softmax", ["logits"], ["p"], name="softmax", axis=1),
             helper.make_node("Identity", ["p"], ["y"], name="out"),
             helper.make_node("Abs", ["x"], ["z"], name="side")]
    path = _model(tmp_path, nodes, ["y", "z"])
    assert order_kept_tail(onnx.load(str(path)).graph, "y") == {"y", "p", "logits"}
    table = tmp_path / "diagnostics.json"

    def culprits(logits_verdict: str) -> list[str]:
        table.write_text(json.dumps({"tensor": ["x", "h", "logits", "p", "y", "z"],
                                     "node": [None, "relu", "fc", "softmax", "out", "side"],
                                     "noise_share": [0.05, 0.1, 0.2, 0.4, 0.05, 0.2],
                                     "verdict": ["sound", "sound", logits_verdict, "sound", "sound", "sound"]}))
        rows = diagnosed_rows(table)
        return [r["tensor"] for r in culprits_upstream(rows, path, "task.top1_agreement", decided_on="y")]

    assert culprits("sound") == ["h", "x"]
    assert culprits("clipping") == ["logits", "h", "x"]
    # no decision: the model's culprits stay
    assert culprits_upstream(diagnosed_rows(table), path, "task.psnr_db") is None


def test_a_combination_is_not_measured_when_fewer_changes_already_make_the_model_ok():
    """Among the changes that make a model ok the fewest rank first (_rank): a combination with more changes than an
    offered ok entry cannot be the best, so its evaluation pass is saved; with as few changes, or no ok entry, or an
    ok entry that does not help, it is measured."""
    from calibrun.analysis.recommend import Candidate, _outranked, _rank

    three = Candidate(("quant.per_channel=true", "quant.activation_type=QInt16", "quant.weight_type=QInt16"), None)
    pair = {"change": "quant.activation_type=QInt16 quant.weight_type=QInt16", "status_after": "ok", "after": 52.8,
            "helps": True}
    single = {"change": "quant.per_channel=true", "status_after": "degraded", "after": 12.9, "helps": True}
    assert _outranked(three, [single, pair]) is pair
    assert _outranked(Candidate(("a", "b"), None), [single, pair]) is None  # as few changes: could rank first
    assert _outranked(three, [single]) is None
    assert _outranked(three, [single, {**pair, "helps": False}]) is None
    # whatever the skipped combination would have measured, ok or not, it ranks below the entry that outranked it
    for status, value in (("ok", 99.0), ("degraded", 19.0), ("broken", 1.0)):
        trial = {"change": three.change, "status_after": status, "after": value}
        assert sorted([trial, pair], key=lambda e: _rank(e, 1.0))[0] is pair


def test_quantised_nodes_are_those_that_read_an_int8_value(tmp_path):
    """In a QDQ model: the nodes reading a DequantizeLinear's output (a MatMul and the Add after it), not the Q/DQ
    ops and not a node that reads float values only (the LSTM quantize_static leaves alone)."""
    import onnx
    from onnx import TensorProto, helper

    from calibrun.analysis.recommend import quantised_nodes

    scale = helper.make_tensor("s", TensorProto.FLOAT, [], [0.1])
    zero = helper.make_tensor("z", TensorProto.INT8, [], [0])
    w = helper.make_tensor("w", TensorProto.INT8, [4, 4], [1] * 16)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq"),
             helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wd"], name="wdq"),
             helper.make_node("MatMul", ["xd", "wd"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "xd"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu_float")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [scale, zero, w])
    path = tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert quantised_nodes(path) == {"matmul": "MatMul", "add": "Add"}


def test_with_a_state_fed_back_a_change_that_helped_per_call_is_combined_and_members_rank_per_call():
    """A diverged stream hides what one change does (DTLN's refine stage: per-channel weights left the streamed block
    at -15.1 dB, per call 12.8 -> 13.6 dB): with a state fed back a change that helped per call is a member, and the
    members rank by their per-call values; a change that helped neither way is not."""
    found = candidates(QuantOptions(), "qdq", "minmax", None, CONF, quantised=NODES)
    by = {c.change: c for c in found}
    act, chan, weight = (by[k] for k in ("quant.activation_type=QInt16", "quant.per_channel=true",
                                         "quant.weight_type=QInt16"))
    singles = [chan, act, weight]

    def entry(candidate, after, helps, per_call=None, per_call_helps=None):
        e = {"change": candidate.change, "after": after, "helps": helps, "status_after": "broken"}
        if per_call is not None:
            e.update(per_call_after=per_call, per_call_helps=per_call_helps)
        return e

    streamed = [entry(chan, -15.1, False, 13.6, True), entry(act, 13.5, True, 24.2, True),
                entry(weight, -15.2, False, 12.9, False)]
    assert changes(combined_members(singles, streamed, 1.0)) == [act.change, chan.change]  # per call: 24.2, 13.6
    alone = [{k: v for k, v in e.items() if not k.startswith("per_call")} for e in streamed]
    assert changes(combined_members(singles, alone, 1.0)) == [act.change]  # no state: what helped streamed only


def test_headroom_that_did_not_help_alone_joins_the_combination_as_both_16_bit_changes_do():
    """Rounding and clipping add: a range widened alone can lose (its grid coarser) while rounding dominates, and win
    once 16 bits go with it (a hand-landmark model: 0.41 -> 0.28 dB alone; with 16-bit types and per-channel weights
    7.5 -> 55.5 dB). Masked changes join the helping ones only where no change made the model ok."""
    diagnosis = {"culprits": [{"tensor": "t", "node": "n", "verdict": "clipping"}]}
    found = candidates(QuantOptions(), "qdq", "minmax", diagnosis, CONF, quantised=NODES, ranges={"t": (-1.0, 0.1)},
                       reach={"t": (-1.0, 5.0)})
    by = {c.change.split("=")[0]: c for c in found}
    chan, both, room = by["quant.per_channel"], next(c for c in found if len(c.changes) == 2), by["quant.tensor_ranges"]
    assert room.masked
    assert room.change == "quant.tensor_ranges={t:[-1.0,5.0]}"  # the low end, reached, not crossed: kept

    def entry(candidate, after, helps, status="broken"):
        return {"change": candidate.change, "after": after, "helps": helps, "status_after": status}

    measured = [entry(c, 0.3, False) for c in found]
    measured[found.index(chan)] = entry(chan, 6.6, True)
    measured[found.index(room)] = entry(room, 0.28, False)
    measured[found.index(both)] = entry(both, 0.35, False)
    members = changes(combined_members(found, measured, 1.0))
    assert members == [chan.change, both.change, room.change]
    measured[found.index(chan)] = entry(chan, 25.0, True, "ok")  # a single change is ok: nothing masked joins
    assert changes(combined_members(found, measured, 1.0)) == [chan.change]


def test_a_candidate_whose_worst_output_moved_names_it():
    """Under the worst-output rule a change can make another output the worst: `after` is that output's SQNR, and the
    entry said the job's output (fusion-surrogates' QLKNN: `out.efeITG.sqnr_db 0 -> 4.97` where 4.97 dB was
    efeTEM's). A task metric, or the same output, names nothing more."""
    from types import SimpleNamespace

    from calibrun.analysis.recommend import metric_after

    worst = SimpleNamespace(worst=True, metric="out.efeITG.sqnr_db")
    assert metric_after(worst, {"metric": "out.efeTEM.sqnr_db"}) == "out.efeTEM.sqnr_db"
    assert metric_after(worst, {"metric": "out.efeITG.sqnr_db"}) is None
    assert metric_after(worst, None) is None
    assert metric_after(SimpleNamespace(worst=False, metric="task.dice"), {"metric": "task.dice"}) is None


def test_a_clipping_culprit_gets_headroom_from_its_own_calibrated_range():
    """Clipping is a range's error: no precision change reaches it. The culprits the diagnosis calls clipping
    get their calibrated ranges with each end twice as far from zero (an end at zero stays), printed to 6 digits as
    the override a user types, the user's own ranges kept; no candidate without a clipping culprit or its range."""
    from calibrun.analysis.recommend import headroom

    assert headroom(-5.91234567, 5.9) == (-11.8247, 11.8)
    assert headroom(0.0, 3.3) == (0.0, 6.6)  # a Relu's output: no negative side to make room for
    assert headroom(0.5, 3.0) == (0.5, 6.0)
    assert headroom(-3.0, -1.0) == (-6.0, -1.0)
    clipping = {"culprits": [{"tensor": "a", "node": "Concat_1", "verdict": "clipping", "float_nodes": []},
                             {"tensor": "b/0", "node": "Conv_3", "verdict": "clipping", "consumers": []},
                             {"tensor": "c", "node": "Conv_9", "verdict": "clipping"}]}  # beyond culprits=2: a
    # range cut anywhere before the output is cut for good, so every clipping culprit is widened
    ranges = {"a": (0.0, 1.25), "b/0": (-2.0, 4.0), "c": (-1.0, 1.0)}
    user = QuantOptions(tensor_ranges={"z": [-1, 1]})
    found = [c for c in candidates(user, "qdq", "minmax", clipping, CONF, quantised=NODES, ranges=ranges)
             if c.changes[0].startswith("quant.tensor_ranges")]
    assert changes(found) == ["quant.tensor_ranges={a:[0.0,2.5],b/0:[-4.0,8.0],c:[-2.0,2.0],z:[-1.0,1.0]}"]
    assert found[0].options.tensor_ranges == {"z": (-1.0, 1.0), "a": (0.0, 2.5), "b/0": (-4.0, 8.0), "c": (-2.0, 2.0)}
    mixed = {"culprits": [{**c, "verdict": "mixed"} for c in clipping["culprits"]]}
    for diagnosis, known in ((mixed, ranges), (clipping, {}), (clipping, None)):
        assert not any("tensor_ranges" in c for c in changes(
            candidates(QuantOptions(), "qdq", "minmax", diagnosis, CONF, quantised=NODES, ranges=known)))
    # a combination carries the ranges with the other changes
    sixteen = candidates(QuantOptions(), "qdq", "minmax", None, CONF, quantised=NODES)[1]
    both = combined([found[0], sixteen], QuantOptions())
    assert both.options.tensor_ranges == found[0].options.tensor_ranges
    assert both.options.activation_type == "QInt16"



def test_headroom_reaches_what_the_evaluation_reached_and_a_clipping_output_is_widened_too():
    """An end the values crossed goes twice as far from zero at least; where the evaluation rows reached further
    (diagnostics.json's eval_min, eval_max), the end goes there (a hand model's presence logit: [-9.84, 0.119]
    calibrated, 12.85 reached). An end the rows stayed inside stays: it clipped nothing, and moving it only coarsens
    the grid (an input of mean-subtracted pixels, which cannot go under its calibrated floor). An output the
    diagnosis calls clipping is widened with the culprits, though its own pair adds no noise (its input was cut
    first); one that overflows is not (no range cures it); one whose rows stayed inside both ends adds nothing."""
    from calibrun.analysis.recommend import headroom

    assert headroom(-9.837, 0.119, (-3.0, 12.85)) == (-9.837, 12.85)  # the low end was not crossed: kept
    assert headroom(-9.837, 0.119, (-10.0, 0.1)) == (-19.674, 0.119)  # crossed just past: twice as far
    assert headroom(0.0, 0.53, (0.0, 1.0)) == (0.0, 1.06)  # doubling already reaches it
    assert headroom(-123.0, -64.0, (-123.0, 151.0)) == (-123.0, 151.0)  # an end under zero crossed: to the reach
    assert headroom(-123.68, 151.06, (-123.68, 200.0)) == (-123.68, 302.12)  # a floor reached, not crossed: kept
    assert headroom(-1.0, 1.0, (-math.inf, math.nan)) == (-2.0, 2.0)  # no finite reach: doubling alone
    assert headroom(-1.0, 1.0) == (-2.0, 2.0)  # no reach known
    assert headroom(-1.0, 1.0, (-0.5, 1.0)) is None  # nothing crossed: nothing to widen
    diagnosis = {"culprits": [{"tensor": "logit", "node": "Gemm_1", "verdict": "clipping"},
                              {"tensor": "inside", "node": "Gemm_2", "verdict": "clipping"}],
                 "clipping_outputs": [{"tensor": "presence", "verdict": "clipping"},
                                      {"tensor": "hot", "verdict": "overflow"}]}
    ranges = {"logit": (-9.837, 0.119), "presence": (0.0, 0.53), "hot": (0.0, 1.0), "inside": (-1.0, 1.0)}
    reach = {"logit": (-3.0, 12.85), "presence": (0.0, 1.0), "hot": (0.0, 9.0), "inside": (-1.0, 1.0)}
    found = [c for c in candidates(QuantOptions(), "qdq", "minmax", diagnosis, CONF, quantised=NODES, ranges=ranges,
                                   reach=reach) if c.changes[0].startswith("quant.tensor_ranges")]
    assert changes(found) == ["quant.tensor_ranges={logit:[-9.837,12.85],presence:[0.0,1.06]}"]
    reach["logit"] = reach["presence"] = (0.0, 0.1)
    assert not [c for c in candidates(QuantOptions(), "qdq", "minmax", diagnosis, CONF, quantised=NODES,
                                      ranges=ranges, reach=reach) if c.changes[0].startswith("quant.tensor_ranges")]


def _singles():
    return [Candidate((f"quant.c{k}=true",), QuantOptions()) for k in range(4)] + \
        [Candidate(("method=entropy",), QuantOptions(), method="entropy")]


def _timed(per_run: float):
    """A stand-in for Evaluator.model's timing: the first candidate's 100 runs took `per_run` seconds each inside
    onnxruntime."""
    def fill(timed):
        if timed is not None:
            timed.update(runs=100, inside=100 * per_run)
    return fill


def test_candidates_measured_two_at_once_keep_their_order_and_a_method_is_measured_alone_after_them():
    """`_each` with two at once: the first candidate alone and timed (its runs long enough inside onnxruntime), then the
    others two at a time, every entry in the candidates' order, each handed on in that order as soon as it and
    those before it are measured, each quantisation alone (under the lock), two measurements overlapping, each
    session with half of the intra-op threads; the other calibration method alone after them, on every thread."""
    events, said, started = [], [], threading.Barrier(2, timeout=5)
    quantising_now = []
    fill = _timed(RUN_SECONDS)

    def measured_alone(candidate, index, threads=None, stop=None, quantising=None, timed=None):
        fill(timed)
        if quantising is not None:
            with quantising:
                quantising_now.append(index)
                assert len(quantising_now) == 1  # one quantisation at a time
                quantising_now.remove(index)
            if index < 3:
                started.wait()  # 1 and 2 are measured at the same time, or this times out
        events.append((index, threads, stop is not None, timed is not None))
        return {"change": candidate.change, "index": index}

    entries, at_once = _each(_singles(), measured_alone, lambda e: said.append(e["index"]) or e, at_once=2,
                             threads=4)
    assert [e["index"] for e in entries] == said == [0, 1, 2, 3, 4]
    assert at_once == 2
    assert events[0] == (0, None, False, True)  # alone, timed, every thread
    assert {e for e in events if 0 < e[0] < 4} == {(i, 2, True, False) for i in (1, 2, 3)}
    assert events[-1] == (4, None, False, False)  # the method: alone, after the others, the job's own threads


def test_candidates_one_at_a_time_where_two_do_not_fit_or_the_first_candidates_runs_are_too_short():
    """Where two do not fit (`at_once` 1), or the first candidate's runs took under RUN_SECONDS each in onnxruntime
    (each run's bookkeeping holds the interpreter: the lab MLP's 16-row runs, 0.014 ms), one after the other."""
    for at_once, share in ((1, 1.0), (2, 0.9 * RUN_SECONDS)):
        calls = []
        fill = _timed(share)

        def measured_alone(candidate, index, threads=None, stop=None, quantising=None, timed=None, calls=calls,
                           fill=fill):
            fill(timed)
            calls.append((index, threads, stop, quantising))
            return {"index": index}

        entries, used = _each(_singles(), measured_alone, lambda e: e, at_once=at_once, threads=0)
        assert [e["index"] for e in entries] == [0, 1, 2, 3, 4]
        assert calls == [(k, None, None, None) for k in range(5)]
        assert used == 1


def test_an_interrupt_stops_the_other_measurement_between_its_runs():
    """An exception that reaches `_each` (an interrupt raised in the job's thread, or in a measurement) sets the
    stop event the other measurement checks before each run, so it ends at its next run instead of its last."""
    seen, running = {}, threading.Event()
    fill = _timed(1.0)

    def measured_alone(candidate, index, threads=None, stop=None, quantising=None, timed=None):
        fill(timed)
        if index == 1:
            assert running.wait(timeout=5)
            raise KeyboardInterrupt
        if index == 2:
            running.set()
            seen["stopped"] = stop.wait(timeout=5)  # the other one: stopped within a run's time
        return {"index": index}

    with pytest.raises(KeyboardInterrupt):
        _each(_singles()[:3], measured_alone, lambda e: e, at_once=2, threads=2)
    assert seen == {"stopped": True}


def test_the_evaluators_stop_ends_a_measurement_before_its_next_run(tmp_path):
    """Evaluator.model with `stop` set raises Stopped (a BaseException: no handler of a candidate's own errors
    takes it for the model's) before the first run, and measures as before without it; `timed` gets how many runs
    the session made and the seconds inside them."""
    from calibrun.analysis.evaluate import Evaluator, Stopped
    from calibrun.data import lab_evaluation
    from calibrun.lab.model import write_lab_model
    from calibrun.model import open_float_model

    fp32 = write_lab_model(tmp_path / "lab.onnx")
    evaluation = lab_evaluation(open_float_model(fp32), 7, 32)
    with Evaluator(fp32, evaluation, 8) as evaluator:
        stop, timed = threading.Event(), {}
        assert evaluator.model(fp32, 1, stop, timed)["max_abs_error"] == 0.0
        assert timed["runs"] == 4  # 32 rows in runs of 8
        assert timed["inside"] > 0
        assert evaluator.largest_run()[1] == 8
        stop.set()
        with pytest.raises(Stopped):
            evaluator.model(fp32, 1, stop)
        assert not issubclass(Stopped, Exception)


def test_a_change_pasted_on_a_shell_reaches_the_job_as_printed():
    """`shell` is what a user pastes after the command: a POSIX shell gives the job exactly the overrides of `change`.
    Unquoted, bash reads a headroom range's `{a:[..],b:[..]}` as brace expansion (22 words on an unseen voice
    detector), drops the backslash of its `\\:` escapes and ends the command at a tf2onnx name's `;`."""
    import shutil
    import subprocess

    diagnosis = {"culprits": [{"tensor": "Relu:0", "node": "n1", "verdict": "clipping"},
                              {"tensor": "a/b;c/d", "node": "n2", "verdict": "clipping"}]}
    found = candidates(QuantOptions(), "qdq", "minmax", diagnosis, CONF, quantised=NODES,
                       ranges={"Relu:0": (0.0, 1.0), "a/b;c/d": (-1.0, 1.0)}, reach={"Relu:0": (0.0, 3.0)})
    room = next(c for c in found if c.change.startswith("quant.tensor_ranges"))
    pair = next(c for c in found if len(c.changes) == 2)
    together = Candidate((*room.changes, *pair.changes, "quant.nodes_to_exclude=['a/b;c/d',n1]"), QuantOptions())
    assert room.change == r"quant.tensor_ranges={Relu\:0:[0.0,3.0],a/b%3Bc/d:[-2.0,2.0]}"
    assert pair.shell == pair.change  # nothing the shell reads: as it is
    assert together.shell != together.change
    shell = shutil.which("sh")
    for candidate in (room, pair, together):
        words = subprocess.run([shell, "-c", f"printf '%s\\n' {candidate.shell}"], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        assert words == list(candidate.changes)
    unquoted = subprocess.run(["bash", "-c", f"printf '%s\\n' {room.change}"], capture_output=True, text=True,
                              check=True).stdout.splitlines()
    assert unquoted != list(room.changes)  # what the quoting is for


def test_a_qoperator_models_integer_ops_are_read_by_the_op_each_computes(tmp_path):
    """quantised_nodes of a QOperator int8 model: its QLinear<op>, QGemm, ConvInteger and MatMulInteger nodes, by
    the op they compute (what the matrix-ops candidate in QDQ form is made from); its float ops are not among them."""
    import onnx
    from onnx import helper

    from calibrun.analysis.recommend import quantised_nodes

    ops = ("QLinearConv", "QLinearAdd", "QGemm", "MatMulInteger", "Relu", "DequantizeLinear")
    nodes = [helper.make_node(op, ["x"], [f"y{k}"], name=f"n{k}") for k, op in enumerate(ops)]
    nodes[1].domain = nodes[2].domain = "com.microsoft"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [], [])), tmp_path / "qop.onnx")
    assert quantised_nodes(tmp_path / "qop.onnx") == {"n0": "Conv", "n1": "Add", "n2": "Gemm", "n3": "MatMul"}
    found = candidates(QuantOptions(format="qoperator"), "qoperator", "minmax", None, CONF,
                       quantised=quantised_nodes(tmp_path / "qop.onnx"))
    assert "format=qdq quant.op_types_to_quantize=[Conv,Gemm,MatMul]" in changes(found)
