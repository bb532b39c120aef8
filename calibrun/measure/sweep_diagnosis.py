"""Sweep-level diagnosis: why an int8 model lost accuracy, from the measurements of its runs.

Per run (QDQ runs carry per-tensor diagnostics): the input tensor's and the model's verdict (clipping / mixed /
coarse / sound, calibrun.measure.diagnosis.classify) with the numbers behind it, the worst tensors by SQNR, the
culprits (the tensors with the largest share of the noise, with the node that produces each, as every run's
result.json records them) and the measured recommendations of the run.

Per calibration with several batch counts: would more samples help? The observed range of n samples of a
light-tailed distribution grows like a + b * sqrt(2 ln n) (the expected maximum of n normal draws). A
least-squares fit of the input's calibration span against sqrt(2 ln rows) extrapolates how many rows would
reach the evaluation span: within 100x of the largest run, more samples would help (the range is still
growing toward it); beyond, they will not: the calibration distribution itself is off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from calibrun.measure.diagnosis import worst

REACHABLE = 100.0  # rows_needed within this factor of the largest run counts as "more samples would help"
COVERED = 0.9  # a calibration span >= 90% of the evaluation span already covers it


def rows_of_table(table: Mapping[str, list]) -> list[dict]:
    """diagnostics.json is column-oriented (mlflow log_table); back to one dict per tensor."""
    columns = list(table)
    return [dict(zip(columns, values, strict=True)) for values in zip(*table.values(), strict=True)]


def run_diagnosis(result: Mapping, table: Mapping[str, list] | None, n_worst: int = 3) -> dict:
    """The verdicts and numbers of one run; `table` is its diagnostics.json (None for QOperator runs)."""
    entry = {"max_abs_error": result["metrics"]["max_abs_error"]}
    for key in ("top1_agreement", "fp32_accuracy", "int8_accuracy"):
        if key in result["metrics"]:
            entry[key] = result["metrics"][key]
    verdict = result.get("diagnosis")
    if verdict is None or table is None:
        entry["verdict"] = None
        return entry
    rows = rows_of_table(table)
    entry["verdict"] = verdict["input"] or verdict["overall"]
    entry["overall"] = verdict["overall"]
    entry["counts"] = verdict["counts"]
    entry["input"] = next(({k: row[k] for k in ("tensor", "calib_min", "calib_max", "eval_min", "eval_max",
                                                 "clipped_fraction", "grid_used", "sqnr_db")}
                           for row in rows if row["tensor"] == verdict["input_tensor"]), None)
    entry["worst_tensors"] = [{k: row.get(k) for k in ("tensor", "node", "verdict", "sqnr_db", "clipped_fraction",
                                                         "clip_cost", "grid_used")} for row in worst(rows, n_worst)]
    entry["culprits"] = list(verdict.get("culprits", []))[:n_worst]
    entry["recommendations"] = list(result.get("recommendations") or [])  # measured (calibrun.analysis.recommend)
    return entry


def sample_trend(points: Sequence[tuple[int, float]], eval_span: float) -> dict:
    """Would more calibration samples help? `points` are (calibration rows, calibration span)."""
    points = sorted(points)
    rows = np.array([p[0] for p in points], dtype=np.float64)
    spans = np.array([p[1] for p in points], dtype=np.float64)
    last_rows, last_span = int(rows[-1]), float(spans[-1])
    out = {"rows": [int(r) for r in rows], "spans": [float(s) for s in spans], "eval_span": eval_span}
    if last_span >= COVERED * eval_span:
        out.update(verdict="covered", more_samples_help=False,
                   reason=f"the calibration span {last_span:.4g} already covers {last_span / eval_span:.0%} "
                          f"of the evaluation span {eval_span:.4g}")
        return out
    x = np.sqrt(2 * np.log(np.maximum(rows, 2)))
    b, a = np.polyfit(x, spans, 1) if len(points) > 1 else (0.0, spans[0])
    out["fit"] = {"a": float(a), "b": float(b)}
    log_needed = math.inf if b <= 0 else ((eval_span - a) / b) ** 2 / 2  # ln(rows needed)
    out["log10_rows_needed"] = log_needed / math.log(10) if math.isfinite(log_needed) else None
    helps = math.isfinite(log_needed) and log_needed <= math.log(REACHABLE * last_rows)
    if helps:
        out.update(verdict="more samples help", more_samples_help=True,
                   reason=f"the span still grows toward the evaluation span {eval_span:.4g}: about "
                          f"{math.exp(log_needed):.3g} rows would reach it ({last_rows} now)")
    else:
        needed = "never" if not math.isfinite(log_needed) else f"about 10^{log_needed / math.log(10):.0f} rows"
        out.update(verdict="distribution is off", more_samples_help=False,
                   reason=f"{last_rows} rows reach a span of {last_span:.4g} against {eval_span:.4g} on the real "
                          f"data, and the trend would need {needed}: calibrate on data distributed like the "
                          f"real inputs")
    return out
