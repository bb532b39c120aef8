"""The best trial of an Optuna search (`+experiment=search`): SWEEP_DIR/search.json, built from the sweeper's
optimization_results.yaml and the trials' job folders, and logged on the sweep's MLflow parent run.

A Hydra callback of its own (listed by conf/experiment/search.yaml), so the sweep callback and the aggregator are
not touched. Hydra calls the end callbacks in reverse order, so this runs before the sweep callback closes the
parent run.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from calibrun.core.errors import one_line
from calibrun.core.files import write_json

log = logging.getLogger("calibrun")

SEARCH_FILE = "search.json"


def _plain(value):
    return value if not isinstance(value, float) or math.isfinite(value) else None


def summarize(sweep_dir: Path, metric: str, goal: str) -> dict:
    """Every trial (job folder, overrides, status, metric) and the best one, from the sweep folder."""
    trials = []
    for result_path in sorted(sweep_dir.glob("*/result.json"), key=lambda p: int(p.parent.name)
                              if p.parent.name.isdigit() else 0):
        job = result_path.parent
        result = json.loads(result_path.read_text())
        overrides_file = job / ".hydra" / "overrides.yaml"
        overrides = list(OmegaConf.load(overrides_file)) if overrides_file.is_file() else []
        value = result.get("metrics", {}).get(metric) if result.get("status") == "ok" else None
        trials.append({"job": job.name, "status": result.get("status"), "value": _plain(value),
                       "overrides": overrides, "error": result.get("error")})
    scored = [t for t in trials if t["value"] is not None]
    best = (min if goal == "min" else max)(scored, key=lambda t: t["value"]) if scored else None
    record = {"metric": metric, "goal": goal, "trials": trials, "best": best}
    results = sweep_dir / "optimization_results.yaml"
    if results.is_file():  # what the Optuna sweeper itself reports
        optuna = OmegaConf.to_container(OmegaConf.load(results))
        record["optuna"] = {"best_params": optuna.get("best_params"), "best_value": _plain(optuna.get("best_value"))}
    return record


class SearchCallback(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            record = summarize(sweep_dir, config.analysis.metric, config.analysis.goal)
            write_json(sweep_dir / SEARCH_FILE, record)
            best = record["best"]
            if best is None:
                log.warning("search: no trial gave %s", config.analysis.metric)
            else:
                log.info("search: best trial %s (job %s): %s = %.6g with %s", best["job"], sweep_dir / best["job"],
                         config.analysis.metric, best["value"], " ".join(best["overrides"]))
            _log_parent(config, sweep_dir, record)
        except Exception as exc:  # Hydra would turn it into a warning; say it in one line instead
            log.error("search: summary not written: %s", one_line(exc))


def _log_parent(config: DictConfig, sweep_dir: Path, record: dict) -> None:
    from calibrun.config import tracking_enabled
    from calibrun.tracking import PARENT_FILE, Tracker

    parent_file = sweep_dir / PARENT_FILE
    if not tracking_enabled(config) or not parent_file.is_file():
        return
    parent = json.loads(parent_file.read_text())
    tracker = Tracker(parent["tracking_uri"], config.tracking.experiment)
    tracker.log_artifact(parent["run_id"], sweep_dir / SEARCH_FILE)
    best = record["best"]
    if best is not None:
        tracker.log(parent["run_id"], metrics={f"best.{record['metric']}": best["value"]},
                    tags={"calibrun.best_trial": best["job"], "calibrun.best_overrides": " ".join(best["overrides"])})
