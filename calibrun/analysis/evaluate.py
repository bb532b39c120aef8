"""The metrics the analysis optimises: calibrun.measure.errors' streaming error metrics and calibrun.measure.tasks' task
metrics, measured on any int8 model (or any session run) against the fp32 model on the evaluation data.

The analysis is written against ONE object, `Evaluator`: `model(path) -> {metric: value}` (an int8 model file ->
its metrics) and `run(session_run)` for a session the caller already holds (the sensitivity pass keeps one
session for every trial). The metric names are the run's own (calibrun.measure.errors, calibrun.measure.tasks):
`max_abs_error`, `mean_abs_error`, `out.<output>.<metric>`, `task.<name>` (task=custom: `task.fn`).

The evaluation batches and their fp32 outputs are written once to a temp folder (one .npz per batch), so memory
holds one batch whatever the number of evaluation rows and trials; runs under HELD_RUN_BYTES stay in memory instead
(up to HELD_BYTES in all): loading an .npz costs about half a millisecond whatever its size, about the time to read
1 MB, and a stream of one-row runs (a state fed back: 1875 of DTLN's blocks) spent more than half of each
measurement loading them.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from calibrun.core.errors import CalibrunError
from calibrun.core.files import temp_dir
from calibrun.data import rows as feed_rows
from calibrun.measure import feedback
from calibrun.measure.errors import Gathered, OutputErrors, as_array, rows_per_run
from calibrun.model.graph import blocks_of
from calibrun.model.sessions import session

Feeds = dict[str, np.ndarray]
HELD_RUN_BYTES = 2**20  # a run this small is held in memory, not written
HELD_BYTES = 16 * 2**20  # at most this much held in all
RunFn = Callable[[Feeds], Sequence[np.ndarray]]


class Stopped(BaseException):
    """A measurement stopped between runs because its caller stopped waiting for it (Evaluator.model's `stop`); a
    BaseException, so that no handler of a measurement's own errors reports it as the model's."""


class Batches:
    """The evaluation batches an Evaluator wrote (inputs, fp32 outputs and labels, one .npz each) and the metrics
    of any run against them: all a worker process needs to measure a trial (it pickles: paths, names and a fresh
    task)."""

    def __init__(self, folder: Path, count: int, input_names: list[str], output_names: list[str], blocks, task,
                 output_shapes: list | None = None, state: dict[str, str] | None = None,
                 held: dict[int, dict[str, np.ndarray]] | None = None, stream: bool = False,
                 row_names: frozenset[str] = frozenset()):
        self.folder, self.count = folder, count
        self.row_names = row_names  # the inputs' batch axes' names (calibrun.measure.errors.row_axis)
        self.held = held or {}  # run index -> its arrays, for the runs kept in memory (Evaluator.add)
        self.input_names, self.output_names, self.blocks, self.task = input_names, output_names, blocks, task
        self.output_shapes = output_shapes
        self.state = dict(state or {})  # input -> the output it takes back (calibrun.measure.feedback): runs in order
        self.stream = stream  # the runs are a stream's one-row runs (a state fed back, or its per-call view)

    def batch(self, i: int) -> tuple[Feeds, list[np.ndarray], np.ndarray | None, int | None]:
        """Batch i: its feeds, fp32 outputs, labels and row count."""
        if i in self.held:
            return self._read(self.held[i])
        with np.load(self.folder / f"{i}.npz", allow_pickle=False) as data:
            return self._read(data)

    def _read(self, data) -> tuple[Feeds, list[np.ndarray], np.ndarray | None, int | None]:
        feeds = {name: data[f"i{k}"] for k, name in enumerate(self.input_names)}
        reference = [data[f"o{k}"] for k in range(len(self.output_names))]
        labels = data.get("labels")
        rows = int(data["rows"]) if "rows" in data else None
        return feeds, reference, labels, rows

    def run(self, run: RunFn) -> dict[str, float]:
        """Metrics of `run(feeds) -> outputs` (outputs in the fp32 model's order) over every evaluation batch. With a
        state (`state`), each run is fed its own previous output there (Evaluator.per_call: none, the state fp32
        carried, the error of each call alone)."""
        errors = OutputErrors(self.output_names, self.blocks, self.output_shapes, self.row_names)
        task = copy.deepcopy(self.task)
        carried = feedback.Carried(feedback.output_indices(self.state, self.output_names), self.output_names)
        # a stream's one-row runs measured 64 at once (calibrun.measure.errors.Gathered), fed back or per call alike
        gathered = Gathered(errors, task, self.output_names, self.output_shapes, 64 if self.stream else 1)
        for i in range(self.count):
            feeds, ref, labels, rows = self.batch(i)
            got = [as_array(o) for o in run(carried.feeds(feeds))]
            carried.took(got)
            if len(got) < len(ref):
                raise CalibrunError(f"the int8 model has {len(got)} outputs, the fp32 model {len(ref)}")
            got = got[: len(ref)]
            gathered.add(ref, got, labels, rows, feeds)
        gathered.flush()
        metrics = errors.metrics()
        if task is not None:
            metrics.update(task.metrics())
        return metrics


class Evaluator:
    """The evaluation batches with their fp32 reference outputs (kept on disk) and the metrics of any int8 run
    against them. Use as a context manager (the temp folder is removed on exit).

    `evaluation`: a calibrun.data.EvalData, read `rows` rows at a time; `task`: a fresh calibrun.measure.tasks.Task
    (None: no task metrics), copied for every measurement.
    """

    def __init__(self, fp32_path: str | Path, evaluation, rows: int, threads: int = 0, task=None,
                 budget: int | None = None):
        """`budget`: memory.budget in bytes (None: auto, calibrun.core.memory): a batch of `rows` rows whose live
        activations exceed it is kept as runs of fewer rows, one file each, as calibrun.measure.errors.evaluate runs
        them (every session of a trial then runs at most that many rows at once). `evaluation` None: an empty
        store that another pass over the fp32 model fills (`kept`)."""
        self.threads = threads
        self.task = task
        self.blocks = blocks_of(fp32_path)  # outputs a Concat joins: measured per Concat input too
        self.state = dict(getattr(evaluation, "state", None) or {})
        self.stream = bool(self.state)  # stays in the per-call view, whose state is none
        self._dir = temp_dir("eval")
        self._tmp = Path(self._dir.name)
        self.count = 0
        self.most_rows = 0  # the most rows a stored run holds
        self.row_names: frozenset[str] = frozenset()  # set by start()
        self._held: dict[int, dict[str, np.ndarray]] = {}
        self._held_bytes = 0
        if evaluation is None:
            return
        try:
            fp32 = session(fp32_path, threads)
            axes = getattr(evaluation, "axes", None)
            self.start([o.name for o in fp32.get_outputs()], [o.shape for o in fp32.get_outputs()],
                       [i.name for i in fp32.get_inputs()],
                       feed_rows.batch_names({i.name: i.shape for i in fp32.get_inputs()}, axes))
            fixed = feed_rows.pinned_rows({i.name: i.shape for i in fp32.get_inputs()}, axes)
            per_run = feedback.rows_per_run(self.state, fixed) if self.state else None
            carried = feedback.Carried(feedback.output_indices(self.state, self.output_names), self.output_names)
            for batch, batch_labels in evaluation.batches(rows):
                count = feed_rows.count(batch, axes)
                if per_run is None:
                    per_run = rows_per_run(fp32_path, batch, fixed, count, budget, None, axes)
                for start, stop, feeds in feed_rows.runs(batch, axes, per_run):
                    labels = batch_labels if per_run >= count or batch_labels is None else batch_labels[start:stop]
                    feeds = carried.feeds(feeds)
                    outputs = fp32.run(None, feeds)
                    carried.took(outputs)
                    self.add(feeds, outputs, labels, feed_rows.count(feeds, axes))
            del fp32
        except BaseException:
            self.close()
            raise
        self.ready()

    @classmethod
    def kept(cls, fp32_path: str | Path, threads: int = 0, task=None, state: dict | None = None) -> Evaluator:
        """An empty store for the fp32 outputs another pass computes anyway (calibrun.measure.errors.evaluate's
        `keep`: the job's own evaluation), so the measurements that follow (the recommendations) need no fp32 pass
        of their own; `start`, `add` per run, then `ready`."""
        kept = cls(fp32_path, None, 0, threads, task)
        kept.state = dict(state or {})  # the evaluation's (EvalData.state): its runs are stored in order
        kept.stream = bool(kept.state)
        return kept

    def start(self, output_names: list[str], output_shapes: list, input_names: list[str],
              row_names: frozenset[str] = frozenset()) -> None:
        self.output_names, self.output_shapes, self.input_names = output_names, output_shapes, input_names
        self.row_names = row_names

    def add(self, feeds: Feeds, outputs: Sequence, labels, rows: int) -> None:
        """One run's feeds, fp32 outputs, labels and row count, as one file."""
        arrays = {f"o{k}": as_array(v) for k, v in enumerate(outputs)}
        arrays.update({f"i{k}": feeds[name] for k, name in enumerate(self.input_names)})
        arrays["rows"] = np.asarray(rows)
        if labels is not None:
            arrays["labels"] = np.asarray(labels)
        size = sum(a.nbytes for a in arrays.values())
        self.most_rows = max(self.most_rows, int(rows))
        if size <= HELD_RUN_BYTES and self._held_bytes + size <= HELD_BYTES:
            self._held[self.count] = {k: np.array(a) for k, a in arrays.items()}  # copies: the caller's may change
            self._held_bytes += size
        else:
            np.savez(self._tmp / f"{self.count}.npz", **arrays)
        self.count += 1

    def ready(self) -> None:
        """Every run added: an empty store is an error (and removed)."""
        if not self.count:
            self.close()
            raise CalibrunError("the analysis needs at least one evaluation batch")

    def per_call(self) -> Evaluator:
        """The same stored runs measured per call: each row fed the state fp32 carried, whatever `state` (a search's
        signal where a diverged stream hides what one change does; calibrun.analysis.recommend). A view: the
        original owns the temp folder and closes it."""
        view = copy.copy(self)
        view.state = {}
        return view

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._dir.cleanup()
        self._held, self._held_bytes = {}, 0

    @property
    def batches(self) -> Batches:
        return Batches(self._tmp, self.count, self.input_names, self.output_names, self.blocks, self.task,
                       self.output_shapes, self.state, self._held, self.stream, self.row_names)

    def run(self, run: RunFn) -> dict[str, float]:
        """Metrics of `run(feeds) -> outputs` (outputs in the fp32 model's order) over every evaluation batch."""
        return self.batches.run(run)

    def model(self, path: str | Path, threads: int | None = None, stop: threading.Event | None = None,
              timed: dict | None = None) -> dict[str, float]:
        """Metrics of the int8 model file `path` (one session of `threads` intra-op threads, the Evaluator's by
        default; every batch). `stop` set: Stopped is raised before the next run (a measurement in another thread
        whose caller was interrupted). `timed` (a dict) receives `runs`, how many runs the session made, and
        `inside`, the seconds inside them."""
        sess = session(path, self.threads if threads is None else threads)
        runs, inside = 0, 0.0

        def run(feeds: Feeds) -> Sequence[np.ndarray]:
            nonlocal runs, inside
            if stop is not None and stop.is_set():
                raise Stopped(str(path))
            began = time.perf_counter()
            outputs = sess.run(None, feeds)
            runs, inside = runs + 1, inside + time.perf_counter() - began
            return outputs

        metrics = self.run(run)
        if timed is not None:
            timed.update(runs=runs, inside=inside)
        return metrics

    def largest_run(self) -> tuple[Feeds, int]:
        """The feeds of the first stored run and the most rows a stored run holds (what a measurement runs at once)."""
        return self.batches.batch(0)[0], self.most_rows


def metric_of(metrics: Mapping[str, float], name: str) -> float:
    """metrics[name] with an error that lists what exists."""
    if name not in metrics:
        raise CalibrunError(f"analysis.metric: {name!r} is not a metric of this run (metrics: {sorted(metrics)})")
    return float(metrics[name])
