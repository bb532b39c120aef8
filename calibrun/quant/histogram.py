"""Histogram calibration at inference speed: onnxruntime's HistogramCollector with the same results, faster.

onnxruntime (quantization/calibrate.py) spends its time in two places:

* `get_entropy_threshold` walks every candidate threshold of every tensor in Python loops, O(bins^2) per tensor
  (2048 bins: about a second per tensor). `entropy_threshold` here screens all candidates at once with prefix
  sums (O(candidates x quantized bins) numpy work, in float64), keeps only the candidates whose KL divergence
  could be the smallest once the reference's float32 rounding is accounted for (a proven error bound, see
  `_screen`), and evaluates those few exactly as onnxruntime does (the same integer p and q, then the float32
  operations of onnxruntime's `smooth_distribution` and `entropy`, without their checks that cannot fire here:
  the same bits, tested). The chosen threshold is therefore onnxruntime's own.
* `np.histogram` per tensor and batch, single-threaded; with explicit bin edges (the percentile merge) it even
  sorts the data. `histogram` here returns the same counts and edges as `np.histogram` (bins are decided by the
  edges exactly as numpy decides them: a float32 position, int32 bins and one `bincount` per block; the values
  within a rounding margin of an edge, zeros on the middle edge among them, are compared with that edge), and
  `FastHistogramCollector` gives about half of each large batch to a worker process
  (calibrun.quant.histogram_worker: np.bincount holds the GIL, so threads bin no faster than one), else spreads the
  tensors of a batch over threads, largest first. The symmetric
  percentile histogram of |x| is binned block by block, without a copy of |x|. Range growth and re-binning
  (`merge_histogram`) are onnxruntime's code, unchanged in effect, except where onnxruntime breaks: a range
  growing so far that it would need more than MAX_GROWN_BINS bins (it asks for billions), and an empty tensor in
  the symmetric percentile histogram (nanmax of nothing).

Percentile and Distribution thresholds are onnxruntime's own (`compute_percentile`, `compute_distribution`):
they are O(bins) numpy already.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import signal
import sys
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from onnxruntime.quantization.calibrate import HistogramCollector, TensorData

from calibrun.core.bounds import inside_stand_in

log = logging.getLogger(__name__)

# In the calibration cache key: bump when anything here can change a range or a histogram.
ALGORITHM = "calibrun.quant.histogram/2"  # 2: a tensor reaching infinity's stand-in has no histogram

_EPS = 0.0001  # smooth_distribution's eps
_F32 = float(np.finfo(np.float32).eps)
# The reference computes KL in float32; its value is within _REF_ERR * eps32 * (KL + 4) of the exact one (see
# `_screen`). Candidates are kept for the exact evaluation with this bound, generously rounded up.
_REF_ERR = 256
_BLOCK = 1 << 17  # elements per binning block (fewer, longer numpy calls let threads overlap)
# onnxruntime keeps a histogram's bin width when a later batch widens the range, adding bins: a tensor whose first
# batch is nearly constant (a text detector's sigmoid map on a photo without text: max 5e-7, then 1.0) would need
# billions of bins (16 GB of edges; numpy then refuses). Beyond this many bins calibrun re-bins instead: the
# histogram keeps its bin count over the new range and the old counts move to the bins of their old bin centres
# (all within one new bin). Below it, the result is onnxruntime's.
MAX_GROWN_BINS = 1 << 17
_SCREEN_CHUNK = 256  # entropy candidates screened at once (its arrays stay in cache; memory bounded for any size)


# ---------------------------------------------------------------------------------------------- binning


_EDGES: dict = {}  # (bins, range and its types, dtype) -> edges: batches after the first reuse one range


def uniform_edges(dtype, bins: int, first, last):
    """(edges, grid): the edges `np.histogram(a, bins, range=(first, last))` uses for an `a` of `dtype`
    (read-only), and their `_grid`."""
    key = (bins, np.dtype(dtype).str, float(first), float(last), np.result_type(first).str,
           np.result_type(last).str)
    found = _EDGES.get(key)
    if found is None:
        edges = np.histogram_bin_edges(np.empty(0, dtype=dtype), bins, range=(first, last))
        edges.flags.writeable = False
        found = (edges, _grid(edges) if edges.dtype == np.float32 else None)
        if len(_EDGES) > 4096:
            _EDGES.clear()
        _EDGES[key] = found
    return found


def _outer(first, last):
    """numpy's _get_outer_edges for a given range (an empty range grows by 0.5 on each side)."""
    if first == last:
        first = first - 0.5
        last = last + 0.5
    return first, last


def _grid(edges: np.ndarray):
    """(origin, scale, margin) of near-uniform float32 edges, or None: the position of x in bins is
    (x - origin) * scale in float32, wrong by less than `margin` bins (edges' distance from an ideal uniform grid
    plus the float32 rounding of the position, with a factor of 5 to spare). `origin` is the first edge."""
    n = edges.size - 1
    lo_edge, hi_edge = float(edges[0]), float(edges[-1])
    width = (hi_edge - lo_edge) / n
    if not (width > 0 and math.isfinite(width) and math.isfinite(1.0 / width)):
        return None
    ideal = lo_edge + np.arange(n + 1, dtype=np.float64) * width
    dev = float(np.max(np.abs(edges.astype(np.float64) - ideal))) / width
    margin = dev + (n + 1) * 8 * _F32 + 1e-6
    with np.errstate(over="ignore"):
        scale = np.float32(1.0 / width)
    if margin > 0.2 or not (abs(float(scale) * width - 1) <= 4 * _F32):
        return None
    return np.float32(lo_edge), scale, margin


def _shifted(grid):
    """(origin', scale, band): `bin_counts`' form of a `_grid` (origin, scale, margin). Its positions
    f = (x - origin') * scale (float32) are those of `_grid` shifted up by S in [margin, 1/2) bins (origin' =
    origin - S / scale is a float32 at or below origin), so the true position p of x satisfies p < f < p + band
    with band = S + margin: if the fractional part of f is at least `band`, x is in bin floor(f); otherwise x is
    in bin j - 1 or j, j = floor(f), whichever side of edges[j] it lies on."""
    origin, scale, margin = grid
    shifted = np.float32(float(origin) - margin / float(scale))
    while (float(origin) - float(shifted)) * float(scale) < margin:  # rounded towards origin: one float lower
        shifted = np.nextafter(shifted, np.float32(-np.inf))
    shift = (float(origin) - float(shifted)) * float(scale)
    return shifted, scale, np.float32(shift + margin + 4 * _F32)


def bin_counts(data: np.ndarray, edges: np.ndarray, first=None, last=None, grid=False, inside=False,
               absolute=False) -> np.ndarray:
    """`np.histogram(data, bins=edges)[0]` for flat float32 `data` and sorted, near-uniform float32 `edges`.

    A value x is counted in bin k when edges[k] <= x < edges[k+1] (the last bin includes its right edge); values
    outside [first, last] (default: the outer edges) and NaN are not counted: numpy's definition. The bin is
    computed in float32 arithmetic (`_shifted`); the few values whose computed position lies within a proven
    error margin of an edge j (zeros on the middle edge of a symmetric range, values equal to the range's ends)
    are first counted in bin j, then moved to bin j - 1 when x < edges[j].
    `inside`: the caller knows every value is in [first, last] (no NaN), so blocks need no range check.
    `absolute`: count |data| (block by block: no copy of the whole of `data`).
    """
    n = edges.size - 1
    if first is None:
        first, last = edges[0], edges[-1]
    counts = np.zeros(n + 1, dtype=np.int64)  # bin n: values on the last edge (bin n - 1, below)
    if data.size == 0:
        return counts[:n]
    if grid is False:
        grid = _grid(edges)
    origin, scale, band = _shifted(grid) if grid is not None else (None, None, 0)
    if not 0 < band < 0.5:
        return np.histogram(np.absolute(data) if absolute else data, bins=edges)[0]
    size = min(_BLOCK, data.size)
    f_buf, frac_buf = np.empty(size, dtype=np.float32), np.empty(size, dtype=np.float32)
    k_buf, near_buf = np.empty(size, dtype=np.int32), np.empty(size, dtype=bool)
    abs_buf = np.empty(size, dtype=np.float32) if absolute else None
    nonzero_buf = None
    # zeros (most of a ReLU output) sit on or near the middle edge of a symmetric range: all in bin j0 by the
    # formula, all in bin `zero_bin` truly; in blocks with many values near edges they are counted apart
    j0 = int(np.floor(np.multiply(np.subtract(np.float32(0), origin), scale)))
    zero_bin = j0 - int(edges[j0] > 0) if 0 <= j0 <= n else None
    zeros = 0
    for start in range(0, data.size, _BLOCK):
        block = data[start:start + _BLOCK]
        if absolute:
            block = np.absolute(block, out=abs_buf[:block.size])
        # values outside the range, or NaN: dropped as numpy does
        if not inside and not (block.min() >= first and block.max() <= last):
            block = block[(block >= first) & (block <= last)]
            if block.size == 0:
                continue
        m = block.size
        f, frac, k, near = f_buf[:m], frac_buf[:m], k_buf[:m], near_buf[:m]
        np.subtract(block, origin, out=f)  # >= 0: block >= first >= edges[0] >= origin' (float32 block)
        np.multiply(f, scale, out=f)
        np.floor(f, out=frac)
        np.copyto(k, frac, casting="unsafe")  # exact: small non-negative integers
        np.subtract(f, frac, out=frac)
        np.less(frac, band, out=near)
        suspect = np.flatnonzero(near)
        if suspect.size > m >> 4 and zero_bin is not None:
            if nonzero_buf is None:
                nonzero_buf = np.empty(size, dtype=bool)
            nonzero = np.not_equal(block, 0, out=nonzero_buf[:m])
            found_zeros = m - np.count_nonzero(nonzero)
            if found_zeros:
                zeros += found_zeros
                suspect = np.flatnonzero(np.logical_and(near, nonzero, out=near))
        if suspect.size:  # counted in bin j, belong to bin j - 1 when below edge j (j > 0: block >= edges[0])
            j = k[suspect]
            j -= block[suspect] < edges[j]
            k[suspect] = j
        found = np.bincount(k, minlength=n + 1)
        if found.size != n + 1:  # a position beyond the last edge: the margin's bound would be wrong
            raise AssertionError(f"calibrun.quant.histogram: values binned beyond the last of {n} bins")
        counts += found
    if zeros:
        counts[j0] -= zeros
        counts[zero_bin] += zeros
    counts[n - 1] += counts[n]
    return counts[:n]


def histogram(data: np.ndarray, bins, range=None, bounds=None, absolute=False):  # noqa: A002 (numpy's name)
    """`np.histogram(data, bins, range)` for a flat array: the same counts and edges (float16 and other dtypes,
    and non-uniform edges, go to numpy itself). `bounds`: (min, max) of `data` when it holds no NaN.
    `absolute`: the histogram of |data| (then `bounds` are those of |data|), without a copy of |data|."""
    if data.dtype != np.float32:
        return np.histogram(np.absolute(data) if absolute else data, bins, range=range)
    if isinstance(bins, np.ndarray):
        inside = bounds is not None and bounds[0] >= bins[0] and bounds[1] <= bins[-1]
        return bin_counts(data, bins, inside=inside, absolute=absolute), bins
    if range is None:
        if data.size == 0:
            return np.histogram(data, bins)
        if absolute:
            data, absolute = np.absolute(data), False
        range = (data.min(), data.max())  # noqa: A001
        if not (np.isfinite(range[0]) and np.isfinite(range[1])):
            return np.histogram(data, bins)  # numpy's error
    first, last = _outer(*range)
    edges, grid = uniform_edges(data.dtype, bins, *range)
    inside = bounds is not None and bounds[0] >= first and bounds[1] <= last
    return bin_counts(data, edges, first, last, grid, inside, absolute), edges.copy()


def _abs_min(data: np.ndarray):
    """np.absolute(data).min() for data without NaN; float32 block by block (no copy of the whole)."""
    if data.dtype != np.float32:
        return np.absolute(data).min()
    buf = np.empty(min(_BLOCK, data.size), dtype=data.dtype)
    return min(np.absolute(data[i:i + _BLOCK], out=buf[:min(_BLOCK, data.size - i)]).min()
               for i in range(0, data.size, _BLOCK))


def largest_first(fn, items: list[tuple], threads: int, pool: ThreadPoolExecutor | None = None) -> list:
    """[fn(name, data) for name, data in items], on `threads` threads (or `pool`'s), the largest data first: no large
    tensor left alone at the end (numpy releases the GIL in its loops)."""
    if len(items) <= 1 or (pool is None and threads <= 1):
        return [fn(name, data) for name, data in items]
    if pool is None:
        with ThreadPoolExecutor(threads) as own:
            return largest_first(fn, items, threads, own)
    order = sorted(range(len(items)), key=lambda i: -_size(items[i][1]))
    done = dict(zip(order, pool.map(lambda i: fn(*items[i]), order), strict=True))
    return [done[i] for i in range(len(items))]


_FORK_LEAST = 1 << 22  # values in a batch below which the worker process is not used (calibrun.quant.histogram_worker)


def _size(data_arr) -> int:
    return sum(np.size(a) for a in data_arr) if isinstance(data_arr, list) else np.size(data_arr)


def _flat(data_arr) -> np.ndarray:
    """onnxruntime's `np.asarray(list).flatten()`: every value of the chunk's batches, in the same order; without a
    copy when the list holds one contiguous array. Batches of different row counts in one chunk (`method.chunk` >= 2
    and a smaller last batch), which numpy refuses to stack (onnxruntime's collector fails there), are concatenated."""
    if not isinstance(data_arr, list):
        return np.asarray(data_arr).reshape(-1)
    if len(data_arr) == 1:
        return np.asarray(data_arr[0]).reshape(-1)
    return np.concatenate([np.asarray(a).reshape(-1) for a in data_arr])


# ---------------------------------------------------------------------------------------------- the collector


class ChunkRange:
    """What decides the bins of a chunk's histogram: the dtype, the number of values, their min and max (NaN propagated,
    and ignored as onnxruntime's np.nanmin/np.nanmax) and, for the symmetric percentile's first chunk, the min of
    |x|. Built from a whole chunk (`of`) or piece by piece (`add`): min and max of pieces are those of the whole."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self.size = 0
        self.low = self.high = None  # NaN propagated
        self.nan_low = self.nan_high = None  # NaN ignored
        self.abs_low = None  # min |x|, NaN propagated (when asked for)

    @classmethod
    def of(cls, data: np.ndarray, absolute: bool) -> ChunkRange:
        chunk = cls(data.dtype)
        chunk.add(data, absolute)
        return chunk

    def add(self, data: np.ndarray, absolute: bool) -> None:
        """Take in the flat array `data`; `absolute`: also the min of |x| (the symmetric percentile's first chunk,
        when the values straddle zero; only float32 without NaN reads it)."""
        if data.size == 0:
            return
        self.size += data.size
        low, high = data.min(), data.max()
        if np.isnan(low) or np.isnan(high):
            nan_low, nan_high = np.nanmin(data), np.nanmax(data)
        else:
            nan_low, nan_high = low, high
        first = self.low is None
        self.low = low if first else np.minimum(self.low, low)
        self.high = high if first else np.maximum(self.high, high)
        self.nan_low = nan_low if first else np.fmin(self.nan_low, nan_low)
        self.nan_high = nan_high if first else np.fmax(self.nan_high, nan_high)
        if absolute:
            smallest = _abs_min(data)
            self.abs_low = smallest if self.abs_low is None else np.minimum(self.abs_low, smallest)

    def needs_abs_low(self, first: bool) -> bool:
        """Whether the symmetric percentile reads the min of |x| (its first histogram's first edge): a first chunk
        without NaN, of float32 values that straddle zero (otherwise it follows from the min and max) or of another
        float type (binned by numpy from |x|)."""
        return (first and self.size > 0 and not np.isnan(self.low) and not np.isnan(self.high)
                and (self.dtype != np.float32 or self.low < 0 < self.high))

    def min_max(self):
        """(nanmin, nanmax) of the whole chunk (what onnxruntime takes) and (min, max) as `histogram`'s bounds, None
        when there is NaN; zeros for an empty chunk."""
        if self.size == 0:
            zero = np.array(0, dtype=self.dtype)
            return zero, zero, None
        if np.isnan(self.low) or np.isnan(self.high):
            return self.nan_low, self.nan_high, None
        return self.low, self.high, (self.low, self.high)

    def abs_high(self):
        """np.nanmax(|x|): the larger |x| of the NaN-ignoring extremes."""
        return max(np.absolute(self.nan_low), np.absolute(self.nan_high))

    def abs_range(self):
        """(min |x|, max |x|): the range np.histogram takes from |x| itself (NaN then: not finite, numpy's error)."""
        if self.size == 0:
            return None  # numpy's default range of nothing
        if np.isnan(self.low) or np.isnan(self.high):
            raise ValueError("autodetected range of [nan, nan] is not finite")
        return self.abs_low, max(np.absolute(self.low), np.absolute(self.high))


class BinPlan:
    """The bins of one chunk of one tensor (`bins`: a count with `range`, or edges) and `finish(counts, edges)`,
    which merges them into the tensor's histogram entry. `counts(piece)` bins any part of the chunk: the counts of
    the parts add up to the whole's (a value's bin depends on the value and the edges only)."""

    def __init__(self, bins, range_, bounds, absolute: bool, finish):
        self.bins, self.range, self.bounds, self.absolute, self.finish = bins, range_, bounds, absolute, finish

    def counts(self, data: np.ndarray):
        """(counts, edges) of the flat array `data`, a part of the chunk."""
        return histogram(data, self.bins, range=self.range, bounds=self.bounds, absolute=self.absolute)

    def apply(self, data: np.ndarray):
        """The histogram entry of the whole chunk `data`."""
        if self.bins is None:  # nothing to count (an empty later chunk of the symmetric percentile)
            return self.finish(None, None)
        return self.finish(*self.counts(data))


class FastHistogramCollector(HistogramCollector):
    """onnxruntime's HistogramCollector with the same histograms and thresholds, computed faster.

    `threads`: tensors of a batch are binned on this many threads (0: one per core).
    `progress(done)`: called as the threshold search finishes tensors (a calibrun.core.progress.Progress.update).
    """

    def __init__(self, method, symmetric, num_bins, num_quantized_bins, percentile, scenario,
                 threads: int = 0, progress: Callable[[int], None] | None = None):
        super().__init__(method, symmetric, num_bins, num_quantized_bins, percentile, scenario)
        self.threads = threads or os.cpu_count() or 1
        self.progress = progress
        # tensors with an infinite value (an attention mask's -inf) or infinity's stand-in (-3.4e38, STAND_IN): no
        # histogram can hold them (numpy refuses an infinite range, in onnxruntime's collector too, and 2048 bins
        # over 6.8e38: "Too many bins for data range"); their range is their min and max, and
        # calibrun.quant.quantize keeps the nodes that read or write them in float
        self.unbounded: dict[str, tuple] = {}
        self.worker = None  # a calibrun.quant.histogram_worker.HistogramWorker: bins half of each large batch

    def _each(self, name_to_arr, fn_name: str) -> None:
        items = list(name_to_arr.items())
        found = self.worker.map(self, fn_name, items) if self.worker is not None else None
        if found is None:
            found = largest_first(getattr(self, fn_name), items, self.threads)
        for (name, _), result in zip(items, found, strict=True):
            if isinstance(result, ChunkRange):
                self.set_unbounded(name, result)
            else:
                self.histogram_dict[name] = result

    def is_unbounded(self, tensor, chunk: ChunkRange) -> bool:
        """Whether `tensor` has no histogram: it had an infinite value (or infinity's stand-in) before, or this chunk
        has one."""
        if tensor in self.unbounded:
            return True
        if chunk.size == 0:
            return False
        return not inside_stand_in(float(chunk.nan_low), float(chunk.nan_high))  # floats: float16's range is 65504

    def set_unbounded(self, tensor, chunk: ChunkRange) -> None:
        """Record an unbounded tensor's chunk: its range grows with the chunk's min and max (NaN ignored)."""
        self.histogram_dict.pop(tensor, None)
        low, high = chunk.nan_low, chunk.nan_high
        if tensor in self.unbounded:
            low, high = np.fmin(self.unbounded[tensor][0], low), np.fmax(self.unbounded[tensor][1], high)
        self.unbounded[tensor] = (low, high)

    def collect(self, name_to_arr):
        if self.method in {"distribution", "entropy"} or (self.method == "percentile" and not self.symmetric):
            return self._each(name_to_arr, "_value")
        if self.method == "percentile":
            return self._each(name_to_arr, "_absolute")
        raise ValueError("Only 'entropy', 'percentile' or 'distribution' methods are supported")

    # collect_value + merge_histogram of onnxruntime, np.histogram replaced by `histogram`; each split into a plan
    # (the bins, from the chunk's range alone) and the counts, so that a chunk too large to hold can be binned in
    # pieces with the same result (calibrun.quant.histogram_runs)
    def _value(self, tensor, data_arr):
        data_arr = _flat(data_arr)
        chunk = ChunkRange.of(data_arr, absolute=False)
        if self.is_unbounded(tensor, chunk):
            return chunk  # `_each` records it
        return self.plan(tensor, chunk).apply(data_arr)

    def _absolute(self, tensor, data_arr):
        if isinstance(data_arr, list):
            dtypes = {a.dtype for a in data_arr}
            assert len(dtypes) == 1, f"The calibration expects only one element type but got {dtypes} for {tensor!r}"
        data = _flat(data_arr)
        chunk = ChunkRange.of(data, absolute=False)
        if self.is_unbounded(tensor, chunk):
            return chunk
        if chunk.needs_abs_low(first=tensor not in self.histogram_dict):
            chunk.abs_low = _abs_min(data)
        return self.plan(tensor, chunk).apply(data)

    def plan(self, tensor, chunk: ChunkRange) -> BinPlan:
        """How the chunk whose values span `chunk` is binned into `tensor`'s histogram: onnxruntime's choice of
        bins (collect_value and merge_histogram, or collect_absolute_value), which depends on the chunk's range
        only."""
        if self.method in {"distribution", "entropy"} or (self.method == "percentile" and not self.symmetric):
            return self._value_plan(tensor, chunk)
        return self._absolute_plan(tensor, chunk)

    def _value_plan(self, tensor, chunk: ChunkRange) -> BinPlan:
        min_value, max_value, bounds = chunk.min_max()
        threshold = np.array(max(abs(min_value), abs(max_value)), dtype=chunk.dtype)
        old = self.histogram_dict.get(tensor)
        if old is None:
            return BinPlan(self.num_bins, (-threshold, threshold), bounds, False,
                           lambda hist, edges: (hist, edges, min_value, max_value, threshold))
        (old_hist, old_hist_edges, old_min, old_max, old_threshold) = old
        low, high = min(old_min, min_value), max(old_max, max_value)
        if threshold <= old_threshold:
            return BinPlan(len(old_hist), (-old_threshold, old_threshold), bounds, False,
                           lambda hist, edges: (hist + old_hist, old_hist_edges, low, high, old_threshold))
        if old_threshold == 0:
            def add(hist, edges):
                hist += old_hist
                return hist, edges, low, high, threshold
            return BinPlan(len(old_hist), (-threshold, threshold), bounds, False, add)
        old_num_bins = len(old_hist)
        old_stride = 2 * old_threshold / old_num_bins
        growth = (threshold - old_threshold) // old_stride + 1
        if 2 * float(growth) + old_num_bins > MAX_GROWN_BINS:
            def moved(hist, edges):
                hist += _moved(old_hist, old_hist_edges, edges)
                return hist, edges, low, high, threshold
            return BinPlan(old_num_bins, (-threshold, threshold), bounds, False, moved)
        half_increased_bins = int(growth)
        new_num_bins = old_num_bins + 2 * half_increased_bins
        new_threshold = half_increased_bins * old_stride + old_threshold

        def grown(hist, edges):
            hist[half_increased_bins: new_num_bins - half_increased_bins] += old_hist
            return hist, edges, low, high, new_threshold
        return BinPlan(new_num_bins, (-new_threshold, new_threshold), bounds, False, grown)

    def _absolute_plan(self, tensor, chunk: ChunkRange) -> BinPlan:
        min_value, max_value, bounds = chunk.min_max()
        dtype = chunk.dtype
        assert dtype != np.float64, "only float32 or float16 is supported"
        if bounds is not None and dtype == np.float32:
            # |data| is binned block by block; its max follows from the data's (no NaN), its min too unless the
            # data straddle zero: then 0 is a lower bound (enough to skip range checks), the exact min (the first
            # histogram's first edge) is the chunk's (ChunkRange.abs_low)
            lo, hi = bounds
            abs_max = max(np.absolute(lo), np.absolute(hi))
            if lo >= 0 or hi <= 0:
                abs_min = min(np.absolute(lo), np.absolute(hi))
            elif tensor in self.histogram_dict:
                abs_min = np.float32(0)
            else:
                abs_min = chunk.abs_low
            abs_bounds, temp_amax = (abs_min, abs_max), abs_max
        else:  # NaN, or float16: |data| as onnxruntime takes it
            abs_bounds = None
            temp_amax = chunk.abs_high() if chunk.size else None
        old = self.histogram_dict.get(tensor)
        if old is None:
            def first(hist, edges):
                return hist, edges.astype(dtype), min_value, max_value
            if abs_bounds is not None:
                return BinPlan(self.num_bins, abs_bounds, abs_bounds, True, first)
            return BinPlan(self.num_bins, chunk.abs_range(), None, True, first)
        old_hist, old_hist_edges, old_min, old_max = old
        low, high = min(old_min, min_value), max(old_max, max_value)
        if chunk.size == 0:  # onnxruntime fails here (nanmax of nothing); nothing to count
            return BinPlan(None, None, None, True, lambda hist, edges: (old_hist, old_hist_edges, low, high))
        if temp_amax > old_hist_edges[-1]:
            width = old_hist_edges[1] - old_hist_edges[0]
            if float((temp_amax - old_hist_edges[-1]) / width) + len(old_hist) > MAX_GROWN_BINS:
                def moved(hist, edges):
                    edges = edges.astype(dtype)
                    hist += _moved(old_hist, old_hist_edges, edges)
                    return hist, edges, low, high
                return BinPlan(len(old_hist), (old_hist_edges[0], temp_amax), abs_bounds, True, moved)
            new_bin_edges = np.arange(old_hist_edges[-1] + width, temp_amax + width, width)
            old_hist_edges = np.hstack((old_hist_edges, new_bin_edges))

        def add(hist, edges):
            hist[: len(old_hist)] += old_hist
            return hist, edges.astype(dtype), low, high
        return BinPlan(old_hist_edges, None, abs_bounds, True, add)

    # ------------------------------------------------------------------------------------------ thresholds

    def compute_collection_result(self):
        if not self.histogram_dict and not self.unbounded:
            raise ValueError("Histogram has not been collected. Please run collect() first.")
        if self.method not in ("entropy", "percentile", "distribution"):
            raise ValueError("Only 'entropy', 'percentile' or 'distribution' methods are supported")
        result = {}
        if self.histogram_dict:
            result = getattr(self, f"compute_{self.method}")()
        for tensor, (low, high) in self.unbounded.items():
            result[tensor] = TensorData(lowest=np.asarray(low, np.float32), highest=np.asarray(high, np.float32))
        return result

    def compute_entropy(self):
        """onnxruntime's compute_entropy: (lowest, highest, hist, edges) per tensor.

        Not on threads: the search is many short numpy calls, and two threads fighting for the GIL took longer
        than one (ocr_det, 649 tensors at 2048 bins: 3.2 s on one thread, 4.5-5.5 s wall and 5.7-6.9 s CPU on
        two). On Linux, with `threads` > 1, the tensors are searched in forked processes (`_forked_thresholds`):
        the histograms reach them through the fork, only the two thresholds come back; the same function, the
        same thresholds. Anywhere a process cannot be forked, one tensor after another here."""
        items = list(self.histogram_dict.items())
        found = None
        if self.worker is not None and len(items) > 1:  # the binning worker, already there: no pool to fork
            found = self.worker.thresholds(items, self.num_quantized_bins, self.progress)
        if found is None:
            found = _forked_thresholds(items, self.num_quantized_bins, self.threads, self.progress)
        if found is None:
            found = []
            for _tensor, histogram_ in items:
                found.append(entropy_threshold(histogram_, self.num_quantized_bins))
                if self.progress is not None:
                    self.progress(len(found))
        return {tensor: (lo, hi, *histogram_[:2]) for (tensor, histogram_), (lo, hi) in zip(items, found, strict=True)}

    def compute_percentile(self):
        with contextlib.redirect_stdout(io.StringIO()):  # onnxruntime prints its settings to stdout
            result = super().compute_percentile()
        if self.progress is not None:
            self.progress(len(result))
        return result

    def compute_distribution(self):
        with contextlib.redirect_stdout(io.StringIO()):
            result = super().compute_distribution()
        if self.progress is not None:
            self.progress(len(result))
        return result


_SEARCH: tuple | None = None  # (items, num_quantized_bins) for the forked searchers
_SEARCH_TASK = 8  # tensors a task: progress as they finish, and the processes balanced
_SEARCH_LEAST = 32  # fewer tensors are searched here: a fork and a pool cost ~0.05 s


def _search(indices: list[int]) -> list[tuple]:
    items, num_quantized_bins = _SEARCH
    return [entropy_threshold(items[i][1], num_quantized_bins) for i in indices]


def _searcher(parent: int) -> None:
    """A forked searcher leaves interrupts to its parent (which ends the pool), dies of SIGTERM, and dies with its
    parent: a job killed with SIGKILL mid-search leaves no searcher behind (without it each one died on its next
    result, printing a BrokenPipeError traceback to the job's terminal)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no prctl: the pool still ends with its parent's exit
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _forked_thresholds(items: list, num_quantized_bins: int, workers: int, progress) -> list[tuple] | None:
    """entropy_threshold of every (tensor, histogram) in `items`, in order, on `workers` forked processes; None
    where that cannot be done (not Linux, one worker, few tensors, a process not allowed children, a pool that
    fails): the caller then searches them itself."""
    global _SEARCH
    workers = min(workers, os.cpu_count() or 1)
    if sys.platform != "linux" or workers < 2 or len(items) < _SEARCH_LEAST:
        return None
    import multiprocessing

    tasks = [list(range(i, min(i + _SEARCH_TASK, len(items)))) for i in range(0, len(items), _SEARCH_TASK)]
    _SEARCH = (items, num_quantized_bins)
    found: list[tuple] = []
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns on fork beside other threads (onnxruntime's pool, tqdm's monitor): the searchers
            # run numpy on the histograms only, and take no lock those threads may hold
            warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
            pool = multiprocessing.get_context("fork").Pool(workers, initializer=_searcher, initargs=(os.getpid(),))
        with pool:
            for part in pool.imap(_search, tasks):
                for threshold in part:  # progress per tensor, as the search here reports it
                    found.append(threshold)
                    if progress is not None:
                        progress(len(found))
    except Exception as exc:  # noqa: BLE001 (a daemonic process, no fork: the search runs here instead)
        log.debug("entropy search: no forked searchers (%s); searching in this process", exc)
        return None
    finally:
        _SEARCH = None
    return found


def _moved(old_hist: np.ndarray, old_edges: np.ndarray, new_edges: np.ndarray) -> np.ndarray:
    """Counts of `old_hist` placed into the bins of `new_edges` by their old bin centres (see MAX_GROWN_BINS)."""
    centres = (old_edges[:-1].astype(np.float64) + old_edges[1:]) / 2
    centres = np.clip(centres, new_edges[0], new_edges[-1])
    return np.histogram(centres, bins=new_edges.astype(np.float64), weights=old_hist)[0].astype(np.int64)


# ---------------------------------------------------------------------------------------------- entropy


def entropy_threshold(histogram_, num_quantized_bins: int):
    """onnxruntime's `HistogramCollector.get_entropy_threshold(histogram_, num_quantized_bins)`, the same
    (lowest, highest), without its O(bins^2) Python loops.

    `histogram_` is (hist, hist_edges, min, max, ...) as collected. Every candidate threshold is screened at once
    (`_screen`); the candidates that could be the reference's minimum are then evaluated as the reference does.
    """
    hist, hist_edges = histogram_[0], histogram_[1]
    num_bins = hist.size
    zero_bin_index = num_bins // 2
    half = num_quantized_bins // 2
    if half > zero_bin_index or num_quantized_bins < 2:
        raise ValueError(f"num_quantized_bins={num_quantized_bins} does not fit a histogram of {num_bins} bins")
    candidates = np.arange(half, zero_bin_index + 1)
    pre = _prefixes(np.asarray(hist, dtype=np.int64))
    bounds = [_screen(pre, candidates[i:i + _SCREEN_CHUNK], num_quantized_bins)
              for i in range(0, candidates.size, _SCREEN_CHUNK)]
    lower = np.concatenate([b[0] for b in bounds])
    upper = np.concatenate([b[1] for b in bounds])
    best_upper = upper.min()
    if math.isinf(best_upper) and np.all(np.isinf(lower)):
        chosen = 0  # every candidate is infinite for the reference too: np.argmin picks the first
    else:
        shortlist = np.flatnonzero(lower <= best_upper)
        dtype = hist_edges.dtype
        values = [exact_kl(hist, int(candidates[j]), num_quantized_bins, dtype) for j in shortlist]
        chosen = int(shortlist[int(np.argmin(values))])  # first of equal values, as np.argmin does
    i = int(candidates[chosen])
    start = zero_bin_index - i
    end = min(zero_bin_index + i + 1, num_bins)
    optimal = (hist_edges[start], hist_edges[end])
    min_value, max_value = histogram_[2], histogram_[3]
    if optimal[0] < min_value:
        optimal = (min_value, optimal[1])
    if optimal[1] > max_value:
        optimal = (optimal[0], max_value)
    return optimal


def exact_kl(hist: np.ndarray, i: int, num_quantized_bins: int, dtype) -> float:
    """The reference's KL divergence for candidate `i` (as stored in its `kl_divergence` array): the same
    integer p and q as its loops build, smoothed and compared with the same float32 operations as onnxruntime's
    `smooth_distribution` and `entropy` (`_smoothed`, `_kl`), so the same bits."""
    num_bins = hist.size
    zero_bin_index = num_bins // 2
    start = zero_bin_index - i
    end = min(zero_bin_index + i + 1, num_bins)
    sliced = hist[start:end]
    p = sliced.copy()
    p[0] += hist[:start].sum()
    p[-1] += hist[end:].sum()
    q_bins = num_quantized_bins
    merged = sliced.size // q_bins
    body = q_bins * merged
    quantized = sliced[:body].reshape(q_bins, merged).sum(axis=1)
    quantized[-1] += sliced[body:].sum()
    norm = (p[:body] != 0).reshape(q_bins, merged).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = np.where(norm != 0, quantized / np.where(norm != 0, norm, 1), 0.0)
    q = np.zeros(p.size, dtype=np.int64)
    q[:body] = np.repeat(spread.astype(np.int64), merged)
    p_s, q_s = _smoothed(p), _smoothed(q)
    if p_s is None or q_s is None:
        return math.inf
    return float(np.array(_kl(p_s, q_s), dtype=dtype))


def _smoothed(p: np.ndarray) -> np.ndarray | None:
    """onnxruntime's `smooth_distribution(p)` (eps 1e-4): the same float32 values; None where it returns None or
    fails its assertions (the reference's calibration stops there: this candidate is unusable)."""
    zeros = p == 0
    n_zeros = np.count_nonzero(zeros)
    n_nonzeros = p.size - n_zeros
    if not n_nonzeros:
        return None
    eps1 = _EPS * float(n_zeros) / float(n_nonzeros)  # the reference's counts are float32 sums: exact below 2^24
    if not eps1 < 1.0:
        return None
    # hist += eps * is_zeros + (-eps1) * is_nonzeros adds float32(eps) to zeros and float32(-eps1) to the others
    hist = p.astype(np.float32)
    hist += np.where(zeros, np.float32(_EPS), np.float32(-eps1))
    if not hist.min() > 0:
        return None
    return hist


def _kl(pk: np.ndarray, qk: np.ndarray) -> np.float32:
    """onnxruntime's `entropy(pk, qk)` of two positive float32 arrays: the same operations (rel_entr's special
    cases, for zeros after the normalisation, are applied when there are any)."""
    pk = pk / np.sum(pk, axis=0, keepdims=True)  # the reference's 1.0 * pk: exact
    qk = qk / np.sum(qk, axis=0, keepdims=True)
    vec = pk * np.log(pk / qk)
    if not (pk.min() > 0 and qk.min() > 0):
        vec[(pk == 0) & (qk >= 0)] = 0
        vec[~((pk > 0) & (qk > 0))] = np.inf
    return np.sum(vec, axis=0)


def _screen(pre: dict, candidates: np.ndarray, q_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Bounds (lower, upper) on the reference's KL value of every candidate, all candidates at once.

    The exact KL (float64) of the reference's smoothed p and q is computed blockwise: q is constant on each of
    the `q_bins` merged blocks (and eps on the tail), so sum p log q needs only block sums of p; sum p log p of
    the smoothed p = h - eps1 is a Taylor series in eps1 over prefix sums of h log h, log h, 1/h, 1/h^2 (the two
    end bins, which carry the outliers, are computed directly). Terms of the series from the 4th on are bounded
    and added to the margin.

    The reference computes the same quantity in float32: per-element relative errors of a few eps32 in p, q
    (conversion, smoothing, normalisation, division, log), and pairwise sums with error <= (log2 L + 1) eps32 of
    the sum of |terms|. Since the negative terms p log(p/q) >= p - q add up to at least -1, sum |terms| <= KL + 2,
    and the reference's value lies within about 72 eps32 (KL + 4) of the exact one; `_REF_ERR` = 256 is used.
    Candidates that are infinite for the reference (p or q all zero) get (inf, inf); candidates this screen
    cannot bound (eps1 near a count) get (-inf, inf) and are always evaluated exactly.
    """
    hist, csum, cnz, total = pre["hist"], pre["csum"], pre["cnz"], pre["total"]
    n = hist.size
    zbi = n // 2
    i = candidates
    s = zbi - i
    e = np.minimum(zbi + i + 1, n)
    length = e - s
    merged = length // q_bins
    tail = length - q_bins * merged
    left = csum[s]
    right = csum[-1] - csum[e]
    h_first, h_last = hist[s], hist[e - 1]
    p_first, p_last = h_first + left, h_last + right
    nnz_p = (cnz[e] - cnz[s]) - (h_first != 0) - (h_last != 0) + (p_first != 0) + (p_last != 0)
    nz_p = length - nnz_p

    # blocks: [s + b*merged, s + (b+1)*merged), b < q_bins; the tail [s + q_bins*merged, e). `quantized` is the
    # reference's quantized_bins (h per block, the tail in the last block); p differs from h only in its first
    # element (left outliers) and last element (right outliers: in the tail, or without a tail in the last block).
    # (block sums in float64: counts are exact below 2^53)
    quantized = _block_sums(pre["csum_f"], s, merged, q_bins)
    pnz = _block_sums(pre["cnz_f"], s, merged, q_bins)  # nonzero p per block: the reference's `norm`
    last_bound = e - tail  # s + q_bins * merged
    h_tail = csum[e] - csum[last_bound]
    nz_tail = cnz[e] - cnz[last_bound]
    quantized[:, -1] += h_tail
    no_tail = tail == 0
    first_fix = (p_first != 0).astype(np.int64) - (h_first != 0)
    last_fix = (p_last != 0).astype(np.int64) - (h_last != 0)
    pnz[:, 0] += first_fix
    pnz[:, -1] += np.where(no_tail, last_fix, 0)
    p_tail = h_tail + np.where(no_tail, 0, right)
    pnz_tail = nz_tail + np.where(no_tail, 0, last_fix)
    fix_first = left  # p block 0 - quantized block 0
    fix_last = np.where(no_tail, right, 0) - h_tail  # p last block - quantized last block

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = np.zeros_like(quantized)
        np.divide(quantized, pnz, out=v, where=pnz > 0)
        np.floor(v, out=v)  # q per block: the reference's int64(quantized / norm)
        qpos = v > 0
        nnz_q = qpos.sum(axis=1) * merged
        nz_q = length - nnz_q
        q_sum = merged * v.sum(axis=1)
        ep = _EPS * nz_p / np.where(nnz_p > 0, nnz_p, 1)
        eq = _EPS * nz_q / np.where(nnz_q > 0, nnz_q, 1)
        log_eps = math.log(_EPS)

        # sum of p~ log q~ by block, p~ = p - ep on nonzero p and eps on zeros, q~ likewise:
        # sum_b (p_b + eps m - (ep + eps) nz_b) log q~_b, plus the tail (q~ = eps there)
        v -= eq[:, None]
        lq = np.log(np.where(qpos, v, _EPS))
        s_plogq = (np.einsum("ij,ij->i", quantized, lq) + fix_first * lq[:, 0] + fix_last * lq[:, -1]
                   + _EPS * merged * lq.sum(axis=1) - (ep + _EPS) * np.einsum("ij,ij->i", pnz, lq))
        s_plogq += (p_tail - ep * pnz_tail + _EPS * (tail - pnz_tail)) * log_eps

        # sum of p~ log p~: zeros, interior nonzero bins (series in ep), the two end bins directly
        lo_in, hi_in = s + 1, e - 1
        a_pref, b_pref, c_pref, d_pref, e_pref = pre["series"]
        a_in = a_pref[hi_in] - a_pref[lo_in]
        b_in = b_pref[hi_in] - b_pref[lo_in]
        c_in = c_pref[hi_in] - c_pref[lo_in]
        d_in = d_pref[hi_in] - d_pref[lo_in]
        e_in = e_pref[hi_in] - e_pref[lo_in]
        interior = a_in - ep * b_in + ep**2 / 2 * c_in + ep**3 / 6 * d_in
        remainder = ep**4 / 12 * e_in / np.maximum(1 - ep, 1e-300)

        def xlogx(x):
            x = x.astype(np.float64) - ep
            return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)

        ends = np.where(p_first != 0, xlogx(p_first), 0.0) + np.where(p_last != 0, xlogx(p_last), 0.0)
        s_plogp = nz_p * _EPS * log_eps + interior + ends
        kl = (s_plogp - s_plogq) / total + np.log(q_sum / total)
        margin = _REF_ERR * _F32 * (np.abs(kl) + 4) + remainder / total + 1e-12
        lower, upper = kl - margin, kl + margin
    infinite = (nnz_p == 0) | (nnz_q == 0) | (total == 0)
    unsure = ~infinite & ((ep >= 0.5) | (eq >= 0.5) | ~np.isfinite(kl) | ~np.isfinite(margin))
    lower = np.where(infinite, np.inf, np.where(unsure, -np.inf, lower))
    upper = np.where(infinite, np.inf, np.where(unsure, np.inf, upper))
    return lower, upper


def _block_sums(prefix: np.ndarray, starts: np.ndarray, merged: np.ndarray, q_bins: int) -> np.ndarray:
    """[candidates, q_bins]: prefix[s + (b+1) m] - prefix[s + b m] for each candidate's start s and block width m
    (`prefix` float64). Consecutive candidates start one bin lower each, so the candidates of one block width read
    `prefix` on a strided grid: a view per width, no index arrays."""
    out = np.empty((starts.size, q_bins))
    step = prefix.strides[0]
    cuts = [0, *(np.flatnonzero(np.diff(merged)) + 1).tolist(), starts.size]
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=False):
        low = int(starts[hi - 1])  # the lowest start of the run; its rows read prefix[low + r + b m]
        grid = np.lib.stride_tricks.as_strided(prefix[low:], shape=(hi - lo, q_bins + 1),
                                               strides=(step, int(merged[lo]) * step), writeable=False)[::-1]
        np.subtract(grid[:, 1:], grid[:, :-1], out=out[lo:hi])
    return out


def _prefixes(hist: np.ndarray) -> dict:
    """Prefix sums `_screen` needs, once per histogram."""
    nonzero = hist != 0
    hf = hist.astype(np.float64)
    safe = np.where(nonzero, hf, 1.0)
    logh = np.log(safe)

    def prefix(values):
        return np.concatenate(([0.0], np.cumsum(np.where(nonzero, values, 0.0))))

    csum = np.concatenate(([0], np.cumsum(hist)))
    cnz = np.concatenate(([0], np.cumsum(nonzero)))
    return {
        "hist": hist, "csum": csum, "cnz": cnz, "total": float(csum[-1]),
        "csum_f": csum.astype(np.float64), "cnz_f": cnz.astype(np.float64),  # for `_block_sums`
        "series": (prefix(hf * logh), prefix(logh + 1.0), prefix(1.0 / safe), prefix(1.0 / safe**2),
                   prefix(1.0 / safe**3)),
    }
