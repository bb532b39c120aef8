"""report.md and the plots, from the facts the aggregator computed."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import numpy as np

from calibrun import lab
from calibrun.core.files import atomic_path

SECTIONS = {
    "calib": "## Narrow calibration — it gets clipped",
    "wide": "## Wide calibration — it gets squashed",
    "samples": "## What cannot be fixed by the number of samples",
    "format": "## The same computation, a different shape",
}
PLOT_FACTOR = "error_vs_factor.png"
PLOT_BATCHES = "error_vs_batches.png"
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
           "tab:olive", "tab:cyan")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINES = ("-", "--", ":", "-.")


# The integer grid of each activation type calibrun accepts (quantize.QUANT_TYPES): (name, qmin, qmax).
INT_GRIDS = {name: (np.dtype(t).name, int(np.iinfo(t).min), int(np.iinfo(t).max))
             for name, t in (("QInt8", np.int8), ("QUInt8", np.uint8), ("QInt16", np.int16), ("QUInt16", np.uint16))}
# The narrow/wide sections describe lab runs only, and a lab run quantises its activations to this type
# (lab.FIXED: the aggregator picks no run with another activation_type as a lab run).
LAB_GRID = INT_GRIDS[lab.FIXED["quant.activation_type"]]


def _clip_range(scale: float, zero_point: int, grid: tuple[str, int, int] = LAB_GRID) -> tuple[float, float]:
    """The float interval a tensor on this integer grid, scale and zero point can hold."""
    _, qmin, qmax = grid
    return scale * (qmin - zero_point), scale * (qmax - zero_point)


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
        f"every input outside [{lo:.3g}, {hi:.3g}] is clipped to the {LAB_GRID[0]} ends. "
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
        f"{steps_used:.0f} of the {LAB_GRID[2] - LAB_GRID[1] + 1} {LAB_GRID[0]} levels. "
        f"Max abs error: **{w['max_abs_error']:.4g}** "
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
    # the input's verdict first (the lab's story: its calibration span), then the model's from all its tensors: a run
    # whose input is sound can clip inside (an entropy run: 97% of its added noise in clipping tensors)
    lines = ["| run | input verdict | input clipped | input grid used | input SQNR | model's diagnosis | top culprit "
             "(node) | max abs error |",
             "|---|---|---:|---:|---:|---|---|---:|"]
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
        said = f"**{run['verdict']}**" if run.get("input") else "- (not quantised)"  # no pair on the input (a float
        # input read first by an op onnxruntime does not quantise, token ids): no verdict of it
        lines.append(f"| {label} | {said} | {_pct(inp.get('clipped_fraction'))} | "
                     f"{_pct(inp.get('grid_used'))} | {_db(inp.get('sqnr_db'))} | {run.get('overall') or 'n/a'} | "
                     f"{culprit} | {run['max_abs_error']:.4g} |")
        advice += [f"- {label}: `{r.get('shell', r['change'])}`: {r['metric']} {_fmt(r['before'])} -> "
                   f"{_fmt(r['after'])} ({r['status_after']})" for r in run.get("recommendations") or []]
    if len(lines) == 2:
        lines = ["No QDQ run in this sweep: per-tensor diagnostics are measured on QDQ models."]
    lines += ["", "*clipping*: values cut off beyond half a step add more error than all the tensor's rounding; "
              "*mixed*: parts of one tensor (Concat inputs, output entries) span ranges 10x apart and the narrow "
              "part gets under 16 steps: one scale "
              "cannot serve both; *coarse*: the real values use under 25% of the integer grid; *sound*: none of "
              "these. A culprit's share is its part of the error added tensor by tensor "
              "(its noise against fp32 minus what its inputs carried in)."]
    if advice:
        lines += ["", "Recommended (each change measured on the evaluation rows, best first):", *advice]
    for calibration, trend in diagnosis["samples"].items():
        lines += ["", f"**More samples for {calibration}?** {trend['verdict']}: {trend['reason']}."]
        advice = trend.get("recommendation")
        if advice:
            lines[-1] += (f" Measured by this sweep: `{advice['change']}` takes {advice['metric']} from "
                          f"{_fmt(advice['before'])} ({advice['measured_by'][0]}) to {_fmt(advice['after'])} "
                          f"({advice['status_after']}).")
    return "\n".join(lines)


def _task_section(runs: dict) -> str | None:
    """One row per run with task metrics (task.<name>; older results: top1_agreement and the accuracies)."""
    def task_metrics(m: dict) -> dict:
        found = {k[len("task."):]: v for k, v in m.items() if k.startswith("task.")}
        for key in ("top1_agreement", "fp32_accuracy", "int8_accuracy"):
            if key in m and key not in found:
                found[key] = m[key]
        return found

    rows = [(label, task_metrics(run.metrics)) for label, run in runs.items()]
    rows = [(label, m) for label, m in rows if m]
    if not rows:
        return None
    names = sorted({name for _, m in rows for name in m})
    lines = ["| run | " + " | ".join(n.replace("_", " ") for n in names) + " |", "|---|" + "---:|" * len(names)]
    for label, m in rows:
        cells = [label]
        cells += ["n/a" if n not in m else f"{m[n]:.2%}" if 0 <= m[n] <= 1 else f"{m[n]:.4g}" for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _number(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if value.strip().lower() not in ("nan", "inf", "-inf", "true", "false") else None


def _plot_name(metric: str, axis: str) -> str:
    return f"{metric}_vs_{re.sub(r'[^A-Za-z0-9_.-]+', '_', axis)}.png"


def _axis_plots(report_dir: Path, runs: dict, facts: dict) -> list[Path]:
    """The headline metric against each swept axis; one line per combination of the other axes, coloured by the
    first other axis (marker and line style: the rest)."""
    import matplotlib.pyplot as plt

    axes = facts.get("axes") or {}
    metric = facts["headline"]["metric"]
    written = []
    for axis, values in axes.items():
        candidates = [a for a in axes if a != axis]
        colour_axis = candidates[0] if candidates else None  # the first other axis of the sweep
        rest = [a for a in candidates if a != colour_axis]
        others = [colour_axis, *rest] if colour_axis else []
        numeric = all(_number(v) is not None for v in values)
        position = (lambda v: _number(v)) if numeric else (lambda v, order=values: order.index(v))
        series: dict[tuple, list[tuple[float, float]]] = {}
        for run in runs.values():
            value = run.metrics.get(metric)
            if axis not in run.overrides or not isinstance(value, (int, float)):
                continue
            key = tuple(run.overrides.get(a, "-") for a in others)
            series.setdefault(key, []).append((position(run.overrides[axis]), float(value)))
        if not any(len(points) > 1 for points in series.values()):
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        rest_values = sorted({key[1:] for key in series}) if rest else [()]
        for key, points in sorted(series.items(), key=lambda kv: [axes[a].index(v) if v in axes[a] else -1
                                                                    for a, v in zip(others, kv[0], strict=True)]):
            colour = COLOURS[axes[colour_axis].index(key[0]) % len(COLOURS)] if colour_axis else COLOURS[0]
            style = rest_values.index(key[1:]) if rest else 0  # the other axes: marker, line style, hollow markers
            points.sort()
            label = " ".join(f"{a}={v}" for a, v in zip(others, key, strict=True)) or None
            ax.plot([x for x, _ in points], [y for _, y in points], marker=MARKERS[style % len(MARKERS)],
                    color=colour, label=label, markerfacecolor="none" if style % 2 else colour,
                    linestyle=LINES[style % len(LINES)] if len(points) > 1 else "none")
        xs = [_number(v) for v in values] if numeric else []
        if numeric and min(xs) > 0 and max(xs) / min(xs) >= 20:
            _log_axis(ax, xs, values)
        if not numeric:
            ax.set_xticks(range(len(values)), values)
            ax.set_xlim(-0.5, len(values) - 0.5)
        better = facts["headline"]["better"]
        ax.set(xlabel=axis + (" (log)" if ax.get_xscale() == "log" else ""), ylabel=f"{metric} ({better} is better)",
               title=f"{metric} vs {axis}" + (f", coloured by {colour_axis}" if colour_axis else ""))
        if colour_axis and len(series) > 4:  # beside the plot, not over the points
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0)
        elif colour_axis:
            ax.legend(fontsize="small")
        written.append(_save(fig, report_dir / _plot_name(metric, axis)))
        plt.close(fig)
    return written


def _lab_plots(report_dir: Path, facts: dict) -> list[Path]:
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
        _log_axis(ax, [factors[n] for n in names], [f"{factors[n]:g}" for n in names])
        ax.set(xlabel="calibration factor (log)", ylabel="max abs error vs fp32",
               title=f"Error vs calibration range (lab, {lab.MAIN_BATCHES} batches, QDQ)")
        written.append(_save(fig, report_dir / PLOT_FACTOR))
        plt.close(fig)
    lab_runs = facts.get("lab_runs") or {}
    for fmt in lab.FORMATS:  # every calibration, in one format: QDQ when the sweep has QDQ runs over batches
        series = {name: sorted((b, run.metrics["max_abs_error"]) for (c, b, f), run in lab_runs.items()
                               if c == name and f == fmt) for name in lab.CALIBRATIONS}
        if not any(len(points) > 1 for points in series.values()):
            continue
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for i, (name, points) in enumerate(series.items()):
            if points:
                ax.plot([b for b, _ in points], [e for _, e in points], "o-", label=name, color=COLOURS[i])
        batches = sorted({b for points in series.values() for b, _ in points})
        _log_axis(ax, batches, [str(b) for b in batches])
        ax.set(xlabel="calibration batches (log)", ylabel="max abs error vs fp32",
               title=f"Error vs number of calibration batches (lab, {fmt.upper() if fmt == 'qdq' else 'QOperator'})")
        ax.legend(title="calibration")
        written.append(_save(fig, report_dir / PLOT_BATCHES))
        plt.close(fig)
        break
    return written


def _log_axis(ax, positions: list, labels: list[str]) -> None:
    """A log x axis ticked at the swept values, labelled as they were written (matplotlib's default labels powers of
    ten in mathtext, which is also a third of a plot's drawing time)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.set_xticks(positions, labels)
    ax.xaxis.set_minor_formatter(NullFormatter())


def _save(fig, path: Path) -> Path:
    with atomic_path(path, suffix=".png") as tmp:  # bbox_inches="tight" fits the outside legend and the title
        fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight")
    return path


def _fmt(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def verdict_line(table: dict) -> str:
    """The report's first line: how many runs are ok, degraded, broken (each run's verdict, calibrun.measure.verdict),
    and the best run's."""
    rows = table["runs"]
    counts = {s: sum(1 for r in rows if r.get("verdict") == s) for s in ("ok", "degraded", "broken")}
    said = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    failed = sum(1 for r in rows if r["status"] != "ok")
    best = next((r for r in rows if r["label"] == table["best"]), None)
    line = (f"**Verdict:** {said} of {len(rows)} run(s)" if said else
            f"**Verdict:** none of the {len(rows)} run(s) has a verdict") + (f" ({failed} failed)" if failed else "")
    if best is not None and best.get("verdict"):
        line += f"; the best run by `{table['headline']['metric']}`, {best['label']}, is **{best['verdict']}**"
    return line + "."


def _runs_section(table: dict) -> str:
    """Every run of the sweep: its swept overrides, the headline metric and the main numbers."""
    axes = list(table["axes"])
    metric = table["headline"]["metric"]
    columns = [metric] + [m for m in ("max_abs_error", "mean_abs_error", "input_scale", "span", "model_bytes")
                          if m != metric]
    head = (axes or ["run"]) + ["verdict"] + columns + ["status"]
    lines = ["| " + " | ".join(head) + " |",
             "|" + "---|" * (len(axes or ["run"]) + 1) + "---:|" * len(columns) + "---|"]
    for row in table["runs"]:
        keys = [row["overrides"].get(a, "-") for a in axes] if axes else [row["label"]]
        metrics = row.get("metrics", {})
        cells = [_fmt(metrics.get(m)) for m in columns]
        if row["label"] == table["best"]:
            cells[0] = f"**{cells[0]}**"
        status = row["status"] if row["status"] == "ok" else f"failed: {row.get('error', '')}"
        said = row.get("verdict") or "-"
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in [*keys, said, *cells, status]) + " |")
    ok = sum(1 for row in table["runs"] if row["status"] == "ok")
    intro = (f"{len(table['runs'])} run(s), {ok} completed; swept: "
             + (", ".join(f"`{a}` ({len(v)} values)" for a, v in table["axes"].items()) or "nothing")
             + f". Headline metric: `{metric}` ({table['headline']['better']} is better)"
             + (f"; best: **{table['best']}**." if table["best"] else "."))
    return intro + "\n\n" + "\n".join(lines)


def write(report_dir: Path, runs: dict, facts: dict, summary) -> list[Path]:
    """Write report.md and report.html (plots embedded) and the plots into report_dir; return the paths written.

    `runs`: the completed runs by label (calibrun.report.aggregate.Run)."""
    import matplotlib

    matplotlib.use("Agg")
    axis_plots = _axis_plots(report_dir, runs, facts)
    lab_plots = _lab_plots(report_dir, facts)
    calib = facts.get("calib")
    parts = ["# calibrun report", ""]
    if "table" in facts:
        parts += [verdict_line(facts["table"]), ""]
    if "table" in facts:
        parts += ["## Runs", "", _runs_section(facts["table"]), ""]
        parts += [f"![{p.stem}]({p.name})" for p in axis_plots] + [""]
    if facts.get("lab_runs"):
        parts += [f"![{p.stem}]({p.name})" for p in lab_plots] + [""]
        if calib:
            parts += [SECTIONS["calib"], "", _narrow_section(calib, facts["eval_span"], facts["narrow_zero_point"]),
                      ""]
            parts += [SECTIONS["wide"], "", _wide_section(calib, facts["eval_span"]), ""]
        else:
            parts += [SECTIONS["calib"], "", _missing(summary, "calib_report.json"), ""]
            parts += [SECTIONS["wide"], "", _missing(summary, "calib_report.json"), ""]
        samples = facts.get("samples")
        parts += [SECTIONS["samples"], "", _samples_section(samples) if samples else _missing(summary, "samples.json"),
                  ""]
        fmt = facts.get("format")
        parts += [SECTIONS["format"], "", _format_section(fmt) if fmt else _missing(summary, "format.json"), ""]
    else:
        parts += ["## The lab", "", "This sweep has none of the lab's runs (the lab model and data, calibration seed "
                  f"{lab.CALIB_SEED}, evaluation seed {lab.EVAL_SEED} on {lab.EVAL_ROWS} rows, minmax, default quant "
                  "options), so the lab's sections are left out: `python -m calibrun -m experiment=lab` runs them.",
                  ""]
    if "diagnosis" in facts:
        parts += ["## Diagnosis", "", _diagnosis_section(facts["diagnosis"]), ""]
    task = _task_section(runs)
    if task:
        parts += ["## Task accuracy", "", task, ""]
    if summary.failed:
        parts += ["## Failed jobs", ""] + [f"- {line}" for line in summary.failed] + [""]
    text = "\n".join(parts)
    path = report_dir / "report.md"
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    page = report_dir / "report.html"
    with atomic_path(page) as tmp:
        tmp.write_text(to_html(text, report_dir))
    return [*axis_plots, *lab_plots, path, page]


# --- report.html: report.md with its images embedded (MLflow's artifact viewer shows HTML, not linked images) ----

_STYLE = ("body{font-family:sans-serif;max-width:60em;margin:1em auto;padding:0 1em;line-height:1.4}"
          "table{border-collapse:collapse;margin:.5em 0;display:block;overflow-x:auto}"
          "td,th{border:1px solid #ccc;padding:.2em .5em}"
          "td{font-variant-numeric:tabular-nums}img{max-width:100%;margin:.5em 0}"
          "code{background:#f3f3f3;padding:0 .2em}")


def _embedded_image(self, tokens, idx, options, env) -> str:
    """markdown-it's image rule, with the PNG read from the report folder and embedded as base64."""
    token = tokens[idx]
    name, alt = token.attrGet("src") or "", self.renderInlineAsText(token.children or [], options, env)
    path = Path(env["folder"]) / name
    if not path.is_file():
        return f"[missing image {html.escape(name)}]"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def to_html(markdown: str, folder: Path) -> str:
    """report.md as one self-contained HTML page (CommonMark and tables, rendered by markdown-it-py; raw HTML in
    the text is escaped); images are read from `folder` and embedded as base64."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    md.add_render_rule("image", _embedded_image)
    body = md.render(markdown, {"folder": str(folder)})
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>calibrun report</title>'
            f"<style>{_STYLE}</style></head><body>\n" + body + "</body></html>\n")
