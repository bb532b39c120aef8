"""Sensitivity analysis and automatic fp32 fallback on a QDQ run (`analysis=sensitivity`), and the metric a
search returns to Hydra's Optuna sweeper (`analysis.objective=true`).

The runner calls three functions: `attach` after compute (adds the analysis to the result record and writes
`sensitivity.json`), `log` in its tracking part (MLflow table, plot, files), `objective` as main's return value.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from calibrun.core.errors import CalibrunError
from calibrun.core.errors import need as check
from calibrun.core.files import strict_json

log = logging.getLogger("calibrun")

SENSITIVITY_FILE = "sensitivity.json"
PLOT_FILE = "sensitivity.png"
FALLBACK_MODEL = "int8_fallback.onnx"
FRONT_PLOT = "repair_front.png"
LISTED = 10  # promoted tensors named in the repair's log line (all of them in repair.json)
NAMES = ("none", "sensitivity", "repair")


def validate(analysis, format_name: str) -> None:
    """Value checks of the `analysis` config node, naming the key (run before any work)."""
    from calibrun.analysis.sensitivity import GOALS, KINDS, STRATEGIES
    from calibrun.analysis.trials import BACKENDS

    def need(ok: bool, key: str, rule: str, value) -> None:
        check(ok, f"analysis.{key}", rule, value)

    need(analysis.name in NAMES, "name", f"must be one of {list(NAMES)}", analysis.name)
    need(analysis.goal in GOALS, "goal", f"must be one of {list(GOALS)}", analysis.goal)
    need(analysis.strategy in STRATEGIES, "strategy", f"must be one of {list(STRATEGIES)}", analysis.strategy)
    need(bool(analysis.kinds) and set(analysis.kinds) <= set(KINDS), "kinds", f"must be a non-empty subset of "
         f"{list(KINDS)}", list(analysis.kinds or []))
    need(analysis.max_steps >= 1, "max_steps", "must be >= 1", analysis.max_steps)
    need(analysis.batch_rows >= 1, "batch_rows", "must be >= 1", analysis.batch_rows)
    need(analysis.groups >= 0, "groups", "must be >= 0 (0: no pre-pass)", analysis.groups)
    need(analysis.groups == 0 or analysis.strategy == "switch", "groups", "needs analysis.strategy=switch",
         analysis.groups)
    need(analysis.workers >= 1, "workers", "must be >= 1", analysis.workers)
    need(analysis.workers == 1 or analysis.strategy == "switch", "workers", "needs analysis.strategy=switch (the "
         "workers share out the switch model's trials)", analysis.workers)
    need(analysis.confirm >= 0, "confirm", "must be >= 0 (0: the switch ranking as measured)", analysis.confirm)
    need(analysis.backend in BACKENDS, "backend", f"must be one of {list(BACKENDS)}", analysis.backend)
    if analysis.backend == "ray" and analysis.workers > 1:
        import importlib.util

        need(importlib.util.find_spec("ray") is not None, "backend", "needs Ray installed (pip install "
             "'calibrun[ray]')", analysis.backend)
    need(analysis.metric is None and analysis.name == "repair" or bool(str(analysis.metric).strip()), "metric",
         "must name a metric of the run (null only with analysis=repair: the verdict's)", analysis.metric)
    if analysis.target is not None:
        need(math.isfinite(analysis.target), "target", "must be a finite number", analysis.target)
        need(analysis.name in ("sensitivity", "repair"), "target", "needs analysis=sensitivity or analysis=repair "
             "(they follow the ranking)", analysis.target)
    if analysis.name in ("sensitivity", "repair"):
        need(format_name == "qdq", "name", f"{analysis.name} needs format=qdq (it edits QDQ pairs)", analysis.name)
    if analysis.name == "repair":
        from calibrun.analysis.repair import PRECISIONS

        need(bool(analysis.precisions) and set(analysis.precisions) <= set(PRECISIONS), "precisions",
             f"must be a non-empty subset of {list(PRECISIONS)}", list(analysis.precisions or []))
        need(analysis.ranking in ("noise", "sensitivity"), "ranking", "must be noise or sensitivity",
             analysis.ranking)
        need(analysis.metric is not None or analysis.target is None, "target", "needs analysis.metric (null: the "
             "verdict's metric and its ok threshold)", analysis.target)


def _finite_only(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(v)}


def attach(ctx, result):
    """Measure `analysis.metric` (and the per-output/task metrics) on the job's int8 model, and with
    analysis=sensitivity rank every QDQ pair and run the fallback; adds what it measured to `result` (a
    calibrun.result.JobResult) and returns it.
    `ctx`: the job's calibrun.job.JobContext (its model, evaluation rows and task, built once)."""
    cfg, job_dir, fp32 = ctx.cfg, ctx.job_dir, ctx.fp32
    a = cfg.analysis
    if a.name == "none" and (not a.objective or a.metric in result.metrics):
        return result
    from calibrun import config
    from calibrun.analysis.evaluate import Evaluator, metric_of
    from calibrun.analysis.repair import timed
    from calibrun.data.rows import pinned_rows

    int8_path = job_dir / result.files["int8"]
    rows = pinned_rows({i.name: i.shape for i in fp32.inputs}, ctx.evaluation.axes) or a.batch_rows
    goal = Goal.of(cfg, result)
    with Evaluator(fp32.path, ctx.evaluation, rows, cfg.ort.intra_op_threads, ctx.fresh_task(),
                   budget=config.memory_budget(cfg)) as evaluator:
        measured, seconds = timed(evaluator.model)(int8_path)
        metric_of(measured, goal.metric)  # a metric name that does not exist fails here, before the long pass
        result.metrics = {**_finite_only(measured), **result.metrics}
        if a.name in ("sensitivity", "repair"):
            _sensitivity(ctx, result, int8_path, evaluator, measured, goal, seconds)
    return result


@dataclass(frozen=True)
class Goal:
    """What the analysis optimises: analysis.metric/goal/target, or with analysis=repair and no metric, the
    verdict's metric, which way it is better and its ok threshold (calibrun.measure.verdict)."""

    metric: str
    goal: str
    target: float | None
    # with the verdict's own target: whether measured metrics are ok by the whole rule (its rows' share and a
    # vector's values too, not the pooled value alone: a repair "reached" 21.1 dB where 24% of the rows were under 20)
    holds: Callable[[Mapping], bool] | None = field(default=None, compare=False)

    @classmethod
    def of(cls, cfg, result) -> Goal:
        a = cfg.analysis
        if a.metric is not None:
            return cls(a.metric, a.goal, a.target)
        from calibrun.measure import verdict

        if not result.verdict:
            raise CalibrunError("analysis=repair: the run has no verdict to repair to (no output or task metric); "
                                "set analysis.metric and analysis.target")
        rule = verdict.rule_for(result.metrics, cfg.verdict)
        return cls(result.verdict["metric"], rule.goal, rule.ok,
                   holds=lambda metrics: rule.status(float(metrics[rule.metric]), metrics) == "ok")


def _sensitivity(ctx, result, int8_path: Path, evaluator, measured: dict, goal: Goal, seconds: float) -> None:
    """The ranking (sensitivity.json), then the fp32 fallback (analysis=sensitivity with a target) or the
    mixed-precision repair (analysis=repair)."""
    cfg, job_dir, fp32 = ctx.cfg, ctx.job_dir, ctx.fp32
    from calibrun.analysis.evaluate import metric_of
    from calibrun.analysis.sensitivity import rank
    from calibrun.core.files import write_json

    a = cfg.analysis
    if a.name == "repair" and a.ranking == "noise":
        from calibrun.analysis.repair import noise_ranking

        if "diagnostics" not in result.files:
            raise CalibrunError("analysis.ranking=noise ranks tensors by the diagnostics' measured noise: it needs "
                                "diagnostics=on, or analysis.ranking=sensitivity")
        import onnx

        ranking = noise_ranking(json.loads((job_dir / result.files["diagnostics"]).read_text()),
                                onnx.load(str(fp32.path), load_external_data=False))
        _repair(ctx, result, int8_path, evaluator, measured, goal, seconds, {"ranking": ranking, "by": "noise"})
        return
    # with a state fed back the tensors are ranked per call (each row fed the state fp32 carried: what one tensor
    # changes, which a diverged stream hides) and the fallback or repair is judged streamed, as the recommendations
    ranking_on = evaluator.per_call() if evaluator.state else evaluator
    ranked = rank(fp32.path, int8_path, ranking_on, goal.metric, goal.goal, a.strategy, tuple(a.kinds),
                  cfg.ort.intra_op_threads, only=set(a.tensors) if a.tensors else None, groups=a.groups,
                  workers=a.workers, backend=a.backend, confirm=a.confirm,
                  int8_metrics=measured if ranking_on is evaluator else None)
    if ranking_on is not evaluator:
        ranked["measured"] = "per call: each row fed the state fp32 carried (the fallback or repair: streamed)"
    ranked["int8_metric"] = metric_of(measured, goal.metric)
    log.info("sensitivity: %d tensors in %.1f s (%d trials, %.3f s per tensor, %s); most sensitive: %s",
             ranked["tensors"], ranked["seconds"], ranked["trials"], ranked["seconds_per_tensor"], a.strategy,
             ", ".join(f"{r['tensor']} ({r['gain']:.4g})" for r in ranked["ranking"][:3] if r["gain"] is not None))
    options = ctx.options  # the job's quantisation options, its exclusions resolved against the model
    record = {"metric": goal.metric, "goal": goal.goal,
              **{k: v for k, v in ranked.items() if k not in ("metric", "goal")}}
    if a.name == "repair":
        _repair(ctx, result, int8_path, evaluator, measured, goal, seconds, ranked)
        record["nodes_to_exclude"] = list(ctx.options.nodes_to_exclude)
    elif goal.target is not None:
        _fallback(ctx, result, int8_path, evaluator, measured, goal, ranked, record)
    else:  # no target: the suggestion is the nodes of the most sensitive tensor (when removing it helps)
        top = ranked["ranking"][0]
        record["nodes_to_exclude"] = list(options.nodes_to_exclude) + [
            n for n in top["nodes"] if n and n not in options.nodes_to_exclude] if (top["gain"] or 0) > 0 else []
    write_json(job_dir / SENSITIVITY_FILE, record)
    result.files["sensitivity"] = SENSITIVITY_FILE
    result.analysis = {**(result.analysis or {}), "metric": goal.metric, "goal": goal.goal,
                       "nodes_to_exclude": record["nodes_to_exclude"],
                       "most_sensitive": [r["tensor"] for r in ranked["ranking"][:5]]}
    result.metrics.update(_finite_only({
        "analysis.baseline": ranked["baseline"] if ranked["baseline"] is not None else math.nan,
        "analysis.tensors": ranked["tensors"], "analysis.seconds": ranked["seconds"],
        "analysis.seconds_per_tensor": ranked["seconds_per_tensor"], "analysis.trials": ranked["trials"]}))


def _fallback(ctx, result, int8_path: Path, evaluator, measured: dict, goal: Goal, ranked: dict,
              record: dict) -> None:
    """analysis=sensitivity with a target: nodes kept in fp32 in ranking order (calibrun.analysis.sensitivity)."""
    from calibrun.analysis.sensitivity import fallback

    cfg, job_dir = ctx.cfg, ctx.job_dir
    done = fallback(ctx.fp32.path, ctx.calibration_of(result), ctx.options, ranked["ranking"], evaluator.model,
                    goal.metric, goal.goal, float(goal.target), job_dir / FALLBACK_MODEL, cfg.analysis.max_steps,
                    ranked["all_pairs_removed"], start=(int8_path, measured))
    record["fallback"] = done
    record["nodes_to_exclude"] = done["nodes_to_exclude"]
    result.files["int8_fallback"] = FALLBACK_MODEL
    result.metrics["analysis.fallback_metric"] = done["metric"]
    result.metrics["analysis.target_reached"] = int(done["reached"])
    result.metrics["analysis.excluded_nodes"] = len(done["nodes_to_exclude"])
    if done["reached"]:
        log.info("fallback: %s = %.6g with quant.nodes_to_exclude=%s -> %s", goal.metric, done["metric"],
                 json.dumps(done["nodes_to_exclude"]), job_dir / FALLBACK_MODEL)
    else:
        log.warning("fallback: %s did not reach %s in %d steps (%.6g); best list: %s", goal.metric, goal.target,
                    cfg.analysis.max_steps, done["metric"], json.dumps(done["nodes_to_exclude"]))


def _repair(ctx, result, int8_path: Path, evaluator, measured: dict, goal: Goal, seconds: float,
            ranked: dict) -> None:
    """analysis=repair: mixed precision to the target (calibrun.analysis.repair); repair.json, the repaired model."""
    from calibrun.analysis.repair import REPAIR_FILE, REPAIRED_MODEL, biases, repair, timed
    from calibrun.analysis.sensitivity import reached
    from calibrun.core.files import write_json
    from calibrun.measure import verdict

    cfg, job_dir = ctx.cfg, ctx.job_dir
    if goal.target is None:
        raise CalibrunError("analysis=repair needs analysis.target (with analysis.metric set)")
    done = repair(ctx.fp32.path, ctx.calibration_of(result), ctx.options, ranked["ranking"], timed(evaluator.model),
                  goal.metric, goal.goal, float(goal.target), job_dir / REPAIRED_MODEL, tuple(cfg.analysis.precisions),
                  cfg.analysis.max_steps, start=(int8_path, measured, seconds), no_int16=biases(ctx.fp32.path),
                  holds=goal.holds)
    done["metrics"] = _finite_only(done["metrics"])
    done["ranking"] = ranked.get("by", "sensitivity")
    write_json(job_dir / REPAIR_FILE, strict_json(done))
    result.files["repair"] = REPAIR_FILE
    result.files["int8_repaired"] = REPAIRED_MODEL
    promoted = done["promoted"]
    result.analysis = {"repair": {"target": done["target"], "reached": done["reached"],
                                  "value": strict_json(done["value"]), "promoted": promoted,
                                  "overrides": done["overrides"]}}
    result.metrics.update(_finite_only({
        "analysis.repair_metric": done["value"], "analysis.target_reached": int(done["reached"]),
        "analysis.promoted_int16": sum(p == "int16" for p in promoted.values()),
        "analysis.promoted_fp32": sum(p == "fp32" for p in promoted.values())}))
    if done["reached"]:
        listed = ", ".join(f"{t}: {p}" for t, p in itertools.islice(promoted.items(), LISTED))
        if len(promoted) > LISTED:
            listed += f", ... {len(promoted) - LISTED} more"
        rebuild = " ".join(done["overrides"])
        if len(rebuild) > 500:
            rebuild = f"the overrides in {job_dir / REPAIR_FILE}"
        log.info("repair: %s = %.6g with %d tensors promoted (%s) -> %s; rebuild it with %s", goal.metric,
                 done["value"], len(promoted), listed, job_dir / REPAIRED_MODEL, rebuild)
    elif reached(goal.goal, done["value"], float(goal.target)):  # the value, but not the verdict's other conditions
        withheld = verdict.ok_withheld(done["metrics"]) or "its other conditions"
        log.warning("repair: %s = %.6g passes %s, but the verdict of the best model measured is not ok (%s) in %d "
                    "steps: %s", goal.metric, done["value"], goal.target, withheld, cfg.analysis.max_steps,
                    job_dir / REPAIRED_MODEL)
    else:
        log.warning("repair: %s did not reach %s in %d steps (%.6g); the best model measured is %s", goal.metric,
                    goal.target, cfg.analysis.max_steps, done["value"], job_dir / REPAIRED_MODEL)


def log_to(tracker, run_id: str, job_dir: Path, result) -> None:
    """The ranking as an MLflow table and a plot, sensitivity.json and the fallback model as artifacts."""
    files = result.files or {}
    if "sensitivity" not in files:
        return
    record = json.loads((job_dir / files["sensitivity"]).read_text())
    ranking = record["ranking"]
    columns = ("tensor", "kind", "node", "metric", "gain", "seconds")
    tracker.log_table(run_id, {c: [r[c] for r in ranking] for c in columns}, "sensitivity_ranking.json")
    tracker.log_artifact(run_id, job_dir / files["sensitivity"])
    plot = _plot(record, job_dir / PLOT_FILE)
    if plot is not None:
        tracker.log_artifact(run_id, plot)
    if "int8_fallback" in files:
        tracker.log_artifact(run_id, job_dir / files["int8_fallback"])
    if "repair" in files:
        _log_repair(tracker, run_id, job_dir, files)


def _log_repair(tracker, run_id: str, job_dir: Path, files: dict) -> None:
    """repair.json, its Pareto front as a table and a plot, and the repaired model as a LoggedModel."""
    record = json.loads((job_dir / files["repair"]).read_text())
    front = record["front"]
    columns = ("promoted", "int16", "fp32", "metric", "seconds", "pareto_promoted", "pareto_seconds")
    tracker.log_table(run_id, {c: [p[c] for p in front] for c in columns}, "repair_front.json")
    tracker.log_artifact(run_id, job_dir / files["repair"])
    plot = _front_plot(record, job_dir / FRONT_PLOT)
    if plot is not None:
        tracker.log_artifact(run_id, plot)
    tracker.log_model(run_id, job_dir / files["int8_repaired"], f"repaired {record['metric']}")


def _front_plot(record: dict, path: Path) -> Path | None:
    plt = _pyplot()
    front = [p for p in record["front"] if p["metric"] is not None]
    if not front:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, cost, label in ((axes[0], "promoted", "tensors promoted (int16 or fp32)"),
                            (axes[1], "seconds", "inference seconds on the evaluation rows")):
        on = [p for p in front if p[f"pareto_{cost}"]]
        ax.scatter([p[cost] for p in front], [p["metric"] for p in front], color="0.7", label="measured")
        ax.plot([p[cost] for p in sorted(on, key=lambda p: p[cost])],
                [p["metric"] for p in sorted(on, key=lambda p: p[cost])], "o-", label="Pareto front")
        ax.axhline(record["target"], linestyle="--", color="tab:red", label=f"target {record['target']:g}")
        ax.set_xlabel(label)
        ax.set_ylabel(record["metric"])
        ax.legend(fontsize=8)
    fig.suptitle(f"repair: {record['metric']} against what it costs (goal {record['goal']})")
    return _save(fig, path)


def _plot(record: dict, path: Path, top: int = 20) -> Path | None:
    plt = _pyplot()
    rows = [r for r in record["ranking"] if r["gain"] is not None][:top]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(rows) + 1.2))
    ax.barh([f"{r['tensor']} ({r['kind'][0]})"[:60] for r in rows][::-1], [r["gain"] for r in rows][::-1])
    ax.set_xlabel(f"gain in {record['metric']} when the tensor stays fp32 (goal: {record['goal']})")
    ax.set_title(f"sensitivity: top {len(rows)} of {record['tensors']} quantised tensors")
    return _save(fig, path)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """The figure as a PNG at `path`, written whole or not at all."""
    from calibrun.core.files import atomic_path

    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    _pyplot().close(fig)
    return path


def objective(cfg, result):
    """main's return value: the float `analysis.metric` for a search (analysis.objective=true), else the result's
    record (`result`: a calibrun.result.JobResult). A failed trial returns the worst value (inf for goal=min, -inf
    for goal=max), so the search goes on."""
    if not cfg.analysis.objective:
        return result.to_json()
    worst = math.inf if cfg.analysis.goal == "min" else -math.inf
    if not result.ok:
        return worst
    value = (result.metrics or {}).get(cfg.analysis.metric)
    return worst if value is None else float(value)

# --- config: this concept's options (the `analysis` node; calibrun.config assembles the schema) ---

@dataclass
class AnalysisConf:
    """Sensitivity analysis / fp32 fallback (calibrun.analysis) and the metric a search optimises."""

    name: str = "none"  # none | sensitivity | repair
    # any metric of the run: max_abs_error, out.<output>.sqnr_db, task.<name>; null (analysis=repair): the verdict's
    metric: str | None = "max_abs_error"
    goal: str = "min"  # min | max
    target: float | None = None  # with sensitivity: keep nodes in fp32 until the metric reaches this value
    strategy: str = "switch"  # switch (one session, a run-time switch per pair) | edit (one model per pair)
    kinds: list[str] = field(default_factory=lambda: ["activation", "weight"])
    tensors: list[str] | None = None  # analyse only the pairs on these tensors (None: every pair of `kinds`)
    groups: int = 0  # > 1: a coarse pre-pass over that many groups of pairs first (switch strategy), 0: none
    workers: int = 1  # > 1: the ranking's trials in that many processes (switch strategy)
    confirm: int = 5  # switch strategy: its top N measured again on the int8 model itself (the job's baseline)
    backend: str = "auto"  # the workers: processes (local) | ray (actors) | auto (ray inside Ray, else processes)
    max_steps: int = 20  # fallback / repair steps at most
    precisions: list[str] = field(default_factory=lambda: ["int16", "fp32"])  # repair: what a tensor may become
    ranking: str = "sensitivity"  # repair: sensitivity (a trial a tensor) | noise (the diagnostics' shares, no trial)
    batch_rows: int = 16  # evaluation rows per batch (a model that pins its first axis: that many)
    objective: bool = False  # the task returns analysis.metric (hydra/sweeper=optuna)
