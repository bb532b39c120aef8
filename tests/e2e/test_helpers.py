"""The shared test helpers of conftest.py: clean_env, run_cmd / run_python, requires_extra."""

from __future__ import annotations

import os
import sys
import time

import pytest

from tests.conftest import clean_env, installed, requires_extra, run_cmd, run_python


def test_clean_env_drops_what_changes_calibrun_and_keeps_the_rest(monkeypatch):
    for name in ("CALIBRUN_DEBUG", "CALIBRUN_CACHE", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "HYDRA_FULL_ERROR",
                 "PYTHONPATH"):
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("SOME_OTHER_SETTING", "kept")
    env = clean_env(MLFLOW_TRACKING_URI="sqlite:///here.db", TMPDIR=os.sep)
    assert not [k for k in env if k.startswith(("CALIBRUN_", "HYDRA_FULL_ERROR", "PYTHONPATH"))]
    assert [k for k in env if k.startswith("MLFLOW_")] == ["MLFLOW_TRACKING_URI"]
    assert env["MLFLOW_TRACKING_URI"] == "sqlite:///here.db"
    assert env["TMPDIR"] == os.sep
    assert env["SOME_OTHER_SETTING"] == "kept"
    assert env["PATH"] == os.environ["PATH"]


def test_run_python_returns_code_and_both_streams(tmp_path, monkeypatch):
    monkeypatch.setenv("CALIBRUN_DEBUG", "1")
    code = "import os, sys; print(os.getcwd()); print(os.environ.get('CALIBRUN_DEBUG'), file=sys.stderr); sys.exit(3)"
    proc = run_python(["-c", code], tmp_path, timeout=60)
    assert (proc.returncode, proc.timed_out) == (3, False)
    assert proc.stdout.strip() == str(tmp_path)
    assert proc.stderr.strip() == "None"  # the child got clean_env()
    assert proc.args[0] == sys.executable


@pytest.mark.slow
def test_run_cmd_kills_the_whole_group_at_the_timeout(tmp_path):
    """A child that started a grandchild and hangs: both are gone after the timeout (no orphan keeps running)."""
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
              "time.sleep(120)\n")
    start = time.monotonic()
    proc = run_python(["-c", script], tmp_path, timeout=2)  # the grandchild starts in ~0.1 s
    assert proc.timed_out
    assert proc.returncode is None
    assert time.monotonic() - start < 60
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_run_cmd_runs_any_command(tmp_path):
    proc = run_cmd(["sh", "-c", "echo out; echo err >&2; exit 0"], tmp_path, timeout=30)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "out\n", "err\n")


def test_requires_extra_skips_naming_the_extra_when_the_module_is_missing():
    missing = requires_extra("calibrun_no_such_module.sub", "nothing")
    assert missing.mark.name == "skipif"
    assert missing.mark.args == (True,)
    assert missing.mark.kwargs["reason"] == "the `nothing` extra is not installed (pip install -e '.[nothing]')"
    present = requires_extra("json", "core")
    assert present.mark.args == (False,)
    assert not installed("calibrun_no_such_module.sub")  # its parent is missing: find_spec raises, we say False
    assert installed("calibrun.core.files")

