"""Histogram calibration (entropy, percentile, distribution) under `memory.budget`.

onnxruntime's histogram calibrators take every calibrated tensor of a chunk of batches at once (`collect_data`
holds the augmented model's outputs for the whole chunk): nudenet at 1280, three photos, 3.1 GB where plain
inference of a photo takes 0.37 GB. A chunk's histogram cannot be built from its rows one at a time directly,
because the chunk's range decides the bins (calibrun.quant.histogram.FastHistogramCollector.plan); it can in two
passes over the chunk:

1. the ranges: each tensor's min and max (and the min of |x| for the symmetric percentile's first chunk), which
   are those of the whole chunk when taken over its pieces (calibrun.quant.histogram.ChunkRange);
2. the counts: each piece binned into the bins the ranges decide; the counts of the pieces add up to the whole's
   (a value's bin depends on the value and the edges only).

So the histograms, and the ranges chosen from them, are those of the whole chunk, up to onnxruntime computing a row
differently in a smaller batch or in a piece of the model (float rounding). A piece is a group of tensors whose rows
stay under half the budget (the other half for what onnxruntime holds meanwhile), the model cut into one piece per
group (calibrun.model.segments: each node runs once per pass), and rows in runs of as many as fit. A chunk that fits
the budget runs as before, in one piece: bit-identical. The second pass is the price of the memory: it runs only
where the chunk would not fit. Where the model is cut into pieces, a piece's tensors are binned while the next piece
runs (its arrays were held until then anyway: no more memory; nudenet at 1280, entropy: 4.4 -> 4.15 s at the same
peak).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from calibrun.core import memory
from calibrun.data import rows as feed_rows
from calibrun.model.graph import outer_reads
from calibrun.model.segments import SegmentError, Segments
from calibrun.model.sessions import session
from calibrun.model.structure import structure
from calibrun.quant.histogram import ChunkRange, FastHistogramCollector, largest_first

log = logging.getLogger(__name__)

Feeds = Mapping[str, np.ndarray]


class HistogramPieces:
    """The calibrated tensors of a histogram calibration in groups, run piece by piece (module docstring).

    `plan` returns one when the first chunk's tensors exceed the budget, else None (the calibrator's own pass)."""

    def __init__(self, model_path: Path, groups: list[list[str]], rows: int, threads: int, axes, fallback,
                 varying: set[str]):
        self.groups, self.rows, self.axes, self.varying = groups, rows, axes, varying
        self.segments = None
        # the augmented session (calibrun.model.sessions.ReusedOutputs): one group, or a model that cannot be cut,
        # runs whole, in runs of rows
        self.fallback = fallback
        if len(groups) > 1:
            try:
                self.segments = Segments(model_path, groups, lambda path: session(
                    path, threads, optimize=False, arena=False, mem_pattern=True, priority_order=True,
                    shown="a piece of the calibration copy of the model"))
            except SegmentError as exc:
                log.info("calibration: the model cannot be cut into pieces (%s): every tensor of a row at once", exc)
                self.groups = [[name for group in groups for name in group]]
                self.rows = 1
        # a piece is binned while the next one runs (collect_pieces' overlap) where pieces' sessions return fresh
        # arrays; the whole model writes into reused buffers
        self.overlap = self.segments is not None

    @classmethod
    def plan(cls, model_path: Path, tensors: Sequence[str], chunk: Sequence[Feeds], setting: int | None,
             threads: int, axes, fallback, used: dict) -> HistogramPieces | None:
        """`chunk`: the first chunk's batches (feeds); `tensors`: the tensors the calibrator histograms;
        `setting`: memory.budget in bytes, None for auto. Records `budget_bytes`, `calibration_rows_per_run` and
        `calibration_groups` in `used`."""
        first = chunk[0]
        sizes = memory.row_bytes(model_path, first, axes)
        budget = memory.resolve(setting, sizes)
        rows_in_chunk = sum(feed_rows.count(feeds, axes) for feeds in chunk)
        batch_rows = feed_rows.count(first, axes)
        per_row = sum(sizes.get(name, 0) for name in tensors)
        used.update(budget_bytes=budget)
        if per_row * rows_in_chunk <= budget:
            used.update(calibration_rows_per_run=batch_rows, calibration_groups=1)
            return None
        model = structure(model_path)
        order = [i.name for i in model.graph.input] + [name for node in model.graph.node for name in node.output]
        wanted = set(tensors)
        ordered = [name for name in dict.fromkeys(order) if name in wanted]
        half = budget // 2
        groups: list[list[str]] = [[]]
        held = 0
        for name in ordered:
            size = sizes.get(name, 0)
            if groups[-1] and held + size > half:
                groups.append([])
                held = 0
            groups[-1].append(name)
            held += size
        missing = sorted(wanted - set(ordered))  # not a top-level tensor: the pieces cannot return it
        if missing:
            groups = [[*ordered, *missing]]
        largest = max(sum(sizes.get(name, 0) for name in group) for group in groups)
        shapes = {i.name: [d.dim_value or None for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
        fixed = feed_rows.pinned_rows(shapes, axes) is not None
        rows = batch_rows if fixed else memory.rows_for(half, largest, batch_rows)
        pieces = cls(model_path, groups, rows, threads, axes, fallback, _varying(model, axes))
        used.update(calibration_rows_per_run=pieces.rows, calibration_groups=len(pieces.groups))
        log.info("calibration: %d tensors of %.0f MB a row in %d groups, %d of %d rows per run, two passes "
                 "(memory.budget %.0f MB)", len(ordered), per_row / 1e6, len(pieces.groups), pieces.rows,
                 batch_rows, budget / 1e6)
        return pieces

    def _runs(self, chunk: Sequence[Feeds]) -> Iterator[dict[str, np.ndarray]]:
        """Every piece of the chunk: per run of rows, each group's tensors (a dict), one group at a time."""
        for feeds in chunk:
            for start, _, part in feed_rows.runs(feeds, self.axes, self.rows):
                for arrays in self._run(part):
                    # a tensor the rows do not reach (a Constant node's, or of constant inputs only) is the same in
                    # every run: counted once per batch, as onnxruntime's calibrator sees it
                    yield arrays if start == 0 else {k: v for k, v in arrays.items() if k in self.varying}

    def _run(self, feeds: Feeds) -> Iterator[dict[str, np.ndarray]]:
        if self.segments is not None:
            yield from self.segments.run(feeds)
            return
        names = [o.name for o in self.fallback.get_outputs()]
        outputs = self.fallback.run(None, dict(feeds))
        group = set(self.groups[0])
        yield {name: array for name, array in zip(names, outputs, strict=True) if name in group}

    def collect(self, collector: FastHistogramCollector, chunk: Sequence[Feeds]) -> None:
        """Add the chunk to `collector`'s histograms as `collector.collect` of the whole chunk would."""
        collect_pieces(collector, lambda: self._runs(chunk), self.overlap)


def _varying(model, axes) -> set[str]:
    """The tensors that depend on the rows: written, directly or not, from a graph input that has a batch axis (a
    constant input, `axes` None, does not count)."""
    varying = {i.name for i in model.graph.input if feed_rows.axis_of(axes, i.name) is not None}
    for node in model.graph.node:  # topological order
        if any(name in varying for name in (*node.input, *outer_reads(node))):
            varying.update(name for name in node.output if name)
    return varying


def collect_pieces(collector: FastHistogramCollector, pieces: Callable[[], Iterator[Mapping[str, np.ndarray]]],
                   overlap: bool = False) -> None:
    """Add one chunk to `collector`'s histograms from its pieces: `pieces()` yields dicts of tensor -> array (any
    split of the chunk's values: groups of tensors, runs of rows), the same every time it is called; it is called
    twice (the ranges, then the counts). The result is `collector.collect` of the whole chunk. The tensors of a piece
    are taken on `collector.threads` threads, the largest first (numpy releases the GIL in its loops).
    `overlap`: a piece's arrays stay valid while the next one is made (not written into again), so a piece's tensors
    are taken while the next piece runs; one piece at a time, so a tensor's range and counts grow in order."""
    absolute = collector.method == "percentile" and collector.symmetric
    ranges: dict[str, ChunkRange] = {}

    def take_range(name: str, flat: np.ndarray) -> None:
        found = ranges[name]
        found.add(flat, absolute and name not in collector.histogram_dict)

    counts: dict[str, tuple] = {}
    plans: dict = {}

    def add_counts(name: str, hist: np.ndarray, edges: np.ndarray) -> None:
        counts[name] = (hist, edges) if name not in counts else (counts[name][0] + hist, edges)

    def take_counts(name: str, flat: np.ndarray) -> None:
        plan = plans.get(name)
        if plan is None or plan.bins is None:
            return
        add_counts(name, *plan.counts(flat))

    def take_all(take: Callable[[str, np.ndarray], None], flats: list[tuple], pool: ThreadPoolExecutor) -> None:
        if take is take_counts and collector.worker is not None:  # half of a large piece in the worker process
            wanted = [(name, flat) for name, flat in flats if name in plans and plans[name].bins is not None]
            found = collector.worker.counts(plans, wanted)
            if found is not None:
                for (name, _), found_counts in zip(wanted, found, strict=True):
                    add_counts(name, *found_counts)
                return
        largest_first(take, flats, collector.threads, pool)

    with ThreadPoolExecutor(max(1, collector.threads)) as pool, ThreadPoolExecutor(1) as lead:

        def each_piece(take: Callable[[str, np.ndarray], None], before=None) -> None:
            pending = None
            for arrays in pieces():
                flats = [(name, np.asarray(array).reshape(-1)) for name, array in arrays.items()]
                if pending is not None:
                    pending.result()
                if before is not None:
                    before(flats)
                if overlap:
                    pending = lead.submit(take_all, take, flats, pool)
                else:
                    take_all(take, flats, pool)
            if pending is not None:
                pending.result()

        def new_ranges(flats) -> None:
            for name, flat in flats:
                if name not in ranges:
                    ranges[name] = ChunkRange(flat.dtype)

        each_piece(take_range, new_ranges)  # a tensor once a piece
        for name, chunk_range in ranges.items():
            if collector.is_unbounded(name, chunk_range):  # an infinite value: no histogram (FastHistogramCollector)
                collector.set_unbounded(name, chunk_range)
            else:
                plans[name] = collector.plan(name, chunk_range)
        each_piece(take_counts)
    for name, plan in plans.items():
        collector.histogram_dict[name] = plan.finish(*counts.get(name, (None, None)))

