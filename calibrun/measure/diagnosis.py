"""Per-tensor verdicts and the model's diagnosis (result.json `diagnosis`), from the rows of the per-tensor statistics
(calibrun.measure.tensor_stats): which tensors clip, mix ranges under one scale, use a coarse grid, and which
ones the output error comes from. The explanation beneath the headline verdict (calibrun.measure.verdict).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from calibrun.core.errors import CalibrunError
from calibrun.core.files import finite
from calibrun.measure.tensor_stats import COLUMNS
from calibrun.measure.verdict import SQNR_OK_DB

# Legacy count rule, kept for rows without a clip_cost (older diagnostics.json files): more than 0.1% of the
# values outside the representable range.
CLIP_THRESHOLD = 0.001
# A tensor is "clipping" when its clip_cost exceeds 1: values cut off beyond half a step add more error energy
# than all the rounding of the tensor does (more than a 3 dB loss from clipping alone). Lab narrow input: ~10^3;
# match: 0 (its few values past the range are within half a step).
CLIP_COST_THRESHOLD = 1.0
# A tensor is "mixed" when its parts' fp32 spans differ by at least this factor (an order of magnitude) and the
# narrowest part covers fewer than MIXED_STEPS quantisation steps: one scale cannot serve both. det_yolox's
# output: boxes span ~3, objectness ~0.06 on photos without objects: 5 steps of 0.012, the objectness part at
# 9.7 dB SQNR while the whole output reads 27 dB. Remedy: keep it in float (quant.nodes_to_exclude).
MIXED_RATIO = 10.0
MIXED_STEPS = 16
# A tensor is "coarse" when it uses less than 25% of the integer levels it could reach: fewer than 64 of int8's
# 256 levels, under 6 effective bits (the calibrated range is more than 4x wider than the data). The 25% is of
# min(grid size, distinct fp32 values): a Relu output's zeros are one value, 100 values cannot fill 256 levels.
COARSE_THRESHOLD = 0.25
# ...or when its own Q/DQ pair leaves it under 20 dB local SQNR without clipping (about 3 effective bits where
# int8 on a well-matched range gives 35-45 dB): the typical values sit on a few levels because outliers (or a
# too wide calibration) stretched the range. On ocr_det the SE blocks' GlobalAveragePool and a few heavy-tailed
# Conv outputs land at 14-16 dB while using 57-87% of the grid; the median tensor is at 41 dB.
COARSE_SQNR_DB = 20.0
CULPRITS = 5  # tensors named in every run's diagnosis
OVERALL_SHARE = 1 / 3  # a problem verdict holding this share of the added error is the model's verdict
ACCUMULATED_DB = SQNR_OK_DB  # an output under the verdict's ok SQNR with only sound tensors: the error accumulates

VERDICTS = ("overflow", "clipping", "mixed", "coarse", "sound")


def _sort_key(row: Mapping) -> tuple:
    value = row.get("sqnr_db")
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return (missing, 0.0 if missing else value, str(row.get("tensor")))


def worst(diags: Sequence[Mapping], n: int = 5) -> list[Mapping]:
    """The `n` rows with the lowest `sqnr_db`, lowest first.

    -inf comes first, +inf (no noise) after every finite value, rows without an SQNR (None/NaN) last; ties are
    broken by tensor name so the order is deterministic.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise CalibrunError(f"n must be an integer >= 0, got {n!r}")
    return sorted(diags, key=_sort_key)[:n]


def _is_mixed(row: Mapping) -> bool:
    ratio, steps = row.get("mixed_ratio"), row.get("narrowest_part_steps")
    if ratio is None or ratio < MIXED_RATIO:
        return False
    part_db = row.get("worst_part_fp32_sqnr_db")
    return steps is None or steps < MIXED_STEPS or (part_db is not None and part_db < COARSE_SQNR_DB)


def classify(diag_row: Mapping) -> str:
    """"overflow" if the int8 model made any of its values inf or NaN where the truth is finite (`nonfinite`: a
    dequantised value beyond float32's range, as a 16-bit grid over a mask's -3.4e38 gives);
    else "clipping" if clip_cost > CLIP_COST_THRESHOLD (rows without clip_cost: clipped_fraction > CLIP_THRESHOLD);
    else "mixed" if the tensor's parts span ranges MIXED_RATIO apart with the narrowest under MIXED_STEPS steps
    (or a part under COARSE_SQNR_DB against fp32, `worst_part_fp32_sqnr_db`);
    else "coarse" if the tensor used fewer than COARSE_THRESHOLD of the levels it could reach,
    `levels < COARSE_THRESHOLD * min(qmax - qmin + 1, distinct)` with `distinct` the distinct fp32 values
    (`elements` without an fp32 counterpart); a row without levels/qmin/qmax on `grid_used < COARSE_THRESHOLD`;
    or (rows with a clip_cost) if its local SQNR `qdq_sqnr_db` is under COARSE_SQNR_DB; else "sound".
    Clipping wins (its error is unbounded), then mixed (a coarse narrow part is its symptom).
    """
    if diag_row.get("nonfinite"):
        return "overflow"
    cost = diag_row.get("clip_cost")
    if cost is not None:
        if cost > CLIP_COST_THRESHOLD:
            return "clipping"
    else:
        clipped = diag_row.get("clipped_fraction")
        if clipped is not None and clipped > CLIP_THRESHOLD:
            return "clipping"
    if _is_mixed(diag_row):
        return "mixed"
    levels, qmin, qmax = diag_row.get("levels"), diag_row.get("qmin"), diag_row.get("qmax")
    reachable = diag_row.get("distinct_values")
    if reachable is None:
        reachable = diag_row.get("elements")
    if None not in (levels, qmin, qmax, reachable):
        coarse = levels < COARSE_THRESHOLD * min(qmax - qmin + 1, reachable)
    else:
        grid = diag_row.get("grid_used")
        coarse = grid is not None and grid < COARSE_THRESHOLD
    local = diag_row.get("qdq_sqnr_db")
    if cost is not None and local is not None and local < COARSE_SQNR_DB:
        coarse = True
    return "coarse" if coarse else "sound"


def float_nodes(rows: Sequence[Mapping]) -> list[str]:
    """The nodes to exclude so that each row's tensor stays in float: onnxruntime keeps a Q/DQ pair on a tensor
    while its producer or any consumer is quantised, and data-movement ops pass the scale on, so the producer
    and the path to the next computation (`float_nodes`) are named."""
    nodes: list[str] = []
    for row in rows:
        path = row.get("float_nodes") or row.get("consumers") or []
        if isinstance(path, str):
            path = [n for n in path.split(",") if n]
        for name in (row.get("node"), *path):
            if name and name not in nodes:
                nodes.append(name)
    return nodes


def classify_model(diags: Sequence[Mapping], weights: Sequence[Mapping] = (), n: int = CULPRITS,
                   output_sqnr_db: Mapping[str, float] | None = None) -> dict:
    """The model's diagnosis (result.json `diagnosis`):

    - `input_tensor`, `input`: the graph input's tensor and verdict (None when the input carries no QDQ pair);
    - `counts`, `tensors`: verdicts over all diagnosed tensors;
    - `culprits`: the `n` tensors with the largest `noise_share`, each with its producing `node` and its
      `consumers` (quant.nodes_to_exclude needs both to keep the tensor in float), `op_type`, `verdict`,
      `noise_share`, `sqnr_db`, `qdq_sqnr_db`, `clip_cost` and,
      for mixed ones, `mixed_ratio`/`mixed_detail`;
    - `overall`: the problem verdict (clipping, mixed, coarse) whose tensors hold the largest summed noise_share
      (`noise_by_verdict`) when that is at least OVERALL_SHARE of it all, else the top culprit's verdict;
    - `clipping_tensors`, `mixed_tensors`, `coarse_tensors`; `mixed_weights` (weights to quantise per channel);
    - `clipping_outputs`: the model outputs called clipping or overflow, each with its `clipped_fraction` and
      `noise_share`, whatever `overall` says (an output's cut values reach the user as they are);
    - with `output_sqnr_db` (output name -> SQNR of int8 vs fp32): `output_sqnr_db` (the lowest) and
      `accumulated`: true when sound tensors hold most of the noise yet an output is under ACCUMULATED_DB: no
      tensor is badly quantised on its own, the error builds up over many of them.
    """
    verdicts = {row["tensor"]: classify(row) for row in diags}
    counts = {verdict: 0 for verdict in VERDICTS}
    shares = {verdict: 0.0 for verdict in VERDICTS}
    for row in diags:
        verdict = verdicts[row["tensor"]]
        counts[verdict] += 1
        shares[verdict] += row.get("noise_share") or 0.0
    first_input = next((row["tensor"] for row in diags if row.get("role") == "input"), None)
    ranked = sorted(diags, key=lambda r: (-(r.get("noise_share") or 0.0), str(r["tensor"])))
    culprits = []
    for row in ranked[:n]:
        entry = {"tensor": row["tensor"], "node": row.get("node"), "op_type": row.get("op_type"),
                 "verdict": verdicts[row["tensor"]], "noise_share": row.get("noise_share"),
                 "sqnr_db": finite(row.get("sqnr_db")), "qdq_sqnr_db": finite(row.get("qdq_sqnr_db")),
                 "clip_cost": row.get("clip_cost")}
        if row.get("mixed_ratio") is not None:
            entry.update(mixed_ratio=row["mixed_ratio"], mixed_detail=row.get("mixed_detail"))
        entry["consumers"] = [n for n in (row.get("consumers") or "").split(",") if n]
        entry["float_nodes"] = [n for n in (row.get("float_nodes") or "").split(",") if n]
        culprits.append(entry)
    total = sum(shares.values())
    bad = max(VERDICTS[:-1], key=lambda v: (shares[v], -VERDICTS.index(v)))
    if not diags:
        overall = None
    elif total > 0 and shares[bad] >= OVERALL_SHARE * total:
        overall = bad
    elif culprits:
        overall = culprits[0]["verdict"]
    else:
        overall = next((v for v in VERDICTS if counts[v]), None)
    mixed_weights = [w for w in weights if w.get("verdict") == "mixed"]
    accumulated = None
    lowest = None
    if output_sqnr_db:
        lowest = min(output_sqnr_db.values())
        accumulated = bool(overall == "sound" and lowest < ACCUMULATED_DB)
    return {
        "input_tensor": first_input,
        "output_sqnr_db": lowest,
        "accumulated": accumulated,
        "input": verdicts.get(first_input) if first_input is not None else None,
        "counts": counts,
        "tensors": len(verdicts),
        "overall": overall,
        "noise_by_verdict": {k: float(v) for k, v in shares.items()},
        "culprits": culprits,
        "clipping_tensors": [name for name, v in verdicts.items() if v == "clipping"],
        "mixed_tensors": [name for name, v in verdicts.items() if v == "mixed"],
        "coarse_tensors": [name for name, v in verdicts.items() if v == "coarse"],
        "mixed_weights": [{k: w[k] for k in ("weight", "node", "op_type", "channels", "ratio")} for w in mixed_weights],
        "clipping_outputs": [{"tensor": row["tensor"], "verdict": verdicts[row["tensor"]],
                              "clipped_fraction": row.get("clipped_fraction"), "noise_share": row.get("noise_share")}
                             for row in diags if row.get("role") == "output"
                             and verdicts[row["tensor"]] in ("overflow", "clipping")],
    }


def accumulated_note(diagnosis: Mapping) -> str:
    """What the diagnosis line adds where no tensor is badly quantised on its own yet an output is under the verdict's
    ok SQNR (`accumulated`): the shares cannot name a cause (hama's phoneme recogniser read "sound" while int8 read no
    phoneme; docs/results.md)."""
    if not diagnosis.get("accumulated"):
        return ""
    lowest = diagnosis.get("output_sqnr_db")  # None in result.json where it was -inf (strict JSON)
    at = f"at {lowest:.1f} dB" if isinstance(lowest, (int, float)) else "at no finite SQNR"
    mixed = diagnosis.get("mixed_weights") or []
    if mixed:  # the activations' shares cannot see a weight's rounding: a hand-landmark model's depthwise kernels,
        # channels 1,778x apart, rounded 7 of 24 channels to zero per tensor while every activation read sound
        worst = max(mixed, key=lambda w: w.get("ratio") or 0)
        return (f"; yet an output is {at}: no activation is badly quantised on its own, but {len(mixed)} "
                f"{'weight holds' if len(mixed) == 1 else 'weights hold'} channels of very different ranges, "
                f"quantised per tensor (the widest: {worst['weight']!r}, its largest channel "
                f"{worst.get('ratio') or 0:.0f}x its median one), which rounds the small channels away "
                "(quant.per_channel=true quantises each channel on its own; the measured recommendations say what "
                "it does)")
    return (f"; yet an output is {at}: no tensor is badly quantised on its own, so the error builds up over many of "
            "them, or a level or a fill that dominates a tensor's energy hides it from the shares (the measured "
            "recommendations are the answer)")


def clipping_outputs_note(diagnosis: Mapping) -> str:
    """What the diagnosis line adds where a model output clips (or overflows) and is not the top culprit the line
    names: the int8 model hands those cut values to the user as they are, whatever the overall verdict. holosoma's
    policy read "sound" while its `actions` output clipped (0.13% of its values beyond the calibrated range, 24% of
    the added error)."""
    top = next(iter(diagnosis.get("culprits") or ()), {}).get("tensor")
    found = [o for o in diagnosis.get("clipping_outputs") or () if o["tensor"] != top]
    if not found:
        return ""

    def said(output: Mapping) -> str:
        share, clipped = output.get("noise_share"), output.get("clipped_fraction")
        parts = [f"{100 * clipped:.2g}% of its values beyond the calibrated range"] if clipped else []
        if share is not None:
            parts.append(f"{100 * share:.0f}% of the added error")
        return f"output {output['tensor']!r} {output['verdict']}" + (f" ({', '.join(parts)})" if parts else "")

    return "; " + "; ".join(said(o) for o in found)


def _json_value(value):
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no inf/NaN (a +inf SQNR means no noise; see the row itself)
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    return value


def as_table(diags: Sequence[Mapping]) -> dict[str, list]:
    """Column-oriented rows plus a `verdict` column, strict JSON (non-finite floats become null), ready for
    `mlflow.log_table(data=..., artifact_file="diagnostics.json")`."""
    columns = list(COLUMNS)
    for row in diags:
        columns.extend(key for key in row if key not in columns)
    table: dict[str, list] = {column: [_json_value(row.get(column)) for row in diags] for column in columns}
    table["verdict"] = [classify(row) for row in diags]
    return table

