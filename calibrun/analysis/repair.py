"""Repair to a target (`analysis=repair`): automatic mixed precision, int8 -> int16 -> fp32 per quantised tensor.

In ranking order (`analysis.ranking`: `sensitivity`, the default, calibrun.analysis.sensitivity.rank, one trial a
tensor; or `noise`, the job's diagnostics' measured share of the added noise per tensor, no trial, first-order only),
the most sensitive tensors are promoted to the cheapest
precision of `analysis.precisions` first: int16 (onnxruntime's TensorQuantOverrides `quant_type`,
`quant.tensor_types`: the model stays integer, onnxruntime converts the type at the region's edges), then fp32
(`quant.nodes_to_exclude` of the tensor's nodes) when every tensor in int16 falls short. The top 1, 2, 4, ...
tensors are promoted together until the target holds, then the fewest top tensors that hold it are found by
bisection: a model's error is often spread over many tensors, which one tensor a step would take as many steps to
reach. Then every promotion the target does not need is taken back, in groups halved where the target stops
holding: to int8, then fp32 ones to int16. Every model is quantised from the job's own ranges (no calibration),
measured on the evaluation rows and recorded, kept or not.

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
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path

from calibrun.analysis.evaluate import metric_of
from calibrun.analysis.sensitivity import gain, reached
from calibrun.core.files import atomic_path, temp_dir
from calibrun.core.overrides import dict_key, list_item
from calibrun.measure.sweep_diagnosis import rows_of_table
from calibrun.quant.quantize import SIXTEEN_BIT, QuantOptions, bias_nodes, quantize, reusing_copies

log = logging.getLogger("calibrun")

PRECISIONS = ("int16", "fp32")
REPAIRED_MODEL = "int8_repaired.onnx"
REPAIR_FILE = "repair.json"
WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")  # ops whose input 1, a constant, is a quantised weight


def biases(fp32_path: Path) -> set[str]:
    """The tensors onnxruntime quantises as biases: int32 with the scale input_scale x weight_scale, already finer
    than 16 bits. A 16-bit override of one is a demotion (onnxruntime then quantises it "as a weight", on a 16-bit
    grid of its own range, and logs so), so the repair never promotes one to int16 (fp32 stays possible)."""
    import onnx

    return set(bias_nodes(onnx.load(str(fp32_path), load_external_data=False).graph.node))


def noise_ranking(table: dict, model=None) -> list[dict]:
    """A first-order ranking from the job's diagnostics (diagnostics.json, column-oriented): the quantised
    activations by their measured share of the added noise, largest first, each with the nodes that keep it in
    float (its producer and the path to the next computation) and, with the fp32 `model`, its producer's weight:
    the noise a tensor adds is its producer's rounding, of the weights as of the output, so promoting the tensor
    promotes that weight with it. No trial: the repair's trials confirm it."""
    weights = {}
    if model is not None:
        constants = {i.name for i in model.graph.initializer}
        weights = {n.name: n.input[1] for n in model.graph.node
                   if n.op_type in WEIGHTED and len(n.input) > 1 and n.input[1] in constants}
    rows = sorted((r for r in rows_of_table(table) if r.get("noise_share") is not None),
                  key=lambda r: -r["noise_share"])
    ranking = []
    for row in rows:
        path = [n for n in (row.get("float_nodes") or row.get("consumers") or "").split(",") if n]
        ranking.append({"tensor": row["tensor"], "kind": "activation", "node": row.get("node"),
                        "nodes": list(dict.fromkeys(n for n in (row.get("node"), *path) if n)),
                        "weights": [weights[row["node"]]] if row.get("node") in weights else [],
                        "noise_share": row["noise_share"]})
    return ranking


def options_for(base: QuantOptions, promoted: dict[str, str], entries: dict[str, dict]) -> QuantOptions:
    """`base` with `promoted` applied: int16 tensors in tensor_types (the 16-bit type of their kind), fp32 ones'
    nodes in nodes_to_exclude (after the user's own)."""
    types = dict(base.tensor_types)
    excluded = list(base.nodes_to_exclude)
    for tensor, precision in promoted.items():
        entry = entries[tensor]
        if precision == "int16":
            kind = base.weight_type if entry.get("kind") == "weight" else base.activation_type
            types[tensor] = SIXTEEN_BIT.get(kind, kind)
            types.update({w: SIXTEEN_BIT.get(base.weight_type, base.weight_type) for w in entry.get("weights", ())})
        else:
            excluded += [n for n in entry["nodes"] if n and n not in excluded]
    return replace(base, tensor_types=types, nodes_to_exclude=tuple(excluded))


def overrides(options: QuantOptions) -> list[str]:
    """The overrides that give `options`' tensor types and exclusions, as typed on a command line."""
    out = []
    if options.tensor_types:
        pairs = ",".join(f"{dict_key(t)}:{k}" for t, k in sorted(options.tensor_types.items()))
        out.append(f"quant.tensor_types={{{pairs}}}")
    if options.nodes_to_exclude:
        out.append(f"quant.nodes_to_exclude=[{','.join(list_item(n) for n in options.nodes_to_exclude)}]")
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
           start: tuple[Path, dict, float] | None = None, no_int16: Collection[str] = (),
           holds: Callable[[dict], bool] | None = None) -> dict:
    """Promote the most sensitive tensors until `metric` reaches `target`, then take back what it does not need
    (module docstring). `measure(path) -> (metrics, seconds)`; `start`: the job's own int8 model, its metrics and
    seconds (step 0, not quantised again); `no_int16`: tensors never promoted to int16 (`biases`); `holds`: what else
    a model's metrics must pass to reach the target (the verdict's rows' share and values, where the target is the
    verdict's ok: calibrun.analysis.Goal). Writes the
    repaired model to `out_path` (the best one measured when the target is not reached) and returns repair.json's
    record.

    The search, in the cheapest precision first: the top 1, 2, 4, ... tensors of the ranking promoted together
    until the target holds (the error of a model is often spread over many tensors: one at a time would take as
    many steps), then the fewest top tensors that hold it, by bisection; with fp32 allowed and every tensor in int16
    short of the target, the same over fp32 with the rest in int16. Then the promotions are taken back while the
    target holds, the least sensitive first, in groups halved where the target no longer holds (a few tensors that
    matter among many that do not are found in a few trials each: single-tensor gains do not add up, and the last
    tensor a model needs can rank near the bottom), to int8, then fp32 ones to int16; at most `max_steps` trials."""
    entries = {e["tensor"]: e for e in ranking}
    order = [e["tensor"] for e in ranking]
    steps: list[dict] = []
    front: list[dict] = []
    with temp_dir("rep") as tmp, reusing_copies():
        made = itertools.count()
        best: dict = {}

        seen: dict[frozenset, bool] = {}  # every state measured: whether it reached the target

        def trial(state: dict[str, str], what: str) -> bool:
            """Quantise and measure `state`; keep it as the best when better; whether it reaches the target. A
            state measured before is not measured again (taking every promotion back gives the int8 model)."""
            key = frozenset(state.items())
            if key in seen:
                return seen[key]
            path = Path(tmp) / f"{next(made)}.onnx"
            quantize(fp32_path, path, calibration, options_for(options, state, entries))
            measured, seconds = measure(path)
            value = metric_of(measured, metric)
            ok = seen[key] = reached(goal, value, target) and (holds is None or holds(measured))
            steps.append({"step": len(steps), "what": what, "promoted": len(state), "metric": value, "reached": ok})
            log.info("repair step %d: %s: %s = %.6g%s", len(steps) - 1, what, metric, value,
                     " (target reached)" if ok else "")
            point(state, value, seconds)
            if _better(goal, best, value, ok, state):
                _drop(best.get("model"), tmp)
                best.update(state=dict(state), value=value, model=path, measured=measured, seconds=seconds, ok=ok)
            else:
                _drop(path, tmp)
            return ok

        def point(state: dict[str, str], value: float, seconds: float) -> None:
            front.append({"promoted": len(state), "int16": sum(p == "int16" for p in state.values()),
                          "fp32": sum(p == "fp32" for p in state.values()), "metric": value,
                          "seconds": round(seconds, 4), "tensors": dict(state)})

        if start is not None:
            model, measured, seconds = start
            value = metric_of(measured, metric)
            ok = reached(goal, value, target) and (holds is None or holds(measured))
            best.update(state={}, value=value, model=model, measured=measured, seconds=seconds, ok=ok)
            seen[frozenset()] = ok
            steps.append({"step": 0, "what": "int8 (the job's model)", "promoted": 0, "metric": value, "reached": ok})
            point({}, value, seconds)
        else:
            trial({}, "int8")
        fp32_able = [t for t in order if [n for n in entries[t]["nodes"] if n]]
        int32 = set(no_int16)
        base: dict[str, str] = {}
        for precision in precisions:
            if best["ok"]:
                break
            names = [t for t in order if t not in int32] if precision == "int16" else fp32_able

            def state(k: int, names=names, precision=precision, base=base) -> dict[str, str]:
                return {**base, **{t: precision for t in names[:k]}}

            if not names:
                continue
            k, low, found = 1, 0, None
            while found is None:
                if trial(state(k), f"top {k} in {precision}"):
                    found = k
                elif k >= len(names):
                    break
                else:
                    low, k = k, min(2 * k, len(names))
            if found is None:  # every tensor in this precision is short of the target: the next builds on it
                base = state(len(names))
                continue
            while found - low > 1:  # the fewest top tensors that reach the target
                mid = (low + found) // 2
                if trial(state(mid), f"top {mid} in {precision}"):
                    found = mid
                else:
                    low = mid
            break
        taken_back: list[dict] = []
        if best["ok"]:
            budget = [max_steps]

            def back(group: list[str], to: str | None) -> None:
                """Take `group` back together (to int8, or `to`); when the target no longer holds, each half."""
                if not group or budget[0] <= 0:
                    return
                had = {t: best["state"][t] for t in group}
                fewer = {t: p for t, p in best["state"].items() if t not in had}
                if to is not None:
                    fewer.update({t: to for t in group})
                if frozenset(fewer.items()) not in seen:  # the budget counts the trials measured
                    budget[0] -= 1
                what = f"{group[0]} back to {to or 'int8'}" if len(group) == 1 else \
                    f"{len(group)} tensors back to {to or 'int8'}"
                if trial(fewer, what) and best["state"] == fewer:
                    taken_back.extend({"tensor": t, "from": had[t], "to": to or "int8"} for t in group)
                    return
                if len(group) > 1:
                    back(group[: len(group) // 2], to)
                    back(group[len(group) // 2 :], to)

            back([t for t in reversed(order) if t in best["state"]], None)  # the least sensitive first
            if "int16" in precisions:
                back([t for t in reversed(order) if best["state"].get(t) == "fp32" and t not in int32], "int16")
        with atomic_path(out_path, suffix=".onnx") as written:
            shutil.copyfile(best["model"], written)
    promoted = best["state"]
    final = options_for(options, promoted, entries)
    for cost in ("promoted", "seconds"):
        for p, on in zip(front, pareto(front, cost, goal), strict=True):
            p[f"pareto_{cost}"] = on
    return {"metric": metric, "goal": goal, "target": target, "reached": best["ok"], "model": out_path.name,
            "value": best["value"], "steps": steps, "taken_back": taken_back, "promoted": promoted,
            "precisions": list(precisions), "front": front, "overrides": overrides(final),
            "seconds": best["seconds"], "metrics": best["measured"]}


def _cost(state: dict[str, str]) -> tuple[int, int]:
    """What a repair costs: the tensors promoted, then those of them in fp32."""
    return len(state), sum(p == "fp32" for p in state.values())


def _better(goal: str, best: dict, value: float, ok: bool, state: dict[str, str]) -> bool:
    """Whether a trial beats the best so far: reaching the target first; both reaching it, the lower cost (fewer
    tensors promoted, then fewer in fp32), then the better metric; neither, the better metric."""
    if not best:
        return True
    if ok != best["ok"]:
        return ok
    if ok and _cost(state) != _cost(best["state"]):
        return _cost(state) < _cost(best["state"])
    return gain(goal, best["value"], value) > 0


def _drop(path: Path | None, tmp) -> None:
    """A trial's model no longer needed (never the job's own)."""
    if path is not None and Path(path).parent == Path(tmp):
        Path(path).unlink(missing_ok=True)


def timed(measure: Callable[[Path], dict]) -> Callable[[Path], tuple[dict, float]]:
    """`measure` returning its wall seconds too (the model's inference over the evaluation rows, with the metrics)."""
    def run(path: Path) -> tuple[dict, float]:
        began = time.perf_counter()
        out = measure(path)
        return out, time.perf_counter() - began

    return run
