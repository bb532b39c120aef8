"""The zoo's registry as code: every model's builder and check hand back what they compute. Two checks had lost their
last line (`return score`) in a merge of two helper branches and gave None, which the bench had read as a check that
cannot run: broken (session 33)."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from tests.zoo import ZOO


def _returns_a_value(function) -> bool:
    """Does the function's body end in a return of a value (or a raise), on every path its last statement takes?"""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))

    def ends(body) -> bool:
        last = body[-1]
        if isinstance(last, ast.Return):
            return last.value is not None
        if isinstance(last, ast.Raise):
            return True
        if isinstance(last, ast.If):
            return ends(last.body) and bool(last.orelse) and ends(last.orelse)
        if isinstance(last, ast.With | ast.Try):
            return ends(last.body) or bool(getattr(last, "finalbody", None)) and ends(last.finalbody)
        return False

    return ends(tree.body[0].body)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_builder_and_check_ends_by_returning_what_it_computed(name):
    entry = ZOO[name]
    assert _returns_a_value(entry.builder), f"{entry.builder.__name__} does not return its Built"
    assert _returns_a_value(entry.checker), f"{entry.checker.__name__} does not return its Score"


def test_the_rule_sees_a_lost_return():
    def lost(x):
        score = {"x": x}
        score.update({"y": 1})

    def kept(x):
        if x:
            return 1
        return 2

    assert not _returns_a_value(lost)
    assert _returns_a_value(kept)
