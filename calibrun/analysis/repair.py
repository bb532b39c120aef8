"""Repair to a target (`analysis=repair`): automatic mixed precision, int8 -> int16 -> fp32 per quantised tensor.

In sensitivity order (calibrun.analysis.sensitivity.rank), each tensor is promoted to the cheapest precision of
`analysis.precisions` that makes the metric better: int16 first (onnxruntime's TensorQuantOverrides `quant_type`,
`quant.tensor_types`: the model stays integer, onnxruntime converts the type at the region's edges), then fp32
(`quant.nodes_to_exclude` of the tensor's nodes). A promotion that does not help is measured, recorded and undone.
Once the target holds, every promotion it does not need is taken back, the last first: to int8, else from fp32 to
int16. Every model is quantised from the job's own ranges (no calibration) and measured on the evaluation rows.

What it leaves: the repaired model (`int8_repaired.onnx`) and `repair.json` with `target`, `reached`, `model`,
`steps`, `promoted` ({tensor: "int16" | "fp32"}), the `front` (the metric against the number of promoted tensors
and against the repaired model's measured inference seconds, each point marked when it is on the Pareto front)
and `overrides`: the command-line overrides that rebuild the same model byte for byte.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from calibrun.analysis.evaluate import metric_of
from calibrun.analysis.sensitivity import gain, reached
from calibrun.files import atomic_path, temp_dir
from calibrun.quantize import QuantOptions, quantize

log = logging.getLogger("calibrun")

PRECISIONS = ("int16", "fp32")
SIXTEEN = {"QInt8": "QInt16", "QUInt8": "QUInt16", "QInt16": "QInt16", "QUInt16": "QUInt16"}
REPAIRED_MODEL = "int8_repaired.onnx"
REPAIR_FILE = "repair.json"
_ESCAPED = set("\\()[]{}:=, \t'\"")


def escape(name: str) -> str:
    """A tensor or node name as Hydra's override grammar reads it back (its special characters escaped)."""
    return "".join(f"\\{c}" if c in _ESCAPED else c for c in name)


def options_for(base: QuantOptions, promoted: dict[str, str], entries: dict[str, dict]) -> QuantOptions:
    """`base` with `promoted` applied: int16 tensors in tensor_types (the 16-bit type of their kind), fp32 ones'
    nodes in nodes_to_exclude (after the user's own)."""
    types = dict(base.tensor_types)
    excluded = list(base.nodes_to_exclude)
    for tensor, precision in promoted.items():
        entry = entries[tensor]
        if precision == "int16":
            kind = base.weight_type if entry.get("kind") == "weight" else base.activation_type
            types[tensor] = SIXTEEN[kind]
        else:
            excluded += [n for n in entry["nodes"] if n and n not in excluded]
    return replace(base, tensor_types=types, nodes_to_exclude=tuple(excluded))


def overrides(options: QuantOptions) -> list[str]:
    """The overrides that give `options`' tensor types and exclusions, as typed on a command line."""
    out = []
    if options.tensor_types:
        pairs = ",".join(f"{escape(t)}:{k}" for t, k in sorted(options.tensor_types.items()))
        out.append(f"quant.tensor_types={{{pairs}}}")
    if options.nodes_to_exclude:
        out.append(f"quant.nodes_to_exclude=[{','.join(escape(n) for n in options.nodes_to_exclude)}]")
    return out


def pareto(points: Sequence[dict], cost: str, goal: str) -> list[bool]:
    """Whether each point is on the Pareto front of (`cost` lower, metric better)."""
    sign = 1.0 if goal == "max" else -1.0
    marks = []
    for p in points:
        dominated = any(q is not p and q[cost] <= p[cost] and sign * q["metric"] >= sign * p["metric"]
                        and (q[cost] < p[cost] or sign * q["metric"] > sign * p["metric"]) for q in points)
        marks.append(not dominated)
    return marks


def repair(fp32_path: Path, calibration, options: QuantOptions, ranking: Sequence[dict],
           measure: Callable[[Path], tuple[dict, float]], metric: str, goal: str, target: float, out_path: Path,
           precisions: Sequence[str] = PRECISIONS, max_steps: int = 20,
           start: tuple[Path, dict, float] | None = None) -> dict:
    """Promote tensors in `ranking` order until `metric` reaches `target`, then take back what it does not need
    (module docstring). `measure(path) -> (metrics, seconds)`; `start`: the job's own int8 model, its metrics and
    seconds (step 0, not quantised again). Writes the repaired model to `out_path` (the best one measured when
    the target is not reached) and returns repair.json's record."""
    entries = {e["tensor"]: e for e in ranking}
    promoted: dict[str, str] = {}
    steps: list[dict] = []
    front: list[dict] = []
    with temp_dir("rep") as tmp:
        made = itertools.count()

        def trial(state: dict[str, str]) -> tuple[float, Path, dict, float]:
            path = Path(tmp) / f"{next(made)}.onnx"
            quantize(fp32_path, path, calibration, options_for(options, state, entries))
            measured, seconds = measure(path)
            return metric_of(measured, metric), path, measured, seconds

        def point(state: dict[str, str], value: float, seconds: float) -> None:
            front.append({"promoted": len(state), "int16": sum(p == "int16" for p in state.values()),
                          "fp32": sum(p == "fp32" for p in state.values()), "metric": value,
                          "seconds": round(seconds, 4), "tensors": dict(state)})

        if start is not None:
            model, measured, seconds = start
            value = metric_of(measured, metric)
        else:
            value, model, measured, seconds = trial({})
        steps.append({"step": 0, "tensor": None, "precision": "int8", "metric": value, "kept": True})
        point({}, value, seconds)
        for entry in ranking:
            if reached(goal, value, target) or len(steps) > max_steps:
                break
            tensor = entry["tensor"]
            for precision in precisions:
                if precision == "fp32" and not [n for n in entry["nodes"] if n]:
                    continue  # an unnamed node cannot be excluded by name
                state = {**promoted, tensor: precision}
                new, path, new_measured, new_seconds = trial(state)
                kept = gain(goal, value, new) > 0
                steps.append({"step": len(steps), "tensor": tensor, "precision": precision, "metric": new,
                              "kept": kept})
                log.info("repair step %d: %s -> %s: %s = %.6g%s", len(steps) - 1, tensor, precision, metric, new,
                         "" if kept else " (no better: undone)")
                if kept:
                    _drop(model, tmp)
                    promoted, value, model, measured, seconds = state, new, path, new_measured, new_seconds
                    point(promoted, value, seconds)
                    break
                _drop(path, tmp)
        ok = reached(goal, value, target)
        taken_back = []
        if ok:
            for tensor in reversed(list(promoted)):
                cheaper = [None] + (["int16"] if promoted[tensor] == "fp32" and "int16" in precisions else [])
                for lower in cheaper:
                    state = {t: p for t, p in promoted.items() if t != tensor}
                    if lower is not None:
                        state[tensor] = lower
                    new, path, new_measured, new_seconds = trial(state)
                    if reached(goal, new, target):
                        _drop(model, tmp)
                        taken_back.append({"tensor": tensor, "from": promoted[tensor], "to": lower or "int8",
                                           "metric": new})
                        log.info("repair: %s back to %s: %s = %.6g, the target still holds", tensor,
                                 lower or "int8", metric, new)
                        promoted, value, model, measured, seconds = state, new, path, new_measured, new_seconds
                        point(promoted, value, seconds)
                        break
                    _drop(path, tmp)
        with atomic_path(out_path, suffix=".onnx") as written:
            shutil.copyfile(model, written)
    final = options_for(options, promoted, entries)
    for cost in ("promoted", "seconds"):
        for p, on in zip(front, pareto(front, cost, goal), strict=True):
            p[f"pareto_{cost}"] = on
    return {"metric": metric, "goal": goal, "target": target, "reached": ok, "model": out_path.name,
            "value": value, "steps": steps, "taken_back": taken_back, "promoted": promoted,
            "precisions": list(precisions), "front": front, "overrides": overrides(final),
            "seconds": seconds, "metrics": measured}


def _drop(path: Path, tmp) -> None:
    """A trial's model no longer needed (never the job's own)."""
    if Path(path).parent == Path(tmp):
        Path(path).unlink(missing_ok=True)


def timed(measure: Callable[[Path], dict]) -> Callable[[Path], tuple[dict, float]]:
    """`measure` returning its wall seconds too (the model's inference over the evaluation rows, with the metrics)."""
    def run(path: Path) -> tuple[dict, float]:
        began = time.perf_counter()
        out = measure(path)
        return out, time.perf_counter() - began

    return run
