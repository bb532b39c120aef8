"""calibrun.sweep_order and its patch of Hydra's basic sweeper: jobs that share a calibration start apart, the
costliest calibration first; the report's order is the one the user wrote."""

from __future__ import annotations

import importlib
import itertools

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from calibrun.core import patches
from calibrun.sweep_order import calibration_cost, outside_key, spread, written_order


def product(**swept: list[str]) -> list[list[str]]:
    """Hydra's order: the last key varying fastest."""
    return [[f"{k}={v}" for k, v in zip(swept, combo, strict=True)] for combo in itertools.product(*swept.values())]


def test_the_keys_outside_the_calibration_vary_slowest_and_the_costliest_calibration_starts_first():
    jobs = spread(product(method=["minmax", "percentile", "entropy"], format=["qdq", "qoperator"]))
    assert jobs == [["method=entropy", "format=qdq"], ["method=percentile", "format=qdq"],
                    ["method=minmax", "format=qdq"], ["method=entropy", "format=qoperator"],
                    ["method=percentile", "format=qoperator"], ["method=minmax", "format=qoperator"]]
    # any two neighbours (what two workers start together) calibrate different keys
    calibration = [[o for o in job if not outside_key(o)] for job in jobs]
    assert all(a != b for a, b in itertools.pairwise(calibration))


def test_more_batches_cost_more_and_the_method_comes_first():
    assert calibration_cost(["method=entropy", "batches=8"]) > calibration_cost(["method=minmax", "batches=512"])
    assert calibration_cost(["+batches=64"]) > calibration_cost(["batches=8"]) > calibration_cost(["format=qdq"])
    assert calibration_cost(["batches=abc", "method=mine"]) == (0, 0.0)  # unknown: no cost, Hydra's order
    jobs = spread(product(calibration=["narrow", "wide"], batches=["1", "64"], format=["qdq", "qoperator"]))
    assert [j[:2] for j in jobs[:4]] == [["calibration=narrow", "batches=64"], ["calibration=wide", "batches=64"],
                                         ["calibration=narrow", "batches=1"], ["calibration=wide", "batches=1"]]
    assert {j[2] for j in jobs[:4]} == {"format=qdq"}


def test_a_sweep_of_calibration_keys_of_no_known_cost_keeps_hydras_order():
    jobs = product(calibration=["narrow", "match"], **{"data.path": ["a.npy", "b.npy"]}, batches=["8"])
    assert spread(jobs) == jobs


@pytest.mark.parametrize(("override", "outside"), [
    ("format=qdq", True), ("quant.per_channel=true", True), ("+eval.rows=8", True), ("eval_data.path=x", True),
    ("diagnostics=off", True), ("method=entropy", False), ("method.num_bins=512", False), ("batches=8", False),
    ("data.path=a.npy", False), ("model.path=m.onnx", False), ("calibration=narrow", False)])
def test_which_keys_are_outside_the_calibrations_key(override, outside):
    assert outside_key(override) is outside


def test_hydras_basic_sweeper_launches_the_spread_order_in_batches(monkeypatch):
    # the module as it is now: Hydra's plugin discovery imports its core plugins again (a new class object)
    BasicSweeper = importlib.import_module("hydra._internal.core_plugins.basic_sweeper").BasicSweeper  # noqa: N806
    monkeypatch.setattr(BasicSweeper, "split_arguments", BasicSweeper.split_arguments)  # restored afterwards
    monkeypatch.setenv("CALIBRUN_PATCHES", "on")
    overrides = OverridesParser.create().parse_overrides(["method=minmax,entropy", "format=qdq,qoperator",
                                                          "batches=8"])
    shipped = BasicSweeper.split_arguments(overrides, None)
    patches.order_jobs(spread)
    patches.order_jobs(spread)  # once per process
    (jobs,) = BasicSweeper.split_arguments(overrides, None)
    assert sorted(jobs) == sorted(shipped[0])  # the same jobs
    assert [j[:2] for j in jobs] == [["method=entropy", "format=qdq"], ["method=minmax", "format=qdq"],
                                     ["method=entropy", "format=qoperator"], ["method=minmax", "format=qoperator"]]
    assert BasicSweeper.split_arguments(overrides, 3) == [jobs[:3], jobs[3:]]


def test_the_written_order_lists_the_started_jobs_as_the_user_wrote_them_outside_keys_slowest():
    swept = dict(method=["minmax", "percentile", "entropy"], format=["qdq", "qoperator"])
    started = [dict(o.partition("=")[::2] for o in job) for job in spread(product(**swept))]
    key = written_order(["method=minmax,percentile,entropy", "format=qdq,qoperator", "model.path=m.onnx"])
    assert sorted(started, key=key) == [{"method": m, "format": f} for f in swept["format"] for m in swept["method"]]
    # the sweeper's params first, then the command line, which replaces a key it repeats; `+` dropped
    key = written_order(["batches=1,8", "calibration=narrow,wide", "+batches=64,8", "calibration=match"])
    assert sorted([{"batches": b} for b in ("8", "64")], key=key) == [{"batches": "64"}, {"batches": "8"}]
    assert written_order(["batches=8", "method=entropy"]) is None  # nothing swept
    assert written_order(["calibration=glob(*)"]) is None  # needs the sweep's config loader: job order kept
