"""SIGINT and SIGTERM as an exception, and never lost.

The handler that `install_signal_handlers` installs (for sweeps and jobs; calibtool has its own) raises
`Interrupted` where the process is, so that the job and the sweep unwind and close their MLflow runs; it ignores
further signals while they close. An exception raised in
some places is dropped without a trace: inside a finaliser (a `__del__`, a weakref or gc callback: printed as
"Exception ignored in ..."), and inside the init of some compiled modules (numpy.random's, imported on first use at
the start of a calibration, swallows it silently: calibtool then ran a 100000-batch calibration to its end, 3 times in
40 Ctrl-Cs). So the handler also records the signal here, the points where work goes on (every atomic write, every
job's start, every chunk of a calibration pass and every evaluation batch) raise it again (`check`), and the places
that handle the interrupt clear it (`acknowledge`), and free what the interrupted code held (`release`) before they
close the runs. A few steps must not be cut in two (`deferred`): there the handler only records the signal, and
it is raised when the step ends. Python prints a dropped exception with its traceback; a dropped interrupt is not
printed (`quiet_dropped`), so that an interrupted run still ends with its one line.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator

_pending: int | None = None
_deferring = 0


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised where the process is, so that the job and the sweep unwind and close their runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def record(signum: int) -> None:
    global _pending
    _pending = signum


def acknowledge() -> None:
    """The interrupt reached a handler: it need not be raised again."""
    global _pending
    _pending = None


def release(exc: BaseException) -> None:
    """Free what the interrupted code still holds through the frames of `exc` (and of the exceptions it was raised
    during), so that the runs can be closed.

    Raised inside an MLflow store query after the query's session wrote (an autoflush before a lazy load), the
    interrupt leaves SQLAlchemy's cursor referenced only by those frames. Until the cursor is freed its SQLite
    connection cannot close and keeps the write lock: closing the job's and the parent run then waits MLflow's
    20 s busy timeout per attempt, retried, for minutes (a SIGINT'd sweep seen stuck 2 minutes, 1 run in ~30)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)  # the frames still executing (the handler's own) are kept
        exc = exc.__context__
    gc.collect()  # SQLAlchemy's objects refer to each other


def check() -> None:
    """Raise a recorded interrupt that no handler has seen (it was dropped on the way)."""
    if _pending is not None:
        signum = _pending
        acknowledge()
        raise Interrupted(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A step that an interrupt must not cut in two (creating a temp folder and registering its removal): inside it
    the handler only records the signal, which is raised when the step ends. Only the main thread's steps (where
    Python runs signal handlers) are deferred."""
    global _deferring
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring:
        check()


def raise_interrupted(signum, frame) -> None:
    """A signal handler: record the signal and raise `Interrupted` where the process is (at the end of a `deferred`
    step when inside one)."""
    record(signum)
    if not _deferring:
        raise Interrupted(signum)


def quiet_dropped() -> Callable:
    """Install a `sys.unraisablehook` that does not print a dropped interrupt ("Exception ignored in ..." and a
    traceback: seen when a SIGTERM landed in SQLAlchemy's weakref cleanup during a sweep) and records it again, so
    that the next `check` raises it. Every other dropped exception goes to the hook it replaces, which it returns
    (to be restored by whoever installed it); installed once."""
    previous = sys.unraisablehook
    if getattr(previous, "calibrun_quiet", False):
        return previous

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, Interrupted):
            record(unraisable.exc_value.signum)
        else:
            previous(unraisable)

    hook.calibrun_quiet = True
    sys.unraisablehook = hook
    return previous


# --- the handlers: every run ends FINISHED, FAILED or KILLED ---------------------------------------------------

def _raise_interrupted(signum, frame) -> None:
    # Further signals are ignored while the runs are closed (bounded: the store's timeouts); SIGKILL still works.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    # Raised inside an MLflow store query, the interrupt leaves SQLAlchemy a cursor it cannot close; its pool logs
    # that with a traceback ("Error closing cursor"). The run is being closed and reported in one line: quiet it.
    logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
    raise_interrupted(signum, frame)  # recorded: raised again at the next check if Python drops it


_IGNORED_AT_START: set[int] = set()  # signals the process was started ignoring (while_starting): kept ignored


def while_starting() -> None:
    """From a CLI's first line until install_signal_handlers: SIGINT or SIGTERM end the process in one line (Python's
    own default printed a KeyboardInterrupt traceback from whichever import it was in). A signal the process was
    started ignoring stays ignored, here and after (a shell's `cmd &` in a script ignores SIGINT, so that the
    script's Ctrl-C is not its background jobs'): the Unix convention, which Python keeps for SIGINT too."""
    with contextlib.suppress(ValueError):  # not the main thread
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is signal.SIG_IGN:
                _IGNORED_AT_START.add(sig)
            else:
                signal.signal(sig, _end_while_starting)


def _end_while_starting(signum, frame) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"calibrun: interrupted by {signal.Signals(signum).name} while starting: no job ran\n")
    die_of(Interrupted(signum))


def install_signal_handlers() -> None:
    """SIGINT and SIGTERM raise Interrupted (a KeyboardInterrupt) in the main thread; one that Python drops is not
    printed (it is raised again at the next check). One the process was started ignoring stays ignored
    (while_starting)."""
    quiet_dropped()
    with contextlib.suppress(ValueError):  # not the main thread (some launchers): keep the defaults
        for sig in (signal.SIGINT, signal.SIGTERM):
            if sig not in _IGNORED_AT_START:
                signal.signal(sig, _raise_interrupted)


_WITH_PARENT: list[int] = []  # this process's pid once die_with_parent has set its death signal


def die_with_parent() -> None:
    """In a launcher's worker (joblib's loky processes): SIGTERM when the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so that a sweep killed with SIGKILL (the OOM killer) takes its workers with it: they had
    finished their jobs in flight and marked the runs FINISHED after the sweep's death, under a resume that had
    closed those runs KILLED. SIGTERM ends the job as any interrupt does (its run KILLED). Elsewhere nothing."""
    if os.getpid() in _WITH_PARENT or not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    _WITH_PARENT[:] = [os.getpid()]
    if os.getppid() != parent:  # it died before the signal was set: nothing would come
        os.kill(os.getpid(), signal.SIGTERM)


def die_of(exc: BaseException) -> None:
    """End the process the way the signal would have (exit status 128 + signal number in a shell), after the
    runs were closed and one line was printed. Plain Ctrl-C (KeyboardInterrupt) counts as SIGINT."""
    signum = getattr(exc, "signum", signal.SIGINT)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached when the signal kills us
