"""analysis.backend=ray on a real local Ray (issue 24 item 3): the ranking's trials on Ray actors give the serial
ranking. Real Ray starts take tens of seconds, so this lives with the end-to-end tests (the processes backend and
the serial ranking are unit tests in tests/unit/test_analysis.py, whose helpers this module shares)."""

from __future__ import annotations

import logging

import pytest

from calibrun.analysis.evaluate import Evaluator
from calibrun.analysis.sensitivity import rank
from calibrun.core.errors import CalibrunError
from calibrun.data import EvalData
from calibrun.measure.tasks import Custom
from tests.unit.test_analysis import _same_ranking, _serial_and_parallel, narrow_lab


@pytest.fixture
def narrow(tmp_path, lab_model):
    return narrow_lab(tmp_path, lab_model)


def test_trials_on_ray_actors_give_the_serial_ranking(narrow, tmp_path, monkeypatch, caplog):
    """analysis.backend=ray: a Ray of this machine started for the trials and stopped after; then, in a process
    already connected to Ray (as a job under the Ray launcher is), `auto` uses that Ray and leaves it running."""
    import ray

    monkeypatch.setenv("HOME", str(tmp_path))  # Ray 2.60 writes ~/.ray/auth_token on a local start
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    serial, parallel = _serial_and_parallel(narrow, 3, "ray")
    assert (parallel["workers"], parallel["backend"]) == (2, "ray")
    _same_ranking(serial, parallel)
    assert not ray.is_initialized()  # the Ray the analysis started is stopped again
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    from calibrun.analysis import evaluate

    monkeypatch.setattr(evaluate, "HELD_RUN_BYTES", 0)  # the runs written to files, sent to the actors as bytes
    try:
        serial, parallel = _serial_and_parallel(narrow, 0, "auto")
        assert (parallel["workers"], parallel["backend"]) == (2, "ray")
        _same_ranking(serial, parallel)
        assert ray.is_initialized()
        # 3 actors of 1 CPU on a Ray of 2 CPUs: the one Ray cannot place is not waited for (not until the
        # READY_SECONDS timeout either: the two that started hold both CPUs)
        fp32, int8, _, feeds = narrow
        with Evaluator(fp32.path, EvalData.from_arrays(feeds), 16, threads=1) as ev, \
                caplog.at_level(logging.WARNING, "calibrun"):
            three = rank(fp32.path, int8, ev, "mean_abs_error", "min", "switch", threads=3, workers=3)
        assert (three["workers"], three["backend"]) == (2, "ray")
        assert "2 of 3 trial actors started (Ray's 2 CPUs cannot hold another of 1 CPUs)" in caplog.text
        assert [r["metric"] for r in three["ranking"]] == [r["metric"] for r in serial["ranking"]]
        # a trial's error in an actor is raised as itself (one line), not as Ray's wrapper with its traceback
        monkeypatch.setenv("CALIBRUN_TEST_DRIVER", "1")  # after ray.init: the actors do not see it
        task = Custom("tests.unit.test_analysis:failing_in_workers_task")
        with Evaluator(fp32.path, EvalData.from_arrays(feeds), 16, threads=1, task=task) as ev, \
                pytest.raises(CalibrunError) as failed:
            rank(fp32.path, int8, ev, "mean_abs_error", "min", "switch", threads=2, workers=2, backend="ray")
        assert "the task failed in a worker" in str(failed.value)
        assert "\n" not in str(failed.value)
    finally:
        ray.shutdown()
