"""Per-tensor diagnostics on the lab's narrow / match / wide models, checked against independent computations."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from calibrun.core import files
from calibrun.core.errors import CalibrunError
from calibrun.lab.data import evaluation_rows
from calibrun.lab.model import LAB_INPUT, write_lab_model
from calibrun.measure.diagnosis import CLIP_THRESHOLD, COARSE_THRESHOLD, as_table, classify, classify_model, worst
from calibrun.measure.tensor_stats import tensor_diagnostics
from calibrun.model import open_float_model
from calibrun.quant.calibrate import CalibrationCache
from calibrun.quant.quantize import QuantOptions, quantize_lab
from tests.modelzoo import pinned_input_quant

FACTORS = {"narrow": 0.2, "match": 1.0, "wide": 10.0}
LAB_TENSORS = ["x", "h_mm", "h", "y_mm", "y"]  # the QDQ pairs quantize_static puts on the lab MLP (Relu fused)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The lab model, its narrow/match/wide QDQ models, their ranges files and the evaluation rows."""
    root = tmp_path_factory.mktemp("diag")
    fp32 = write_lab_model(root / "lab.onnx")
    model = open_float_model(fp32)
    cache = CalibrationCache(root / "cache")
    rows = evaluation_rows(model.info, 777, 256)
    runs = {}
    for name, factor in FACTORS.items():
        result = quantize_lab(model, root / f"int8_{name}.onnx", seed=4242, factor=factor, batches=64,
                                     cache=cache)
        ranges = cache.path(result["cache_key"])
        diags = tensor_diagnostics(fp32, result["out"], ranges, [{LAB_INPUT: rows}])
        runs[name] = {"path": Path(result["out"]), "ranges": ranges, "diags": diags}
    return {"root": root, "fp32": fp32, "model": model, "cache": cache, "rows": rows, "runs": runs}


def row(lab, name: str, tensor: str = LAB_INPUT) -> dict:
    return next(r for r in lab["runs"][name]["diags"] if r["tensor"] == tensor)


def test_every_quantised_activation_once_no_weights(lab):
    for run in lab["runs"].values():
        assert [r["tensor"] for r in run["diags"]] == LAB_TENSORS
        assert [r["role"] for r in run["diags"]] == ["input", "activation", "activation", "activation", "output"]
        assert all(r["qtype"] == "int8" and (r["qmin"], r["qmax"]) == (-128, 127) for r in run["diags"])


def test_narrow_input_clips(lab):
    narrow = row(lab, "narrow")
    assert narrow["clipped_fraction"] > 0
    assert classify(narrow) == "clipping"
    assert classify_model(lab["runs"]["narrow"]["diags"])["input"] == "clipping"


def test_wide_input_is_coarse(lab):
    wide, match = row(lab, "wide"), row(lab, "match")
    assert wide["clipped_fraction"] == 0
    assert wide["grid_used"] < match["grid_used"] / 4
    assert classify(wide) == "coarse"


def test_match_input_is_sound(lab):
    match = row(lab, "match")
    assert classify(match) == "sound"
    assert classify_model(lab["runs"]["match"]["diags"])["input"] == "sound"


def test_sqnr_orders_the_lab(lab):
    narrow, match, wide = (row(lab, name)["sqnr_db"] for name in ("narrow", "match", "wide"))
    assert narrow < match
    assert wide < match
    # the graph input is the same tensor before and after its pair: both SQNRs agree there
    assert row(lab, "match")["qdq_sqnr_db"] == pytest.approx(match)


def test_sqnr_recomputed_for_the_input(lab):
    """fp32 rows vs their quantise-dequantise with the graph's scale/zp (round half to even, saturate)."""
    rows = lab["rows"].astype(np.float64)
    for name in FACTORS:
        scale, zero_point = pinned_input_quant(lab["runs"][name]["path"])
        deq = (np.clip(np.rint(rows / scale) + zero_point, -128, 127) - zero_point) * scale
        expected = 20 * math.log10(np.linalg.norm(rows) / np.linalg.norm(rows - deq))
        assert row(lab, name)["sqnr_db"] == pytest.approx(expected, abs=1e-3)


def test_calib_ranges_are_the_cache_files(lab):
    for run in lab["runs"].values():
        raw = json.loads(run["ranges"].read_text())["data"]
        for r in run["diags"]:
            assert r["calib_min"] == raw[r["tensor"]]["lowest"]["data"][0]
            assert r["calib_max"] == raw[r["tensor"]]["highest"]["data"][0]


def test_eval_ranges_independent(lab):
    rows = lab["rows"]
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(lab["fp32"])).graph.initializer}
    hidden = np.maximum(rows.astype(np.float64) @ weights["w1"] + weights["b1"], 0)
    for name in FACTORS:
        assert row(lab, name)["eval_min"] == float(rows.min())
        assert row(lab, name)["eval_max"] == float(rows.max())
        assert row(lab, name)["elements"] == rows.size
        h = row(lab, name, "h")  # the Relu output: the fp32 model's value, not the int8 model's pre-Relu Add
        assert h["eval_min"] == 0
        assert h["eval_max"] == pytest.approx(hidden.max(), rel=1e-5)


def test_clipped_fraction_and_grid_from_the_graph(lab):
    rows = lab["rows"].astype(np.float64)
    for name in FACTORS:
        scale, zero_point = pinned_input_quant(lab["runs"][name]["path"])
        got = row(lab, name)
        assert (got["scale"], got["zero_point"]) == (scale, zero_point)
        lo, hi = scale * (-128 - zero_point), scale * (127 - zero_point)
        assert (got["repr_min"], got["repr_max"]) == (lo, hi)
        assert got["clipped_fraction"] == np.count_nonzero((rows < lo) | (rows > hi)) / rows.size
        levels = np.unique(np.clip(np.rint(rows / scale) + zero_point, -128, 127)).size
        assert got["levels"] == levels
        assert got["grid_used"] == levels / 256
        assert got["distinct_values"] == min(np.unique(rows).size, 256)  # counted up to the grid size


def test_batched_feeds_give_the_same_numbers(lab):
    rows, run = lab["rows"], lab["runs"]["narrow"]
    feeds = [{LAB_INPUT: rows[i : i + 64]} for i in range(0, len(rows), 64)]
    batched = tensor_diagnostics(lab["fp32"], run["path"], run["ranges"], feeds)
    for one, many in zip(run["diags"], batched, strict=True):
        for key, value in one.items():
            # energies are float32 dot products (BLAS accumulation order depends on the batch): 1e-6 relative;
            # added_nsr / noise_share are differences of two such ratios (cancellation): 1e-4
            rel = 1e-4 if key in ("added_nsr", "noise_share") else 1e-6
            assert many[key] == (pytest.approx(value, rel=rel) if isinstance(value, float) else value), key


def test_nothing_written_beside_the_inputs(lab):
    def listing():
        return sorted(str(p.relative_to(lab["root"])) for p in lab["root"].rglob("*"))

    before = listing()
    run = lab["runs"]["match"]
    tensor_diagnostics(lab["fp32"], run["path"], run["ranges"], [{LAB_INPUT: lab["rows"][:32]}])
    assert listing() == before


def test_missing_range_is_null(lab, tmp_path):
    run = lab["runs"]["match"]
    payload = json.loads(run["ranges"].read_text())
    del payload["data"]["h"]
    ranges = tmp_path / "ranges.json"
    ranges.write_text(json.dumps(payload))
    diags = tensor_diagnostics(lab["fp32"], run["path"], ranges, [{LAB_INPUT: lab["rows"]}])
    h = next(r for r in diags if r["tensor"] == "h")
    assert (h["calib_min"], h["calib_max"]) == (None, None)
    assert h["grid_used"] == row(lab, "match", "h")["grid_used"]


def test_qoperator_is_refused(lab):
    out = lab["root"] / "int8_qop.onnx"
    result = quantize_lab(lab["model"], out, seed=4242, factor=1.0, batches=64, cache=lab["cache"],
                                 options=QuantOptions(format="qoperator"))
    with pytest.raises(CalibrunError, match="QOperator") as info:
        tensor_diagnostics(lab["fp32"], out, lab["cache"].path(result["cache_key"]), [{LAB_INPUT: lab["rows"]}])
    assert "\n" not in str(info.value)


def test_bad_inputs(lab, tmp_path):
    run = lab["runs"]["match"]
    with pytest.raises(CalibrunError, match="calibration ranges"):
        tensor_diagnostics(lab["fp32"], run["path"], tmp_path / "absent.json", [{LAB_INPUT: lab["rows"]}])
    with pytest.raises(CalibrunError, match="feed"):
        tensor_diagnostics(lab["fp32"], run["path"], run["ranges"], [])
    with pytest.raises(CalibrunError, match="evaluation feeds failed"):
        tensor_diagnostics(lab["fp32"], run["path"], run["ranges"], [{"nope": lab["rows"]}])


@pytest.mark.parametrize(
    ("activation", "weight", "qtype", "qmin", "qmax", "wide_verdict"),
    [("QUInt8", "QUInt8", "uint8", 0, 255, "coarse"), ("QInt16", "QInt8", "int16", -32768, 32767, "sound")],
)
def test_other_integer_types(lab, activation, weight, qtype, qmin, qmax, wide_verdict):
    """The grid follows the zero point's type. 10x too wide on int16 still reaches more than 25% of the levels
    4096 values can reach (it has ~12 bits left): not coarse."""
    rows = lab["rows"].astype(np.float64)
    for factor, verdict in ((1.0, "sound"), (10.0, wide_verdict)):
        out = lab["root"] / f"int8_{activation}_{factor}.onnx"
        result = quantize_lab(lab["model"], out, seed=4242, factor=factor, batches=64, cache=lab["cache"],
                                     options=QuantOptions(activation_type=activation, weight_type=weight))
        diags = tensor_diagnostics(lab["fp32"], out, lab["cache"].path(result["cache_key"]),
                                   [{LAB_INPUT: lab["rows"]}])
        got = diags[0]
        assert (got["tensor"], got["qtype"], got["qmin"], got["qmax"]) == (LAB_INPUT, qtype, qmin, qmax)
        scale, zero_point = pinned_input_quant(out)
        levels = np.unique(np.clip(np.rint(rows / scale) + zero_point, qmin, qmax)).size
        assert got["levels"] == levels
        assert got["grid_used"] == levels / (qmax - qmin + 1)
        assert got["clipped_fraction"] == 0
        assert classify(got) == verdict


def test_classify_thresholds():
    assert classify({"clipped_fraction": CLIP_THRESHOLD, "grid_used": COARSE_THRESHOLD}) == "sound"
    assert classify({"clipped_fraction": CLIP_THRESHOLD * 1.01, "grid_used": 1.0}) == "clipping"
    assert classify({"clipped_fraction": 0.0, "grid_used": COARSE_THRESHOLD * 0.99}) == "coarse"
    assert classify({"clipped_fraction": 0.5, "grid_used": 0.01}) == "clipping"  # clipping wins
    assert classify({"clipped_fraction": None, "grid_used": 0.01}) == "coarse"
    # the coarse rule counts levels against what the data could reach: min(grid size, distinct fp32 values)
    int8 = {"clipped_fraction": 0.0, "qmin": -128, "qmax": 127}
    assert classify({**int8, "levels": 63, "distinct_values": 4096, "grid_used": 63 / 256}) == "coarse"
    assert classify({**int8, "levels": 64, "distinct_values": 4096, "grid_used": 64 / 256}) == "sound"
    assert classify({**int8, "levels": 30, "distinct_values": 100, "grid_used": 30 / 256}) == "sound"
    assert classify({**int8, "levels": 24, "distinct_values": 100, "grid_used": 24 / 256}) == "coarse"
    int16 = {"clipped_fraction": 0.0, "qmin": -32768, "qmax": 32767}
    assert classify({**int16, "levels": 2000, "distinct_values": 4096, "grid_used": 2000 / 65536}) == "sound"
    assert classify({**int16, "levels": 2000, "distinct_values": None, "elements": 10000,
                     "grid_used": 2000 / 65536}) == "coarse"


def test_classify_model_counts(lab):
    verdict = classify_model(lab["runs"]["wide"]["diags"])
    assert verdict["input_tensor"] == LAB_INPUT
    assert verdict["input"] == "coarse"
    assert sum(verdict["counts"].values()) == verdict["tensors"] == len(LAB_TENSORS)
    assert verdict["overall"] == "coarse"
    narrow = classify_model(lab["runs"]["narrow"]["diags"])
    assert narrow["overall"] == "clipping"
    assert narrow["counts"]["clipping"] >= 1


def test_sound_tensors_under_a_low_output_say_the_error_accumulated():
    """Every tensor sound, yet an output under the verdict's ok SQNR (hama's phoneme recogniser: int8 read no
    phoneme, its diagnosis "sound"): `accumulated`, and the diagnosis line says the shares cannot name a cause; a
    clipping tensor, or an ok output, says nothing of the kind."""
    from calibrun.core.files import strict_json
    from calibrun.measure.diagnosis import accumulated_note

    rows = [{"tensor": t, "node": t, "levels": 200, "qmin": -128, "qmax": 127, "distinct_values": 10**6,
             "clip_cost": 0.0, "qdq_sqnr_db": 30.0, "noise_share": share} for t, share in (("a", 0.6), ("b", 0.4))]
    low = classify_model(rows, output_sqnr_db={"y": 3.0})
    assert (low["overall"], low["accumulated"]) == ("sound", True)
    assert accumulated_note(low).startswith("; yet an output is at 3.0 dB: no tensor is badly quantised on its own")
    assert classify_model(rows, output_sqnr_db={"y": 30.0})["accumulated"] is False
    clipped = classify_model([{**rows[0], "clip_cost": 50.0}, rows[1]], output_sqnr_db={"y": 3.0})
    assert (clipped["overall"], clipped["accumulated"]) == ("clipping", False)
    assert accumulated_note(clipped) == accumulated_note(classify_model(rows)) == ""
    # an output at -inf dB reaches result.json as null (strict JSON): the line still reads
    nowhere = strict_json(classify_model(rows, output_sqnr_db={"y": -math.inf}))
    assert nowhere["output_sqnr_db"] is None
    assert accumulated_note(nowhere).startswith("; yet an output is at no finite SQNR: no tensor")
    # weights whose channels differ widely, quantised per tensor: named, since no activation's share shows them
    weights = [{"weight": "w1", "node": "conv1", "op_type": "Conv", "channels": 24, "ratio": 39.5, "verdict": "mixed"},
               {"weight": "w2", "node": "conv2", "op_type": "Conv", "channels": 24, "ratio": 229.9, "verdict": "mixed"},
               {"weight": "w3", "node": "conv3", "op_type": "Conv", "channels": 8, "ratio": 2.0, "verdict": "sound"}]
    said = accumulated_note(classify_model(rows, weights, output_sqnr_db={"y": 0.4}))
    assert said.startswith("; yet an output is at 0.4 dB: no activation is badly quantised on its own, but 2 weights "
                           "hold channels of very different ranges, quantised per tensor (the widest: 'w2', its "
                           "largest channel 230x its median one)")
    assert "quant.per_channel=true" in said


def test_worst_orders_and_handles_inf_nan_ties():
    rows = [{"tensor": t, "sqnr_db": s} for t, s in
            [("a", 10.0), ("b", math.inf), ("c", None), ("d", 3.0), ("e", 3.0), ("f", -math.inf), ("g", math.nan)]]
    assert [r["tensor"] for r in worst(rows, n=10)] == ["f", "d", "e", "a", "b", "c", "g"]
    assert [r["tensor"] for r in worst(rows, n=2)] == ["f", "d"]
    assert worst(rows, n=0) == []
    with pytest.raises(CalibrunError):
        worst(rows, n=-1)


def test_worst_on_the_lab(lab):
    diags = lab["runs"]["narrow"]["diags"]
    lowest = worst(diags, n=2)
    assert len(lowest) == 2
    assert lowest[0]["sqnr_db"] == min(r["sqnr_db"] for r in diags)
    assert lowest[0]["sqnr_db"] <= lowest[1]["sqnr_db"]


def test_as_table_is_strict_json_columns(lab):
    diags = lab["runs"]["narrow"]["diags"] + [dict(lab["runs"]["match"]["diags"][0], sqnr_db=math.inf)]
    table = as_table(diags)
    json.dumps(table, allow_nan=False)
    assert {len(column) for column in table.values()} == {len(diags)}
    assert table["tensor"][: len(LAB_TENSORS)] == LAB_TENSORS
    assert table["verdict"][0] == "clipping"
    assert table["sqnr_db"][-1] is None
    assert as_table([])["tensor"] == []


def test_no_temp_files_left(lab, tmp_path, monkeypatch):
    """The augmented models live in a private temp folder that is gone afterwards. The temp dir is this test's own:
    the system's is shared with every other process, whose folders come and go meanwhile."""
    import tempfile

    from calibrun.measure import tensor_stats

    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    made = []

    def temp_dir(kind, folder=None):
        made.append(temp := files.temp_dir(kind, folder))
        return temp

    monkeypatch.setattr(tensor_stats, "temp_dir", temp_dir)
    run = lab["runs"]["wide"]
    tensor_diagnostics(lab["fp32"], run["path"], run["ranges"], [{LAB_INPUT: lab["rows"][:16]}])
    assert [Path(t.name).parent for t in made] == [private]  # the diagnostics' folder was made there
    assert os.listdir(private) == []  # and is gone


def test_diagnostics_in_groups_run_each_node_once_in_pieces(lab, monkeypatch):
    """memory.budget of 1 byte: one group per tensor. Each model is cut into pieces, one per group, run one after
    the other over each row (every node once); the rows are the bits of the fallback that runs a model per group
    (each ending at its group's last tensor), and within float rounding of one pass (which runs a batch's rows at
    once, where groups run them one at a time)."""
    from calibrun.measure import tensor_stats
    from calibrun.model.segments import SegmentError

    run = lab["runs"]["narrow"]
    nodes = []
    real = tensor_stats._session

    def counted(path, *args, **kwargs):
        nodes.append((Path(path).parent.name, len(onnx.load(str(path), load_external_data=False).graph.node)))
        return real(path, *args, **kwargs)

    def grouped() -> list[dict]:
        nodes.clear()
        with tensor_stats.StreamingDiagnostics(lab["fp32"], run["path"], run["ranges"], budget=1) as diag:
            diag.update({LAB_INPUT: lab["rows"][:24]})
            diag.update({LAB_INPUT: lab["rows"][24:31]})
            assert len(diag.groups) == len(LAB_TENSORS)
            return diag.rows()

    monkeypatch.setattr(tensor_stats, "_session", counted)
    full = len(onnx.load(str(run["path"])).graph.node)  # a budget of 1 byte: the weights' floats do not fit it
    pieces = grouped()
    runs = 31  # one row a run: one row's tensors exceed the budget
    int8 = [count for folder, count in nodes if folder == "int8-pieces"]
    assert len(int8) == (1 + runs) * len(LAB_TENSORS)  # a piece per group, loaded when cut, opened for each run
    assert sum(int8[:len(LAB_TENSORS)]) == full  # each node in one piece
    fp32 = [count for folder, count in nodes if folder == "fp32-pieces"]
    assert len(fp32) == (1 + runs) * (len(LAB_TENSORS) - 1)  # the input `x` is fed: no piece writes it
    assert sum(fp32[:len(LAB_TENSORS) - 1]) == len(onnx.load(str(lab["fp32"])).graph.node)

    def cannot_cut(*args, **kwargs):
        raise SegmentError("no element type for ['t']")

    monkeypatch.setattr(tensor_stats, "Segments", cannot_cut)
    per_group = grouped()
    prefixes = [count for folder, count in nodes if folder.startswith("int8-")][:len(LAB_TENSORS)]  # 1st batch
    assert prefixes == sorted(prefixes)
    assert prefixes[0] < full  # the early groups' models end at their tensors
    assert pieces == per_group
    with tensor_stats.StreamingDiagnostics(lab["fp32"], run["path"], run["ranges"]) as diag:
        diag.update({LAB_INPUT: lab["rows"][:24]})
        diag.update({LAB_INPUT: lab["rows"][24:31]})
        one = diag.rows()
    assert len(diag.groups) == 1
    for row, whole in zip(pieces, one, strict=True):
        assert row["tensor"] == whole["tensor"]
        assert row["sqnr_db"] == pytest.approx(whole["sqnr_db"], rel=1e-6)
        assert row["clipped_fraction"] == whole["clipped_fraction"]


def test_pieces_run_over_the_waiting_runs_open_each_session_once_and_give_the_same_rows(lab, monkeypatch):
    """Runs wait for the pieces while their carried tensors fit a quarter of the budget; then each piece's session
    opens once for all of them (not once per run) and every tensor sees the same runs in the same order: the rows
    are equal to those of run by run. A 1-byte budget: every run but the first is carried on disk."""
    from calibrun.measure import tensor_stats
    from calibrun.model import segments

    run = lab["runs"]["narrow"]
    opened = []
    real = tensor_stats._session

    def counted(path, *args, **kwargs):
        opened.append(Path(path).parent.name)
        return real(path, *args, **kwargs)

    def diagnose(wait: int | None) -> list[dict]:
        opened.clear()
        plan = tensor_stats.StreamingDiagnostics._plan

        def planned(self, feeds):
            plan(self, feeds)
            if wait is not None:
                self.carry_runs = wait

        monkeypatch.setattr(tensor_stats.StreamingDiagnostics, "_plan", planned)
        with tensor_stats.StreamingDiagnostics(lab["fp32"], run["path"], run["ranges"], budget=1) as diag:
            diag.update({LAB_INPUT: lab["rows"][:24]})
            diag.update({LAB_INPUT: lab["rows"][24:31]})
            rows = diag.rows()
            assert list(Path(diag._tmp.name).glob("carried-*")) == []  # each read back once and removed
            return rows

    monkeypatch.setattr(tensor_stats, "_session", counted)
    one_by_one = diagnose(None)
    assert opened.count("int8-pieces") == (1 + 31) * len(LAB_TENSORS)  # the budget carries one run at a time
    spilled = []
    put = segments.Carried.put

    def counted_put(self, run, tensors):
        put(self, run, tensors)
        spilled.extend([run] if run in self.saved else [])

    monkeypatch.setattr(segments.Carried, "put", counted_put)
    waiting = diagnose(100)
    assert opened.count("int8-pieces") == 2 * len(LAB_TENSORS)  # loaded when cut, then once for the 31 runs
    assert set(spilled) == set(range(31))  # a quarter of 1 byte holds one run at most: the others wait on disk
    assert waiting == one_by_one


def test_carried_tensors_over_the_limit_go_to_disk_and_come_back_equal(tmp_path):
    from calibrun.model.segments import Carried

    store = Carried(tmp_path, limit=100)
    small = ({"x": np.arange(4, dtype=np.float32)}, {"x": np.arange(4, dtype=np.float32)})
    big = ({"a:0": np.arange(40, dtype=np.int64).reshape(5, 8), "b/1": np.ones(3, bool)}, {})
    store.put(0, small)
    store.put(1, big)  # 32 + 323 bytes > 100: saved
    assert [p.name for p in tmp_path.iterdir()] == ["carried-1.npz"]
    back = store.take(1)
    assert list(back[0]) == ["a:0", "b/1"]
    assert back[1] == {}
    np.testing.assert_array_equal(back[0]["a:0"], big[0]["a:0"])
    assert back[0]["b/1"].dtype == bool
    assert list(tmp_path.iterdir()) == []  # read back once, then gone
    assert store.take(0) is not None
    assert store.bytes == {}


def test_keep_only_drops_what_no_wanted_tensor_needs_and_keeps_what_a_subgraph_reads():
    from onnx import TensorProto, helper

    from calibrun.model.graph import keep_only

    then = helper.make_graph([helper.make_node("Identity", ["a"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["b"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"], name="relu"),
         helper.make_node("Neg", ["x"], ["b"], name="neg"),
         helper.make_node("Abs", ["x"], ["unused"], name="abs"),
         helper.make_node("If", ["cond"], ["r"], name="if", then_branch=then, else_branch=other),
         helper.make_node("Add", ["r", "w"], ["y"], name="add"),
         helper.make_node("Mul", ["y", "v"], ["z"], name="mul")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "w"), numpy_helper.from_array(np.ones(2, np.float32), "v")])
    keep_only(graph, ["y", "a"])
    assert [n.name for n in graph.node] == ["relu", "neg", "if", "add"]  # both branches' outer reads kept
    assert [o.name for o in graph.output] == ["y", "a"]
    assert [t.name for t in graph.initializer] == ["w"]
    assert [i.name for i in graph.input] == ["x", "cond"]  # every input stays feedable


def test_pieces_give_a_group_half_the_budget_and_a_model_per_group_the_whole(lab, monkeypatch):
    """Every lab tensor takes 300 bytes a row (three copies of 100): under a 700-byte budget, pieces hold one
    tensor a group (half the budget: the rest is for what a piece carries), a model per group two."""
    from calibrun.core import memory
    from calibrun.measure import tensor_stats
    from calibrun.model.segments import SegmentError

    run = lab["runs"]["narrow"]
    monkeypatch.setattr(memory, "row_bytes", lambda *args: dict.fromkeys(LAB_TENSORS, 100))

    def groups() -> list[list[str]]:
        with tensor_stats.StreamingDiagnostics(lab["fp32"], run["path"], run["ranges"], budget=700) as diag:
            diag.update({LAB_INPUT: lab["rows"][:4]})
            return [[s.pair.tensor for s in group] for group in diag.groups]

    assert groups() == [[t] for t in LAB_TENSORS]

    def cannot_cut(*args, **kwargs):
        raise SegmentError("no element type for ['t']")

    monkeypatch.setattr(tensor_stats, "Segments", cannot_cut)
    assert groups() == [LAB_TENSORS[0:2], LAB_TENSORS[2:4], LAB_TENSORS[4:]]


def _stats(scale: float, zero_point: int):
    from types import SimpleNamespace

    from calibrun.measure.tensor_stats import TensorStats
    from calibrun.model.pairs import Grid

    grid = Grid(scale=scale, zero_point=zero_point, qtype="int8", qmin=-128, qmax=127)
    return TensorStats(SimpleNamespace(tensor="t", grid=grid), None, None)


def test_an_attention_mask_fill_value_gives_numbers_not_null():
    """-3.4e38 squared overflows float32's sums: they are taken in float64 there, so the SQNRs are numbers (they were
    inf / inf, null in diagnostics.json)."""
    fill = np.finfo(np.float32).min
    scale = np.float32(-float(fill) / 255)
    values = np.array([fill, fill, 1.5, -2.0, 0.25], np.float32)
    dequantised = ((np.clip(np.rint(values / scale) + 127, -128, 127) - 127) * scale).astype(np.float32)
    stats = _stats(float(scale), 127)
    stats.update(values, values, dequantised)
    row = stats.row()
    assert math.isfinite(row["sqnr_db"])
    assert math.isfinite(row["qdq_sqnr_db"])
    assert row["nonfinite"] == 0


def test_values_the_int8_model_made_inf_or_nan_are_counted_as_an_overflow_without_a_warning():
    import warnings

    truth = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)
    got = np.array([[np.inf, -2.0, np.nan, -np.inf]], np.float32)
    stats = _stats(0.05, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow / invalid-value warnings would reach the user's stderr
        stats.update(truth, truth, got)
        row = stats.row()
    assert row["nonfinite"] == 3
    assert classify(row) == "overflow"
    assert classify({**row, "nonfinite": 0}) != "overflow"


@pytest.mark.parametrize("zero_point", [-128, 0, 37])
def test_the_levels_hit_are_those_of_every_value_though_values_inside_the_levels_hit_are_left_out(zero_point):
    """Batches of dequantised values whose levels fill gaps, extend the run of levels hit on both sides, sit on a
    run's ends, fall outside the grid (clipped to its ends) and hold NaN: the levels counted equal np.unique of every
    value's level, batch after batch, though only values outside the longest run of levels hit are counted."""
    rng = np.random.default_rng(zero_point + 200)
    scale = np.float32(0.0173)
    stats = _stats(float(scale), zero_point)

    def dequantised(levels) -> np.ndarray:
        return ((np.asarray(levels, np.float32) - zero_point) * scale).astype(np.float32)

    every = []
    batches = [dequantised(rng.integers(-20, 21, 500) + zero_point // 2),  # a run in the middle
               dequantised([-60, -59, 80, 127, 127]) ,  # outside the run, beside it and at the grid's end
               dequantised(rng.integers(-20, 21, 300) + zero_point // 2),  # inside the run: adds nothing
               dequantised(np.arange(-128, 128)[::3]),  # gaps on both sides
               np.array([1e6, -1e6, np.float32(scale) * 0.49], np.float32),  # off the grid: its ends
               np.array([np.nan, 0.0], np.float32)]  # NaN: every value counted as before
    for batch in batches:
        stats.update(batch, batch, batch)
        every.append(batch)
        values = np.concatenate(every)
        with np.errstate(invalid="ignore"):  # NaN casts to some level, as in the diagnostics
            q = np.rint(values / scale).astype(np.int32) + zero_point + 128
        expected = np.unique(np.clip(q, 0, 255)).size
        assert stats.row()["levels"] == expected


@pytest.mark.parametrize(("qtype", "dtype", "zero_point"),
                         [("int8", np.int8, 0), ("int8", np.int8, -128), ("uint8", np.uint8, 37),
                          ("int16", np.int16, 0), ("uint16", np.uint16, 40000)])
def test_the_levels_read_off_the_quantizelinears_integers_are_those_read_off_its_floats(qtype, dtype, zero_point):
    """Given each run's QuantizeLinear output too, the levels are counted from its integers: batch after batch the
    same count as from the dequantised floats alone, and np.unique's of every integer, runs inside the levels
    already hit, beside them, at both ends of the type and with gaps among them."""
    from calibrun.measure.tensor_stats import TensorStats
    from calibrun.model.pairs import INT_TYPES, Grid

    qmin, qmax = next((lo, hi) for name, lo, hi in INT_TYPES.values() if name == qtype)
    grid = Grid(scale=0.0173, zero_point=zero_point, qtype=qtype, qmin=qmin, qmax=qmax)
    from_q, from_floats = (TensorStats(SimpleNamespace(tensor="t", grid=grid), None, None) for _ in range(2))
    rng = np.random.default_rng(abs(qmax + zero_point))
    middle = (qmin + qmax) // 2
    batches = [rng.integers(middle - 20, middle + 21, 500), [middle - 60, middle - 59, middle + 80, qmax, qmax],
               rng.integers(middle - 20, middle + 21, 300), np.linspace(qmin, qmax, 90).astype(np.int64),
               [qmin, qmin, middle]]
    every = []
    for batch in batches:
        q = np.asarray(batch).astype(dtype)
        post = ((q.astype(np.float32) - np.float32(zero_point)) * np.float32(grid.scale)).astype(np.float32)
        from_q.update(post, post, post, q)
        from_floats.update(post, post, post)
        every.append(q)
        assert from_q.row()["levels"] == from_floats.row()["levels"] == np.unique(np.concatenate(every)).size
    assert from_q.q_core is not None  # the integers' path was taken
    assert from_floats.q_core is None


def test_the_qdq_sessions_read_weights_dequantised_once_and_measure_what_they_measured(lab, monkeypatch):
    """Under the default budget the diagnostics' QDQ copy holds the lab's weights and biases as floats (no
    DequantizeLinear of an initializer left), and its rows are those of the copy that dequantises on every run, to
    the bit (its session packs no constant weight: a packed MatMul sums in another order)."""
    from calibrun.measure import tensor_stats

    run = lab["runs"]["narrow"]

    def diagnose() -> tuple[list[dict], int]:
        with tensor_stats.StreamingDiagnostics(lab["fp32"], run["path"], run["ranges"]) as diag:
            copy = onnx.load(str(Path(diag._tmp.name) / "int8" / "augmented.onnx"))
            weights = {t.name for t in copy.graph.initializer}
            left = sum(n.op_type == "DequantizeLinear" and set(n.input) <= weights for n in copy.graph.node)
            diag.update({LAB_INPUT: lab["rows"][:31]})
            return diag.rows(), left

    folded, left = diagnose()
    assert left == 0
    monkeypatch.setattr(tensor_stats, "fold_weight_dequantize", lambda model, limit=None: 0)
    unfolded, left = diagnose()
    assert left == 4  # two weights, two biases
    assert folded == unfolded


def test_a_tensor_int8_computed_at_another_size_is_judged_on_its_own_values():
    """Robust Video Matting's first Resize took its scales from a quantised Concat (0.5 -> 127/255): the frame was 127
    pixels in int8 where fp32's is 128, and the element-wise difference failed the whole job with numpy's "operands
    could not be broadcast". The tensor is now judged on the int8 model's values (its grid, its own QDQ noise), with
    no SQNR against fp32, and its row says both shapes."""
    fp32 = np.linspace(-1, 1, 3 * 128 * 128, dtype=np.float32).reshape(1, 3, 128, 128)
    pre = np.linspace(-1, 1, 3 * 127 * 127, dtype=np.float32).reshape(1, 3, 127, 127)
    post = (np.rint(pre / 0.01) * 0.01).astype(np.float32)
    stats = _stats(0.01, 0)
    stats.update(fp32, pre, post)
    row = stats.row()
    assert row["sqnr_db"] is None
    assert row["resized"] == "fp32 [1, 3, 128, 128], int8 [1, 3, 127, 127]"
    assert row["elements"] == pre.size
    assert math.isfinite(row["qdq_sqnr_db"])
    same = _stats(0.01, 0)
    same.update(pre, pre, post)
    assert "resized" not in same.row()
    assert same.row()["sqnr_db"] == row["qdq_sqnr_db"]


def test_a_tensor_a_gather_writes_is_kept_float_from_where_its_values_are_computed():
    """fusion-surrogates' QLKNN reads each output by a Gather from one Add's [N, 8] (one int8 scale for values from
    -139 to 133 and from 0 to 0.3): the Gathers were the culprits and keeping them alone in float left the Add's scale
    on every column. The float path of a tensor a data-movement op writes now starts at the op that computes its
    values; a computed tensor's path is as before (its producer, then through moves to the next computation)."""
    from onnx import helper

    from calibrun.measure.tensor_stats import _float_path

    nodes = [helper.make_node("Gemm", ["h", "w"], ["g"], name="gemm"),
             helper.make_node("Add", ["g", "b"], ["t"], name="add"),
             helper.make_node("Gather", ["t", "i0"], ["c0"], name="gather0", axis=1),
             helper.make_node("Gather", ["t", "i1"], ["c1"], name="gather1", axis=1),
             helper.make_node("Unsqueeze", ["c1", "ax"], ["u1"], name="unsqueeze1"),
             helper.make_node("Mul", ["u1", "c0"], ["y"], name="mul")]
    producers = {o: n for n in nodes for o in n.output}
    consumers: dict = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    assert _float_path("u1", producers, consumers) == ["add", "gather0", "gather1", "mul", "unsqueeze1"]
    assert _float_path("g", producers, consumers) == ["gemm", "add"]


def test_a_clipping_output_is_named_on_the_diagnosis_line_whatever_the_overall_verdict():
    """holosoma's policy: most of the noise in sound tensors (overall "sound"), yet its `actions` output clipped; the
    line names the output with its clipped share and its share of the error. An output that is the top culprit is
    named by the line already, and a clipping tensor inside the graph is not an output."""
    from calibrun.measure.diagnosis import clipping_outputs_note

    sound = {"levels": 200, "qmin": -128, "qmax": 127, "distinct_values": 10**6, "clip_cost": 0.0, "qdq_sqnr_db": 30.0}
    rows = [{**sound, "tensor": "a", "node": "a", "noise_share": 0.5},
            {**sound, "tensor": "b", "node": "b", "noise_share": 0.26},
            {**sound, "tensor": "actions", "node": "gemm", "role": "output", "noise_share": 0.24,
             "clip_cost": 5.4, "clipped_fraction": 0.0013}]
    diagnosis = classify_model(rows)
    assert diagnosis["overall"] == "sound"
    assert diagnosis["clipping_outputs"] == [{"tensor": "actions", "verdict": "clipping", "clipped_fraction": 0.0013,
                                              "noise_share": 0.24}]
    assert clipping_outputs_note(diagnosis) == (
        "; output 'actions' clipping (0.13% of its values beyond the calibrated range, 24% of the added error)")
    on_top = classify_model([{**rows[2], "noise_share": 0.6}, rows[0]])
    assert on_top["clipping_outputs"]
    assert clipping_outputs_note(on_top) == ""
    inside = classify_model([rows[0], {**rows[2], "role": None}])
    assert inside["clipping_outputs"] == []
    assert clipping_outputs_note(inside) == ""
    assert clipping_outputs_note(classify_model(rows[:2])) == ""


def test_the_next_run_computed_ahead_and_statistics_taken_in_two_threads_give_the_same_rows(lab, monkeypatch):
    """The diagnostics' two overlaps (onnxruntime computing the next run while this one's statistics are taken,
    where two runs' outputs fit the budget; each run's tensors shared between two threads) change no number: the
    rows are those of one thing at a time, to the bit, over runs in several batches. Where two runs' outputs do not
    fit the budget, nothing is computed ahead."""
    from calibrun.measure import tensor_stats

    run = lab["runs"]["narrow"]

    def diagnose(budget: int | None = None) -> tuple[list[dict], bool, bool, float]:
        with tensor_stats.StreamingDiagnostics(lab["fp32"], run["path"], run["ranges"], budget=budget) as diag:
            for start in range(0, 96, 24):
                diag.update({LAB_INPUT: lab["rows"][start:start + 24]})
            return diag.rows(), diag.ahead is not None, diag.shared is not None, diag.per_row

    monkeypatch.setattr(tensor_stats, "SHARED_VALUES", 0)
    both, ahead, shared, per_row = diagnose()
    assert ahead
    assert shared
    monkeypatch.setattr(tensor_stats, "SHARED_VALUES", math.inf)
    monkeypatch.setattr(tensor_stats, "AHEAD", False)
    alone, ahead, shared, _ = diagnose()
    assert not ahead
    assert not shared
    assert both == alone
    monkeypatch.setattr(tensor_stats, "AHEAD", True)
    rows, ahead, _, _ = diagnose(budget=int(24 * per_row))  # one run of a batch fits, two do not
    assert not ahead
    assert rows == alone


def test_outputs_written_into_the_same_arrays_run_after_run_give_the_rows_of_fresh_outputs(lab, monkeypatch):
    """The one-pass sessions write every run's outputs into kept arrays (calibrun.model.sessions.ReusedOutputs, two
    sets: a run's statistics are taken while the next run computes into the other). The rows are those of fresh
    outputs every run, to the bit, over batches of two sizes (the arrays made again for the smaller one), with the
    next run computed ahead and without; where two runs' outputs do not fit the budget, one set is held."""
    from calibrun.measure import tensor_stats

    run = lab["runs"]["narrow"]

    class Fresh:  # onnxruntime's own run: new arrays every run
        def __init__(self, session, sets):
            self.session = session

        def run(self, names, feeds):
            return self.session.run(names, feeds)

        def single(self):
            pass

        def release(self):
            pass

    def diagnose(budget: int | None = None, reused: bool = True):
        if not reused:
            monkeypatch.setattr(tensor_stats, "ReusedOutputs", Fresh)
        with tensor_stats.StreamingDiagnostics(lab["fp32"], run["path"], run["ranges"], budget=budget) as diag:
            for start, stop in ((0, 24), (24, 48), (48, 72), (72, 82), (82, 106), (106, 130)):
                diag.update({LAB_INPUT: lab["rows"][start:stop]})
            rows = diag.rows()
            return rows, diag.ahead is not None, diag.int8_sess, diag.per_row

    reused, ahead, int8, per_row = diagnose()
    assert ahead
    assert int8.reuse
    assert all(held is not None for held in int8.held)  # both sets in use
    fresh, ahead, _, _ = diagnose(reused=False)
    assert ahead
    assert reused == fresh
    monkeypatch.undo()
    # one run of 24 rows fits, two do not (two of 10 rows do: that batch is computed ahead)
    rows, _, int8, _ = diagnose(budget=int(24 * per_row))
    assert int8.held[0] is not None
    assert int8.held[1] is None  # the last run, of 24 rows, held one set
    assert rows == fresh
