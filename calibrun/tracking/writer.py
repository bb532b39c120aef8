"""The tracking writer: MLflow in a process of its own, started before Hydra, so that no job waits on its import.

Importing MLflow and its SQLAlchemy store costs ~2 s of CPU in a fresh process, and a tracked run used to pay it in
line, before its first job. `python -m calibrun` now starts this writer first thing (`start`): a child process
that imports MLflow on the other core while the parent imports Hydra, composes and validates the config and
computes. Every tracking call of the parent goes to the writer (`RemoteTracker`, the interface of
`calibrun.tracking.Tracker`), which holds the real Tracker and serves the calls in order; the parent process never
imports MLflow.

Nothing waits until an answer is needed (`RemoteTracker`): run and model ids are `Pending` until resolved, logging
calls return at once and their errors are raised by the next call that waits (a run's `finish` at the latest), so
result.json still says ok only once tracking succeeded and a store error still fails the job with its one line.
Steps that read the store (the sweep's summary, a resumed job's earlier runs) run inside the writer through
`Tracker.run(function, ...)`.

The writer ignores SIGINT and SIGTERM (the parent catches them and asks it to close the runs KILLED) and exits when
the parent says so or its pipe closes (the parent died). A writer that dies fails the call in flight with one line
naming it (the job fails, as on any tracking error); the parent then opens the store itself for every later call,
so the failed job's run is still closed FAILED and the next jobs are recorded.

Only where it pays (`wanted`): not with tracking=off, not where MLflow is imported already, not in a launcher's
workers (joblib, Ray, SLURM: processes of their own, each with an in-process Tracker), and not with
`CALIBRUN_TRACKING_WRITER=off` (the bench compares both). docs/tracking.md has the user's view.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection

log = logging.getLogger(__name__)
_WRITER: Writer | None = None
ENV = "CALIBRUN_TRACKING_WRITER"
EXIT_WAIT = 30.0  # seconds the parent waits, at its exit, for the writer to end the store's session
_NO_TRACKING = ("tracking=off", "tracking.name=off")
# Hydra's flags that only show something (no job, nothing tracked); calibrun.__main__ reads them here too
SHOW_FLAGS = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--resolve", "--shell-completion", "-sc",
              "--version"}


def wanted(argv: list[str]) -> bool:
    """Whether a writer pays here: the command line may track (not tracking=off, not a flag that only shows
    something), MLflow is not imported in this process already (a process forked from one that preloaded it, as the
    test suite's CLI runs are: its import costs nothing there), $CALIBRUN_TRACKING_WRITER does not say off, and the
    system is POSIX (the pipe's descriptors are passed to the child)."""
    if os.environ.get(ENV, "").lower() in ("0", "off", "false", "no") or os.name != "posix" or "mlflow" in sys.modules:
        return False
    return not any(a.lstrip("+") in _NO_TRACKING or a in SHOW_FLAGS for a in argv)


def start(argv: list[str]) -> None:
    """Start this process's writer (once) when the command line may track."""
    global _WRITER
    if _WRITER is None and wanted(argv):
        try:
            _WRITER = Writer()
        except OSError as exc:  # no process to start (an interpreter this user may not run): MLflow stays here
            log.debug("no tracking writer: %s", exc)
            return
        atexit.register(_WRITER.stop)


def current() -> Writer | None:
    """This process's writer while it is usable: not in a process forked from the one that started it."""
    return _WRITER if _WRITER is not None and _WRITER.owner == os.getpid() else None


class RemoteError(Exception):
    """An error raised in the writer (not a CalibrunError): its message, as the in-process call would have given."""


class WriterDied(Exception):
    pass


class Pending:
    """The answer of a request sent without waiting (a run id, a model id): passed as an argument of later calls,
    the writer puts the value in its place; `RemoteTracker.resolve` waits for it where the caller needs it."""

    def __init__(self, seq: int):
        self.seq = seq
        self.known = False  # (the parent's copy, once resolved: the value below; never pickled)
        self.value = None
        self.tags: dict = {}

    def __getstate__(self):
        return {"seq": self.seq, "known": False, "value": None, "tags": {}}

    def __repr__(self) -> str:
        return f"<pending answer {self.seq}>"


class Outcome:
    """An argument the writer hands over as (True, value) or (False, error) instead of failing the call: a Pending
    id whose request may have failed (`complete_job` records a job whose run never started)."""

    def __init__(self, value):
        self.value = value


class Writer:
    """The parent's end: the child process, the two pipes, and the answers read but not yet claimed."""

    def __init__(self):
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        self.owner = os.getpid()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "calibrun.tracking.writer", str(to_child), str(from_child), "--", *sys.argv],
            pass_fds=(to_child, from_child), stdin=subprocess.DEVNULL, close_fds=True)
        os.close(to_child)
        os.close(from_child)
        self._send = Connection(from_parent, readable=False)
        self._recv = Connection(to_parent, writable=False)
        self._seq = 0
        self._answers: dict[int, tuple[bool, object]] = {}  # claimable answers read ahead
        self._claimable: set[int] = set()
        self._read = 0  # the last answer read (they come in order)
        self._errors: list[Exception] = []  # errors of requests nobody waits for, raised by the next wait
        self._owned = 0  # requests up to this one: their errors are the writer's to record (`complete`)
        self.used = False
        self.dead: str | None = None

    def submit(self, op: str, *payload, claim: bool = False) -> int:
        """Send one request without waiting; its number. Its answer is kept when `claim`, else only its error. The
        answers that arrived meanwhile are read first: the writer's replies never pile up in the pipe."""
        if self.dead is not None:
            raise WriterDied(self.dead)
        self._drain()
        self._seq += 1
        self.used = True
        if claim:
            self._claimable.add(self._seq)
        try:
            self._send.send((self._seq, op, payload))
        except (OSError, ValueError) as exc:
            self._died(exc)
        return self._seq

    def answer(self, seq: int, errors: bool = True):
        """Wait for the answer of request `seq` (an interrupt waits only while nothing is read: `poll`). With
        `errors`, the error of an earlier request nobody waited for is raised first."""
        while seq not in self._answers:
            if self.dead is not None:
                raise WriterDied(self.dead)
            if seq <= self._read:
                raise RuntimeError(f"answer {seq} of the tracking writer was read already")
            try:
                ready = self._recv.poll(0.5)
            except (EOFError, OSError) as exc:
                self._died(exc)
            if ready:
                self._read_one(seq)
            elif self.proc.poll() is not None:
                self._died(None)
        self._claimable.discard(seq)
        ok, value = self._answers.pop(seq)
        if errors and self._errors:
            raise self._errors.pop(0)
        if not ok:
            raise _error(value)
        return value

    def _drain(self) -> None:
        """Read the answers already there, without waiting."""
        try:
            while self._recv.poll(0):
                self._read_one(None)
        except (EOFError, OSError) as exc:
            self._died(exc)

    def _read_one(self, waited: int | None) -> None:
        from calibrun.core import interrupts

        try:
            with interrupts.deferred():  # a message is never read in half
                got, ok, value = self._recv.recv()
        except (EOFError, OSError) as exc:
            self._died(exc)
        self._read = got
        if got in self._claimable or got == waited:
            self._answers[got] = (ok, value)
        elif not ok and got <= self._owned:
            log.debug("tracking writer: request %d failed (recorded by the writer): %s", got, value[1])
        elif not ok:
            self._errors.append(_error(value))

    def answered(self, seq: int) -> bool:
        """Whether the answer of request `seq` (a claimed one) has been read."""
        return seq in self._answers

    def own_errors(self, upto: int) -> None:
        """The errors of requests up to `upto` are recorded by the writer itself: not raised here."""
        self._owned = upto
        self._errors = []

    def forget_errors(self) -> list[Exception]:
        errors, self._errors = self._errors, []
        return errors

    def call(self, op: str, *payload):
        """Send one request and wait for its answer."""
        return self.answer(self.submit(op, *payload))

    def _died(self, exc: BaseException | None):
        code = self.proc.poll()
        self.dead = (f"the MLflow tracking writer (pid {self.proc.pid}) died"
                     + (f" (exit code {code})" if code is not None else f": {exc or 'its pipe closed'}"))
        raise WriterDied(self.dead) from None

    def stop(self) -> None:
        """At exit: a writer that never served a call is killed (it wrote nothing); else it is asked to end its
        store's session (after the requests before it) and waited for."""
        if self.owner != os.getpid() or self.proc.poll() is not None:
            return
        try:
            if not self.used or self.dead is not None:
                raise OSError
            self._send.send((0, "exit", ()))
            self.proc.wait(EXIT_WAIT)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            self._send.close()
            self._recv.close()


def _error(value) -> Exception:
    kind, message = value
    return _calibrun_error(message) if kind == "CalibrunError" else RemoteError(message)


def _calibrun_error(message: str):
    from calibrun.core.errors import CalibrunError

    return CalibrunError(message)


# answered None: their errors come later (`later`: Tracker.later, a step run without waiting)
NO_WAIT = frozenset({"log", "log_datasets", "log_artifact", "log_table", "later"})
LATER = frozenset({"start_run", "log_model"})  # their ids are Pending until resolved


class RemoteTracker:
    """`calibrun.tracking.Tracker`'s interface, served by the writer.

    Nothing waits for the writer until an answer is needed: the store is opened, runs are started and logged to
    while the job computes. `start_run` and `log_model` give `Pending` ids (`resolve` waits for the value); the
    logging calls return at once and their errors are raised by the next call that waits (`finish` at the latest),
    so a job still fails on any error of its record. `check=True` checks the store here first (the file or the
    server, without MLflow: calibrun.tracking.check_store), so a store that cannot be used still stops a run before
    it computes; what only MLflow finds (a deleted experiment) is raised where the experiment id is first needed."""

    def __init__(self, writer: Writer, uri: str, experiment: str, check: bool = False,
                 http_timeout: float | None = None, http_retries: int | None = None):
        self._writer, self._key = writer, (uri, experiment)
        self._options = (http_timeout, http_retries)
        self._local = None
        self._completions: dict[int, tuple] = {}  # job records the writer ends (`complete`), by request
        self.uri = uri
        if check:
            from calibrun.core.errors import one_line
            from calibrun.tracking import check_store, http_settings

            try:
                check_store(uri, http_settings(http_timeout, http_retries)[0], experiment)
            except Exception as exc:
                raise _calibrun_error(f"MLflow tracking store {uri} is not usable: {one_line(exc)}") from None
        try:
            self._opened = Pending(writer.submit("open", uri, experiment, check, http_timeout, http_retries,
                                                 claim=True))
        except WriterDied:  # the writer could not start or died: this process opens the store itself
            self._local = self._open_here(check)

    @property
    def experiment_id(self) -> str:
        if self._local is not None:
            return self._local.experiment_id
        return self.resolve(self._opened)[1]

    def resolve(self, value):
        """The value of a Pending id (waiting for the writer); any other value as it is."""
        if not isinstance(value, Pending):
            return value
        if value.known:
            return value.value
        if self._local is not None:
            found = _started_run(self._local, value.tags) if value.tags else None
            if found is None:
                raise _calibrun_error(f"{self._writer.dead} before it answered")
            value.value, value.known = found, True
            return found
        try:
            value.value, value.known = self._writer.answer(value.seq, errors=False), True
            return value.value
        except WriterDied as exc:
            self._lost(exc)
            raise _calibrun_error(str(exc)) from None

    def _call(self, method: str, args: tuple, kwargs: dict, wait: bool = True):
        if self._local is not None:
            args = tuple(self.resolve(a) for a in args)
            kwargs = {k: self.resolve(v) for k, v in kwargs.items()}
            if method == "run":
                return args[0](self._local, *args[1:], **kwargs)
            return getattr(self._local, method)(*args, **kwargs)
        try:
            seq = self._writer.submit("call", self._key, method, args, kwargs, claim=method in LATER)
            if method in LATER:
                pending = Pending(seq)
                if method == "start_run":  # what finds the run again if the writer dies before it answers
                    pending.tags = {k: v for k, v in args[1].items() if k in FINDING_TAGS}
                return pending
            return None if method in NO_WAIT and not wait else self._writer.answer(seq)
        except WriterDied as exc:
            self._lost(exc)
            raise _calibrun_error(f"{exc}; its {_what(method, args)} did not complete") from None

    def _open_here(self, check: bool = False):
        """After the writer died: the store opened in this process, for every later call."""
        from calibrun.tracking import Tracker

        timeout, retries = self._options
        return Tracker(*self._key, check=check, http_timeout=timeout, http_retries=retries)

    pipelined = True  # a sweep job's record is ended by the writer while the next job computes (`complete`)

    def flush(self) -> None:
        """Wait until the writer has done every call sent so far; the first error among them is raised."""
        self.run(_nothing)

    def complete(self, function, run_id, model_id, *args) -> None:
        """`function(tracker, run, model, *args)` in the writer, without waiting: it ends a job's record
        (calibrun.tracking.record.complete_job) and records the errors of the job's calls before it, which are
        therefore not raised here. `run` and `model` arrive as (ok, id or error)."""
        if self._local is not None:
            outcome = [self._outcome_here(v) for v in (run_id, model_id)]
            function(self._local, *outcome, *args)
            return
        self._completions = {seq: c for seq, c in self._completions.items() if not self._writer.answered(seq)}
        try:
            seq = self._writer.submit("call", self._key, "run", (function, Outcome(run_id), Outcome(model_id), *args),
                                      {}, claim=True)
        except WriterDied as exc:
            self._lost(exc)
            raise _calibrun_error(f"{exc}; its {_what('run', (function,))} did not complete") from None
        self._writer.own_errors(seq)
        self._completions[seq] = (function, run_id, model_id, args)

    def _lost(self, exc: WriterDied) -> None:
        """The writer died: the store opened here for every later call, and the jobs whose record it had not ended
        failed here (result.json failed, their runs closed FAILED): none is lost."""
        self._local = self._open_here()
        with contextlib.suppress(WriterDied):
            self._writer._drain()  # what it answered before it died
        died = _calibrun_error(f"{exc} before this job's record was complete")
        for seq, (function, run_id, _, args) in sorted(self._completions.items()):
            if self._writer.answered(seq):
                continue
            run = self._outcome_here(run_id)
            try:
                function(self._local, run if run[0] else (False, died), (True, None), *args, died=died)
            except Exception as error:  # (the next ones are still ended)
                log.warning("a job's record could not be ended after the tracking writer died: %s", error)
        self._completions = {}

    def _outcome_here(self, value) -> tuple[bool, object]:
        try:
            return True, self.resolve(value)
        except Exception as exc:
            return False, exc

    def run(self, function, *args, **kwargs):
        """`function(tracker, *args, **kwargs)` with the writer's Tracker (a module-level function: it is pickled by
        name), waiting for its answer."""
        return self._call("run", (function, *args), kwargs)

    def close(self, run_id, status: str) -> Exception | None:
        """Tracker.close, which never raises (a dead writer: tried once more in this process). The errors of the
        calls before it are the run's that is being closed: dropped with it (logged at debug level)."""
        error = None
        for _ in range(2):
            try:
                result = self._call("close", (run_id, status), {})
                for dropped in self._writer.forget_errors():
                    log.debug("MLflow run %s: an earlier call failed: %s", run_id, dropped)
                return result
            except Exception as exc:
                error = exc
        return error

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self._call(method, args, kwargs, wait=False)


FINDING_TAGS = ("calibrun.job_dir", "calibrun.sweep_dir")  # a job's run, a sweep's parent run


def _started_run(tracker, tags: dict) -> str | None:
    """The RUNNING run that a start_run with these tags made (the writer died before answering), or None: a job's
    run by its folder, a sweep's parent run by the sweep's folder (and no parent of its own)."""
    from calibrun.tracking import latest_run

    key = "calibrun.job_dir" if "calibrun.job_dir" in tags else "calibrun.sweep_dir"
    if key not in tags:
        return None
    return latest_run(tracker, key, tags[key], "attributes.status = 'RUNNING'", parentless=key == "calibrun.sweep_dir")


def _nothing(tracker) -> None:
    return None


def _what(method: str, args: tuple) -> str:
    return getattr(args[0], "__name__", "step") if method == "run" and args else method


# --- the child ---

RUN_ERRORS: dict[str, Exception] = {}  # in the writer: the first failed logging call of each run
_LOGGING = frozenset({"log", "log_datasets", "log_model", "log_artifact", "log_table"})


def run_failed(run_id: str) -> Exception | None:
    """In the writer: the first error of a logging call of run `run_id` (taken: asked once, by `complete_job`)."""
    return RUN_ERRORS.pop(run_id, None)


def _serve(requests: Connection, replies: Connection) -> None:
    """Answer each request in order. A Pending argument is the value of the request it names (its error, when that
    request failed: a run that was never started is not logged to). The answers go out through a thread of their
    own, so that serving never waits for the parent to read them (it may be sending a request at that moment)."""
    import queue
    import threading

    outbox: queue.SimpleQueue = queue.SimpleQueue()

    def send_answers() -> None:
        while (reply := outbox.get()) is not None:
            try:
                replies.send(reply)
            except OSError:  # the parent is gone
                return
            except Exception as exc:  # an answer that cannot be pickled: its error instead
                replies.send((reply[0], False, (type(exc).__name__, f"the answer could not be sent: {exc}")))

    sender = threading.Thread(target=send_answers, name="answers", daemon=True)
    sender.start()
    try:
        _answer(requests, outbox)
    finally:
        outbox.put(None)
        sender.join()


def _answer(requests: Connection, outbox) -> None:
    from calibrun.core.errors import CalibrunError, one_line
    from calibrun.tracking import open_tracker
    from calibrun.tracking import writer as this  # (this file runs as __main__: its classes are the module's)

    trackers: dict = {}
    done: dict[int, tuple[bool, object]] = {}  # answers later requests may name: values that are not None, errors
    started: dict[str, object] = {}  # run id -> its tracker: the runs this writer started or reopened
    parent = os.getppid()

    def value_of(arg):
        if isinstance(arg, this.Outcome):
            try:
                return True, value_of(arg.value)
            except Exception as exc:
                return False, exc
        if not isinstance(arg, this.Pending):
            return arg
        ok, value = done.get(arg.seq, (True, None))
        if not ok:
            raise value
        return value

    while True:
        try:
            seq, op, payload = requests.recv()
        except EOFError:  # the parent died (SIGKILL, the OOM killer): its runs cannot end as it would end them
            _orphaned(started)
            return
        if op == "exit":
            return
        if os.getppid() != parent:  # died with requests still in the pipe: none is served (a run started now
            _orphaned(started)  # would be left RUNNING by nobody)
            return
        try:
            if op == "open":
                uri, experiment, check, timeout, retries = payload
                trackers[(uri, experiment)] = seq
                tracker = open_tracker(uri, experiment, check=check, http_timeout=timeout, http_retries=retries)
                trackers[(uri, experiment)] = tracker
                value = (tracker.uri, tracker.experiment_id)
            else:
                key, method, args, kwargs = payload
                tracker = value_of(this.Pending(trackers[key])) if isinstance(trackers[key], int) else trackers[key]
                args = [value_of(a) for a in args]
                kwargs = {k: value_of(v) for k, v in kwargs.items()}
                value = args[0](tracker, *args[1:], **kwargs) if method == "run" else \
                    getattr(tracker, method)(*args, **kwargs)
            if isinstance(value, BaseException):  # Tracker.close's error: its message crosses, not the object
                value = this.RemoteError(one_line(value))
            reply = (seq, True, value)
        except Exception as exc:
            done[seq] = (False, exc)
            if op == "call" and method in _LOGGING and args and isinstance(args[0], str):  # (the run existed)
                this.RUN_ERRORS.setdefault(args[0], exc)
            reply = (seq, False, ("CalibrunError" if isinstance(exc, CalibrunError) else type(exc).__name__,
                                  str(exc)))
        else:
            if value is not None:
                done[seq] = (True, value)
            if op == "call" and method in ("start_run", "reopen"):
                started[value if method == "start_run" else args[0]] = tracker
        outbox.put(reply)


def _orphaned(started: dict) -> None:
    """The parent is gone: each run this writer started or reopened that is still RUNNING is closed KILLED (what
    the parent does on SIGINT or SIGTERM), so that no run is left RUNNING by a job nobody will finish."""
    for run_id, tracker in started.items():
        try:
            if tracker.status(run_id) == "RUNNING":
                tracker.close(run_id, "KILLED")
                log.warning("the job's process died: its MLflow run %s closed KILLED", run_id)
        except Exception as exc:  # the store unreachable too: resume=true closes it (docs/reliability.md)
            log.warning("the job's process died; its MLflow run %s not closed: %s", run_id, exc)


def _main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent catches them and asks for the runs to be closed
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    requests = Connection(int(argv[0]), writable=False)
    replies = Connection(int(argv[1]), readable=False)
    sys.argv = argv[3:] or sys.argv  # the parent's command line: MLflow's source tags name calibrun, not this
    import logging

    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401  the import the parent no longer waits for
    from mlflow import MlflowClient  # noqa: F401

    try:
        _serve(requests, replies)
    finally:
        from calibrun.tracking import dispose_stores

        dispose_stores()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no teardown walk of MLflow's objects (calibrun.__main__._quick_exit)


if __name__ == "__main__":
    _main(sys.argv[1:])
