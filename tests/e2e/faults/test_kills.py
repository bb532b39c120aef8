"""Real tracked sweeps killed (SIGKILL, SIGINT, SIGTERM) at several points, a tracking failure inside jobs, then
`resume=true`: the record (MLflow store, job folders, report) must end complete and consistent.
Sweeps in one folder and in one second must not mix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import message_lines
from tests.e2e.faults.record import (
    SMALL,
    check_record,
    env_for,
    fresh,
    results,
    run,
    runs_of,
    start,
    store,
    wait_for_results,
)

pytestmark = pytest.mark.slow

KILLS = {  # scenario: (signal, finished jobs before it is sent)
    "sigkill-in-job-1": (signal.SIGKILL, 1),
    "sigint-in-job-1": (signal.SIGINT, 1),
    "sigterm-in-job-2": (signal.SIGTERM, 2),
}
# Resumed afterwards: the SIGTERM'd sweep is left as it was killed, since SIGTERM and SIGINT close the record the same
# way (one handler) and the SIGINT'd sweep's resume checks it; a resume costs a tracked process (~4 CPU s).
RESUMED = ("sigkill-in-job-1", "sigint-in-job-1")


def killed_then_resumed(tmp: Path, sig: int, after: int, resume: bool) -> dict:
    sweep = fresh(tmp)
    proc = start(tmp, *SMALL, sweep=sweep)
    try:
        wait_for_results(proc, sweep, after)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    killed = {r.info.run_id: (r.info.status, "mlflow.parentRunId" in r.data.tags) for r in runs_of(tmp)}
    done = {job: r for job, r in results(sweep).items() if r["status"] == "ok"}
    resumed = run(tmp, *SMALL, "resume=true", sweep=sweep)[0] if resume else None
    return {"tmp": tmp, "sweep": sweep, "code": proc.returncode, "stderr": (tmp / "first.err").read_text(),
            "after_kill": killed, "done": done, "resumed": resumed}


def tracking_fails_then_resumed(tmp: Path) -> dict:
    """The artifact store cannot be written (its folder is a file): every job's tracking fails."""
    sweep = fresh(tmp)
    blocker = tmp / "blocker"
    blocker.write_text("not a folder")
    MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}").create_experiment(
        "calibrun", artifact_location=(blocker / "artifacts").as_uri())
    first, _ = run(tmp, *SMALL, sweep=sweep)
    failed = results(sweep)
    after = {r.info.run_id: r.info.status for r in runs_of(tmp)}
    blocker.unlink()
    blocker.mkdir()
    resumed, _ = run(tmp, *SMALL, "resume=true", sweep=sweep)
    return {"tmp": tmp, "sweep": sweep, "first": first, "failed": failed, "after": after, "resumed": resumed}


def same_second(tmp: Path) -> dict:
    """The issue's reproduction: two sweeps of the default folder started together."""
    env = env_for(tmp)
    procs = [subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd in (["-m", "calibrun", "-m", *SMALL, "tracking=off"],
                         ["-m", "calibrun", "-m", *SMALL, "format=qoperator", "tracking=off"])
             for cmd in [[sys.executable, *cmd, f"cache.dir={tmp / 'cache'}"]]]
    outs = [p.communicate(timeout=240) for p in procs]
    return {"tmp": tmp, "codes": [p.returncode for p in procs], "stderr": [e for _, e in outs]}


def one_folder(tmp: Path) -> dict:
    """Two sweeps given the same hydra.sweep.dir at once, then a third reusing it without resume=true."""
    sweep = tmp / "sweep"
    procs = [subprocess.Popen(cmd, cwd=tmp, env=env_for(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for fmt in ("qdq", "qoperator")
             for cmd in [[sys.executable, "-m", "calibrun", "-m", *SMALL, "batches=2", "tracking=off",
                          f"format={fmt}", f"hydra.sweep.dir={sweep}", f"cache.dir={tmp / 'cache'}"]]]
    outs = [p.communicate(timeout=240) for p in procs]
    before = {p: p.stat().st_mtime_ns for p in sweep.glob("*/result.json")}
    again, _ = run(tmp, *SMALL, "batches=2", "tracking=off", sweep=sweep)
    return {"tmp": tmp, "sweep": sweep, "codes": [p.returncode for p in procs], "stderr": [e for _, e in outs],
            "before": before, "again": again}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    sigint = signal.getsignal(signal.SIGINT)  # a sweep must get SIGINT's default even if pytest runs with `&`
    if sigint == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    tasks = {name: (killed_then_resumed, sig, after, name in RESUMED) for name, (sig, after) in KILLS.items()}
    tasks.update({"tracking fails": (tracking_fails_then_resumed,), "same second": (same_second,),
                  "one folder": (one_folder,)})
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {name: pool.submit(fn, tmp_path_factory.mktemp(name.replace(" ", "_")), *args)
                       for name, (fn, *args) in tasks.items()}
            return {name: future for name, future in futures.items()}
    finally:
        signal.signal(signal.SIGINT, sigint)


def outcome(outcomes: dict, name: str) -> dict:
    return outcomes[name].result()


@pytest.mark.parametrize("name", RESUMED)
def test_kill_then_resume_leaves_a_complete_record(outcomes, name):
    o = outcome(outcomes, name)
    sig, _ = KILLS[name]
    assert o["code"] == -sig, o["stderr"][-3000:]  # died of the signal, as a shell expects
    resumed = o["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    by_job = check_record(o["tmp"], o["sweep"], 3)
    for job in o["done"]:  # complete before the kill: skipped, and not logged a second time
        assert f"job {job}: complete and valid, skipped (resume=true)" in resumed.stderr
        assert [r.info.status for r in by_job[job]].count("FINISHED") == 1
    parents_before = [run_id for run_id, (_, child) in o["after_kill"].items() if not child]
    assert len(parents_before) == 1
    assert f"continuing MLflow parent run {parents_before[0]}" in resumed.stderr  # the same parent, continued


@pytest.mark.parametrize("name", ["sigint-in-job-1", "sigterm-in-job-2"])
def test_sigint_and_sigterm_close_every_run_with_one_line(outcomes, name):
    o = outcome(outcomes, name)
    sig, _ = KILLS[name]
    assert "Traceback" not in o["stderr"]
    lines = message_lines(o["stderr"])
    assert lines == [f"calibrun: interrupted by {signal.Signals(sig).name}: sweep {o['sweep']} stopped, MLflow parent "
                     f"run KILLED; the same command with resume=true continues it"]
    statuses = [status for status, _ in o["after_kill"].values()]
    assert "RUNNING" not in statuses
    parent = [status for status, child in o["after_kill"].values() if not child]
    assert parent == ["KILLED"]
    assert statuses.count("KILLED") <= 2  # the parent and the job in flight, if one was


def test_sigkill_leaves_running_runs_that_resume_closes(outcomes):
    o = outcome(outcomes, "sigkill-in-job-1")
    assert "RUNNING" in [status for status, _ in o["after_kill"].values()]
    assert "closed" in o["resumed"].stderr or all(s != "RUNNING" for s, child in o["after_kill"].values() if child)


def test_tracking_failure_fails_the_job_and_resume_recomputes_it(outcomes):
    o = outcome(outcomes, "tracking fails")
    first = o["first"]
    assert first.returncode == 1
    assert "Traceback" not in first.stderr
    assert sorted(o["failed"]) == [0, 1, 2]
    assert all(r["status"] == "failed" for r in o["failed"].values())  # never `ok` with tracking broken
    assert all("Not a directory" in r["error"] or "not a directory" in r["error"].lower()
               for r in o["failed"].values()), [r["error"] for r in o["failed"].values()]
    assert "RUNNING" not in o["after"].values()
    assert list(o["after"].values()).count("FAILED") == 4  # three jobs and the parent
    resumed = o["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "skipped (resume=true)" not in resumed.stderr  # a failed job is recomputed
    check_record(o["tmp"], o["sweep"], 3)


def test_two_sweeps_in_one_second_get_their_own_folders(outcomes):
    o = outcome(outcomes, "same second")
    assert o["codes"] == [0, 0], o["stderr"]
    sweeps = sorted((o["tmp"] / "multirun").glob("*/*"))
    assert len(sweeps) == 2
    formats = []
    for sweep in sweeps:
        jobs = results(sweep)
        assert sorted(jobs) == [0, 1, 2]
        formats.append({r["params"]["format"] for r in jobs.values()})
        assert (sweep / "report" / "report.md").is_file()
    assert sorted(map(sorted, formats)) == [["qdq"], ["qoperator"]]


def test_one_folder_is_never_shared_nor_reused_without_resume(outcomes):
    o = outcome(outcomes, "one folder")
    assert sorted(o["codes"]) == [0, 1], o["stderr"]
    loser = o["stderr"][o["codes"].index(1)]
    assert "Traceback" not in loser
    assert f"calibrun: error: sweep folder {o['sweep']}" in loser
    assert "is in use by another sweep" in loser or "holds an earlier sweep" in loser
    winner_format = ["qdq", "qoperator"][o["codes"].index(0)]
    assert {r["params"]["format"] for r in results(o["sweep"]).values()} == {winner_format}
    again = o["again"]
    assert again.returncode == 1
    assert "holds an earlier sweep" in again.stderr
    assert "add resume=true to continue it" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in o["sweep"].glob("*/result.json")} == o["before"]


def _signalled(tmp_path, args: list[str], sig: int, ready,
               command: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """`python -m calibrun ARGS` (or `command` ARGS) in a session of its own, stderr to tmp_path/single.err;
    `ready(err_path, proc)` waits for the moment to send `sig` to its group (failing if the process ended first or it
    takes over 180 s); then (the process, its stderr) once it has exited."""
    err_path = tmp_path / "single.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([*(command or [sys.executable, "-m", "calibrun"]), *args], cwd=tmp_path,
                                env=env_for(tmp_path), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        ready(err_path, proc)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc, err_path.read_text()


def _until(done, err_path, proc) -> None:
    """Wait until `done()` holds while the process runs (180 s at most)."""
    end = time.monotonic() + 180
    while not done():
        assert proc.poll() is None, err_path.read_text()[-3000:]
        assert time.monotonic() < end
        time.sleep(0.05)


def test_sigterm_during_a_single_run_ends_its_run_killed(tmp_path):
    """A single run (no -m) that calibrates long enough to be caught working, then SIGTERM. (100000 batches: the
    tracking writer starts the run while the job computes, ~2 s in, and 20000 batches were done by then.)"""
    fresh(tmp_path)
    run_dir = tmp_path / "run"

    def working(err_path, proc):
        _until(lambda: runs_of(tmp_path), err_path, proc)  # its MLflow run exists: the job is working
        time.sleep(0.5)

    proc, stderr = _signalled(tmp_path, ["batches=100000", f"hydra.run.dir={run_dir}",
                                         f"cache.dir={tmp_path / 'cache'}"], signal.SIGTERM, working)
    assert proc.returncode == -signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr
    assert [r.info.status for r in runs_of(tmp_path)] == ["KILLED"]
    assert not (run_dir / "result.json").exists()
    assert not (run_dir / "int8.onnx").exists()
    kept = sorted(p.name for p in run_dir.iterdir() if p.suffix in (".onnx", ".json"))
    assert kept == ["fp32.onnx", "fp32.steps.json"]  # the prepared lab model, whole: the line names it
    assert message_lines(stderr) == [
        f"calibrun: interrupted by SIGTERM: no result.json for this run (fp32.onnx, fp32.steps.json in {run_dir} were "
        "finished before it), its MLflow run (if started) KILLED"]


def test_sigterm_while_two_candidates_are_measured_at_once_ends_the_run_killed(tmp_path):
    """A single run caught in its recommendations, two candidates measured at once (the lab in runs of 4096 rows:
    each run long enough in onnxruntime for two at once), then SIGTERM: the job's thread stops waiting, the other
    candidate stops before its next run, and the run ends KILLED with its one line, no traceback, its result.json
    never written."""
    fresh(tmp_path)
    run_dir = tmp_path / "run"
    proc, stderr = _signalled(  # signalled after the first candidate, alone: the next two are measured together
        tmp_path, ["calibration=narrow", "eval.rows=1000000", "eval.batch_size=4096", f"hydra.run.dir={run_dir}",
                   f"cache.dir={tmp_path / 'cache'}"], signal.SIGTERM,
        lambda err_path, proc: _until(lambda: "candidates 2 at a time" in err_path.read_text(), err_path, proc))
    assert proc.returncode == -signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "recommend: best" not in stderr  # stopped among the candidates
    assert [r.info.status for r in runs_of(tmp_path)] == ["KILLED"]
    assert not (run_dir / "result.json").exists()
    lines = message_lines(stderr)
    assert len(lines) == 1, lines
    assert lines[0].startswith("calibrun: interrupted by SIGTERM: no result.json for this run")


def test_a_run_folder_is_never_shared(tmp_path):
    """Two single runs given one hydra.run.dir had mixed their files (one's result.json beside the other's config)
    and an MLflow run had logged the other job's int8 model. The run folder is locked as a sweep's is: a run started
    while another holds it stops with one line before Hydra writes anything into it; once free, it runs."""
    import fcntl

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    command = [sys.executable, "-m", "calibrun", f"hydra.run.dir={run_dir}", "tracking=off", "batches=2",
               f"cache.dir={tmp_path / 'cache'}"]
    with open(run_dir / ".calibrun.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 4242\n")
        held.flush()
        loser = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert loser.returncode == 1
    assert message_lines(loser.stderr) == [f"calibrun: error: run folder {run_dir} is in use by another run (pid "
                                           "4242); wait for it or choose another hydra.run.dir"]
    assert sorted(p.name for p in run_dir.iterdir()) == [".calibrun.lock"]  # no .hydra, no log of its own
    winner = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert winner.returncode == 0, winner.stderr[-3000:]
    assert (run_dir / "result.json").is_file()


def test_a_job_whose_stderr_reader_goes_away_still_completes(tmp_path):
    """`calibrun ... 2>&1 | head -2`: the reader closes the pipe after two lines. A progress or link line then raised
    BrokenPipeError inside the job, which failed it (result.json failed, its run FAILED) for output nobody reads.
    The job completes; its record is whole."""
    import json

    store(tmp_path)  # tracked: the run's link line is printed at the end, after the reader has gone
    proc = subprocess.Popen([sys.executable, "-m", "calibrun", f"hydra.run.dir={tmp_path / 'run'}", "batches=2000",
                             f"cache.dir={tmp_path / 'cache'}"], cwd=tmp_path, env=env_for(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc.stderr.readline()
    proc.stderr.readline()
    proc.stderr.close()  # as head does after its lines
    assert proc.wait(timeout=300) == 0
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "ok"
    assert [r.info.status for r in runs_of(tmp_path)] == ["FINISHED"]


@pytest.mark.parametrize("delay", [0.0, 0.25])
def test_ctrl_c_while_the_cli_starts_is_one_line(tmp_path, delay):
    """`python -m calibrun` in a fresh process spends its first half second importing: a Ctrl-C there printed
    Python's KeyboardInterrupt traceback (from inside numpy's imports) until session 41. Sent once the process has
    imported calibrun.tracking (the module after the start-of-process handlers: `-X importtime` says when, so that a
    loaded machine does not make it land before), and `delay` seconds later, in Hydra's or onnxruntime's imports or
    after: the process dies of the signal after one calibrun line, whenever it lands."""

    def imported(err_path, proc):
        _until(lambda: "| calibrun.tracking\n" in err_path.read_text(), err_path, proc)
        time.sleep(delay)

    with_importtime = [sys.executable, "-X", "importtime", "-m", "calibrun"]
    proc, stderr = _signalled(tmp_path, ["tracking=off", f"hydra.run.dir={tmp_path / 'run'}",
                                         f"cache.dir={tmp_path / 'cache'}"], signal.SIGINT, imported,
                              command=with_importtime)
    assert proc.returncode == -signal.SIGINT, stderr[-3000:]
    assert "Traceback" not in stderr
    lines = message_lines(stderr)
    assert len(lines) == 1
    assert lines[0].startswith("calibrun: interrupted by SIGINT")
