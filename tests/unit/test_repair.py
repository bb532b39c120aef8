"""The mixed-precision repair's search (calibrun.analysis.repair) on a stand-in for quantise-and-measure: which
tensors it promotes to what, what it takes back, the Pareto front, and the overrides that rebuild the model."""

import json
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from calibrun.analysis import repair as repair_module
from calibrun.analysis.repair import escape, options_for, overrides, pareto, repair
from calibrun.quantize import QuantOptions

RANKING = [{"tensor": "a", "kind": "activation", "nodes": ["A"]},
           {"tensor": "w", "kind": "weight", "nodes": ["W"]},
           {"tensor": "b", "kind": "activation", "nodes": ["B", "B2"]},
           {"tensor": "c", "kind": "activation", "nodes": [""]}]


def fake(monkeypatch, score):
    """quantize writes the options it was given; measure scores them with `score(tensor_types, excluded)`."""
    def quantize(fp32, path, calibration, options):
        Path(path).write_text(json.dumps({"types": options.tensor_types, "excluded": options.nodes_to_exclude}))

    monkeypatch.setattr(repair_module, "quantize", quantize)

    def measure(path):
        got = json.loads(Path(path).read_text())
        return {"m": score(got["types"], got["excluded"])}, 0.1 * (len(got["types"]) + 2 * len(got["excluded"]))

    return measure


def test_int16_is_tried_first_and_enough_where_it_suffices(monkeypatch, tmp_path):
    # a needs 16 bits; b needs fp32 (16 bits do not help it); w does nothing
    def score(types, excluded):
        return 0.5 + 0.3 * ("a" in types) + 0.2 * ("B" in excluded)

    done = repair(tmp_path / "fp32.onnx", None, QuantOptions(), RANKING, fake(monkeypatch, score), "m", "max", 0.95,
                  tmp_path / "out.onnx")
    assert done["reached"] and done["value"] == pytest.approx(1.0)
    assert done["promoted"] == {"a": "int16", "b": "fp32"}
    kept = [(s["tensor"], s["precision"]) for s in done["steps"] if s["kept"] and s["tensor"]]
    assert kept == [("a", "int16"), ("b", "fp32")]
    assert ("w", "int16") in [(s["tensor"], s["precision"]) for s in done["steps"] if not s["kept"]]
    assert done["overrides"] == ["quant.tensor_types={a:QInt16}", "quant.nodes_to_exclude=[B,B2]"]
    assert (tmp_path / "out.onnx").is_file()


def test_what_the_target_does_not_need_is_taken_back(monkeypatch, tmp_path):
    # a alone reaches the target, but b helped first on the way (it ranks higher here)
    ranking = [RANKING[2], RANKING[0]]

    def score(types, excluded):
        return 0.5 + 0.1 * ("b" in types) + 0.45 * ("a" in types)

    done = repair(tmp_path / "fp32.onnx", None, QuantOptions(), ranking, fake(monkeypatch, score), "m", "max", 0.95,
                  tmp_path / "out.onnx")
    assert done["promoted"] == {"a": "int16"}
    assert done["taken_back"][0]["tensor"] == "b" and done["taken_back"][0]["to"] == "int8"


def test_fp32_goes_back_to_int16_when_that_holds_and_precisions_limit_the_search(monkeypatch, tmp_path):
    calls = {"n": 0}

    def score(types, excluded):
        calls["n"] += 1
        if calls["n"] == 2:  # the int16 trial of `a` during the search: no gain then (noise)
            return 0.5
        return 0.5 + 0.5 * ("a" in types or "A" in excluded)

    done = repair(tmp_path / "fp32.onnx", None, QuantOptions(), RANKING[:1], fake(monkeypatch, score), "m", "max",
                  0.95, tmp_path / "out.onnx")
    assert done["promoted"] == {"a": "int16"}  # fp32 during the search, int16 after: none in fp32 where int16 does
    only16 = repair(tmp_path / "fp32.onnx", None, QuantOptions(), RANKING, fake(monkeypatch, lambda t, e: 0.5), "m",
                    "max", 0.95, tmp_path / "out.onnx", precisions=("int16",))
    assert not only16["reached"] and only16["promoted"] == {}
    assert {s["precision"] for s in only16["steps"][1:]} == {"int16"}


def test_a_weight_takes_the_16_bit_type_of_weights_and_user_options_stay():
    base = QuantOptions(activation_type="QUInt8", weight_type="QInt8", nodes_to_exclude=("U",),
                        tensor_types={"x": "QInt16"})
    entries = {e["tensor"]: e for e in RANKING}
    got = options_for(base, {"a": "int16", "w": "int16", "b": "fp32"}, entries)
    assert got.tensor_types == {"x": "QInt16", "a": "QUInt16", "w": "QInt16"}
    assert got.nodes_to_exclude == ("U", "B", "B2")


def test_the_overrides_parse_back_to_the_same_names():
    names = ["/model.22/Concat_25_output_0", "odd:name=with,commas [x]", "p2o.Conv.3"]
    options = QuantOptions(tensor_types={n: "QInt16" for n in names}, nodes_to_exclude=tuple(names))
    parser = OverridesParser.create()
    types, excluded = (parser.parse_override(o).value() for o in overrides(options))
    assert types == {n: "QInt16" for n in names}
    assert excluded == names
    assert escape("a b") == "a\\ b"


def test_the_pareto_front():
    points = [{"promoted": 0, "metric": 0.5}, {"promoted": 1, "metric": 0.8}, {"promoted": 2, "metric": 0.7},
              {"promoted": 3, "metric": 0.96}]
    assert pareto(points, "promoted", "max") == [True, True, False, True]
    assert pareto(points, "promoted", "min") == [True, False, False, False]
