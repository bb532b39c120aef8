"""calibrun.core.overrides: a name written into an override reads back, through Hydra's own parser, as that name."""

import string

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from calibrun.analysis.recommend import changes_of
from calibrun.core.overrides import bare, dict_key, escaped, key_name, list_item

PARSER = OverridesParser.create()
NAMES = ["p2o.Conv.3", "/model.22/Concat_25_output_0", "model_1/cq_t2010v2_1/conv1d_25;model_1/cq_t2010v2_1/x__306",
         "odd:name=with,commas [x]", "a b", " lead", "x'y", 'x"y', "a\\b", "ab\\", "a\\'b", "1", "1_000", "-2.5e3",
         "true", "Null", "nan", "층", "a#b", "semi;colon'and\\\\"]


@pytest.mark.parametrize("name", [*NAMES, *(f"a{c}b" for c in string.punctuation)])
def test_a_list_item_reads_back_as_the_name(name):
    assert PARSER.parse_override(f"quant.nodes_to_exclude=[{list_item(name)},other]").value() == [name, "other"]


def test_names_hydra_reads_unquoted_stay_unquoted_and_others_are_quoted():
    assert list_item("p2o.Conv.3") == "p2o.Conv.3"
    assert list_item("a b") == "a\\ b"
    assert list_item("conv1d_25;x") == "'conv1d_25;x'"
    assert list_item("1") == "'1'"  # Hydra would read an int
    assert (bare("null"), bare("a;b"), bare("")) == (False, False, False)


@pytest.mark.parametrize("name", ["/model.22/Concat_25_output_0", "odd:name=with,commas [x]", "a\\b"])
def test_a_dict_key_reads_back_escaped(name):
    assert PARSER.parse_override(f"quant.tensor_types={{{escaped(name)}:QInt16}}").value() == {name: "QInt16"}


@pytest.mark.parametrize("name", [*NAMES, "142", "a%3Bb", "50%", *(f"a{c}b" for c in string.punctuation)])
def test_a_dict_key_reads_back_through_its_escapes(name):
    """Any name as a dict key: Hydra's grammar cannot quote a key, so a character it has no place for (tf2onnx's `;`,
    a quote, a `%` itself) is a %XX escape, and a name Hydra would read as a float, bool or null starts with one;
    key_name decodes what Hydra gives (a plain integer name, 142, reads as the int 142: its str)."""
    parsed = PARSER.parse_override(f"quant.tensor_ranges={{{dict_key(name)}:[-1.0,2.0],other:[0,1]}}").value()
    assert {key_name(k): v for k, v in parsed.items()} == {name: [-1.0, 2.0], "other": [0, 1]}


def test_a_dict_key_stays_readable_where_it_can():
    assert dict_key("/model.22/Concat_25_output_0") == "/model.22/Concat_25_output_0"
    assert dict_key("a/b;c/d") == "a/b%3Bc/d"
    assert dict_key("x:0") == "x\\:0"
    assert dict_key("142") == "142"
    assert dict_key("1.5") == "%31.5"


def test_a_change_of_several_overrides_splits_where_each_starts():
    names = ",".join(map(list_item, ["a b", "c;d"]))
    change = f"quant.activation_type=QInt16 quant.nodes_to_exclude=[{names}] method=entropy"
    parts = changes_of({"change": change})
    assert parts == ["quant.activation_type=QInt16", "quant.nodes_to_exclude=[a\\ b,'c;d']", "method=entropy"]
    assert PARSER.parse_override(parts[1]).value() == ["a b", "c;d"]
