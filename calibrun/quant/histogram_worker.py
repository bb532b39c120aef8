"""A second process for histogram calibration's binning: it bins about half of every large batch while this process
bins the rest, on the other core.

Why a process: binning (calibrun.quant.histogram.bin_counts) holds the GIL for about half its time (np.bincount and
np.flatnonzero do not release it), so two threads bin a batch no faster than one (1.07x measured on 16 tensors of
1.4M values, while two processes each bin at full speed side by side). Why one process for the whole calibration,
forked when the collector is made: forking per batch cost 10 ms a fork and then a page fault on every page of
onnxruntime's arenas the parent wrote while the child lived (ddddocr's YOLOX, 12 batches: Entropy calibration
1.86 -> 2.12 s). Forked before the first batch, the process shares only the interpreter, the libraries and the model
with its parent; the batches reach it through an anonymous shared mapping made before the fork (no file, nothing
left behind however either process ends), and only the tensors' names, the histograms of the tensors it bins and
its results travel over a pipe.

The worker runs the collector's own `_value` / `_absolute` on a copy of the collector made by the fork, with the
histograms of its tensors sent with each batch: the same code on the same values, so the same histograms
(tests/unit/test_histogram.py compares). It ignores Ctrl-C (its parent handles it and ends it), dies of SIGTERM,
and dies with its parent (PR_SET_PDEATHSIG). If it dies on its own, its part of the batch is binned here and it is
not used again.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import multiprocessing
import os
import signal
import sys
import warnings

import numpy as np

from calibrun.quant.histogram import _FORK_LEAST, BinPlan, _flat, _searcher, _size, entropy_threshold

log = logging.getLogger(__name__)

CAPACITY = 64 << 20  # bytes of the shared mapping by default (a page takes memory once a batch is written into it)
_ALIGN = 64


class HistogramWorker:
    """The forked binning process of one FastHistogramCollector (`start` makes one where it can pay)."""

    def __init__(self, collector, capacity: int = CAPACITY):
        self.capacity = capacity
        # bytes a batch may copy into the mapping: a quarter of memory.budget once the calibration knows it (the
        # copy of the worker's half is memory beside the batch's own arrays); the rest is binned here
        self.limit = capacity
        # MAP_SHARED | MAP_ANONYMOUS: what is written here, the child reads; address space as the budget allows
        # (a job under RLIMIT_AS has no room for a mapping sized for the largest batch)
        self.buffer = mmap.mmap(-1, capacity)
        self.conn, child = multiprocessing.Pipe()
        parent = os.getpid()
        with warnings.catch_warnings():  # Python 3.12+ warns on fork beside other threads: the child runs numpy only
            warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            status = 1
            try:
                self.conn.close()
                _searcher(parent)
                _serve(collector, child, self.buffer)
                status = 0
            finally:
                os._exit(status)
        child.close()
        self.pid: int | None = pid

    @classmethod
    def start(cls, collector, workers: int, capacity: int = CAPACITY) -> HistogramWorker | None:
        """A worker for `collector` whose mapping holds `capacity` bytes, or None where one cannot help or be made
        (not Linux, fewer than two workers or cores, a fork or a mapping refused)."""
        if sys.platform != "linux" or min(workers, os.cpu_count() or 1) < 2 or capacity < _ALIGN:
            return None
        try:
            return cls(collector, capacity)
        except OSError as exc:
            log.debug("histogram binning: no worker process (%s); threads instead", exc)
            return None

    def map(self, collector, fn_name: str, items: list[tuple]) -> list | None:
        """[collector.<fn_name>(name, data) for name, data in items], about half of the values binned by the worker;
        None for a batch too small to be worth it (the caller uses threads) or once the worker is gone."""
        fn = getattr(collector, fn_name)

        def request(names: list[str]) -> tuple:
            return "collector", fn_name, {name: (collector.histogram_dict.get(name), collector.unbounded.get(name))
                                          for name in names}

        return self._split(items, fn, request)

    def counts(self, plans: dict, items: list[tuple]) -> list | None:
        """[plans[name].counts(data) for name, data in items] (a piece of a chunk, calibrun.quant.histogram_runs), about
        half of the values counted by the worker; None as for `map`."""

        def request(names: list[str]) -> tuple:
            return "counts", None, {name: (plans[name].bins, plans[name].range, plans[name].bounds,
                                           plans[name].absolute) for name in names}

        return self._split(items, lambda name, data: plans[name].counts(_flat(data)), request)

    def thresholds(self, items: list[tuple], num_quantized_bins: int, progress) -> list[tuple] | None:
        """entropy_threshold of every (tensor, histogram) in `items`, in order, every other one searched by the worker
        (the histograms go to it over the pipe: ~25 KB each); None once the worker is gone. The search is the same
        function either side; `progress(done)` as this side finishes tensors, and for the worker's at its answer."""
        if self.pid is None:
            return None
        with contextlib.suppress(AttributeError, OSError, ValueError):  # the batches' pages are no longer needed
            self.buffer.madvise(mmap.MADV_REMOVE)
        theirs = list(range(1, len(items), 2))
        try:
            self.conn.send(("search", num_quantized_bins, [items[i][1] for i in theirs], []))
        except OSError as exc:
            self._gone(exc)
            return None
        found: list = [None] * len(items)
        for done, i in enumerate(range(0, len(items), 2), start=1):
            found[i] = entropy_threshold(items[i][1], num_quantized_bins)
            if progress is not None:
                progress(done)
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            self._gone(exc)
            kind, value = "ok", [entropy_threshold(items[i][1], num_quantized_bins) for i in theirs]
        if kind == "error":
            raise value
        for i, threshold in zip(theirs, value, strict=True):
            found[i] = threshold
        if progress is not None:
            progress(len(items))
        return found

    def _split(self, items: list[tuple], fn, request) -> list | None:
        """fn(name, data) of every item, the larger items alternating between here and the worker so that each
        side gets about half of the values; `request(names)` is what the worker needs for its items."""
        if self.pid is None or len(items) < 2:
            return None
        sizes = [_size(data) for _, data in items]
        if sum(sizes) < _FORK_LEAST:
            return None
        mine: list[int] = []
        tasks: list[tuple] = []
        theirs: list[int] = []
        load = [0, 0]
        offset = 0
        for i in sorted(range(len(items)), key=lambda i: -sizes[i]):  # largest first onto the lighter side
            if load[1] < load[0]:
                flat = _flat(items[i][1])
                start = -(-offset // _ALIGN) * _ALIGN
                if start + flat.nbytes <= min(self.capacity, self.limit):
                    np.frombuffer(self.buffer, flat.dtype, flat.size, start)[:] = flat
                    tasks.append((items[i][0], start, flat.size, flat.dtype.str))
                    theirs.append(i)
                    load[1] += sizes[i]
                    offset = start + flat.nbytes
                    continue
            mine.append(i)
            load[0] += sizes[i]
        try:
            self.conn.send((*request([task[0] for task in tasks]), tasks))
        except OSError as exc:
            self._gone(exc)
            return None
        results: list = [None] * len(items)
        for i in mine:
            results[i] = fn(*items[i])
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError) as exc:  # the worker died (killed, out of memory): its part here
            self._gone(exc)
            kind, value = "ok", [fn(*items[i]) for i in theirs]
        if kind == "error":
            raise value
        for i, result in zip(theirs, value, strict=True):
            results[i] = result
        return results

    def _gone(self, exc: BaseException) -> None:
        log.warning("histogram binning: the worker process ended (%s); binning here from now on", exc)
        self.close()

    def close(self) -> None:
        """End the worker (at once: it holds nothing worth waiting for) and free the shared mapping."""
        if self.pid is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = None
        with contextlib.suppress(BufferError):  # a view of it still alive: freed with the last one
            self.buffer.close()


def _serve(collector, conn, buffer: mmap.mmap) -> None:
    """The worker's loop: bin the tasks of each message (with the collector and the histograms the message brings, or
    with a piece's bins), answer, forget them."""
    while True:
        try:
            kind, fn_name, states, tasks = conn.recv()
        except EOFError:
            return
        arrays = []
        try:
            arrays = [(name, np.frombuffer(buffer, np.dtype(dtype), size, at)) for name, at, size, dtype in tasks]
            if kind == "search":  # `fn_name` holds num_quantized_bins, `states` the histograms
                answer = ("ok", [entropy_threshold(histogram_, fn_name) for histogram_ in states])
            elif kind == "counts":
                answer = ("ok", [BinPlan(*states[name], finish=None).counts(data) for name, data in arrays])
            else:
                for name, (entry, unbounded) in states.items():
                    if entry is not None:
                        collector.histogram_dict[name] = entry
                    if unbounded is not None:
                        collector.unbounded[name] = unbounded
                fn = getattr(collector, fn_name)
                answer = ("ok", [fn(name, data) for name, data in arrays])
        except Exception as exc:  # noqa: BLE001 (raised again in the parent)
            answer = ("error", exc)
        collector.histogram_dict.clear()
        collector.unbounded.clear()
        del arrays
        conn.send(answer)
