"""Running real sweeps for the fault tests, and the checks every fault must leave true.

After any fault (and the resume that follows it) the record a user trusts must hold: no MLflow run RUNNING,
each job of the sweep with exactly one FINISHED or FAILED run that result.json names (earlier attempts
are KILLED or FAILED history), no temp file anywhere, and a report that says what the job folders say.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from mlflow import MlflowClient

from tests.conftest import Proc, clean_env, run_python
from tests.stores import fresh_mlflow_store

SMALL = ("calibration=narrow,match,wide",)  # 3 lab jobs at the lab's 64 batches: calib_report.json is built
DEADLINE = 240


def env_for(tmp: Path, uri: str | None = None) -> dict:
    return clean_env(MLFLOW_TRACKING_URI=uri or f"sqlite:///{tmp / 'mlflow.db'}")


def store(tmp: Path) -> str:
    """A migrated empty MLflow store at tmp/mlflow.db (copied from a template: migrating costs seconds)."""
    if not (tmp / "mlflow.db").exists():
        return fresh_mlflow_store(tmp)
    return f"sqlite:///{tmp / 'mlflow.db'}"


def cli(tmp: Path, *overrides: str, sweep: Path | None = None, multirun: bool = True) -> list[str]:
    """`-m calibrun ...`: what follows the interpreter (run_python forks it; `argv` is the whole command)."""
    args = ["-m", "calibrun"] + (["-m"] if multirun else [])
    if sweep is not None:
        args.append(f"hydra.sweep.dir={sweep}")
    return [*args, f"cache.dir={tmp / 'cache'}", *overrides]


def argv(tmp: Path, *overrides: str, sweep: Path | None = None, multirun: bool = True) -> list[str]:
    return [sys.executable, *cli(tmp, *overrides, sweep=sweep, multirun=multirun)]


def run(tmp: Path, *overrides: str, sweep: Path | None = None, multirun: bool = True, env: dict | None = None,
        cwd: Path | None = None) -> tuple[Proc, float]:
    """Run calibrun to the end, forked from the preloaded server like every CLI run (tests/forked.py); (the
    process, its wall seconds). `start` keeps plain subprocesses for the sweeps a test kills."""
    start = time.monotonic()
    proc = run_python(cli(tmp, *overrides, sweep=sweep, multirun=multirun), cwd or tmp, env or env_for(tmp), DEADLINE)
    assert not proc.timed_out, f"calibrun still running after {DEADLINE} s:\n{proc.stderr[-3000:]}"
    return proc, time.monotonic() - start


def start(tmp: Path, *overrides: str, sweep: Path | None = None, name: str = "first") -> subprocess.Popen:
    """Start a sweep in its own session (the whole group can be signalled), output to files in tmp."""
    with open(tmp / f"{name}.out", "w") as out, open(tmp / f"{name}.err", "w") as err:
        return subprocess.Popen(argv(tmp, *overrides, sweep=sweep), cwd=tmp, env=env_for(tmp), stdout=out,
                                stderr=err, start_new_session=True)


def results(sweep: Path) -> dict[int, dict]:
    found = {}
    for path in sweep.glob("*/result.json"):
        try:
            found[int(path.parent.name)] = json.loads(path.read_text())
        except ValueError:
            found[int(path.parent.name)] = {"status": "unreadable"}
    return found


def wait_for_results(proc: subprocess.Popen, sweep: Path, count: int, timeout: float = DEADLINE) -> None:
    end = time.monotonic() + timeout
    while len(results(sweep)) < count:
        assert proc.poll() is None, f"the sweep exited ({proc.returncode}) before {count} job(s) finished"
        assert time.monotonic() < end, f"fewer than {count} job(s) finished in {timeout} s"
        time.sleep(0.02)


def temp_files(root: Path) -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(root):
        found += [Path(folder) / n for n in dirs + files if n.endswith((".tmp", ".prepare"))]
    return sorted(found)


def runs_of(tmp: Path) -> list:
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("calibrun")
    if experiment is None:
        return []
    return list(client.search_runs([experiment.experiment_id], max_results=10000))


def check_record(tmp: Path, sweep: Path, jobs: int) -> dict:
    """The invariants after a fault and its resume. Returns the runs by job number."""
    runs = runs_of(tmp)
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags
               and r.data.tags.get("calibrun.sweep_dir") == str(sweep.resolve())]
    assert len(parents) == 1, [p.info.run_name for p in parents]
    parent = parents[0]
    by_job = defaultdict(list)
    for r in runs:
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id:
            by_job[int(r.data.tags["calibrun.job_num"])].append(r)
    on_disk = results(sweep)
    assert sorted(on_disk) == list(range(jobs))
    for job, result in on_disk.items():
        current = [r for r in by_job[job] if r.info.status in ("FINISHED", "FAILED")
                   and r.info.run_id == result["mlflow"]["run_id"]]
        assert len(current) == 1, (job, [(r.info.status, r.info.run_id) for r in by_job[job]])
        assert current[0].info.status == ("FINISHED" if result["status"] == "ok" else "FAILED")
        finished = [r for r in by_job[job] if r.info.status == "FINISHED"]
        assert len(finished) == (1 if result["status"] == "ok" else 0), job  # never logged twice
    assert temp_files(tmp) == []
    report = json.loads((sweep / "report" / "calib_report.json").read_text())
    for result in on_disk.values():
        name = result["params"]["calibration"]
        assert report[name]["max_abs_error"] == result["metrics"]["max_abs_error"]
    return by_job


def one_line_error(proc: Proc) -> str:
    """The single calibrun error line of a failed run (and no traceback)."""
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("calibrun: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def fresh(tmp: Path) -> Path:
    store(tmp)
    return tmp / "sweep"
