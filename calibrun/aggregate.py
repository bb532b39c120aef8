"""Sweep -> report files + model bundle (DESIGN.md section 1, "The report files").

    python -m calibrun.aggregate SWEEP_DIR [report.dir=DIR]

Also run by the sweep callback at multirun end. Each report file is written only when the sweep holds
every run it needs; otherwise it is skipped and the missing runs are named. Numbers come from the jobs'
result.json, which were measured on exactly the model files copied into the bundle.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from calibrun import datasets, engine
from calibrun.diagnosis import run_diagnosis, sample_trend
from calibrun.errors import CalibrunError
from calibrun.files import atomic_path, remove_orphans, write_json
from calibrun.measure import max_abs_difference
from calibrun.runner import RESULT_FILE

log = logging.getLogger("calibrun")

MAIN_BATCHES = 64
SAMPLE_BATCHES = (1, 8, 64, 512)
SMALL_BATCHES = 8
CALIBRATIONS = ("narrow", "match", "wide")
BUNDLE = "bundle"


@dataclass(frozen=True)
class Run:
    job_dir: Path
    result: dict

    @property
    def params(self) -> dict:
        return self.result["params"]

    @property
    def metrics(self) -> dict:
        return self.result["metrics"]

    def file(self, which: str) -> Path:
        path = Path(self.result["files"][which])
        return path if path.is_absolute() else self.job_dir / path


@dataclass
class Summary:
    report_dir: Path
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    missing: dict[str, list[str]] = field(default_factory=dict)


def _label(calibration: str, batches: int, fmt: str) -> str:
    return f"calibration={calibration} batches={batches} format={fmt}"


def load_runs(sweep_dir: Path) -> tuple[dict[tuple, Run], list[str]]:
    """Completed runs by (calibration, batches, format), and a line per failed job."""
    runs: dict[tuple, Run] = {}
    failed: list[str] = []
    results = sorted(sweep_dir.glob(f"*/{RESULT_FILE}"), key=lambda p: (len(p.parent.name), p.parent.name))
    for path in results:
        try:
            result = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            failed.append(f"job {path.parent.name}: unreadable {RESULT_FILE} ({exc})")
            continue
        if result.get("status") != "ok":
            failed.append(f"job {path.parent.name}: {result.get('error', 'failed')}")
            continue
        p = result["params"]
        key = (p["calibration"], int(p["batches"]), p["format"])
        if key in runs:
            log.warning("%s appears twice in the sweep; the report uses job %s", _label(*key), runs[key].job_dir.name)
            continue
        runs[key] = Run(path.parent, result)
    return runs, failed


class _Report:
    def __init__(self, sweep_dir: Path, report_dir: Path):
        self.runs, failed = load_runs(sweep_dir)
        self.summary = Summary(report_dir, ok=len(self.runs), failed=failed)
        self.dir = report_dir

    def need(self, name: str, keys: list[tuple]) -> list[Run] | None:
        missing = [_label(*k) for k in keys if k not in self.runs]
        if missing:
            self.summary.missing[name] = missing
            log.warning("report: skipping %s, missing runs: %s", name, "; ".join(missing))
            return None
        return [self.runs[k] for k in keys]

    def write(self, name: str, obj: dict) -> None:
        path = self.dir / name
        write_json(path, obj)
        self.summary.files.append(path)

    def bundle(self, run: Run, which: str, name: str) -> None:
        target = self.dir / BUNDLE / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(target, suffix=".onnx") as tmp:
            shutil.copyfile(run.file(which), tmp)


def _row(run: Run, *keys: str) -> dict:
    m = run.metrics
    values = {"batches": int(run.params["batches"]), **m}
    return {k: values[k] for k in keys}


def build(sweep_dir: str | Path, report_dir: str | Path | None = None) -> Summary:
    """Write every report file the sweep has runs for; return what was written, skipped and failed."""
    from calibrun import report

    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise CalibrunError(f"sweep folder not found: {sweep_dir}")
    report_dir = Path(report_dir) if report_dir else sweep_dir / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    for folder in (report_dir, report_dir / BUNDLE, report_dir / BUNDLE / "samples"):
        remove_orphans(folder)  # left by a report build that was killed
    r = _Report(sweep_dir, report_dir)
    if not r.runs:
        log.error("report: no completed runs in %s (no */%s with status ok)", sweep_dir, RESULT_FILE)
        return r.summary
    facts: dict = {}

    lab = r.need("calib_report.json", [(c, MAIN_BATCHES, "qdq") for c in CALIBRATIONS])
    if lab:
        narrow, match, wide = lab
        r.bundle(match, "fp32", "fp32.onnx")
        for name, run in zip(CALIBRATIONS, lab, strict=True):
            r.bundle(run, "int8", f"int8_{name}.onnx")
        r.write("match.json", _row(match, "span", "batches", "input_scale", "input_zero_point", "observed_span",
                                   "quantize_nodes", "dequantize_nodes"))
        for name, run in (("narrow", narrow), ("wide", wide)):
            r.write(f"{name}.json", {**_row(run, "span", "batches", "input_scale", "observed_span", "max_abs_error"),
                                     "match_max_abs_error": match.metrics["max_abs_error"]})
        errors = {name: run.metrics["max_abs_error"] for name, run in zip(CALIBRATIONS, lab, strict=True)}
        calib = {
            "eval": {"seed": int(match.params["eval_seed"]), "rows": int(match.params["eval_rows"])},
            **{name: _row(run, "span", "input_scale", "observed_span", "max_abs_error")
               for name, run in zip(CALIBRATIONS, lab, strict=True)},
            "best": min(errors, key=errors.get),
            "clipping_worse_than_coarse": errors["narrow"] > errors["wide"],
        }
        r.write("calib_report.json", calib)
        facts["calib"] = calib
        facts["eval_span"] = _eval_span(match)
        facts["narrow_zero_point"] = int(narrow.metrics["input_zero_point"])
        facts["factors"] = {name: float(run.params["factor"]) for name, run in zip(CALIBRATIONS, lab, strict=True)}

    samples = r.need("samples.json", [("narrow", b, "qdq") for b in SAMPLE_BATCHES]
                     + [("match", SMALL_BATCHES, "qdq")])
    if samples:
        *narrow_runs, match_small = samples
        for run in narrow_runs:
            r.bundle(run, "int8", f"samples/narrow_n{run.params['batches']}.onnx")
        r.bundle(match_small, "int8", f"samples/match_n{SMALL_BATCHES}.onnx")
        rows = [_row(run, "batches", "span", "input_scale", "observed_span", "max_abs_error") for run in narrow_runs]
        best = min(row["max_abs_error"] for row in rows)
        small = _row(match_small, "batches", "span", "input_scale", "observed_span", "max_abs_error")
        sample_report = {
            "narrow_runs": rows,
            "match_small": small,
            "narrow_best": best,
            "narrow_gain": rows[0]["max_abs_error"] / best,
            "beats_narrow": small["max_abs_error"] < rows[-1]["max_abs_error"],
        }
        r.write("samples.json", sample_report)
        facts["samples"] = sample_report

    formats = r.need("format.json", [("match", MAIN_BATCHES, "qdq"), ("match", MAIN_BATCHES, "qoperator")])
    if formats:
        qdq, qop = formats
        r.bundle(qdq, "fp32", "fp32.onnx")
        r.bundle(qdq, "int8", "int8_match.onnx")
        r.bundle(qop, "int8", "int8_qop.onnx")
        difference = _format_difference(qdq, qop)
        fmt = {
            "qdq": {"bytes": int(qdq.metrics["model_bytes"]), "ops": qdq.result["ops"],
                    "max_abs_error": qdq.metrics["max_abs_error"]},
            "qoperator": {"bytes": int(qop.metrics["model_bytes"]), "ops": qop.result["ops"],
                          "max_abs_error": qop.metrics["max_abs_error"]},
            "same_input_scale": qdq.metrics["input_scale"] == qop.metrics["input_scale"],
            "max_abs_difference": difference,
            "difference_vs_error": difference / qdq.metrics["max_abs_error"],
        }
        r.write("format.json", fmt)
        facts["format"] = fmt

    facts["diagnosis"] = _diagnosis(r)
    r.write("diagnosis.json", facts["diagnosis"])
    r.summary.files.extend(report.write(report_dir, r.runs, facts, r.summary))
    return r.summary


def _diagnosis(r: _Report) -> dict:
    """diagnosis.json: a verdict per run, and per calibration with several batch counts whether more samples
    would help (calibrun.diagnosis)."""
    runs = {}
    for (calibration, batches, fmt), run in r.runs.items():
        table_file = run.result["files"].get("diagnostics")
        table = json.loads((run.job_dir / table_file).read_text()) if table_file else None
        runs[_label(calibration, batches, fmt)] = {"calibration": calibration, "batches": batches, "format": fmt,
                                                   **run_diagnosis(run.result, table)}
    samples = {}
    by_calibration: dict[str, list[Run]] = {}
    for (calibration, _, fmt), run in r.runs.items():
        if fmt == "qdq":
            by_calibration.setdefault(calibration, []).append(run)
    for calibration, group in sorted(by_calibration.items()):
        if len(group) < 2:
            continue
        points = [(int(run.params["batches"]) * int(run.params.get("rows_per_batch", 16)), run.metrics["span"])
                  for run in group]
        samples[calibration] = sample_trend(points, _eval_span(group[0]))
    return {"runs": runs, "samples": samples}


def _evaluation(run: Run):
    """The job's evaluation rows, rebuilt from what its result.json recorded, and its fp32 model."""
    fp32 = engine.open_float_model(run.file("fp32"))
    source = run.result["eval_source"]
    return fp32, datasets.evaluation_data(source, fp32, int(source["seed"]), int(source["rows"]))


def _eval_span(run: Run) -> float:
    """max - min of the primary input's evaluation rows, on which the errors were measured."""
    fp32, evaluation = _evaluation(run)
    rows = evaluation.feeds[fp32.info.name]
    return float(rows.max() - rows.min())


def _format_difference(qdq: Run, qop: Run) -> float:
    """max |qdq output - qoperator output| on the evaluation rows."""
    fp32, evaluation = _evaluation(qdq)
    a = engine.outputs(qdq.file("int8"), fp32, evaluation.feeds)
    b = engine.outputs(qop.file("int8"), fp32, evaluation.feeds)
    return max_abs_difference(a, b)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    report_dir = None
    positional = []
    for arg in argv:
        if arg.startswith("report.dir="):
            report_dir = arg.split("=", 1)[1]
        else:
            positional.append(arg)
    if len(positional) != 1:
        print("usage: python -m calibrun.aggregate SWEEP_DIR [report.dir=DIR]", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        summary = build(positional[0], report_dir)
    except CalibrunError as exc:
        print(f"calibrun.aggregate: error: {exc}", file=sys.stderr)
        return 1
    if not summary.ok:
        print(f"calibrun.aggregate: error: no completed runs in {positional[0]}", file=sys.stderr)
        return 1
    for path in summary.files:
        print(path)
    for name, missing in summary.missing.items():
        print(f"skipped {name}: missing {'; '.join(missing)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
