"""Shared test helpers: subprocess runs of the CLIs, skips for optional extras, the lab model in tmp_path.

- `run_cmd(argv, cwd, env=None, timeout=...)` runs any command in a session of its own from `cwd` and returns a
  `Proc` (returncode, stdout, stderr, timed_out); at the timeout the whole process group is killed (joblib or Ray
  workers included) and returncode is None. `run_python(args, ...)` is the same for `python ARGS` with this
  interpreter (`["-m", "calibrun", ...]`, `[CALIBTOOL, ...]`); those two are forked from a process that imported
  their libraries once (tests/forked.py; `CALIBRUN_TEST_FORK=off`: plain subprocesses). Without `env` the child gets
  `clean_env()`.
- `clean_env(**extra)`: this environment without the variables that change what calibrun, MLflow or Hydra do
  (CALIBRUN_*, MLFLOW_*, HYDRA_FULL_ERROR, PYTHONPATH), plus `extra`. The package is installed (`pip install -e`),
  so the children import it from any folder.
- `requires_extra(module, extra)`: a skip marker for tests of an optional extra whose module is not installed.

tests/unit holds in-process tests (one file per module, the quick loop); tests/e2e holds subprocess runs, real
sweeps and trained models, all marked `slow` here. The suite runs on two pytest-xdist workers, one module per worker
at a time (pyproject.toml); the longest modules are collected first so that they do not end the run alone.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.process
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import forked

REPO = Path(__file__).resolve().parent.parent

# Bytecode is cached as a default Python does (in __pycache__, ignored by git) even where PYTHONDONTWRITEBYTECODE is
# set: otherwise each of the suite's ~300 processes compiles calibrun again (~40 ms) and each worker rewrites every
# test module's asserts again (~2 s). Set before the test modules are imported, inherited by every subprocess.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
CALIBTOOL = REPO / "calibtool.py"
FORK = os.environ.get("CALIBRUN_TEST_FORK", "on").lower() not in ("off", "0", "false", "no")
DROPPED_PREFIXES = ("CALIBRUN_", "MLFLOW_")
DROPPED = frozenset({"HYDRA_FULL_ERROR", "PYTHONPATH"})
TESTS = Path(__file__).resolve().parent
# Test modules by their summed seconds in a whole run (2 workers on 2 cores, 2026-12-04), longest first, then the
# others: with --dist loadscope a long module started last would hold the suite's end.
LONGEST_FIRST = (
    "e2e/test_repair_models.py", "e2e/test_fallback_nudenet.py", "e2e/test_cluster.py", "e2e/test_verdicts.py",
    "e2e/test_real_models.py", "e2e/test_sweep_record.py", "e2e/faults/test_store_creation.py",
    "e2e/faults/test_kills.py", "e2e/test_histogram_trained.py", "e2e/test_bad_inputs.py", "e2e/test_calibtool.py",
    "e2e/faults/test_server_faults.py", "e2e/test_tracking_server.py", "e2e/test_sweep.py",
    "e2e/test_aggregate_sweeps.py", "e2e/test_analysis_runs.py", "e2e/faults/test_disk_full.py",
    "unit/test_config.py", "e2e/test_trials_ray.py", "e2e/test_parallel.py", "e2e/test_memory_limit.py",
    "e2e/test_user_models.py", "e2e/test_packaging.py", "e2e/test_resume.py", "e2e/test_task_outputs.py",
    "e2e/faults/test_store_faults.py", "unit/test_patches.py", "unit/test_analysis.py", "e2e/test_measure_runs.py",
    "e2e/faults/test_config_faults.py", "e2e/test_zoo.py", "unit/test_aggregate.py",
)


def pytest_configure(config: pytest.Config) -> None:
    # A pytest started with SIGINT ignored (`pytest &` from a script) passes that on to every child, and the CLIs
    # would ignore Ctrl-C. The tests that send SIGINT need its default, as from a terminal (exec resets a handled
    # signal to its default, not an ignored one).
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """tests/e2e is `slow`; the longest modules first (a stable sort: each module keeps its own order)."""
    rank = {name: num for num, name in enumerate(LONGEST_FIRST)}

    def where(item: pytest.Item) -> str:
        try:
            return item.path.resolve().relative_to(TESTS).as_posix()
        except ValueError:  # a test file outside tests/ (given on the command line)
            return ""

    for item in items:
        if where(item).startswith("e2e/"):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: rank.get(where(item), len(rank)))


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without CALIBRUN_*, MLFLOW_*, HYDRA_FULL_ERROR and PYTHONPATH; then `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED and not k.startswith(DROPPED_PREFIXES)}
    env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass
class Proc:
    """What a finished (or killed) subprocess left: the attributes of subprocess.CompletedProcess that tests read."""

    args: list[str]
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    timed_out: bool = False


def run_cmd(argv, cwd: Path | str, env: dict | None = None, timeout: float = 300, stdin=subprocess.DEVNULL) -> Proc:
    """Run `argv` from `cwd` in a session of its own, output captured as text; kill its group at `timeout`."""
    argv = [str(a) for a in argv]
    proc = subprocess.Popen(argv, cwd=cwd, env=clean_env() if env is None else env, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return Proc(argv, proc.returncode, stdout, stderr)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return Proc(argv, None, stdout, stderr, timed_out=True)
    finally:
        if proc.poll() is None:  # interrupted (KeyboardInterrupt) while waiting: leave nothing running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_python(args, cwd: Path | str, env: dict | None = None, timeout: float = 300) -> Proc:
    """`python ARGS` with this interpreter: run_cmd([sys.executable, *args], ...); `-m calibrun ...` and
    `calibtool.py ...` are forked from a process that imported their libraries already (tests/forked.py)."""
    args = [str(a) for a in args]
    if FORK and args[:2] == ["-m", "calibrun"]:
        return _run_forked("module", "calibrun", args, cwd, env, timeout)
    if FORK and args[:1] == [str(CALIBTOOL)]:
        return _run_forked("script", str(CALIBTOOL), args, cwd, env, timeout)
    return run_cmd([sys.executable, *args], cwd, env, timeout)


_forkserver: tuple | None = None
# Process.start() first polls every child in multiprocessing.process._children that has not been joined (its
# _cleanup); from another thread, that poll can read a running child's exit status while the thread joining that
# child reads the pipe's end instead and reports 255 (1 in ~100 with 4 threads starting trivial children). Each
# child is taken out of that set as soon as it started, under this lock, so no start polls another thread's child.
_STARTING = threading.Lock()


def _server() -> tuple:
    """The forkserver context (started here, one per pytest worker, with clean_env()), the
    interpreter's own sys.path (what `python` puts after the script's folder and PYTHONPATH) and the environment's
    names the server starts with."""
    global _forkserver
    if _forkserver is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(forked.PRELOAD))
        base = subprocess.run([sys.executable, "-c", "import sys; print(repr(sys.path[1:]))"], env=clean_env(),
                              cwd="/", capture_output=True, text=True, check=True).stdout
        # started now, with the children's base environment (clean_env: no MLFLOW_*), so that what the preloaded
        # modules add to it at import is told apart from what a test's environment leaves out
        saved, launch = dict(os.environ), clean_env()
        os.environ.clear()
        os.environ.update(launch)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _forkserver = (context, ast.literal_eval(base), frozenset(launch))
    return _forkserver


def _run_forked(kind: str, target: str, args: list[str], cwd: Path | str, env: dict | None, timeout: float) -> Proc:
    """run_cmd's contract (output captured as text, the group killed at `timeout`) for a forked CLI."""
    context, base, launch_keys = _server()
    argv = [sys.executable, *args]
    cli_args = args[2:] if kind == "module" else args[1:]
    env = clean_env() if env is None else env
    with tempfile.TemporaryDirectory(prefix="calibrun-fork-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        out.touch()
        err.touch()
        proc = context.Process(target=forked.child, args=(kind, target, cli_args, str(Path(cwd).resolve()),
                                                           dict(env), base, launch_keys, str(out), str(err)))
        with _STARTING:  # see _STARTING
            proc.start()
            multiprocessing.process._children.discard(proc)
        timed_out = False
        try:
            proc.join(timeout)
            timed_out = proc.exitcode is None
        finally:
            if proc.exitcode is None:  # the timeout, or interrupted while waiting: leave nothing running
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.join()
        read = {"encoding": "utf-8", "errors": "replace"}
        return Proc(argv, None if timed_out else proc.exitcode, out.read_text(**read), err.read_text(**read),
                    timed_out)


def installed(module: str) -> bool:
    """Whether `module` can be imported, found without importing it; False also when its parent package is missing
    (`hydra_plugins.x` with no Hydra plugin installed at all, where find_spec raises)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def extra_missing(extra: str) -> str:
    return f"the `{extra}` extra is not installed (pip install -e '.[{extra}]')"


def requires_extra(module: str, extra: str) -> pytest.MarkDecorator:
    """A skip marker: the test SKIPS, naming the extra to install, when `module` of the optional `extra` is missing.

    Import the extra's modules inside the test (or after this check), never at the top of a test file."""
    return pytest.mark.skipif(not installed(module), reason=extra_missing(extra))


@pytest.fixture
def lab_model(tmp_path: Path) -> Path:
    """The lab model written by calibrun.model.write_lab_model into tmp_path/models/lab.onnx."""
    from calibrun.lab.model import write_lab_model

    folder = tmp_path / "models"
    folder.mkdir(exist_ok=True)
    return write_lab_model(folder / "lab.onnx")


def run_calibtool(args, cwd: Path, cache: Path | str, timeout: float = 300,
                  extra_env: dict | None = None) -> tuple[int, str, str]:
    """`python calibtool.py ARGS` from `cwd`, CALIBRUN_CACHE=cache (and `extra_env`) -> (returncode, stdout, stderr)."""
    proc = run_python([CALIBTOOL, *args], cwd, clean_env(**{"CALIBRUN_CACHE": cache, **(extra_env or {})}), timeout)
    assert not proc.timed_out, f"calibtool {args} still running after {timeout} s"
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An empty working directory that is not the repository."""
    folder = tmp_path / "cwd"
    folder.mkdir(exist_ok=True)
    assert folder.resolve() != REPO
    return folder


@pytest.fixture
def calibtool(tmp_path: Path, workdir: Path):
    """A runner for calibtool.py as a subprocess from `workdir`, cache in tmp_path/cache.

    `calibtool("scales", path)` -> (returncode, stdout, stderr).
    """
    cache = tmp_path / "cache"

    def run(*args, cwd: Path | None = None) -> tuple[int, str, str]:
        return run_calibtool(args, cwd or workdir, cache)

    run.cwd = workdir
    run.cache = cache
    return run


PROGRESS_LINE = re.compile(r"^calibrun: [\w ]+: +\d+%\|")  # a progress meter (calibrun.core.progress), not a message


def message_lines(stderr: str) -> list[str]:
    """calibrun's own lines on stderr (`calibrun: ...`), progress meters left out: what a user reads as messages."""
    return [line for line in stderr.splitlines() if line.startswith("calibrun:") and not PROGRESS_LINE.match(line)]
