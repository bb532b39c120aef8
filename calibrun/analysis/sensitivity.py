"""Sensitivity of the chosen metric to each QDQ pair, and the automatic fp32 fallback that follows from it.

`rank`: for every quantised tensor (activations, and weights), the metric when only that tensor's pair is taken out
(the tensor stays fp32, every other pair keeps its calibrated scale: no re-calibration), against the metric with
every pair in. `gain` is the improvement (goal=min: baseline - metric; goal=max: metric - baseline).

With `groups=N` (switch strategy), a coarse pre-pass first: the pairs, in graph order, are cut into N contiguous
groups, each group is taken out at once (one trial per group), and only the pairs of the groups whose removal
improves the metric are then measured one by one; the others stay in the ranking unmeasured (`metric`, `gain`
None, their group's `group_gain` beside them). On NudeNet's YOLOv8n (420 pairs) 20 groups cut the trials from
420 to about 60 and found the same two tensors. It is a heuristic: a tensor whose gain is cancelled by a pair of
its group that hurts is missed; when no group improves the metric, every pair is measured alone after all;
groups=0 (the default) measures every pair.

The switch model computes the pairs as float arithmetic, so its metric with every pair in is close to the int8
model's, not equal: with `confirm=N` the N best of its ranking are measured again on the int8 model itself (that
pair removed, every other pair fused by onnxruntime as in the job's model), against the int8 model's own metric.

`fallback`: keep the nodes of the most sensitive tensors in fp32 one tensor at a time, re-quantising with
onnxruntime's quantize_static(nodes_to_exclude=...) from the same calibration ranges and re-measuring after each
step, until the metric reaches the target; then drop every node the target does not need (one at a time, re-measured).
The list is exactly what `quant.nodes_to_exclude=[...]` takes, and that run builds the same model.
"""

from __future__ import annotations

import itertools
import logging
import math
import shutil
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path

import onnx

from calibrun.analysis import qdq
from calibrun.analysis.evaluate import Evaluator, metric_of
from calibrun.analysis.trials import Trials, switched
from calibrun.core.errors import CalibrunError
from calibrun.core.files import atomic_path, finite, temp_dir
from calibrun.model.pairs import find_pairs
from calibrun.model.sessions import session
from calibrun.quant.calibrate import Calibration
from calibrun.quant.quantize import QuantOptions, quantize, reusing_copies

log = logging.getLogger("calibrun")

GOALS = ("min", "max")
STRATEGIES = ("switch", "edit")
KINDS = ("activation", "weight")


def gain(goal: str, baseline: float, value: float) -> float:
    """How much better `value` is than `baseline` (positive: better)."""
    return baseline - value if goal == "min" else value - baseline


def reached(goal: str, value: float, target: float) -> bool:
    return value <= target if goal == "min" else value >= target


def _finite(value: float) -> float | None:
    return finite(float(value))


def rank(fp32_path: Path, int8_path: Path, evaluator: Evaluator, metric: str, goal: str, strategy: str = "switch",
         kinds: Sequence[str] = KINDS, threads: int = 0, every: float = 5.0,
         only: Collection[str] | None = None, groups: int = 0, workers: int = 1,
         backend: str = "auto", confirm: int = 0, int8_metrics: dict | None = None) -> dict:
    """The ranking of every QDQ pair of `int8_path` (a QDQ model) by the gain in `metric` when it alone is removed
    (`only`: just the pairs on these tensors; `groups`: the coarse pre-pass of the module docstring; `workers`: the
    switch strategy's trials in that many processes, `Trials`, on `backend`; `confirm`: `_confirm`'s top N;
    `int8_metrics`: the int8 model's metrics when the caller measured them on the same evaluator already)."""
    if goal not in GOALS:
        raise CalibrunError(f"analysis.goal must be one of {list(GOALS)}, got {goal!r}")
    if strategy not in STRATEGIES:
        raise CalibrunError(f"analysis.strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    int8 = onnx.load(str(int8_path))
    fp32 = onnx.load(str(fp32_path))
    pairs = [p for p in find_pairs(int8, fp32) if p.kind in kinds and (only is None or p.tensor in only)]
    if only is not None:
        missing = sorted(set(only) - {p.tensor for p in pairs})
        if missing:
            raise CalibrunError(f"analysis.tensors: {missing[:5]} carry no quantised {'/'.join(kinds)} pair in "
                                f"{int8_path.name}")
    if not pairs:
        raise CalibrunError(f"{int8_path} has no QuantizeLinear/DequantizeLinear pair on {' or '.join(kinds)}: the "
                            "sensitivity analysis needs a QDQ model (format=qdq)")
    names = evaluator.output_names
    confirmed: dict[int, float] = {}  # pair index -> its metric on the int8 model (`_confirm`)
    confirm_seconds = 0.0
    start = time.perf_counter()
    with temp_dir("sens") as tmp:
        if strategy == "switch":
            path = Path(tmp) / "switch.onnx"
            onnx.save_model(qdq.switch_model(int8, fp32, pairs), str(path))
            del int8
            sess = session(path, threads)
            setup = time.perf_counter() - start

            def trial(on):
                return switched(sess, evaluator.batches, names, len(pairs), on)

            with Trials(path, threads, evaluator, names, len(pairs), workers, trial, backend) as trials:
                baseline_metrics = trial(None)
                baseline = metric_of(baseline_metrics, metric)
                chosen, group_of, group_gains, group_seconds = _prepass(
                    len(pairs), groups, lambda sets: [m for m, _ in trials.map(sets)], metric, goal, baseline)
                alone = sorted(chosen)
                *measured, (every_pair, _) = trials.map([*alone, set(range(len(pairs)))], every)
                ran_on = trials.ran_on()
            measured_alone = dict(zip(alone, measured, strict=True))
            values = [(metric_of(measured_alone[i][0], metric), measured_alone[i][1]) if i in measured_alone
                      else (math.nan, None) for i in range(len(pairs))]
            all_fp32 = metric_of(every_pair, metric)
            switch_baseline = metric_of(baseline_metrics, metric)
            if confirm:
                t0 = time.perf_counter()
                baseline_metrics = int8_metrics if int8_metrics is not None else evaluator.model(int8_path)
                confirmed = _confirm(values, confirm, goal, switch_baseline, pairs, onnx.load(str(int8_path)), fp32,
                                     evaluator, metric, Path(tmp))
                confirm_seconds = time.perf_counter() - t0
        else:
            if groups:
                raise CalibrunError("analysis.groups needs analysis.strategy=switch (one session for every trial)")
            setup = 0.0
            group_of, group_gains, group_seconds = {}, [], 0.0
            ran_on = {"workers": 1, "backend": None}
            baseline_metrics = int8_metrics if int8_metrics is not None else evaluator.model(int8_path)
            values = []
            last = time.perf_counter()
            for i, pair in enumerate(pairs):
                t0 = time.perf_counter()
                path = Path(tmp) / f"{i}.onnx"
                onnx.save_model(qdq.without_pair(int8, fp32, pair), str(path))
                values.append((metric_of(evaluator.model(path), metric), time.perf_counter() - t0))
                path.unlink()
                if time.perf_counter() - last > every:
                    last = time.perf_counter()
                    log.info("sensitivity: %d/%d tensors", i + 1, len(pairs))
            all_fp32 = switch_baseline = None
    seconds = time.perf_counter() - start
    baseline = metric_of(baseline_metrics, metric)
    ranking = []
    on_int8 = strategy == "edit" or bool(confirm)  # the baseline: the int8 model's own metric
    for i, (p, (v, s)) in enumerate(zip(pairs, values, strict=True)):
        real = strategy == "edit" or i in confirmed
        value = confirmed.get(i, v)
        entry = {"tensor": p.tensor, "kind": p.kind, "node": p.node, "nodes": p.nodes, "metric": _finite(value),
                 "gain": _finite(gain(goal, baseline if real or not on_int8 else switch_baseline, value)),
                 "measured_on": "int8" if real else "switch", "seconds": None if s is None else round(s, 4)}
        if i in confirmed:  # the switch trial that put it in the top
            entry["switch_metric"] = _finite(v)
            entry["switch_gain"] = _finite(gain(goal, switch_baseline, v))
        if group_of:
            entry["group"] = group_of[i]
            entry["group_gain"] = group_gains[group_of[i]]
        ranking.append(entry)
    # the confirmed first (the switch ranking's top, in the order the int8 model gives), then the rest by switch gain
    ranking.sort(key=lambda r: (r["measured_on"] == "int8", -math.inf if r["gain"] is None else r["gain"]),
                 reverse=True)
    trials = [s for _, s in values if s is not None]
    measured = len(trials) + len(group_gains)
    record = {
        "metric": metric, "goal": goal, "strategy": strategy, "tensors": len(pairs),
        "baseline": _finite(baseline), "baseline_on": "int8" if on_int8 else "switch",
        "switch_baseline": None if switch_baseline is None else _finite(switch_baseline),
        "confirmed": len(confirmed), "confirm_seconds": round(confirm_seconds, 3),
        "all_pairs_removed": None if all_fp32 is None else _finite(all_fp32),
        "seconds": round(seconds, 3), "setup_seconds": round(setup, 3),
        # the trials' time over the analysed tensors (with groups: the group trials too, over every tensor)
        "seconds_per_tensor": round((sum(trials) + group_seconds) / len(pairs), 4),
        "trials": measured, "measured_alone": len(trials), **ran_on,
        "ranking": ranking,
    }
    if group_gains:
        record["groups"] = [{"group": g, "gain": group_gains[g], "size": sum(1 for v in group_of.values() if v == g)}
                            for g in range(len(group_gains))]
    return record


def _confirm(values: list, top: int, goal: str, switch_baseline: float, pairs: list, int8, fp32, evaluator: Evaluator,
             metric: str, tmp: Path) -> dict[int, float]:
    """The `top` pairs of the switch ranking measured again on the int8 model itself: the int8 model with that pair
    removed (`qdq.without_pair`, the edit strategy's trial: onnxruntime fuses every other pair into its integer
    kernels as in the job's model), against the job's own int8 metric. Returns {pair index: its metric there}."""
    order = sorted((i for i, (v, _) in enumerate(values) if math.isfinite(v)),
                   key=lambda i: gain(goal, switch_baseline, values[i][0]), reverse=True)[:top]
    real = {}
    for i in order:
        path = tmp / f"confirm_{i}.onnx"
        onnx.save_model(qdq.without_pair(int8, fp32, pairs[i]), str(path))
        real[i] = metric_of(evaluator.model(path), metric)
        path.unlink()
    return real


def _prepass(count: int, groups: int, measure: Callable[[list[set[int]]], list[dict]], metric: str, goal: str,
             baseline: float) -> tuple[set[int], dict[int, int], list[float | None], float]:
    """The coarse pre-pass: (pair indices to measure alone, pair -> group, each group's gain, seconds spent).
    `measure(sets)`: the metrics with each set of pairs taken out. Without groups (or no fewer groups than pairs)
    every pair is measured alone."""
    if groups <= 1 or groups >= count:
        return set(range(count)), {}, [], 0.0
    bounds = [round(g * count / groups) for g in range(groups + 1)]
    group_of, gains, chosen = {}, [], set()
    start = time.perf_counter()
    sets = [set(range(bounds[g], bounds[g + 1])) for g in range(groups)]
    for g, (members, measured) in enumerate(zip(sets, measure(sets), strict=True)):
        value = gain(goal, baseline, metric_of(measured, metric))
        gains.append(_finite(value))
        group_of.update(dict.fromkeys(members, g))
        if value > 0:
            chosen |= members
    spent = time.perf_counter() - start
    helped = [g for g in range(groups) if (gains[g] or 0) > 0]
    if not helped:  # nothing to narrow down to: the pre-pass must not leave the fallback an unmeasured ranking
        log.warning("sensitivity pre-pass: no group of pairs improves %s when taken out (%d groups, %.1f s); "
                    "measuring every pair alone", metric, groups, spent)
        return set(range(count)), group_of, gains, spent
    log.info("sensitivity pre-pass: %d groups in %.1f s; %d improve %s (%s): %d of %d tensors to measure alone",
             groups, spent, len(helped), metric, ", ".join(f"group {g}: {gains[g]:+.4g}" for g in helped),
             len(chosen), count)
    return chosen, group_of, gains, spent


def fallback(fp32_path: Path, calibration: Calibration, options: QuantOptions, ranking: Sequence[dict],
             measure: Callable[[Path], dict], metric: str, goal: str, target: float, out_path: Path,
             max_steps: int = 20, best_possible: float | None = None, start: tuple[Path, dict] | None = None) -> dict:
    """Greedy fp32 fallback: exclude the nodes of the next most sensitive tensor (kept when the metric does not get
    worse, else undone) until `metric` reaches `target`, then prune what the target does not need. Writes the final
    int8 model to `out_path`; when the target is not reached, the list is the best one measured.

    `best_possible`: the metric with every analysed pair out (rank's `all_pairs_removed`); when even that misses
    the target, a warning says the target is probably out of reach (recorded as `out_of_reach`). Only probably: a
    task metric need not be monotone (YOLOX on 12 photos: all 10 top tensors in fp32 0.931, the first alone
    0.947), so the greedy steps still run.

    `start`: the int8 model quantised with `options` and what `measure` gave for it (the job's own), step 0 without
    quantising it again. Each model is quantised and measured once: the final one is the kept trial's file."""
    excluded = list(options.nodes_to_exclude)  # the user's own exclusions stay
    steps: list[dict] = []
    out_of_reach = best_possible is not None and not reached(goal, best_possible, target)
    if out_of_reach:
        log.warning("fallback: %s = %.6g with every analysed tensor in fp32, short of the target %s: the target "
                    "is probably out of reach of these tensors (other kinds, per-channel weights or another "
                    "calibration may reach it)", metric, best_possible, target)

    with temp_dir("fb") as tmp, reusing_copies():
        made = itertools.count()

        def trial(nodes: list[str]) -> tuple[float, Path, dict]:
            path = Path(tmp) / f"{next(made)}.onnx"
            quantize(fp32_path, path, calibration, replace(options, nodes_to_exclude=tuple(nodes)))
            measured = measure(path)
            return metric_of(measured, metric), path, measured

        def drop(path: Path) -> None:  # a trial's model no longer needed (never `start`'s): at most two are kept
            if path.parent == Path(tmp):
                path.unlink()

        value, model, measured = (metric_of(start[1], metric), *start) if start is not None else trial(excluded)
        neutral: list[str] = []  # nodes of steps kept without changing the metric
        steps.append({"step": 0, "added": [], "tensor": None, "metric": _finite(value), "kept": True})
        for entry in ranking:
            if reached(goal, value, target) or len(steps) > max_steps:
                break
            # tensors that do not help on their own are tried too, in ranking order: where several clip, only
            # keeping all of them in fp32 helps. A step that makes the metric worse is measured, recorded and undone
            # (single-tensor gains do not add up: on YOLOX the second-ranked tensor cost 0.02 after the first).
            new = [n for n in entry["nodes"] if n and n not in excluded]
            if not new:
                if not entry["nodes"] or "" in entry["nodes"]:
                    log.warning("fallback: tensor %r is quantised by an unnamed node; it cannot be excluded by name",
                                entry["tensor"])
                continue
            candidate_value, candidate, candidate_measured = trial(excluded + new)
            kept = gain(goal, value, candidate_value) >= 0
            steps.append({"step": len(steps), "added": new, "tensor": entry["tensor"],
                          "metric": _finite(candidate_value), "kept": kept})
            log.info("fallback step %d: + %s (tensor %s) -> %s = %.6g%s", len(steps) - 1, new, entry["tensor"],
                     metric, candidate_value, "" if kept else " (worse: undone)")
            if kept:
                if gain(goal, value, candidate_value) == 0:
                    neutral += new
                drop(model)
                excluded, value, model, measured = excluded + new, candidate_value, candidate, candidate_measured
            else:
                drop(candidate)
        ok = reached(goal, value, target)
        pruned: list[str] = []
        if ok:
            # Prune what the target does not need: first, in one trial, every node a step added without moving the
            # metric (the steps kept because they did no harm), then each remaining node on its own, last added
            # first. Either way every node left is one whose removal misses the target.
            user = set(options.nodes_to_exclude)

            def without(nodes: list[str], shown: str) -> None:
                nonlocal excluded, value, model, measured
                candidate_nodes = [n for n in excluded if n not in nodes]
                candidate_value, candidate, candidate_measured = trial(candidate_nodes)
                needed = not reached(goal, candidate_value, target)
                log.info("fallback prune %s -> %s = %.6g (%s)", shown, metric, candidate_value,
                         "needed" if needed else "not needed")
                if needed:
                    drop(candidate)
                    return
                drop(model)
                excluded, value, model, measured = candidate_nodes, candidate_value, candidate, candidate_measured
                pruned.extend(nodes)

            neutral = [n for n in neutral if n not in user]
            if len(neutral) > 1:
                without(neutral, f"(one trial): without the {len(neutral)} nodes of the steps that left the metric "
                                 "as it was")
            singles = [n for n in reversed(excluded) if n not in user]
            for number, node in enumerate(singles, 1):
                without([node], f"{number}/{len(singles)}: without {node}")
        with atomic_path(out_path, suffix=".onnx") as written:
            shutil.copyfile(model, written)
    return {"target": target, "reached": ok, "out_of_reach": out_of_reach, "best_possible": best_possible,
            "nodes_to_exclude": excluded, "metric": _finite(metric_of(measured, metric)), "steps": steps,
            "pruned": pruned, "metrics": {k: _finite(v) for k, v in measured.items()}}
