"""Issue 25, items 6 and 8: the MLflow record made for comparing (job metrics) and one rule for "best"."""

from __future__ import annotations

from pathlib import Path

from calibrun.result import JobResult
from calibrun.tracking.record import job_metrics, verdict_tags

RESULT = JobResult(
    "ok",
    metrics={"span": 4.0, "input_scale": 0.02, "observed_span": 5.1, "max_abs_error": 0.5, "cache_hit": True,
             "eval_span": 6.0},
    diagnosis={"input": "clipping", "overall": "mixed", "input_tensor": "x",
               "counts": {"clipping": 1, "mixed": 2}, "shares": {"clipping": 0.5, "mixed": 0.5}},
)


def test_verdicts_are_no_one_hot_metrics_and_every_count_is_there():
    metrics = job_metrics(RESULT)
    assert "diagnosis.input.clipping" not in metrics  # a word: the tag diagnosis.input carries it
    assert "diagnosis.overall.mixed" not in metrics
    assert {k: v for k, v in metrics.items() if k.startswith("diagnosis.counts.")} == {
        "diagnosis.counts.overflow": 0, "diagnosis.counts.clipping": 1, "diagnosis.counts.mixed": 2,
        "diagnosis.counts.coarse": 0, "diagnosis.counts.sound": 0}


def test_the_headline_comes_first_and_spans_are_named_unambiguously():
    metrics = job_metrics(RESULT)
    assert next(iter(metrics)) == "max_abs_error"
    assert metrics["input.calibrated_span"] == 4.0
    assert metrics["input.int8_grid_span"] == 5.1
    assert metrics["input.eval_span"] == 6.0
    assert not {"span", "observed_span", "eval_span"} & set(metrics)
    with_task = JobResult("ok", metrics={**RESULT.metrics, "top1_agreement": 0.9, "int8_accuracy": 0.8})
    assert next(iter(job_metrics(with_task))) == "int8_accuracy"


def test_best_is_the_best_value_and_on_a_tie_the_first_job():
    from calibrun.report.aggregate import best_of

    candidates = [(0.5, "10", "j10"), (0.5, "2", "j2"), (0.7, "0", "j0"), (float("nan"), "1", "j1")]
    assert best_of(candidates, "lower") == "j2"  # 2 before 10: job numbers, not text
    assert best_of(candidates, "higher") == "j0"
    assert best_of([(float("nan"), "0", "x")], "lower") is None


def test_a_resumed_job_logs_the_datasets_its_result_was_computed_from(tmp_path, monkeypatch):
    """tracking.record.datasets reads the calibration data's identity from the job's ranges file and the
    evaluation's from result.json: what a resumed job logs equals what the job itself had (file hashes included),
    with nothing rebuilt from the config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from calibrun import config
    from calibrun.job import compute, context
    from calibrun.tracking.record import datasets

    monkeypatch.setenv("CALIBRUN_CACHE", str(tmp_path / "cache"))
    config.register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=["batches=2", "eval.rows=16", "diagnostics=off",
                                                       f"cache.dir={tmp_path / 'cache'}"])
    GlobalHydra.instance().clear()
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    ctx = context(cfg, job_dir)
    result = compute(ctx)
    logged = datasets(result, job_dir)
    assert logged["calibration"] == ctx.data.identity()
    assert logged["calibration"]["batches"] == 2
    assert logged["evaluation"]["rows"] == 16


def test_a_job_record_that_cannot_be_written_still_ends_its_run_failed(tmp_path, monkeypatch):
    """A probe's sweep folder filled up: the writer's complete_job failed writing result.json (ok), then failed
    writing the failed one and left the run RUNNING. The run ends FAILED whatever the folder takes."""
    from calibrun.core.errors import CalibrunError
    from calibrun.tracking import record

    calls = []

    class Store:  # the tracker's calls, recorded (a pure unit: the real store's part is tested end to end)
        experiment_id = "1"

        def log(self, run_id, **kwargs):
            calls.append(("log", run_id))

        def log_artifact(self, run_id, path):
            calls.append(("log_artifact", run_id))

        def finish(self, run_id, status="FINISHED"):
            calls.append(("finish", run_id, status))

        def close(self, run_id, status):
            calls.append(("close", run_id, status))

    def full(self, path):
        raise CalibrunError(f"folder {Path(path).parent} is full (No space left on device): cannot write result.json")

    monkeypatch.setattr(JobResult, "write", full)
    message = record.complete_job(Store(), (True, "r1"), (True, "m1"), JobResult("ok", metrics={}),
                                  tmp_path / "result.json", (0, {}, {}))
    assert message.endswith("is full (No space left on device): cannot write result.json")
    assert ("close", "r1", "FAILED") in calls
    assert ("finish", "r1", "FINISHED") not in calls
    assert not [c for c in calls if c[0] == "log_artifact"]  # nothing written to log


def test_the_best_recommendation_is_tagged_as_it_pastes_on_a_shell():
    """A user copies the tag from MLflow's UI to the command line: a headroom range's braces come quoted (bash would
    expand them), a change the shell reads as it is stays bare."""
    ranges = "quant.tensor_ranges={x:[0.0,3.0],y:[-1.0,1.0]}"
    quoted = JobResult("ok", recommendations=[{"change": f"{ranges} quant.weight_type=QInt16",
                                               "shell": f"'{ranges}' quant.weight_type=QInt16"}])
    assert verdict_tags(quoted)["calibrun.recommendation"] == f"'{ranges}' quant.weight_type=QInt16"
    plain = JobResult("ok", recommendations=[{"change": "quant.weight_type=QInt16"}])
    assert verdict_tags(plain)["calibrun.recommendation"] == "quant.weight_type=QInt16"
