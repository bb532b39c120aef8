"""The CLIs run as forks of a process that imported their libraries once (multiprocessing's forkserver).

`python -m calibrun` spends about a second importing calibrun, Hydra, onnxruntime and numpy, and a tracked run 2.4 s
more importing MLflow and its SQL store; the suite starts about 300 such processes. tests/conftest.py's
`run_python` forks each one instead from a server process (one per pytest worker, started at the first call) that
imported those libraries once, and runs the CLI there as Python runs it: `sys.argv`, the working directory, the
environment (plus what the preloaded modules set at import unless it sets that itself, as calibrun.tracking's
MLFLOW_DISABLE_TELEMETRY default), `sys.path` (the working directory, then PYTHONPATH, then the interpreter's own)
and stdin/stdout/stderr are the child's own; `runpy` executes `calibrun/__main__.py` (or calibtool.py) as
`__main__`; on exit the interpreter's order: non-daemon threads joined, exit handlers run, streams flushed. A
SystemExit's code, an uncaught exception's traceback (exit 1) and a death by a signal (-N) come back as from a
process Python started.

What a fork does not show, the cold start (an import that fails, a slow import), is what the processes that tests
start with subprocess show: the wheel installed in a clean venv (tests/e2e/test_packaging.py, .ci/run), the kills
and `-c`/`-W` runs. `CALIBRUN_TEST_FORK=off` runs every CLI as a plain subprocess.

Only the standard library is imported here: the forkserver's children unpickle the target by importing this module.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import signal
import sys
import tempfile
import threading
import traceback

# what the server imports once (a module that fails to import is skipped by multiprocessing); not calibrun.__main__,
# which runpy executes as __main__ in each child (runpy warns when it was imported before)
PRELOAD = ("calibrun.runner", "calibrun.sweep", "calibrun.report.aggregate", "calibrun.tracking", "mlflow",
           "mlflow.store.tracking.sqlalchemy_store", "mlflow.onnx", "onnxruntime.quantization")


def _exit_code(exc: SystemExit) -> int:
    """What the interpreter exits with for an uncaught SystemExit (a non-int code is printed, exit 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def child(kind: str, target: str, args: list[str], cwd: str, env: dict[str, str], base_path: list[str],
          launch_keys: frozenset[str], out: str, err: str) -> None:
    """The forked child: set up what a fresh `python -m calibrun ARGS` (kind "module") or `python calibtool.py ARGS`
    (kind "script") gets, run it, exit as the interpreter would. `launch_keys`: the environment's names when the
    server started (any other name in it the preloaded modules set)."""
    os.setsid()  # a session of its own, as run_cmd's start_new_session: its group is killed at a timeout
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY), (2, err, os.O_WRONLY)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the child's stdin for its whole life)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, errors="backslashreplace")  # noqa: SIM115
    os.chdir(cwd)
    set_at_import = {k: v for k, v in os.environ.items() if k not in launch_keys}
    os.environ.clear()
    os.environ.update({**set_at_import, **env})  # an import's setdefault: the environment given wins
    tempfile.tempdir = None  # read TMPDIR again
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [cwd if kind == "module" else os.path.dirname(target), *extra, *base_path]
    sys.argv = [target, *args]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    code = 0
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:  # Python dies of SIGINT on an uncaught KeyboardInterrupt
        traceback.print_exc()
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 (the interpreter prints it and exits 1)
        traceback.print_exc()
        code = 1
    _finish()
    os._exit(code)


def _finish() -> None:
    threading._shutdown()  # the interpreter's order at exit: threads, exit handlers, streams
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a full disk: the interpreter ignores it too
            stream.flush()
