"""The headline verdict (calibrun.measure.verdict): which metric decides, the thresholds, the sentence."""

import math
from types import SimpleNamespace

import pytest

from calibrun.errors import CalibrunError
from calibrun.measure import verdict


def conf(metric=None, goal="max", ok=None, broken=None):
    return SimpleNamespace(metric=metric, goal=goal, ok=ok, broken=broken)


@pytest.mark.parametrize("value,status", [(0.99, "ok"), (0.95, "ok"), (0.949, "degraded"), (0.8, "degraded"),
                                          (0.799, "broken"), (0.0, "broken")])
def test_agreement_decides_a_classifier(value, status):
    metrics = {"task.top1_agreement": value, "out.prob.sqnr_db": 60.0}  # the task wins over a fine SQNR
    got = verdict.decide(metrics, rows=52)
    assert got["status"] == status
    assert got["metric"] == "task.top1_agreement"
    assert got["value"] == value
    assert "52 evaluation rows" in got["because"] and f"{value:.1%}" in got["because"]


def test_a_task_metric_wins_over_a_bad_sqnr():
    assert verdict.decide({"task.iou": 0.97, "out.map.sqnr_db": 3.0})["status"] == "ok"
    assert verdict.decide({"task.iou": 0.5, "out.map.sqnr_db": 60.0})["status"] == "broken"


@pytest.mark.parametrize("db,status", [(32.0, "ok"), (20.0, "ok"), (15.0, "degraded"), (9.9, "broken"),
                                       (1.55, "broken"), (-200.0, "broken")])
def test_without_a_task_the_worst_output_sqnr_decides(db, status):
    metrics = {"out.prob.sqnr_db": db, "out.state.sqnr_db": 45.0, "max_abs_error": 0.1}
    got = verdict.decide(metrics)
    assert (got["status"], got["metric"]) == (status, "out.prob.sqnr_db")
    assert "'prob'" in got["because"]


def test_a_part_of_an_output_counts_on_its_own():
    """A detector's objectness (part 4) is what breaks; the whole output's energy is the boxes'."""
    metrics = {"out.output.sqnr_db": 35.0, "out.output.ch0.sqnr_db": 36.0, "out.output.ch4.sqnr_db": 4.0}
    got = verdict.decide(metrics)
    assert got["metric"] == "out.output.ch4.sqnr_db"
    assert got["status"] == "broken"
    assert "part 4" in got["because"]


def test_the_worst_output_is_found_again_in_other_metrics():
    rule = verdict.rule_for({"out.a.sqnr_db": 5.0, "out.b.sqnr_db": 30.0})
    assert rule.value({"out.a.sqnr_db": 40.0, "out.b.sqnr_db": 25.0}) == 25.0  # b is now the worst
    assert math.isnan(rule.value({"max_abs_error": 1.0}))


def test_nothing_to_decide_on_gives_none():
    assert verdict.decide({"max_abs_error": 0.2}) is None
    assert verdict.line(None).startswith("verdict: none")


def test_a_custom_metric_with_its_thresholds():
    c = conf("task.f1", "max", 0.9, 0.5)
    assert verdict.decide({"task.f1": 0.82, "out.x.sqnr_db": 80.0}, c)["status"] == "degraded"
    assert verdict.decide({"task.f1": 0.4}, c)["status"] == "broken"
    lower = conf("task.cer", "min", 0.02, 0.2)
    assert verdict.decide({"task.cer": 0.01}, lower)["status"] == "ok"
    assert verdict.decide({"task.cer": 0.3}, lower)["status"] == "broken"
    assert verdict.decide({"task.cer": math.nan}, lower)["status"] == "broken"
    with pytest.raises(ValueError, match="'task.f1' is not a metric of this run"):
        verdict.decide({"task.other": 1.0}, c)


def test_the_line_is_the_status_and_the_reason():
    got = verdict.decide({"out.y.sqnr_db": 1.55})
    assert verdict.line(got) == f"verdict: BROKEN: {got['because']}"
    assert got["because"].endswith("broken (ok >= 20, broken < 10)")


@pytest.mark.parametrize("c,message", [
    (conf("task.f1", "max", None, 0.5), "verdict.ok: is required with verdict.metric"),
    (conf("task.f1", "max", 0.5, 0.9), "verdict.ok: must be >= verdict.broken"),
    (conf("task.cer", "min", 0.5, 0.1), "verdict.ok: must be <= verdict.broken"),
    (conf(None, "max", 0.5, None), "verdict.ok: needs verdict.metric"),
    (conf("task.f1", "up", 0.9, 0.5), "verdict.goal: must be one of"),
])
def test_bad_verdict_config_names_the_key(c, message):
    with pytest.raises(CalibrunError, match=message):
        verdict.validate(c)
