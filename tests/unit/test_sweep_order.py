"""calibrun.sweep_order and its patch of Hydra's basic sweeper: jobs that share a calibration start apart."""

from __future__ import annotations

import importlib
import itertools

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from calibrun.core import patches
from calibrun.sweep_order import outside_key, spread


def product(**swept: list[str]) -> list[list[str]]:
    """Hydra's order: the last key varying fastest."""
    return [[f"{k}={v}" for k, v in zip(swept, combo, strict=True)] for combo in itertools.product(*swept.values())]


def test_the_keys_outside_the_calibration_vary_slowest():
    jobs = spread(product(method=["minmax", "percentile", "entropy"], format=["qdq", "qoperator"]))
    assert jobs == [["method=minmax", "format=qdq"], ["method=percentile", "format=qdq"],
                    ["method=entropy", "format=qdq"], ["method=minmax", "format=qoperator"],
                    ["method=percentile", "format=qoperator"], ["method=entropy", "format=qoperator"]]
    # any two neighbours (what two workers start together) calibrate different keys
    calibration = [[o for o in job if not outside_key(o)] for job in jobs]
    assert all(a != b for a, b in itertools.pairwise(calibration))


def test_a_sweep_of_calibration_keys_only_keeps_hydras_order():
    jobs = product(calibration=["narrow", "match"], batches=["1", "2"], **{"data.path": ["a.npy"]})
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
    assert [j[:2] for j in jobs] == [["method=minmax", "format=qdq"], ["method=entropy", "format=qdq"],
                                     ["method=minmax", "format=qoperator"], ["method=entropy", "format=qoperator"]]
    assert BasicSweeper.split_arguments(overrides, 3) == [jobs[:3], jobs[3:]]
