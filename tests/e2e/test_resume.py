"""A real lab sweep (the lab's QDQ half: 3 calibrations x 4 batch counts, enough for calib_report.json and
samples.json) killed mid-way (SIGINT, SIGKILL) and resumed with `resume=true`.

The kill is made to land while a file is being written: once at least MIN_DONE jobs are finished, the sweep
is frozen (SIGSTOP) at a moment a temp file of calibrun.core.files.atomic_path exists, then sent the signal (a
SIGINT that is not acted on is sent again at the next write; test_one_ctrl_c_stops_the_sweep counts them).
After the kill every file under its final name must be whole; the resumed sweep must skip exactly the jobs
that were complete (and valid), recompute the rest, and report exactly what a clean, uninterrupted sweep
reports. Tracking is off (MLflow is not what is tested here, and it would double the time).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import pytest

from tests.conftest import Proc, clean_env, message_lines, run_python

pytestmark = pytest.mark.slow

LAB_SWEEP = ("calibration=narrow,match,wide", "batches=1,8,64,512", "format=qdq")
LAB_JOBS = 12
MIN_DONE = 5
DEADLINE = 180  # seconds for anything the tests wait for


def lab_command(tmp: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "calibrun", "-m", *LAB_SWEEP, f"hydra.sweep.dir={tmp / 'sweep'}",
            f"cache.dir={tmp / 'cache'}", "tracking=off", *extra]


def env_for(tmp: Path) -> dict:
    return clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp / 'mlflow.db'}")


def start(tmp: Path, argv: list[str]) -> subprocess.Popen:
    """The command in its own session (so the whole group can be signalled), output to files in tmp."""
    with open(tmp / "first.out", "w") as out, open(tmp / "first.err", "w") as err:
        return subprocess.Popen(argv, cwd=tmp, env=env_for(tmp), stdout=out, stderr=err, start_new_session=True)


def run(tmp: Path, argv: list[str], cwd: Path | None = None) -> Proc:
    """The command to its end; `python -m calibrun` forked from the preloaded server (tests/forked.py)."""
    proc = run_python(argv[1:], cwd or tmp, env_for(tmp), DEADLINE)
    assert not proc.timed_out, f"{argv} still running after {DEADLINE} s:\n{proc.stderr[-3000:]}"
    return proc


def temp_files(root: Path) -> list[Path]:
    """Temp files of atomic_path (`.NAME.XXXX[.suffix].tmp`) and prepare workspaces (`.NAME.XXXX.prepare`)."""
    found = []
    for folder, dirs, files in os.walk(root):
        found += [Path(folder) / name for name in dirs + files if name.endswith((".tmp", ".prepare"))]
    return sorted(found)


def results(sweep: Path) -> dict[int, Path]:
    return {int(p.parent.name): p for p in sweep.glob("*/result.json")}


def stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:  # no /proc: give the signal a moment instead
        time.sleep(0.05)
        return True


def freeze_mid_write(proc: subprocess.Popen, tmp: Path, end: float, seen: set[Path]) -> list[Path] | None:
    """Freeze the sweep (SIGSTOP) at a moment a temp file not in `seen` exists; the temp files present then,
    or None once the sweep has exited."""
    while proc.poll() is None:
        assert time.monotonic() < end, f"no write caught in progress in {DEADLINE} s"
        if set(temp_files(tmp)) - seen:
            os.killpg(proc.pid, signal.SIGSTOP)
            while not stopped(proc.pid):
                time.sleep(0.001)
            caught = temp_files(tmp)
            if set(caught) - seen:
                return caught
            os.killpg(proc.pid, signal.SIGCONT)
        time.sleep(0.002)
    return None


def interrupt_mid_write(proc: subprocess.Popen, tmp: Path, sig: int) -> tuple[list[Path], int]:
    """Wait for MIN_DONE finished jobs, freeze the sweep while a temp file exists, send `sig`, let it run.

    Returns the temp files present when the first signal was sent, and how many signals it took. A SIGINT
    that is not acted on lets the sweep reach its next write, where it is frozen and sent another one (an
    interrupted sweep only unwinds, it starts no new write)."""
    end = time.monotonic() + DEADLINE
    while len(results(tmp / "sweep")) < MIN_DONE:
        assert proc.poll() is None, f"the sweep exited ({proc.returncode}) before {MIN_DONE} jobs finished"
        assert time.monotonic() < end, f"fewer than {MIN_DONE} jobs finished in {DEADLINE} s"
        time.sleep(0.05)
    first: list[Path] = []
    sent = 0
    seen: set[Path] = set()
    while (caught := freeze_mid_write(proc, tmp, end, seen)) is not None:
        assert sent == 0 or sig != signal.SIGKILL
        first = first or caught
        seen |= set(caught)
        os.killpg(proc.pid, sig)
        sent += 1
        os.killpg(proc.pid, signal.SIGCONT)  # a pending SIGINT is delivered when the process runs again
    proc.wait(timeout=60)
    assert sent, "the sweep finished before a write could be caught in progress"
    return first, sent


def broken_files(root: Path) -> list[str]:
    """Files under their final name that are not whole: JSON that does not parse, ONNX that does not load."""
    broken = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or any(part.startswith(".") for part in path.relative_to(root).parts):
            continue  # temp files and workspaces are hidden; .hydra holds Hydra's own yaml
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".onnx":
                onnx.load(str(path))
        except Exception as exc:
            broken.append(f"{path.relative_to(root)}: {exc!r}"[:300])
    return broken


def report_jsons(sweep: Path) -> dict[str, object]:
    return {p.name: json.loads(p.read_text()) for p in sorted((sweep / "report").glob("*.json"))}


def skipped_line(job: int) -> str:
    return f"job {job}: complete and valid, skipped (resume=true)"


@dataclass
class Interrupted:
    sig: int
    tmp: Path
    code: int  # of the killed sweep
    signals: int  # how many were sent (at successive writes) until the sweep stopped
    caught: list[Path]  # temp files present when the signal was sent
    after_kill_temps: list[Path]
    after_kill_broken: list[str]
    report_after_kill: list[str]  # report files that did not parse (the report folder may not exist)
    done: dict[int, tuple[bytes, int]]  # complete jobs before the resume: result.json bytes and mtime
    tampered: int  # a complete job whose int8.onnx was truncated before the resume
    resumed: Proc = field(repr=False, default=None)


def interrupted_sweep(tmp: Path, sig: int) -> Interrupted:
    proc = start(tmp, lab_command(tmp))
    try:
        caught, signals = interrupt_mid_write(proc, tmp, sig)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    sweep = tmp / "sweep"
    report_broken = broken_files(sweep / "report") if (sweep / "report").exists() else []
    done = {}
    for job, path in results(sweep).items():
        data = path.read_bytes()
        try:
            ok = json.loads(data)["status"] == "ok"
        except ValueError:
            ok = False  # broken_files names it
        if ok:
            done[job] = (data, path.stat().st_mtime_ns)
    state = Interrupted(sig, tmp, proc.returncode, signals, caught, temp_files(tmp), broken_files(tmp),
                        report_broken, done, tampered=min(done))
    int8 = sweep / str(state.tampered) / "int8.onnx"
    int8.write_bytes(int8.read_bytes()[: int8.stat().st_size // 2])
    state.resumed = run(tmp, lab_command(tmp, "resume=true"))
    return state


def clean_sweep(tmp: Path) -> Path:
    """The clean, uninterrupted lab sweep."""
    proc = run(tmp, lab_command(tmp))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "sweep"


@dataclass
class Continued:
    """`-m calibration=narrow,match,wide` in the default multirun/<date>/<time> folder, one result.json
    deleted, then the same command with resume=true."""

    cwd: Path
    sweep: Path
    kept: dict[int, tuple[bytes, int]]
    resumed: Proc
    changed: Proc  # resume=true into that folder with other overrides, before `resumed`: refused


def continued_sweep(tmp: Path) -> Continued:
    cwd = tmp / "cwd"
    cwd.mkdir()
    argv = [sys.executable, "-m", "calibrun", "-m", "calibration=narrow,match,wide", f"cache.dir={tmp / 'cache'}",
            "tracking=off"]
    first = run(tmp, argv, cwd)
    assert first.returncode == 0, first.stderr[-3000:]
    (sweep,) = (cwd / "multirun").glob("*/*")
    assert sorted(results(sweep)) == [0, 1, 2]
    (sweep / "1" / "result.json").unlink()
    kept = {job: (p.read_bytes(), p.stat().st_mtime_ns) for job, p in results(sweep).items()}
    changed = run(tmp, [*argv, "format=qoperator", "resume=true", f"hydra.sweep.dir={sweep}"], cwd)
    return Continued(cwd, sweep, kept, run(tmp, [*argv, "resume=true"], cwd), changed)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every sweep of this module, run side by side (each spends seconds importing, then little CPU per job)."""
    tasks = {
        "clean": (clean_sweep, "clean"),
        "sigint": (lambda tmp: interrupted_sweep(tmp, signal.SIGINT), "sigint"),
        "sigkill": (lambda tmp: interrupted_sweep(tmp, signal.SIGKILL), "sigkill"),
        "continued": (continued_sweep, "continued"),
    }
    # A process started with SIGINT ignored (pytest run with `&` from a script) passes that on: Python then keeps
    # ignoring Ctrl-C. The sweeps must get SIGINT's default, as from a terminal (a handled signal is reset on exec).
    sigint = signal.getsignal(signal.SIGINT)
    if sigint == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ThreadPoolExecutor(max_workers=len(tasks)) as pool:
            futures = {name: pool.submit(fn, tmp_path_factory.mktemp(folder)) for name, (fn, folder) in tasks.items()}
            outcomes = {}
            for name, future in futures.items():
                try:
                    outcomes[name] = future.result()
                except Exception as exc:  # reported by the tests that need it
                    outcomes[name] = exc
    finally:
        signal.signal(signal.SIGINT, sigint)
    return outcomes


def outcome(runs: dict, name: str):
    value = runs[name]
    if isinstance(value, Exception):
        raise AssertionError(f"the {name} sweep failed: {value}") from value
    return value


SCENARIOS = ["sigint", "sigkill"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_kill_leaves_only_whole_files(scenario, runs):
    s: Interrupted = outcome(runs, scenario)
    assert s.code != 0
    assert s.caught, "the signal was not sent during a write"
    assert len(s.done) >= MIN_DONE
    assert s.after_kill_broken == []
    assert s.report_after_kill == []
    if s.sig == signal.SIGINT:  # Python unwinds: every temp file is removed on the way out
        assert s.after_kill_temps == []
    else:  # nothing runs after SIGKILL: only atomic_path's hidden temps may be left, never a final name
        assert all(p.name.startswith(".") for p in s.after_kill_temps), s.after_kill_temps


# A SIGINT that landed while runner.run wrote config_resolved.yaml was sometimes not acted on (3 of 10 trials) while
# Python's default handler was in place; calibrun now installs its own
# (calibrun.core.interrupts.install_signal_handlers).
def test_one_ctrl_c_stops_the_sweep(runs):
    s: Interrupted = outcome(runs, "sigint")
    assert s.signals == 1


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_resume_skips_complete_jobs_and_computes_the_rest(scenario, runs):
    s: Interrupted = outcome(runs, scenario)
    proc = s.resumed
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    now = results(s.tmp / "sweep")
    assert sorted(now) == list(range(LAB_JOBS))
    for job, path in now.items():
        assert json.loads(path.read_text())["status"] == "ok", job
        assert onnx.load(str(path.parent / "int8.onnx")).graph.node
        if job in s.done and job != s.tampered:
            assert skipped_line(job) in proc.stderr
            assert (path.read_bytes(), path.stat().st_mtime_ns) == s.done[job]  # not rewritten
        else:
            assert skipped_line(job) not in proc.stderr
    skipped = proc.stderr.count("skipped (resume=true)")
    assert skipped == len(s.done) - 1  # every complete job but the tampered one
    assert temp_files(s.tmp / "sweep" / "report") == []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_resume_recomputes_a_truncated_model(scenario, runs):
    s: Interrupted = outcome(runs, scenario)
    job = s.tmp / "sweep" / str(s.tampered)
    assert skipped_line(s.tampered) not in s.resumed.stderr
    result = job / "result.json"
    assert (result.read_bytes(), result.stat().st_mtime_ns) != s.done[s.tampered]
    assert json.loads(result.read_text())["status"] == "ok"
    assert (job / "int8.onnx").read_bytes() == (outcome(runs, "clean") / str(s.tampered) / "int8.onnx").read_bytes()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_resumed_report_equals_the_report_of_a_clean_sweep(scenario, runs):
    s: Interrupted = outcome(runs, scenario)
    assert s.resumed.returncode == 0, s.resumed.stderr[-3000:]
    expected = report_jsons(outcome(runs, "clean"))
    assert {"calib_report.json", "samples.json"} <= set(expected)
    got = report_jsons(s.tmp / "sweep")
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name] == value, name




@pytest.mark.parametrize("scenario", ["sigint", "sigkill"])
def test_no_temp_file_is_left_after_the_resume(scenario, runs):
    s: Interrupted = outcome(runs, scenario)
    assert s.caught  # a write was in progress at the kill
    assert temp_files(s.tmp) == []


def test_resume_without_sweep_dir_continues_the_newest_sweep_of_the_command(runs):
    c: Continued = outcome(runs, "continued")
    second = c.resumed
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resume=true: continuing sweep {c.sweep.relative_to(c.cwd)}" in second.stderr
    assert sorted((c.cwd / "multirun").glob("*/*")) == [c.sweep]  # no second sweep folder
    now = results(c.sweep)
    assert sorted(now) == [0, 1, 2]
    for job in (0, 2):
        assert skipped_line(job) in second.stderr
        assert (now[job].read_bytes(), now[job].stat().st_mtime_ns) == c.kept[job]
    assert skipped_line(1) not in second.stderr
    assert json.loads(now[1].read_text())["status"] == "ok"
    assert json.loads((c.sweep / "report" / "calib_report.json").read_text())["best"] in {"narrow", "match", "wide"}


def test_resume_with_other_overrides_is_refused_and_changes_nothing(runs):
    """A probe resumed a finished sweep with format=qoperator: every job folder was rewritten with the new settings
    and the finished runs closed FAILED. resume=true continues a sweep as it was started; other overrides are one
    line, before any job (the resume after it, with the same command, skips the jobs that were complete)."""
    c: Continued = outcome(runs, "continued")
    assert c.changed.returncode == 1
    assert message_lines(c.changed.stderr) == [
        f"calibrun: error: resume=true continues the sweep in {c.sweep} with the overrides it was started with, and "
        "this command's differ (this command adds format=qoperator): give the same overrides with resume=true, or "
        "start another sweep"]
    for job in (0, 2):
        assert skipped_line(job) in c.resumed.stderr  # untouched by the refused command
