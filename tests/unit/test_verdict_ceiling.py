"""bench/verdict_ceiling.py: the most check labels two thresholds can agree with, and the pairs none can."""

import math

from bench.verdict_ceiling import best_thresholds, family, inversions


def test_two_thresholds_that_separate_the_labels_agree_with_all_of_them():
    rows = [(1.0, "broken"), (5.0, "broken"), (12.0, "degraded"), (18.0, "degraded"), (25.0, "ok"), (40.0, "ok")]
    agree, low, high = best_thresholds(rows)
    assert agree == 6
    assert 5.0 < low <= 12.0
    assert 18.0 < high <= 25.0


def test_an_ok_below_a_broken_costs_one_label_whatever_the_thresholds():
    """rxnmap's check ok at 10.2 dB below the decision-tree surrogate's broken at 32.8 dB: one of the two is wrong
    under any pair of thresholds."""
    rows = [(10.2, "ok"), (32.8, "broken")]
    assert best_thresholds(rows)[0] == 1
    assert inversions([("rxnmap", 10.2, "ok"), ("dtree", 32.8, "broken")]) == [("rxnmap", "dtree")]
    assert inversions([("a", 1.0, "broken"), ("b", 2.0, "ok")]) == []
    assert best_thresholds([(3.0, "ok")]) == (1, -math.inf, -math.inf)


def test_every_output_sqnr_is_one_family_and_each_task_metric_its_own():
    assert family("out.output.concat2.sqnr_db") == family("out.y.sqnr_db") == "output SQNR (dB)"
    assert family("task.dice") == "task.dice"
    assert family("out.y.rows_under_20db") == "out.y.rows_under_20db"
