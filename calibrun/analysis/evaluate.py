"""The metrics the analysis optimises, measured batch by batch with running sums only.

The analysis is written against ONE callable, `Evaluator.model(path) -> {metric: value}` (an int8 model file ->
its metrics on the evaluation data), plus `Evaluator.run(session_run)` for a session the caller already holds
(the sensitivity pass keeps one session for every trial). Metric names:

- `max_abs_error`, `mean_abs_error`: |fp32 - int8| over every element of every output (the lab's definition);
- `out.<output>.max_abs_error`, `out.<output>.mean_abs_error`, `out.<output>.sqnr_db` per model output
  (SQNR = 10 log10(sum fp32^2 / sum (fp32 - int8)^2), +inf when identical);
- `task.<name>` for each key of a custom task function `fn(fp32_outputs, int8_outputs, labels) -> {name: float}`
  (dicts of arrays by output name), called once per evaluation batch; the values are averaged over batches,
  weighted by the batch's rows.

The fp32 outputs are computed once and kept on disk (one .npz per batch in a temp folder), so memory holds one
batch whatever the number of evaluation rows and trials.
"""

from __future__ import annotations

import importlib
import math
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from calibrun.errors import CalibrunError, one_line
from calibrun.measure import session

Feeds = dict[str, np.ndarray]
RunFn = Callable[[Feeds], Sequence[np.ndarray]]
TaskFn = Callable[[dict, dict, object], Mapping[str, float]]


def load_task_fn(spec: str | None) -> TaskFn | None:
    """`module:function` -> the function (None for no spec), with one clear error when it cannot be found."""
    if not spec:
        return None
    module_name, sep, name = str(spec).partition(":")
    if not sep or not module_name or not name:
        raise CalibrunError(f"analysis.task_fn must be module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CalibrunError(f"analysis.task_fn: cannot import {module_name!r}: {one_line(exc)}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise CalibrunError(f"analysis.task_fn: {module_name!r} has no function {name!r}")
    return fn


def batches_of(feeds: Feeds, rows: int) -> list[Feeds]:
    """`feeds` cut into batches of `rows` rows (views, no copies)."""
    total = len(next(iter(feeds.values())))
    return [{k: v[i : i + rows] for k, v in feeds.items()} for i in range(0, total, rows)]


class _Sums:
    """Running statistics of one output."""

    def __init__(self):
        self.max_abs = 0.0
        self.abs_sum = 0.0
        self.count = 0
        self.signal = 0.0
        self.noise = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
        diff = np.abs(ref64 - got64)
        if diff.size:
            self.max_abs = max(self.max_abs, float(diff.max()))
        self.abs_sum += float(diff.sum())
        self.count += diff.size
        self.signal += float(np.square(ref64).sum())
        self.noise += float(np.square(diff).sum())

    def sqnr_db(self) -> float:
        if self.noise == 0:
            return math.inf
        if self.signal == 0:
            return -math.inf
        return 10 * math.log10(self.signal / self.noise)


class Evaluator:
    """fp32 reference outputs of the evaluation batches (kept on disk) and the metrics of any int8 run against them.

    Use as a context manager (the temp folder is removed on exit).
    """

    def __init__(self, fp32_path: str | Path, batches: Sequence[Feeds], labels=None, threads: int = 0,
                 task_fn: TaskFn | None = None):
        if not batches:
            raise CalibrunError("the analysis needs at least one evaluation batch")
        self.batches = list(batches)
        self.labels = None if labels is None else np.asarray(labels)
        self.threads = threads
        self.task_fn = task_fn
        self._tmp = Path(tempfile.mkdtemp(prefix="calibrun.eval."))
        fp32 = session(fp32_path, threads)
        self.output_names = [o.name for o in fp32.get_outputs()]
        self.input_names = [i.name for i in fp32.get_inputs()]
        for i, feeds in enumerate(self.batches):
            outputs = fp32.run(None, feeds)
            np.savez(self._tmp / f"{i}.npz", **{f"o{k}": np.asarray(v) for k, v in enumerate(outputs)})
        del fp32

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _reference(self, i: int) -> list[np.ndarray]:
        with np.load(self._tmp / f"{i}.npz", allow_pickle=False) as data:
            return [data[f"o{k}"] for k in range(len(self.output_names))]

    def run(self, run: RunFn) -> dict[str, float]:
        """Metrics of `run(feeds) -> outputs` (outputs in the fp32 model's order) over every evaluation batch."""
        total = _Sums()
        per_output = [_Sums() for _ in self.output_names]
        task: dict[str, float] = {}
        rows_seen = 0
        start = 0
        for i, feeds in enumerate(self.batches):
            ref = self._reference(i)
            got = [np.asarray(o) for o in run(feeds)]
            if len(got) < len(ref):
                raise CalibrunError(f"the int8 model has {len(got)} outputs, the fp32 model {len(ref)}")
            rows = len(next(iter(feeds.values())))
            for k, (r, g) in enumerate(zip(ref, got[: len(ref)], strict=True)):
                if r.shape != g.shape:
                    raise CalibrunError(f"output {self.output_names[k]!r}: shapes differ, {r.shape} vs {g.shape}")
                total.add(r, g)
                per_output[k].add(r, g)
            if self.task_fn is not None:
                labels = None if self.labels is None else self.labels[start : start + rows]
                values = self.task_fn(dict(zip(self.output_names, ref, strict=True)),
                                      dict(zip(self.output_names, got, strict=False)), labels)
                for name, value in dict(values).items():
                    task[name] = task.get(name, 0.0) + float(value) * rows
            rows_seen += rows
            start += rows
        metrics = {"max_abs_error": total.max_abs, "mean_abs_error": total.abs_sum / max(total.count, 1)}
        for name, sums in zip(self.output_names, per_output, strict=True):
            metrics[f"out.{name}.max_abs_error"] = sums.max_abs
            metrics[f"out.{name}.mean_abs_error"] = sums.abs_sum / max(sums.count, 1)
            metrics[f"out.{name}.sqnr_db"] = sums.sqnr_db()
        metrics.update({f"task.{name}": value / rows_seen for name, value in task.items()})
        return metrics

    def model(self, path: str | Path) -> dict[str, float]:
        """Metrics of the int8 model file `path` (one session, every batch)."""
        sess = session(path, self.threads)
        return self.run(lambda feeds: sess.run(None, feeds))


def metric_of(metrics: Mapping[str, float], name: str) -> float:
    """metrics[name] with an error that lists what exists."""
    if name not in metrics:
        raise CalibrunError(f"analysis.metric: {name!r} is not a metric of this run (metrics: {sorted(metrics)})")
    return float(metrics[name])
