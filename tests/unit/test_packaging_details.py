"""Issue 25, item 11: what the package declares, and onnxruntime's QOperator advice once per process."""

from __future__ import annotations

import logging
import os
import re
import tomllib
from pathlib import Path

from calibrun.quant import quantize

REPO = Path(__file__).resolve().parents[2]


def test_pillow_is_a_dependency():
    """data=images imports PIL: Pillow must be installed with calibrun, not found by luck."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].strip().lower() for d in deps}
    assert "pillow" in names


def test_every_package_calibrun_imports_is_a_declared_dependency():
    """Each third-party module the package and calibtool import (at any depth, lazily too) comes from a declared
    dependency or from the optional extra that needs it: a clean install must not find it by luck (tqdm did)."""
    import ast
    import sys
    from importlib import metadata

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(specs):
        return {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].strip().lower().replace("_", "-") for d in specs}

    declared = names(project["dependencies"])
    optional = {extra: names(specs) for extra, specs in project["optional-dependencies"].items()}
    modules = set()
    for path in [REPO / "calibtool.py", *sorted((REPO / "calibrun").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.add(node.module.split(".")[0])
    distributions = metadata.packages_distributions()
    missing = {}
    for module in sorted(modules - set(sys.stdlib_module_names) - {"calibrun", "calibtool", "__future__"}):
        provided = {d.lower().replace("_", "-") for d in distributions.get(module, [module])}
        if not provided & declared:
            extras = [extra for extra, deps in optional.items() if provided & deps and extra not in ("test", "dev")]
            if not extras:
                missing[module] = sorted(provided)
    assert missing == {}, f"imported but not declared (module: distributions): {missing}"


def test_qoperator_advice_is_shown_once_per_process(caplog):
    """onnxruntime logs "Please use QuantFormat.QDQ ..." on the root logger for every QOperator model: the
    filter calibrun installs lets the first through and drops the repeats; other messages pass."""
    advice = ("Please use QuantFormat.QDQ for activation type QInt8 and weight type QInt8. Or it will lead to bad "
              "performance on x64.")
    quantize.ADVICE_ONCE.seen.clear()
    quantize.advice_once()
    quantize.advice_once()  # idempotent
    assert logging.getLogger().filters.count(quantize.ADVICE_ONCE) == 1
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            logging.warning(advice)
            logging.warning("another warning")
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count(advice) == 1
    assert messages.count("another warning") == 3


def test_onnxruntimes_per_tensor_info_lines_are_dropped_and_its_warnings_kept(caplog, tmp_path):
    """A 16-bit override makes onnxruntime log one INFO line per bias tensor on the root logger; calibrun drops
    onnxruntime quantisation's INFO records (by their source file) and keeps its warnings."""
    quantize.advice_once()
    root = logging.getLogger()
    where = f"{os.sep}site-packages{os.sep}onnxruntime{os.sep}quantization{os.sep}base_quantizer.py"
    with caplog.at_level(logging.INFO):
        for level, message, path in ((logging.INFO, "Quantizing bias tensor 'b' as a weight", where),
                                     (logging.WARNING, "a warning of onnxruntime's", where),
                                     (logging.INFO, "calibrun's own line", __file__)):
            root.handle(root.makeRecord("root", level, path, 1, message, None, None))
    assert [r.getMessage() for r in caplog.records] == ["a warning of onnxruntime's", "calibrun's own line"]
    assert [r.name for r in caplog.records] == ["onnxruntime.quantization", "root"]  # whose line, by its source


def test_onnxruntimes_per_weight_axis_warnings_are_shown_once_saying_what_happens(caplog):
    """With per-channel weights onnxruntime warns once per rank-1 weight (a BatchNormalization's scale) that the
    axis is out of range, then quantises it per tensor: the first line is shown, saying so, the others dropped."""
    quantize.ADVICE_ONCE.seen.clear()
    quantize.advice_once()
    with caplog.at_level(logging.WARNING):
        for k in range(3):
            logging.warning(f"Axis 1 is out-of-range for weight 'batch_norm2d_{k}.w_0' with rank 1")
        logging.warning("Axis 1 is out-of-range for something else")  # not the per-weight line: kept
    assert [r.getMessage() for r in caplog.records] == [
        "Axis 1 is out-of-range for weight 'batch_norm2d_0.w_0' with rank 1: onnxruntime quantises it per tensor "
        "(further weights like it are not named)",
        "Axis 1 is out-of-range for something else"]


def test_onnxruntimes_per_tensor_type_warnings_are_one_line_once(caplog):
    """A QOperator model makes onnxruntime warn, for every tensor of a type it does not quantise, with the type's
    protobuf text on eight more lines (36 tensors on NudeNet): the first is one line naming the type, the rest
    are dropped; the same words about something else pass."""
    from onnx import TensorProto, helper

    quantize.ADVICE_ONCE.seen.clear()
    quantize.advice_once()
    kind = helper.make_tensor_type_proto(TensorProto.INT64, [1])
    with caplog.at_level(logging.WARNING):
        for name in ("Cast@1", "Shape@2", "Gather@3"):
            logging.warning(f"Inference failed or unsupported type to quantize for tensor {name!r}, type is {kind}.")
        logging.warning("Inference failed for another reason")
    assert [r.getMessage() for r in caplog.records] == [
        "onnxruntime does not quantise tensor 'Cast@1' (INT64): not a float type, or no type known (further tensors "
        "like it are not named)",
        "Inference failed for another reason"]
    assert "\n" in str(kind)  # what onnxruntime's line held
