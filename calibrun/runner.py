"""The Hydra task around one job: validate -> compute (calibrun.job) -> track (calibrun.tracking.record) -> write
result.json, with resume and the error policy (every run ends FINISHED, FAILED or KILLED).

Writes `result.json` and `config_resolved.yaml` into the Hydra job folder (calibrun.job writes the models and
ranges beside them) and, with tracking on, one MLflow run (a child of the sweep's parent run in a multirun).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from calibrun import analysis, config
from calibrun.analysis import recommend
from calibrun.core import interrupts
from calibrun.core.errors import CalibrunError, one_line
from calibrun.core.files import (
    RESULT_FILE,
    atomic_path,
    remove_orphans,
    remove_temp_orphans,
)
from calibrun.core.interrupts import die_of, die_with_parent, install_signal_handlers
from calibrun.job import compute, context, job_identity, job_params, one_row_context
from calibrun.measure import verdict
from calibrun.model import file_sha256
from calibrun.quant import cache
from calibrun.result import JobResult
from calibrun.sweep import in_sweep_process
from calibrun.tracking import (
    Tracker,
    link_line,
    resolve_uri,
    run_filter,
    store_message,
)
from calibrun.tracking.record import (
    Job,
    calibration_identity,
    close_earlier_runs,
    complete_job,
    end_run,
    failed_params,
    finished_under,
    open_job_tracker,
    run_record,
    start_run,
    track,
)

log = logging.getLogger("calibrun")


def run(cfg: DictConfig, job_dir: Path, sweep_dir: Path | None = None, job_num: int | None = None,
        overrides: list[str] | None = None) -> JobResult:
    """Validate, compute, track, write result.json. A failure is recorded (result.json with status failed, a
    FAILED MLflow run when tracking works) and then raised; an interrupt (SIGINT, SIGTERM) ends the run KILLED
    and writes no result. result.json says ok only once tracking succeeded. An invalid config or an unusable
    tracking store of a single run fails before anything is written."""
    job = Job(sweep_dir, job_num, overrides)
    invalid = _validation_error(cfg, sweep_job=sweep_dir is not None)
    if invalid is not None and sweep_dir is None:
        raise invalid  # a single run fails fast: nothing ran, nothing to track
    job_dir = job_dir.resolve()
    tracker = None
    if sweep_dir is None:
        tracker = open_job_tracker(cfg, job, check=True)  # the sweep callback checked the store of a sweep
    if cfg.resume:
        done = completed_result(cfg, job_dir)
        if done is not None:
            return _resumed(cfg, done, job_dir, job, tracker)
    job_dir.mkdir(parents=True, exist_ok=True)
    _clear_orphans(cfg, job_dir)
    with atomic_path(job_dir / "config_resolved.yaml") as tmp:
        tmp.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    run_id = None
    try:
        if sweep_dir is not None:
            tracker = open_job_tracker(cfg, job)
        if tracker is not None:
            if cfg.resume:
                close_earlier_runs(tracker, job)
            run_id = start_run(tracker, cfg, job_dir, job)
        if invalid is not None:
            raise invalid
        ctx = context(cfg, job_dir)
        recommending = recommend.enabled(cfg, multirun=sweep_dir is not None)
        ctx.keep_reference = recommending and cfg.recommend.rows is None  # its fp32 outputs: no second fp32 pass
        try:
            try:
                result = compute(ctx)
            except Exception:
                ctx.close_reference()
                retry = one_row_context(ctx)  # a model exported for one row at a time: again, a row per run
                if retry is None:
                    raise
                retry.keep_reference = ctx.keep_reference
                ctx, result = retry, compute(retry)
            analysis.attach(ctx, result)
            if recommending:
                recommend.attach(ctx, result)
        finally:
            ctx.close_reference()
        later = run_id is not None and sweep_dir is not None and tracker.pipelined
        if run_id is not None:
            model_id = track(tracker, run_id, cfg, result, job_dir, job, resolve=not later)
            analysis.log_to(tracker, run_id, job_dir, result)
        if later:  # the writer ends the record (result.json, the run) while the next job computes
            tracker.complete(complete_job, run_id, model_id, result, job_dir / RESULT_FILE,
                             (job_num, _plain_params(cfg), failed_params(cfg)))
        else:
            result.write(job_dir / RESULT_FILE)
            if run_id is not None:
                tracker.log_artifact(run_id, job_dir / RESULT_FILE)
                tracker.finish(run_id)
    except KeyboardInterrupt as exc:
        interrupts.acknowledge()
        if run_id is not None:
            interrupts.release(exc)
            end_run(tracker, run_id, "KILLED")
        raise
    except Exception as exc:
        message = _said(exc, cfg)
        record = JobResult.failed(message, _plain_params(cfg),
                                  mlflow=None if run_id is None else run_record(tracker, run_id))
        try:
            record.write(job_dir / RESULT_FILE)
        except Exception:  # a full disk: the record cannot be written, the run is closed all the same
            if run_id is not None:
                end_run(tracker, run_id, "FAILED")
            raise
        if run_id is not None:
            try:
                tracker.log(run_id, params=failed_params(cfg), tags={"calibrun.error": message[:5000]})
                tracker.log_artifact(run_id, job_dir / RESULT_FILE)
            except Exception as error:
                log.warning("%sthe error could not be logged to MLflow: %s",
                            "" if job_num is None else f"job {job_num}: ", one_line(error))
            finally:
                end_run(tracker, run_id, "FAILED")
        raise
    m = result.metrics
    scale = "fp32 (not quantised)" if m.get("input_scale") is None else f"{m['input_scale']:.6g}"
    used = (result.used or {}).get("calibration_batches", cfg.batches)  # the batches the data held, not those asked
    if cfg.model.name == "lab":  # the lab's own words: its headline is max_abs_error (docs/lab.md)
        log.info("%s factor=%s batches=%s %s: input_scale=%s max_abs_error=%.6g cache_hit=%s -> %s",
                 cfg.calibration.name, cfg.calibration.factor, used, cfg.format.name, scale,
                 m["max_abs_error"], bool(m["cache_hit"]), job_dir / RESULT_FILE)
    else:  # a model's outputs may be class indices or logits far from what its package reads: the verdict's line
        # that follows says what was measured, not a largest difference over every output
        log.info("%s int8 model from %s calibration batch(es) (calibration=%s, factor %s; ranges %s), input scale "
                 "%s -> %s", cfg.format.name.upper() if cfg.format.name == "qdq" else "QOperator", used,
                 cfg.calibration.name, cfg.calibration.factor, "from the cache" if m["cache_hit"] else "calibrated",
                 scale, job_dir / RESULT_FILE)
    log.info(verdict.line(result.verdict))  # the job's last line: the headline
    if run_id is not None and sweep_dir is None:  # a sweep prints its parent run's link at its end
        print(link_line(tracker.uri, tracker.experiment_id, run_filter(tracker.resolve(run_id))), file=sys.stderr)
    return result


def _clear_orphans(cfg: DictConfig, job_dir: Path) -> None:
    """Temp files a killed run left in the folders this job writes (its own, the cache's)."""
    removed = [p for folder in (job_dir, *cache.folders(cfg.cache.dir)) for p in remove_orphans(folder)]
    removed += remove_temp_orphans()  # private temp folders (calibrun.calib.*, .q.*, ...) in the system temp dir
    if removed:
        log.info("removed %d temp file(s) left by killed runs: %s", len(removed), ", ".join(map(str, removed)))


def completed_result(cfg: DictConfig, job_dir: Path) -> JobResult | None:
    """The job's earlier result when it is complete and valid for this config, else None.

    Complete: result.json says ok, was made with the same params (this config, these library versions), and the
    int8 model and ranges it names are there with the bytes it recorded, with what tracking logs of it (the ranges'
    record of the calibration data, the evaluation's `eval_source`). Anything else is recomputed."""
    try:
        result = JobResult.read(job_dir / RESULT_FILE)
        if not result.ok:
            return None
        files = result.files
        same = all(result.params.get(k) == v for k, v in job_params(cfg).items())
        intact = all(file_sha256(job_dir / files[name]) == files[f"{name}_sha256"] for name in ("int8", "ranges"))
        calibration_identity(result, job_dir)  # raises when the ranges' record is missing
        same = same and isinstance(result.eval_source, dict)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return result if same and intact else None


def _resumed(cfg: DictConfig, result: JobResult, job_dir: Path, job: Job, tracker: Tracker | None) -> JobResult:
    """A reused result: already tracked as a FINISHED run of this sweep's parent, nothing is logged again; else
    (its run was killed, or is in another store or sweep) it is logged as a new run tagged resumed, and
    result.json records that run."""
    if job.sweep_dir is not None:
        tracker = open_job_tracker(cfg, job)
    if tracker is not None:
        previous = (result.mlflow or {}).get("run_id")
        tracked = False
        if previous:
            try:
                tracked = tracker.run(finished_under, previous, job.parent.get("run_id"))
            except Exception:
                tracked = False
        if not tracked:
            close_earlier_runs(tracker, job)
            run_id = start_run(tracker, cfg, job_dir, job)
            try:
                tracker.log(run_id, tags={"calibrun.resumed": "true"})
                track(tracker, run_id, cfg, result, job_dir, job)
                result.write(job_dir / RESULT_FILE)
                tracker.log_artifact(run_id, job_dir / RESULT_FILE)
                tracker.finish(run_id)
            except KeyboardInterrupt as exc:
                interrupts.acknowledge()
                interrupts.release(exc)
                end_run(tracker, run_id, "KILLED")
                raise
            except Exception:
                end_run(tracker, run_id, "FAILED")
                raise
    log.info("job %s: complete and valid, skipped (resume=true) -> %s", job.job_num, job_dir / RESULT_FILE)
    log.info(verdict.line(result.verdict))
    return result


def _validation_error(cfg: DictConfig, sweep_job: bool = False) -> CalibrunError | None:
    try:
        config.validate(cfg, sweep_job=sweep_job)
    except CalibrunError as exc:
        return exc
    return None


def _plain_params(cfg: DictConfig) -> dict:
    """What a failed job records: its identity and the model it was given."""
    return {**job_identity(cfg), "model_path": cfg.model.path}


def _unfinished(job_dir: Path) -> str:
    """What an interrupted single run leaves: no result.json, and the files it had finished (each written whole, by
    a rename: a model, its ranges, the diagnostics), named so that nobody takes them for a result."""
    try:
        kept = sorted(p.name for p in job_dir.iterdir() if p.is_file() and p.suffix in (".onnx", ".json"))
    except OSError:
        kept = []
    return "no result.json for this run" + (f" ({', '.join(kept)} in {job_dir} were finished before it)"
                                            if kept else "")


def _said(exc: BaseException, cfg: DictConfig) -> str:
    """A job's error in one line; a file of the calibration cache removed under the running job said as such
    (cache.vanished), not as a bare "No such file or directory"."""
    gone = cache.vanished(exc, cfg.cache.dir) if cfg.cache.enabled else None
    return gone or one_line(exc)


def main(cfg: DictConfig) -> dict | None:
    """The Hydra task. A failing job in a multirun is recorded and reported, and the sweep goes on; the
    sweep callback makes the exit code non-zero. A failing single run exits 1 with one line. SIGINT/SIGTERM
    end the job's run KILLED: a single run prints one line and dies of the signal; in a sweep the interrupt
    goes on up to the sweep callback, which closes the parent run."""
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    job_dir = Path(hydra_cfg.runtime.output_dir)
    sweep_dir = Path(hydra_cfg.sweep.dir) if multirun else None
    job_num = hydra_cfg.job.num if multirun else None
    install_signal_handlers()
    worker = multirun and not in_sweep_process()
    if worker:  # a launcher's worker: it ends with the sweep's process
        die_with_parent()
    try:
        interrupts.check()  # an interrupt dropped by Python (in a finaliser) before this job stops the sweep here
        # a float for a search (analysis.objective), else the result record
        return analysis.objective(cfg, run(cfg, job_dir, sweep_dir, job_num, list(hydra_cfg.overrides.task)))
    except KeyboardInterrupt as exc:
        interrupts.acknowledge()
        if multirun and in_sweep_process():
            raise
        if multirun:  # a launcher's worker, its job's run closed KILLED: it ends too (loky's had waited on, orphaned)
            die_of(exc)
        name = signal.Signals(getattr(exc, "signum", signal.SIGINT)).name
        print(f"calibrun: interrupted by {name}: {_unfinished(job_dir)}"
              + ("" if not config.tracking_enabled(cfg) else ", its MLflow run (if started) KILLED"), file=sys.stderr)
        die_of(exc)
    except Exception as exc:
        message = _said(exc, cfg)
        if config.tracking_enabled(cfg):
            message = store_message(message, resolve_uri(cfg.tracking.uri))
        if not isinstance(exc, CalibrunError):
            log.debug("job failed", exc_info=True)
        if multirun:
            log.error("job %s failed: %s", job_num, message)
            return analysis.objective(cfg, JobResult.failed(message, _plain_params(cfg)))
        print(f"calibrun: error: {message}", file=sys.stderr)
        sys.exit(1)
    finally:
        if worker:  # idle until its next job: the death signal ends it (raised as an interrupt, loky's loop kept it)
            with contextlib.suppress(ValueError):  # not the main thread (some launchers): its handler was not set
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
