"""The activation budget (`memory.budget`): how many bytes of activations may leave onnxruntime at a time.

A model with large activations (a 1024x1024 segmentation net, a detector at 1280) holds hundreds of MB per row
inside onnxruntime and, in an augmented session that returns every intermediate tensor, as much again per copy
outside it. calibrun bounds what it asks for per run (docs/memory.md):

- calibration (MinMax): a batch whose rows' live activations (`live_bytes`, counted twice for the kernels'
  workspace) exceed the budget is run in runs of `rows_for(budget, 2 * live_bytes)` rows (the minima and maxima
  merge exactly; onnxruntime's kernels may round a row differently in a smaller batch, so the ranges then match
  one run's within float32 rounding);
- evaluation: each evaluation batch is run in runs of as many rows;
- per-tensor diagnostics: the diagnosed tensors are split into groups whose outputs for one run stay under the
  budget, one pair of augmented sessions per group (calibrun.measure.tensor_stats).

The sizes come from ONNX shape inference with the real input shape of one row (`row_bytes`); a tensor whose shape
cannot be inferred counts as 0 (it is measured nowhere else), so the bound is as good as shape inference.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, shape_inference

from calibrun.core.errors import CalibrunError

log = logging.getLogger(__name__)

AUTO = "auto"
MiB = 2**20
# `auto`: 256 MiB (what the diagnostics returned per run before the budget existed, OUTPUT_BUDGET: ResNet-50 at
# 224 and ocr_det at 320 run as before), raised to 3x the largest single activation of one row so that the three
# copies the diagnostics need of one tensor (fp32, before and after its Q/DQ pair) always fit one group.
AUTO_FLOOR = 256 * MiB
AUTO_TENSORS = 3
_UNITS = {"": MiB, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": MiB, "mb": 10**6, "mib": MiB, "g": 2**30,
          "gb": 10**9, "gib": 2**30}


def parse_budget(value) -> int | None:
    """`memory.budget` as bytes; None for `auto`. A number is MiB; a string may carry a unit (512MB, 1GiB)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == AUTO):
        return None
    if isinstance(value, bool):
        raise CalibrunError(f"config memory.budget: must be `auto` or a size such as 512MB, got {value!r}")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
        if not match or match.group(2).lower() not in _UNITS:
            raise CalibrunError(f"config memory.budget: must be `auto` or a size such as 512MB, got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * _UNITS[unit])
    if size < MiB:
        raise CalibrunError(f"config memory.budget: must be at least 1 MiB, got {value!r}")
    return size


def resolve(setting: int | None, row_bytes: Mapping[str, int]) -> int:
    """The budget in bytes: `setting` (parse_budget's result) or, for auto, AUTO_FLOOR raised to AUTO_TENSORS x the
    largest activation of one row."""
    if setting is not None:
        return setting
    return max(AUTO_FLOOR, AUTO_TENSORS * max(row_bytes.values(), default=0))


def describe(setting: int | None, resolved: int | None) -> dict:
    """What result.json `used.memory` records: the setting and the bytes it came to (null before any run)."""
    return {"budget": AUTO if setting is None else setting, "budget_bytes": resolved}


def rows_for(budget: int, per_row: int, rows: int) -> int:
    """Rows per run so that `per_row` bytes per row stay under `budget` (at least 1, at most `rows`), the `rows` of a
    batch shared evenly among the fewest runs (16 rows at most 13 per run: 2 runs of 8, not 13 and 3)."""
    if per_row <= 0:
        return rows
    most = max(1, min(rows, budget // per_row))
    runs = -(-rows // most)
    return -(-rows // runs)


def live_bytes(model: str | Path | onnx.ModelProto, feeds: Mapping[str, np.ndarray], axes=None,
               sizes: Mapping[str, int] | None = None) -> int:
    """The most bytes of one row's activations alive at once when the nodes run in graph order, each tensor freed
    after its last consumer (what an inference session holds at its peak, roughly; 0 when sizes are unknown).
    `sizes`: row_bytes of the same model and feeds, where the caller has them (shape inference is not run twice)."""
    model = _structure(model)
    sizes = row_bytes(model, feeds, axes) if sizes is None else sizes
    if not sizes:
        return 0
    nodes = list(model.graph.node)
    last: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            last[name] = index
    keep = {o.name for o in model.graph.output}
    live = sum(sizes.get(i.name, 0) for i in model.graph.input)
    peak = live
    for index, node in enumerate(nodes):
        live += sum(sizes.get(out, 0) for out in node.output)
        peak = max(peak, live)
        for name in {*node.input, *node.output}:
            if name and name not in keep and last.get(name, index) <= index and name not in feeds:
                live -= sizes.get(name, 0)
    return peak


def row_bytes(model: str | Path | onnx.ModelProto, feeds: Mapping[str, np.ndarray], axes=None) -> dict[str, int]:
    """Bytes of one row of every float tensor a node of `model` produces (and of the graph inputs): ONNX shape
    inference with the inputs pinned to the shapes of `feeds` as they are, each size divided by the feed's rows
    (along the batch axes, `axes`, calibrun.data.rows). The feed's own shapes, not one row: a model whose rows are
    frames of a sequence (a convolution over them) can be invalid at one row, and onnx's shape inference then aborts
    the process (an assertion in its C++, madmom's onset CNN) where the shapes that are run are fine. Tensors whose
    shape or type stays unknown are left out. Never raises: a model shape inference cannot handle gives {}."""
    from calibrun.data.rows import count

    try:
        rows = max(1, count(feeds, axes))
        model = _structure(model)
        initializers = {t.name for t in model.graph.initializer}
        for info in model.graph.input:
            if info.name in initializers or info.name not in feeds:
                continue
            elem = info.type.tensor_type.elem_type or TensorProto.FLOAT
            info.CopyFrom(helper.make_tensor_value_info(info.name, elem, list(np.shape(feeds[info.name]))))
        del model.graph.value_info[:]
        inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 (shape inference fails in many ways; the budget then has no sizes)
        log.debug("memory: shape inference failed (%s); activation sizes unknown", exc)
        return {}
    sizes: dict[str, int] = {}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        tensor = info.type.tensor_type
        if not info.type.HasField("tensor_type") or not tensor.HasField("shape"):
            continue
        if tensor.elem_type not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tensor.shape.dim]
        if any(d <= 0 for d in dims):
            continue
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
        sizes[info.name] = -(-int(np.prod(dims, dtype=np.int64)) * itemsize // rows)
    return sizes


def _structure(model: str | Path | onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model's graph without its weights' values (calibrun.model.structure): shape inference reads
    their types and dims only, and a 100 MB model is not read, copied and serialised again at every call."""
    from calibrun.model.structure import hollow, structure

    if not isinstance(model, onnx.ModelProto):
        return structure(model)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return hollow(copy)


# --- config: this concept's options (the `memory` node; calibrun.config assembles the schema) ---

@dataclass
class MemoryConf:
    """How many bytes of activations may leave onnxruntime at a time (docs/memory.md)."""

    budget: str = AUTO  # auto, or a size: 512MB, 1GiB, or a number of MiB
