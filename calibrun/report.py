"""report.md and the plots, from the facts the aggregator computed."""

from __future__ import annotations

from pathlib import Path

from calibrun.files import atomic_path

SECTIONS = {
    "calib": "## Narrow calibration — it gets clipped",
    "wide": "## Wide calibration — it gets squashed",
    "samples": "## What cannot be fixed by the number of samples",
    "format": "## The same computation, a different shape",
}
PLOT_FACTOR = "error_vs_factor.png"
PLOT_BATCHES = "error_vs_batches.png"


def _clip_range(scale: float, zero_point: int) -> tuple[float, float]:
    """The float interval an int8 tensor with this scale and zero point can hold."""
    return scale * (-128 - zero_point), scale * (127 - zero_point)


def _missing(summary, name: str) -> str:
    runs = summary.missing.get(name, [])
    return "Not measured in this sweep; missing runs: " + "; ".join(runs) + "."


def _narrow_section(calib: dict, eval_span: float, narrow_zp: int) -> str:
    n, m = calib["narrow"], calib["match"]
    ratio = n["max_abs_error"] / m["max_abs_error"]
    lo, hi = _clip_range(n["input_scale"], narrow_zp)
    text = (
        f"Calibration saw a span of {n['span']:.4g} where the real data (evaluation seed {calib['eval']['seed']}, "
        f"{calib['eval']['rows']} rows) spans {eval_span:.4g}. The graph pinned input_scale "
        f"{n['input_scale']:.6g} (observed span {n['observed_span']:.4g}, vs {m['observed_span']:.4g} for match): "
        f"every input outside [{lo:.3g}, {hi:.3g}] is clipped to the int8 ends. "
    )
    text += (
        f"Max abs error: **{n['max_abs_error']:.4g}** vs {m['max_abs_error']:.4g} for match ({ratio:.1f}x). "
        f"Best of the three: **{calib['best']}**."
    )
    return text


def _wide_section(calib: dict, eval_span: float) -> str:
    w, m, n = calib["wide"], calib["match"], calib["narrow"]
    steps_used = eval_span / w["input_scale"]
    verdict = "worse" if calib["clipping_worse_than_coarse"] else "not worse"
    return (
        f"Calibration saw a span of {w['span']:.4g}; input_scale {w['input_scale']:.6g} is "
        f"{w['input_scale'] / m['input_scale']:.1f}x the match scale, so the real data lands on about "
        f"{steps_used:.0f} of the 256 int8 levels. Max abs error: **{w['max_abs_error']:.4g}** "
        f"({w['max_abs_error'] / m['max_abs_error']:.1f}x match). Clipping (narrow, {n['max_abs_error']:.4g}) is "
        f"{verdict} than a coarse grid (wide) here: clipping_worse_than_coarse = "
        f"{str(calib['clipping_worse_than_coarse']).lower()}."
    )


def _samples_section(s: dict) -> str:
    lines = ["| batches | span | input_scale | max_abs_error |", "|---:|---:|---:|---:|"]
    for row in s["narrow_runs"]:
        cells = (row["batches"], f"{row['span']:.4g}", f"{row['input_scale']:.6g}", f"{row['max_abs_error']:.4g}")
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    small, last = s["match_small"], s["narrow_runs"][-1]
    verdict = "still beats" if s["beats_narrow"] else "does not beat"
    lines += [
        "",
        f"More narrow samples widen the observed range only toward the tails of the *narrow* distribution: "
        f"the best narrow run reaches {s['narrow_best']:.4g} ({s['narrow_gain']:.2f}x better than 1 batch), "
        f"yet match with only {small['batches']} batches ({small['max_abs_error']:.4g}) {verdict} narrow with "
        f"{last['batches']} batches ({last['max_abs_error']:.4g}). A skewed calibration set is not fixed by "
        f"more of it.",
    ]
    return "\n".join(lines)


def _format_section(f: dict) -> str:
    q, o = f["qdq"], f["qoperator"]
    same = "the same" if f["same_input_scale"] else "a different"
    return (
        f"QDQ: {q['bytes']} bytes, ops {q['ops']}, max abs error {q['max_abs_error']:.4g}. "
        f"QOperator: {o['bytes']} bytes, ops {o['ops']}, max abs error {o['max_abs_error']:.4g}. "
        f"Both pin {same} input scale. Their outputs differ by at most {f['max_abs_difference']:.4g} "
        f"({f['difference_vs_error']:.2f}x the QDQ error): one computation, two graph shapes, and the kernels "
        f"round intermediate results differently."
    )


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def _db(value) -> str:
    return "n/a" if value is None else f"{value:.1f} dB"


def _diagnosis_section(diagnosis: dict) -> str:
    lines = ["| run | verdict | input clipped | input grid used | input SQNR | top culprit (node) | max abs error |",
             "|---|---|---:|---:|---:|---|---:|"]
    advice = []
    for label, run in diagnosis["runs"].items():
        if run.get("verdict") is None:
            continue
        inp = run.get("input") or {}
        culprits = run.get("culprits") or []
        if culprits:
            top = culprits[0]
            share = top.get("noise_share")
            culprit = (f"{top.get('tensor')} ({top.get('node') or 'input'}, {top.get('verdict')}, "
                       f"{_pct(share)} of the noise)")
        else:
            worst = (run.get("worst_tensors") or [{}])[0]
            culprit = f"{worst.get('tensor', 'n/a')} ({_db(worst.get('sqnr_db'))})" if worst else "n/a"
        lines.append(f"| {label} | **{run['verdict']}** | {_pct(inp.get('clipped_fraction'))} | "
                     f"{_pct(inp.get('grid_used'))} | {_db(inp.get('sqnr_db'))} | {culprit} | "
                     f"{run['max_abs_error']:.4g} |")
        advice += [f"- {label}: {text}" for text in run.get("recommendations") or []]
    if len(lines) == 2:
        lines = ["No QDQ run in this sweep: per-tensor diagnostics are measured on QDQ models."]
    lines += ["", "*clipping*: values cut off beyond half a step add more error than all the tensor's rounding; "
              "*mixed*: parts of one tensor (Concat inputs, output entries) span ranges 10x apart and the narrow "
              "part gets under 16 steps: one scale "
              "cannot serve both; *coarse*: the real values use under 25% of the integer grid; *sound*: none of "
              "these. A culprit's share is its part of the error added tensor by tensor "
              "(its noise against fp32 minus what its inputs carried in)."]
    if advice:
        lines += ["", "Recommended:", *advice]
    for calibration, trend in diagnosis["samples"].items():
        lines += ["", f"**More samples for {calibration}?** {trend['verdict']}: {trend['reason']}."]
    return "\n".join(lines)


def _task_section(runs: dict) -> str | None:
    """One row per run with task metrics (task.<name>; older results: top1_agreement and the accuracies)."""
    def task_metrics(m: dict) -> dict:
        found = {k[len("task."):]: v for k, v in m.items() if k.startswith("task.")}
        for key in ("top1_agreement", "fp32_accuracy", "int8_accuracy"):
            if key in m and key not in found:
                found[key] = m[key]
        return found

    rows = [(key, task_metrics(run.metrics)) for key, run in sorted(runs.items())]
    rows = [(key, m) for key, m in rows if m]
    if not rows:
        return None
    names = sorted({name for _, m in rows for name in m})
    lines = ["| run | " + " | ".join(n.replace("_", " ") for n in names) + " |", "|---|" + "---:|" * len(names)]
    for (calibration, batches, fmt), m in rows:
        cells = [f"calibration={calibration} batches={batches} format={fmt}"]
        cells += ["n/a" if n not in m else f"{m[n]:.2%}" if 0 <= m[n] <= 1 else f"{m[n]:.4g}" for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plots(report_dir: Path, runs: dict, facts: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    if "calib" in facts:
        factors = facts["factors"]
        names = sorted(factors, key=factors.get)
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([factors[n] for n in names], [facts["calib"][n]["max_abs_error"] for n in names], "o-")
        for n in names:
            ax.annotate(n, (factors[n], facts["calib"][n]["max_abs_error"]), textcoords="offset points",
                        xytext=(4, 4))
        ax.set(xscale="log", xlabel="calibration factor (log)", ylabel="max abs error vs fp32",
               title="Error vs calibration range")
        written.append(_save(fig, report_dir / PLOT_FACTOR))
        plt.close(fig)
    series = {
        name: sorted((b, run.metrics["max_abs_error"]) for (c, b, fmt), run in runs.items()
                     if c == name and fmt == "qdq")
        for name in ("narrow", "match")
    }
    if any(len(points) > 1 for points in series.values()):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for name, points in series.items():
            if points:
                ax.plot([b for b, _ in points], [e for _, e in points], "o-", label=name)
        ax.set(xscale="log", xlabel="calibration batches (log)", ylabel="max abs error vs fp32",
               title="Error vs number of calibration batches")
        ax.legend()
        written.append(_save(fig, report_dir / PLOT_BATCHES))
        plt.close(fig)
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    return path


def write(report_dir: Path, runs: dict, facts: dict, summary) -> list[Path]:
    """Write report.md (and its plots) into report_dir; return the paths written."""
    plots = _plots(report_dir, runs, facts)
    calib = facts.get("calib")
    parts = ["# calibrun report", ""]
    parts += [f"![{p.stem}]({p.name})" for p in plots] + [""]
    if calib:
        parts += [SECTIONS["calib"], "", _narrow_section(calib, facts["eval_span"], facts["narrow_zero_point"]), ""]
        parts += [SECTIONS["wide"], "", _wide_section(calib, facts["eval_span"]), ""]
    else:
        parts += [SECTIONS["calib"], "", _missing(summary, "calib_report.json"), ""]
        parts += [SECTIONS["wide"], "", _missing(summary, "calib_report.json"), ""]
    samples = facts.get("samples")
    parts += [SECTIONS["samples"], "", _samples_section(samples) if samples else _missing(summary, "samples.json"), ""]
    fmt = facts.get("format")
    parts += [SECTIONS["format"], "", _format_section(fmt) if fmt else _missing(summary, "format.json"), ""]
    if "diagnosis" in facts:
        parts += ["## Diagnosis", "", _diagnosis_section(facts["diagnosis"]), ""]
    task = _task_section(runs)
    if task:
        parts += ["## Task accuracy", "", task, ""]
    if summary.failed:
        parts += ["## Failed jobs", ""] + [f"- {line}" for line in summary.failed] + [""]
    path = report_dir / "report.md"
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts))
    return [*plots, path]
