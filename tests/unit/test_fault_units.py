"""Fast, in-process checks of the pieces the fault handling and the MLflow record are built from."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from calibrun.config import register_resolvers
from calibrun.core.errors import CalibrunError
from calibrun.sweep import earlier_jobs, previous_sweep
from calibrun.tracking import check_sqlite, check_store, digest, ui_url, yaml_value


def test_yaml_values_not_python_reprs():
    assert [yaml_value(v) for v in (True, False, None, 0.2, 8, "QInt8")] == ["true", "false", "null", "0.2", "8",
                                                                           "QInt8"]
    assert yaml_value(["Conv", "MatMul"]) == "[Conv, MatMul]"
    assert yaml_value([]) == "[]"


def test_dataset_digest_follows_the_identity():
    a = {"source": "lab", "seed": 4242, "factor": 0.2, "batches": 8}
    assert digest(a) == digest(dict(reversed(a.items())))  # key order does not matter
    assert digest(a) != digest({**a, "batches": 64})
    assert len(digest(a)) == 16


def test_ui_url_opens_the_machine_learning_runs_page():
    assert ui_url("http://host:5000/", "3", "attributes.run_id = 'abc'", "max_abs_error") == (
        "http://host:5000/#/experiments/3/runs?workflowType=machine_learning&searchFilter=attributes.run_id%20%3D"
        "%20%27abc%27&orderByKey=metrics.%60max_abs_error%60&orderByAsc=true")
    assert ui_url("sqlite:////x/mlflow.db", "1") == \
        "http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning"


def test_sweep_id_is_one_value_per_config_and_differs_between_configs():
    register_resolvers()
    first = OmegaConf.create({"a": "${calibrun.sweep_id:}", "b": "${calibrun.sweep_id:}"})
    second = OmegaConf.create({"a": "${calibrun.sweep_id:}"})
    assert first.a == first.b  # cached: the sweep, its launcher and its jobs see one folder
    assert first.a != second.a
    assert len(first.a) == 6


def test_store_checks_name_the_cause(tmp_path):
    (tmp_path / "folder.db").mkdir()
    with pytest.raises(CalibrunError, match="is a folder"):
        check_sqlite(tmp_path / "folder.db")
    (tmp_path / "junk.db").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(CalibrunError, match="file is not a database"):
        check_sqlite(tmp_path / "junk.db")
    with pytest.raises(CalibrunError, match="does not exist"):
        check_sqlite(tmp_path / "missing" / "mlflow.db")
    with pytest.raises(CalibrunError, match="unknown URI scheme 'ftp'"):
        check_store("ftp://host/store", 1)
    check_sqlite(tmp_path / "new.db")  # can be created: fine, and nothing is left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.db", "junk.db"]
    with sqlite3.connect(tmp_path / "other.db") as connection:
        connection.execute("CREATE TABLE t (x)")
    with pytest.raises(CalibrunError, match="not an MLflow store"):
        check_sqlite(tmp_path / "other.db")


def _sweep(root: Path, name: str, overrides: list[str], age: float) -> Path:
    folder = root / "2026-12-01" / name
    (folder / ".hydra").mkdir(parents=True)
    path = folder / "multirun.yaml"
    OmegaConf.save(OmegaConf.create({"hydra": {"overrides": {"task": overrides}}}), path)
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return folder


def test_previous_sweep_with_suffixed_folder_names(tmp_path):
    command = ["calibration=narrow,match,wide"]
    old = _sweep(tmp_path, "10-00-00-ffffff", command, age=100)
    newer = _sweep(tmp_path, "10-00-00-000000", command, age=10)  # same second, started later
    _sweep(tmp_path, "11-00-00-aaaaaa", ["batches=8"], age=1)  # another command
    assert previous_sweep(tmp_path, [*command, "resume=true"]) == newer
    assert previous_sweep(tmp_path, ["format=qdq"]) is None
    assert earlier_jobs(old) == ["multirun.yaml"]


@pytest.fixture
def signal_state():
    """The process's signal handlers, unraisable hook, pending interrupt and SQLAlchemy pool log level, restored
    after the test (calibrun.sweep's handler changes all four)."""
    import signal
    import sys

    from calibrun.core import interrupts

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    unraisable_hook = sys.unraisablehook
    yield
    interrupts.acknowledge()
    sys.unraisablehook = unraisable_hook
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    logging.getLogger("sqlalchemy.pool").setLevel(logging.NOTSET)


def test_an_interrupt_quiets_sqlalchemys_pool_log(signal_state):
    """A signal raised inside a store query leaves SQLAlchemy a cursor it cannot close, and its pool logs that with
    a traceback; after the interrupt that log is quiet, so the sweep's report stays one line."""
    import signal

    from calibrun.core.interrupts import Interrupted, _raise_interrupted

    pool_log = logging.getLogger("sqlalchemy.pool.impl.QueuePool")
    assert pool_log.isEnabledFor(logging.ERROR)
    with pytest.raises(Interrupted):
        _raise_interrupted(signal.SIGTERM, None)
    assert not pool_log.isEnabledFor(logging.ERROR)
    assert pool_log.isEnabledFor(logging.CRITICAL)


def test_an_interrupt_python_drops_in_a_finaliser_is_not_printed_and_is_raised_at_the_next_write(tmp_path, monkeypatch,
                                                                                            signal_state):
    """The signal handler's exception, raised inside a __del__ (or a weakref callback: SQLAlchemy's cleanup in a
    sweep on CI), is dropped by Python, and further signals are ignored from then on: without a second chance the
    sweep would run on to its end. The dropped interrupt is not printed ("Exception ignored in ..." and a traceback
    under the sweep's one line), the next atomic write raises it again, once, and a handled interrupt is not raised
    twice. Other dropped exceptions are still printed."""
    import gc
    import os
    import signal
    import sys

    from calibrun.core.files import atomic_path
    from calibrun.core.interrupts import Interrupted, install_signal_handlers

    class SignalledWhileCollected:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100_000):  # the handler runs at one of these steps, inside the finaliser
                pass

    class FailsWhileCollected:
        def __del__(self):
            raise ValueError("not an interrupt")

    printed = []  # what Python's own hook would print as "Exception ignored in ..."
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: printed.append(unraisable.exc_type))
    install_signal_handlers()
    install_signal_handlers()  # the hook is installed once, not wrapped twice
    SignalledWhileCollected()  # collected at once: the interrupt is raised in __del__ and dropped there
    gc.collect()
    assert printed == []
    with pytest.raises(Interrupted) as info, atomic_path(tmp_path / "after.json") as tmp:
        tmp.write_text("{}")
    assert info.value.signum == signal.SIGTERM
    assert not (tmp_path / "after.json").exists()
    with atomic_path(tmp_path / "then.json") as tmp:  # raised once: the write after it goes on
        tmp.write_text("{}")
    assert (tmp_path / "then.json").exists()
    FailsWhileCollected()
    gc.collect()
    assert printed == [ValueError]


def test_a_dropped_interrupt_stops_a_calibration_pass_and_an_evaluation_within_one_step(tmp_path, signal_state):
    """An interrupt that Python dropped (recorded, never raised: numpy.random's first import swallows it at the start
    of a calibration) stops the calibration pass after its first chunk and the evaluation after its first batch,
    instead of letting them run to their end."""
    import signal

    from calibrun.core import interrupts
    from calibrun.data import EvalData
    from calibrun.lab.data import lab_batches
    from calibrun.lab.model import write_lab_model
    from calibrun.measure import errors as measure
    from calibrun.model import open_float_model
    from calibrun.quant.calibrate import CalibrationCache, CalibrationSpec, run_calibration
    from calibrun.quant.quantize import quantize_lab

    model = open_float_model(write_lab_model(tmp_path / "lab.onnx"))
    int8 = tmp_path / "int8.onnx"
    cache = CalibrationCache(tmp_path / "cache")
    ranges = cache.path(quantize_lab(model, int8, 1, 1.0, 2, cache=cache)["cache_key"])
    served = []

    class Counted:  # 10 chunks of 16 batches (minmax's chunk), counting what the pass asked for
        def __init__(self):
            self.batches = lab_batches(model.info, 4242, 1.0, 160)

        def __len__(self):
            return len(self.batches)

        def __iter__(self):
            for batch in self.batches:
                served.append(1)
                if len(served) == 1:  # dropped while the first chunk is read
                    interrupts.record(signal.SIGINT)
                yield batch

    with pytest.raises(interrupts.Interrupted):
        run_calibration(model.path, Counted(), model.info.name, CalibrationSpec())
    assert len(served) == 16  # the first chunk, not the 160 batches

    evaluation = _CountedEval(EvalData.from_arrays(measure.lab_feeds(model, 777, 64)))
    interrupts.record(signal.SIGTERM)
    with pytest.raises(interrupts.Interrupted) as info:
        measure.evaluate(model.path, int8, evaluation, batch_size=8, progress=None)
    assert info.value.signum == signal.SIGTERM
    assert evaluation.served == 1  # one batch of 8, not 8 batches
    interrupts.check()  # raised once: nothing pending afterwards

    from calibrun.measure.tensor_stats import StreamingDiagnostics

    evaluation.served = 0
    with StreamingDiagnostics(model.path, int8, ranges) as diag:  # the diagnostics' own pass, the same way
        interrupts.record(signal.SIGINT)
        with pytest.raises(interrupts.Interrupted):
            diag.over(evaluation, batch_size=8, progress=None)
    assert evaluation.served == 1
    interrupts.check()


class _CountedEval:
    """An EvalData that counts the batches a pass took from it."""

    def __init__(self, data):
        self.data, self.served = data, 0
        self.rows, self.axes = data.rows, data.axes

    def sizes(self, size: int) -> list[int]:
        return self.data.sizes(size)

    def batches(self, size: int):
        for batch in self.data.batches(size):
            self.served += 1
            yield batch


def test_an_interrupt_inside_a_store_write_does_not_keep_the_lock_that_closing_the_runs_needs(tmp_path):
    """The interrupt lands in MLflow's set_terminated after its UPDATE and during the SELECT that follows (what a
    SIGINT'd sweep hit, 1 run in ~30: it then waited minutes on 'database is locked' to close its runs). The
    interrupted cursor holds SQLite's write lock until `release` frees the exception's frames."""
    import contextlib
    import signal

    from mlflow import MlflowClient
    from sqlalchemy import event

    from calibrun.core import interrupts
    from tests.stores import fresh_mlflow_store

    uri = fresh_mlflow_store(tmp_path)
    client = MlflowClient(uri)
    experiment = client.create_experiment("e")
    job, parent = (client.create_run(experiment).info.run_id for _ in range(2))
    wrote: list[str] = []

    def interrupt_after_the_write(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("UPDATE"):
            wrote.append(statement)
        elif wrote and statement.lstrip().upper().startswith("SELECT"):
            event.remove(client._tracking_client.store.engine, "after_cursor_execute", interrupt_after_the_write)
            raise interrupts.Interrupted(signal.SIGINT)

    def write_lock_is_free() -> bool:
        with contextlib.closing(sqlite3.connect(tmp_path / "mlflow.db", timeout=0.2)) as probe:
            try:
                probe.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return False
            probe.execute("ROLLBACK")
            return True

    event.listen(client._tracking_client.store.engine, "after_cursor_execute", interrupt_after_the_write)
    with pytest.raises(interrupts.Interrupted) as caught:
        client.set_terminated(job, "FINISHED")
    assert wrote, "the interrupt did not land after a write"
    assert not write_lock_is_free()  # what the test reproduces: the interrupted write keeps the lock
    interrupts.release(caught.value)
    assert write_lock_is_free()
    for run_id in (job, parent):
        client.set_terminated(run_id, "KILLED")
    assert {client.get_run(r).info.status for r in (job, parent)} == {"KILLED"}


def test_an_interrupt_while_a_temp_folder_is_created_removes_it(tmp_path, monkeypatch, signal_state):
    """SIGINT just after tempfile made the folder and before TemporaryDirectory registered its removal: the
    interrupt is raised when temp_dir's step ends, and the folder is gone (it was left behind)."""
    import signal
    import tempfile

    from calibrun.core import interrupts
    from calibrun.core.files import temp_dir

    made = []
    mkdtemp = tempfile.mkdtemp

    def signalled_mkdtemp(*args, **kwargs):
        made.append(mkdtemp(*args, **kwargs))
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):  # the handler runs at one of these steps
            pass
        return made[-1]

    signal.signal(signal.SIGINT, interrupts.raise_interrupted)
    monkeypatch.setattr(tempfile, "mkdtemp", signalled_mkdtemp)
    with pytest.raises(interrupts.Interrupted):
        temp_dir("calib", tmp_path)
    assert len(made) == 1
    assert not Path(made[0]).exists()
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    with temp_dir("calib", tmp_path) as folder:  # raised once: the next folder is made and removed as usual
        assert Path(folder).is_dir()
    assert list(tmp_path.iterdir()) == []


def test_calibtool_restores_the_process_hooks_it_installs(tmp_path, capsys, signal_state):
    """calibtool.main installs its signal handlers and its quiet hook for dropped interrupts only while it runs: a
    program that calls it gets its own back, after a failure too."""
    import signal
    import sys

    import calibtool

    def own_hook(unraisable):
        pass

    sys.unraisablehook = own_hook
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    root_handlers, root_level = root.handlers[:], root.level
    try:
        assert calibtool.main(["scales", str(tmp_path / "missing.onnx")]) == 1
    finally:
        root.handlers[:], root.level = root_handlers, root_level  # calibtool holds its logs on the root logger
    assert "calibtool: error:" in capsys.readouterr().err
    assert sys.unraisablehook is own_hook
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


def test_a_killed_process_that_waits_to_be_reaped_leaves_orphans_to_remove(tmp_path):
    """A zombie is gone: the tracking writer of a SIGKILLed run waits for init to reap it (~1 s in a container)
    while the next run removes the temp store it left."""
    import subprocess
    import sys

    from calibrun.core.files import remove_orphans, temp_name

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        orphan = Path(str(temp_name(tmp_path / "mlflow.db", ".tmp")).replace(f".{os.getpid()}.", f".{child.pid}."))
        orphan.mkdir()
        assert remove_orphans(tmp_path) == []  # its process runs
        child.kill()
        time.sleep(0.2)
        assert Path(f"/proc/{child.pid}").exists()  # not reaped: a zombie
        assert remove_orphans(tmp_path) == [orphan]
        assert not orphan.exists()
    finally:
        child.kill()
        child.wait()


def _startup(code: str, ignore_sigint: bool = False) -> subprocess.CompletedProcess:
    """A fresh interpreter running `code` after calibrun's start-of-process signal setup (signal handlers are the
    process's: not in the test's own)."""
    import signal
    import sys

    prelude = "import os, signal, time\nfrom calibrun.core import interrupts\ninterrupts.while_starting()\n"
    preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60,
                          preexec_fn=preexec, cwd=Path(__file__).parents[2])


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_signal_while_the_cli_starts_ends_it_in_one_line(name):
    """A Ctrl-C in the first half second of `python -m calibrun` (its imports) printed Python's KeyboardInterrupt
    traceback from inside numpy's; now one line and the signal's own death, as after the start."""
    import signal

    done = _startup(f"os.kill(os.getpid(), signal.{name})\ntime.sleep(30)\nprint('not ended')")
    assert done.returncode == -getattr(signal, name)
    assert done.stderr == f"calibrun: interrupted by {name} while starting: no job ran\n"
    assert done.stdout == ""


def test_sigint_ignored_when_the_process_started_stays_ignored():
    """A script's `calibrun ... &` starts it with SIGINT ignored, so that the script's Ctrl-C is not its background
    job's: the convention Python keeps for itself. calibrun's handlers kept it until session 41 only while it imported
    (and then caught it); now it stays ignored, and SIGTERM (never ignored by `&`) still ends the job."""
    code = ("interrupts.install_signal_handlers()\nos.kill(os.getpid(), signal.SIGINT)\nprint('still here')\n"
            "try:\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(30)\n"
            "except interrupts.Interrupted as exc:\n    print('interrupted by', exc)\n")
    done = _startup(code, ignore_sigint=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "still here\ninterrupted by SIGTERM\n", "")
    done = _startup(code)  # not ignored at the start: SIGINT is the job's interrupt
    assert done.stdout == ""  # the first kill raised the job's interrupt (uncaught here)
    assert done.stderr.rstrip().endswith("Interrupted: SIGINT")
