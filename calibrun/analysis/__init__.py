"""Sensitivity analysis and automatic fp32 fallback on a QDQ run (`analysis=sensitivity`), and the metric a
search returns to Hydra's Optuna sweeper (`analysis.objective=true`).

The runner calls three functions: `attach` after compute (adds the analysis to the result record and writes
`sensitivity.json`), `log` in its tracking part (MLflow table, plot, files), `objective` as main's return value.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from calibrun.errors import need as check

log = logging.getLogger("calibrun")

SENSITIVITY_FILE = "sensitivity.json"
PLOT_FILE = "sensitivity.png"
FALLBACK_MODEL = "int8_fallback.onnx"
NAMES = ("none", "sensitivity")


def validate(analysis, format_name: str) -> None:
    """Value checks of the `analysis` config node, naming the key (run before any work)."""
    from calibrun.analysis.sensitivity import GOALS, KINDS, STRATEGIES

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
    need(bool(str(analysis.metric).strip()), "metric", "must name a metric of the run", analysis.metric)
    if analysis.target is not None:
        need(math.isfinite(analysis.target), "target", "must be a finite number", analysis.target)
        need(analysis.name == "sensitivity", "target", "needs analysis=sensitivity (the fallback follows the "
             "ranking)", analysis.target)
    if analysis.name == "sensitivity":
        need(format_name == "qdq", "name", "sensitivity needs format=qdq (it edits QDQ pairs)", analysis.name)


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
    from calibrun.analysis.evaluate import Evaluator, metric_of
    from calibrun.data.rows import pinned_rows

    int8_path = job_dir / result.files["int8"]
    rows = pinned_rows({i.name: i.shape for i in fp32.inputs}, ctx.evaluation.axes) or a.batch_rows
    with Evaluator(fp32.path, ctx.evaluation, rows, cfg.ort.intra_op_threads, ctx.fresh_task()) as evaluator:
        measured = evaluator.model(int8_path)
        metric_of(measured, a.metric)  # a metric name that does not exist fails here, before the long pass
        result.metrics = {**_finite_only(measured), **result.metrics}
        if a.name == "sensitivity":
            _sensitivity(ctx, result, int8_path, evaluator, measured)
    return result


def _sensitivity(ctx, result, int8_path: Path, evaluator, measured: dict) -> None:
    cfg, job_dir, fp32 = ctx.cfg, ctx.job_dir, ctx.fp32
    from calibrun.analysis.evaluate import metric_of
    from calibrun.analysis.sensitivity import fallback, rank
    from calibrun.calibrate import Calibration
    from calibrun.files import write_json

    a = cfg.analysis
    ranked = rank(fp32.path, int8_path, evaluator, a.metric, a.goal, a.strategy, tuple(a.kinds),
                  cfg.ort.intra_op_threads, only=set(a.tensors) if a.tensors else None, groups=a.groups)
    ranked["int8_metric"] = metric_of(measured, a.metric)
    log.info("sensitivity: %d tensors in %.1f s (%d trials, %.3f s per tensor, %s); most sensitive: %s",
             ranked["tensors"], ranked["seconds"], ranked["trials"], ranked["seconds_per_tensor"], a.strategy,
             ", ".join(f"{r['tensor']} ({r['gain']:.4g})" for r in ranked["ranking"][:3] if r["gain"] is not None))
    options = ctx.options  # the job's quantisation options, its exclusions resolved against the model
    record = {"metric": a.metric, "goal": a.goal, **{k: v for k, v in ranked.items() if k not in ("metric", "goal")}}
    if a.target is not None:
        calibration = Calibration(job_dir / result.files["ranges"], cfg.method.name, result.cache_key, True,
                                  0.0, result.metrics.get("span", 0.0), int(result.params.get("batches", 0)))
        done = fallback(fp32.path, calibration, options, ranked["ranking"], evaluator.model, a.metric, a.goal,
                        float(a.target), job_dir / FALLBACK_MODEL, a.max_steps, ranked["all_pairs_removed"],
                        start=(int8_path, measured))
        record["fallback"] = done
        record["nodes_to_exclude"] = done["nodes_to_exclude"]
        result.files["int8_fallback"] = FALLBACK_MODEL
        result.metrics["analysis.fallback_metric"] = done["metric"]
        result.metrics["analysis.target_reached"] = int(done["reached"])
        result.metrics["analysis.excluded_nodes"] = len(done["nodes_to_exclude"])
        if done["reached"]:
            log.info("fallback: %s = %.6g with quant.nodes_to_exclude=%s -> %s", a.metric, done["metric"],
                     json.dumps(done["nodes_to_exclude"]), job_dir / FALLBACK_MODEL)
        else:
            log.warning("fallback: %s did not reach %s in %d steps (%.6g); best list: %s", a.metric, a.target,
                        a.max_steps, done["metric"], json.dumps(done["nodes_to_exclude"]))
    else:  # no target: the suggestion is the nodes of the most sensitive tensor (when removing it helps)
        top = ranked["ranking"][0]
        record["nodes_to_exclude"] = list(options.nodes_to_exclude) + [
            n for n in top["nodes"] if n and n not in options.nodes_to_exclude] if (top["gain"] or 0) > 0 else []
    write_json(job_dir / SENSITIVITY_FILE, record)
    result.files["sensitivity"] = SENSITIVITY_FILE
    result.analysis = {"metric": a.metric, "goal": a.goal, "nodes_to_exclude": record["nodes_to_exclude"],
                          "most_sensitive": [r["tensor"] for r in ranked["ranking"][:5]]}
    result.metrics.update(_finite_only({
        "analysis.baseline": ranked["baseline"] if ranked["baseline"] is not None else math.nan,
        "analysis.tensors": ranked["tensors"], "analysis.seconds": ranked["seconds"],
        "analysis.seconds_per_tensor": ranked["seconds_per_tensor"], "analysis.trials": ranked["trials"]}))


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


def _plot(record: dict, path: Path, top: int = 20) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from calibrun.files import atomic_path

    rows = [r for r in record["ranking"] if r["gain"] is not None][:top]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(rows) + 1.2))
    ax.barh([f"{r['tensor']} ({r['kind'][0]})"[:60] for r in rows][::-1], [r["gain"] for r in rows][::-1])
    ax.set_xlabel(f"gain in {record['metric']} when the tensor stays fp32 (goal: {record['goal']})")
    ax.set_title(f"sensitivity: top {len(rows)} of {record['tensors']} quantised tensors")
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
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

    name: str = "none"  # none | sensitivity
    metric: str = "max_abs_error"  # any metric of the run: max_abs_error, out.<output>.sqnr_db, task.<name>
    goal: str = "min"  # min | max
    target: float | None = None  # with sensitivity: keep nodes in fp32 until the metric reaches this value
    strategy: str = "switch"  # switch (one session, a run-time switch per pair) | edit (one model per pair)
    kinds: list[str] = field(default_factory=lambda: ["activation", "weight"])
    tensors: list[str] | None = None  # analyse only the pairs on these tensors (None: every pair of `kinds`)
    groups: int = 0  # > 1: a coarse pre-pass over that many groups of pairs first (switch strategy), 0: none
    max_steps: int = 20  # fallback steps at most
    batch_rows: int = 16  # evaluation rows per batch (a model that pins its first axis: that many)
    objective: bool = False  # the task returns analysis.metric (hydra/sweeper=optuna)
