"""The sensitivity ranking's trials (calibrun.analysis.sensitivity): each trial a set of QDQ pairs switched out of
the switch model (calibrun.analysis.qdq.switch_model), measured over every evaluation batch; one after the other in
the job's process, or shared out to worker processes (`analysis.workers`) on local processes or Ray actors
(`analysis.backend`). A trial's metrics are the same wherever it runs: one pass over the same batches in a session
of the same model.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from calibrun.analysis import qdq
from calibrun.analysis.evaluate import Evaluator
from calibrun.core.errors import CalibrunError, one_line
from calibrun.core.files import temp_dir
from calibrun.model.sessions import session

log = logging.getLogger("calibrun")

BACKENDS = ("auto", "processes", "ray")


class Trials:
    """Trials of the switch model: each a set of pairs switched out, measured over every evaluation batch.
    `workers` > 1: in that many worker processes, each holding one session of the switch model with
    `threads` // workers intra-op threads (at least 1), the trials dealt out a few at a time; the metrics are the
    serial run's (one trial, one pass over the same batches, in a session of the same model). `backend`:
    `processes` (local processes, started with `spawn`: a fork of a process holding onnxruntime's threads is not
    safe), `ray` (Ray actors, `_Actors`), `auto` (ray when the job runs inside Ray, e.g. under Hydra's Ray launcher,
    else processes). `workers` <= 1: `serial` here, one after the other."""

    def __init__(self, path: Path, threads: int, evaluator: Evaluator, names: list[str], pairs: int, workers: int,
                 serial: Callable, backend: str = "auto"):
        self.serial, self.pool = serial, None
        if workers > 1:
            per = max(1, (threads or os.cpu_count() or 1) // workers)
            pool = _Actors if uses_ray(backend) else _Processes
            self.pool = pool(workers, (str(path), per, evaluator.batches, names, pairs))

    def __enter__(self) -> Trials:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.close()

    def ran_on(self) -> dict:
        """Where the trials ran: {"workers": how many ran them, "backend": "processes" | "ray" | None (serial)}."""
        if self.pool is None or not self.pool.size():
            return {"workers": 1, "backend": None}
        return {"workers": self.pool.size(), "backend": self.pool.name}

    def map(self, trials: Sequence, every: float = math.inf) -> list[tuple[dict, float]]:
        """(metrics, seconds) of each trial, in order; a progress line every `every` seconds."""
        out: list[tuple[dict, float] | None] = [None] * len(trials)
        last = time.perf_counter()

        def progress(done: int) -> None:
            nonlocal last
            if time.perf_counter() - last > every:
                last = time.perf_counter()
                log.info("sensitivity: %d/%d trials", done, len(trials))

        if self.pool is not None and self.pool.size():
            size = max(1, min(4, len(trials) // (8 * self.pool.size())))  # a few trials a task: balance, progress
            done = 0
            for k, results in self.pool.run([(k, list(trials[k:k + size])) for k in range(0, len(trials), size)]):
                out[k:k + len(results)] = results
                done += len(results)
                progress(done)
            return out
        for k, on in enumerate(trials):
            t0 = time.perf_counter()
            out[k] = (self.serial(on), time.perf_counter() - t0)
            progress(k + 1)
        return out


def uses_ray(backend: str) -> bool:
    """analysis.backend: ray, processes, or auto (ray when this process is already connected to a Ray cluster)."""
    if backend != "auto":
        return backend == "ray"
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


class _Processes:
    """Local worker processes (spawn), each with a session of the switch model (`_worker_session`)."""

    name = "processes"

    def __init__(self, workers: int, args: tuple):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.workers = workers
        self.executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_worker_session, initargs=args)
        self.executor.submit(int)  # the processes start now: their imports and sessions overlap the baseline

    def size(self) -> int:
        return self.workers

    def run(self, chunks: list[tuple[int, list]]) -> Iterator[tuple[int, list]]:
        from concurrent.futures import as_completed

        futures = {self.executor.submit(_run_trials, None, trials): k for k, trials in chunks}
        for future in as_completed(futures):
            yield futures[future], future.result()

    def close(self) -> None:
        self.executor.shutdown(cancel_futures=True)


READY_SECONDS = 60.0  # how long Ray may take to place the trial actors before the analysis goes on without them


class _Actors:
    """Ray actors (analysis.backend=ray), each asking Ray for its threads' CPUs, on any node of the cluster: the
    switch model and the evaluation batches travel through Ray's object store (each actor writes them to a temp
    folder of its own node). Connects to the Ray the process is in, else `ray.init()` (RAY_ADDRESS, or a Ray of
    this machine, stopped after). Actors Ray cannot place within READY_SECONDS (no free CPU: e.g. every CPU held by
    the sweep's jobs), or at all (the started ones hold every CPU the cluster has), are not waited for: the trials
    run on those that started, or in the job's process."""

    name = "ray"

    def __init__(self, workers: int, args: tuple):
        import ray

        self.ray = ray
        self.owned = not ray.is_initialized()
        if self.owned:
            ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        path, per, batches, names, pairs = args
        model = ray.put(Path(path).read_bytes())
        # the runs written to files (the ones held in memory travel inside `batches`)
        data = {i: ray.put((batches.folder / f"{i}.npz").read_bytes()) for i in range(batches.count)
                if i not in batches.held}
        actor = ray.remote(num_cpus=per)(_TrialActor)
        self.actors = [actor.remote(model, per, batches, data, names, pairs) for _ in range(workers)]
        self.per = per
        self.waiting = {a.ready.remote(): a for a in self.actors}  # their start overlaps the baseline trial
        self.started: list | None = None

    def _wait(self) -> tuple[list, list, str]:
        """The actors that started, those that did not, and why not. Waiting stops at READY_SECONDS, or sooner
        once the cluster cannot place another: the started ones hold `per` CPUs each, and one more would exceed
        the CPUs the cluster has (`ray.cluster_resources()`; a cluster that grows later is not waited for)."""
        ready, late = [], list(self.waiting)
        deadline = time.monotonic() + READY_SECONDS
        while late:
            total = self.ray.cluster_resources().get("CPU", 0.0)
            if (len(ready) + 1) * self.per > total:
                return ready, late, f"Ray's {total:g} CPUs cannot hold another of {self.per} CPUs"
            done, late = self.ray.wait(late, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                return ready, late, f"Ray had no free CPU for the others within {READY_SECONDS:.0f} s"
            ready += done
        return ready, late, ""

    def size(self) -> int:
        if self.started is None:
            ready, late, why = self._wait()
            self.ray.get(ready)  # an actor that failed to start raises here
            self.started = [self.waiting[r] for r in ready]
            if late:
                log.warning("analysis.backend=ray: %d of %d trial actors started (%s); the trials run on %s",
                            len(ready), len(self.actors), why,
                            f"{len(ready)} actor(s)" if ready else "the job's process")
                for ref in late:
                    self.ray.kill(self.waiting[ref])
        return len(self.started)

    def run(self, chunks: list[tuple[int, list]]) -> Iterator[tuple[int, list]]:
        from ray.util import ActorPool

        try:
            yield from ActorPool(self.started).map_unordered(lambda actor, chunk: actor.run.remote(chunk), chunks)
        except self.ray.exceptions.RayTaskError as exc:  # a trial's own error, as the processes backend raises it
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            raise
        except self.ray.exceptions.RayActorError as exc:  # the actor's process died (killed, out of memory, a node)
            raise CalibrunError(f"analysis.backend=ray: a trial actor died ({one_line(exc)})") from None

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        if self.owned:
            self.ray.shutdown()


class _TrialActor:
    """A Ray actor holding a session of the switch model and the evaluation batches (written to its own folder)."""

    def __init__(self, model: bytes, threads: int, batches, data: dict, names: list[str], pairs: int):
        import copy

        import ray

        self.folder = temp_dir("trials")
        folder = Path(self.folder.name)
        (folder / "switch.onnx").write_bytes(model)
        for i, blob in zip(data, ray.get(list(data.values())), strict=True):
            (folder / f"{i}.npz").write_bytes(blob)
        batches = copy.copy(batches)
        batches.folder = folder
        self.state = _state(folder / "switch.onnx", threads, batches, names, pairs)

    def ready(self) -> bool:
        return True

    def run(self, chunk: tuple[int, list]) -> tuple[int, list]:
        k, trials = chunk
        return k, _run_trials(self.state, trials)


_WORKER: dict = {}


def _state(path: str | Path, threads: int, batches, names: list[str], pairs: int) -> dict:
    """What a worker (a process's `_WORKER`, an actor's `state`) holds to run trials: a session and the batches."""
    return {"sess": session(path, threads), "batches": batches, "names": names, "pairs": pairs}


def _worker_session(path: str, threads: int, batches, names: list[str], pairs: int) -> None:
    _WORKER.update(_state(path, threads, batches, names, pairs))


def switched(sess, batches, names: list[str], pairs: int, on) -> dict[str, float]:
    """One trial: the metrics of the switch model's session with the pairs `on` switched out, over every batch."""
    flags = qdq.switches(pairs, on)
    return batches.run(lambda feeds: sess.run(names, {**feeds, **flags}))


def _run_trials(state: dict | None, trials: list) -> list[tuple[dict, float]]:
    """(metrics, seconds) of each trial in a worker (`state`: an actor's; None: this process's `_WORKER`)."""
    sess, batches, names, pairs = ((state or _WORKER)[k] for k in ("sess", "batches", "names", "pairs"))
    out = []
    for on in trials:
        t0 = time.perf_counter()
        out.append((switched(sess, batches, names, pairs, on), time.perf_counter() - t0))
    return out
