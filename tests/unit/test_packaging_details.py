"""Issue 25, item 11: what the package declares, and onnxruntime's QOperator advice once per process."""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path

from calibrun import quantize

REPO = Path(__file__).resolve().parents[2]


def test_pillow_is_a_dependency():
    """data=images imports PIL: Pillow must be installed with calibrun, not found by luck."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].strip().lower() for d in deps}
    assert "pillow" in names


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
