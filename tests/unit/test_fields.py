"""calibrun.core.fields: the config schema is made from the dataclasses the code uses, and those are built back from
config nodes, so that an option is written once (a new CalibrationSpec field is a new `method.<x>` key)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from omegaconf import OmegaConf

from calibrun.config import Config, DataConf, MethodConf, QuantConf, calibration_spec, quant_options
from calibrun.core.fields import build_from, schema_of
from calibrun.data.images import ImageTransform
from calibrun.quant.calibrate import CalibrationSpec
from calibrun.quant.quantize import QuantOptions


def names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def test_config_nodes_are_the_code_classes_fields():
    assert names(MethodConf) == ["name", *(n for n in names(CalibrationSpec) if n not in ("method", "op_types"))]
    assert names(QuantConf) == [n for n in names(QuantOptions) if n != "format"]
    assert names(DataConf) == ["name", "path", "inputs", *names(ImageTransform)]
    method = OmegaConf.structured(Config).method
    assert {k: method[k] for k in method if k != "name"} == {
        f.name: f.default for f in dataclasses.fields(CalibrationSpec) if f.name in method}


@dataclass(frozen=True)
class Spec:
    method: str = "a"
    width: int | None = None
    parts: tuple[str, ...] = ("x", "y")
    only: tuple[str, ...] | None = None
    new_option: float = 0.5  # what adding an option looks like: one field


def test_a_new_field_is_a_new_key_with_its_type_and_default():
    schema = schema_of("SpecConf", Spec, skip=("only",), rename={"method": "name"})
    node = OmegaConf.structured(schema)
    assert list(node) == ["name", "width", "parts", "new_option"]
    assert node.new_option == 0.5
    assert list(node.parts) == ["x", "y"]
    node.new_option = 2  # typed: an int is taken as a float
    assert node.new_option == 2.0
    built = build_from(Spec, node, rename={"name": "method"})
    assert built == Spec(method="a", width=None, parts=("x", "y"), only=None, new_option=2.0)


def test_build_from_takes_lists_as_tuples_and_empty_optional_lists_as_unset():
    assert build_from(Spec, {"parts": ["p"], "only": []}) == Spec(parts=("p",), only=None)
    assert build_from(Spec, {"only": ["q"], "unrelated": 1}) == Spec(only=("q",))
    assert build_from(Spec, {"method": "b"}, method="c") == Spec(method="c")  # given fields win


def test_the_config_builds_the_classes_the_code_uses():
    cfg = OmegaConf.structured(Config)
    cfg.method.name, cfg.method.num_bins, cfg.method.chunk = "entropy", 512, 2
    cfg.quant.nodes_to_exclude, cfg.quant.op_types_to_quantize = ["fc1"], []
    cfg.format.name = "qoperator"
    assert calibration_spec(cfg) == CalibrationSpec(method="entropy", num_bins=512, chunk=2)
    assert quant_options(cfg) == QuantOptions(format="qoperator", nodes_to_exclude=("fc1",))
    cfg.data.crop = [48, 192]
    assert ImageTransform.from_config(cfg.data) == ImageTransform(crop=(48, 192))
