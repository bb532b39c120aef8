"""Sweep -> report files + model bundle (docs/lab.md, "The report files").

    python -m calibrun.report SWEEP_DIR [report.dir=DIR]

Also run by the sweep callback at multirun end. For ANY sweep: `runs.json` and the report's *Runs* table (every
job, keyed by its own overrides, `.hydra/overrides.yaml`) and a plot of the headline metric against each swept
axis, and diagnosis.json (per-run verdicts from the jobs' diagnostics). The lab's files (calib_report.json,
match/narrow/wide.json, samples.json, format.json) are written when the sweep holds the lab's runs, picked by the
lab's fixed settings (calibrun.lab); a lab file whose runs are missing is skipped and the missing runs are named.
Numbers come from the jobs' result.json, measured on exactly the model files copied into the bundle, with two
exceptions that onnxruntime recomputes: format.json's QDQ-vs-QOperator output difference (both int8 models run on
the evaluation rows) and the evaluation data's span when a result.json did not record it (metrics.eval_span).
The report is built in a temp folder and renamed into place: it appears whole.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from calibrun import lab
from calibrun.core.errors import CalibrunError, one_line
from calibrun.core.files import RESULT_FILE, atomic_path, finite, remove_orphans, temp_name, write_json
from calibrun.measure import verdict
from calibrun.measure.sweep_diagnosis import run_diagnosis, sample_trend
from calibrun.result import JobResult
from calibrun.sweep_order import sweeper_lines, written_order

log = logging.getLogger("calibrun")

RUNS_FILE = "runs.json"
BUNDLE = "bundle"
# the headline metric: the first one every completed run has (task metrics first), and which way is better
HEADLINES = (("int8_accuracy", "higher"), ("top1_agreement", "higher"), ("max_abs_error", "lower"))
LAB_METRICS = ("span", "input_scale", "input_zero_point", "observed_span", "max_abs_error", "quantize_nodes",
               "dequantize_nodes", "model_bytes")
IGNORED_OVERRIDES = ("resume",)  # how a job was run, not what it measured (a resumed sweep equals a clean one)
REPORT_MARKERS = ("report.md", RUNS_FILE, "calib_report.json", BUNDLE)  # a folder holding one of these is a report


@dataclass
class Run:
    """One job of the sweep: its folder, result.json, own overrides and composed config."""

    job_dir: Path
    result: JobResult
    overrides: dict[str, str]
    config: dict
    cwd: Path | None = None  # the working directory the job ran in (relative paths in its record start there)
    label: str = ""

    @property
    def job(self) -> str:
        return self.job_dir.name

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def params(self) -> dict:
        return self.result.params

    @property
    def metrics(self) -> dict:
        return self.result.metrics

    def resolve(self, path: str | os.PathLike) -> Path:
        """A path from the job's record: absolute as it is; relative to the job folder, else to the folder the job
        ran in (result.json of earlier versions recorded cache paths relative to that)."""
        path = Path(path).expanduser()
        if path.is_absolute():
            return path
        for base in (self.job_dir, self.cwd):
            if base is not None and (base / path).exists():
                return base / path
        return self.job_dir / path

    def file(self, which: str) -> Path:
        return self.resolve(self.result.files[which])

    def cache_dir(self) -> Path | None:
        """The job's cache folder (cache.dir of its config, relative to the folder it ran in), or None."""
        configured = (self.config.get("cache") or {}).get("dir") if isinstance(self.config, dict) else None
        if not configured:
            return None
        path = Path(str(configured)).expanduser()
        if not path.is_absolute():
            if self.cwd is None:
                return None
            path = self.cwd / path
        return path

    def outside(self) -> str | None:
        """A path of the record that leads outside the job folder (int8 model, ranges, diagnostics) or outside the
        job folder and its cache (fp32 model): a record that names other files (`../../etc/passwd`) must not get
        them copied into the report's bundle or read into its files. What is wrong, or None."""
        allowed = {"int8": False, "ranges": False, "diagnostics": False, "fp32": True}
        for which, cache_too in allowed.items():
            value = self.result.files.get(which)
            if value is None:
                continue
            if not isinstance(value, str):
                return f"files.{which} is not a path"
            path = self.file(which).resolve()
            roots = [self.job_dir.resolve()] + ([self.cache_dir().resolve()] if cache_too and self.cache_dir()
                                                else [])
            if not any(path.is_relative_to(root) for root in roots):
                return (f"files.{which} {value!r} leads outside the job folder"
                        + (" and its cache" if cache_too else ""))
        return None

    def tampered(self) -> str | None:
        """A model the report would copy into its bundle whose bytes are not the ones its record gives (int8:
        files.int8_sha256, fp32: params.model_sha256). What is wrong, or None."""
        from calibrun.model import file_sha256

        for which, recorded in (("int8", self.result.files.get("int8_sha256")),
                                ("fp32", self.params.get("model_sha256"))):
            if which not in self.result.files:
                continue
            if not isinstance(recorded, str):
                return f"records no sha256 of its {which} model"
            path = self.file(which)
            if path.is_file() and file_sha256(path) != recorded:
                return f"its {which} model {path} does not have the sha256 its {RESULT_FILE} records"
        return None

    def lab_key(self) -> tuple[str, int, str]:
        cfg = self.config
        return cfg["calibration"]["name"], int(cfg["batches"]), cfg["format"]["name"]


@dataclass
class Summary:
    report_dir: Path
    ok: int = 0
    failed: list[str] = field(default_factory=list)  # a line per job that failed or could not be used
    files: list[Path] = field(default_factory=list)
    missing: dict[str, list[str]] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)  # the subset of `failed` the aggregator could not read


# --- reading a sweep --------------------------------------------------------------------------------------------

def _job_order(path: Path) -> tuple:
    name = path.parent.name
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when PyYAML has it: ~10x faster


def _load_yaml(path: Path):
    try:
        return yaml.load(path.read_text(), Loader=_YAML_LOADER)
    except (OSError, yaml.YAMLError):
        return None


def _overrides(job_dir: Path, result: JobResult) -> dict[str, str]:
    """The job's own overrides (`key=value`, `+`/`++` dropped, `resume` left out) from Hydra's record; without one
    (a folder not made by Hydra), the identity result.json holds."""
    listed = _load_yaml(job_dir / ".hydra" / "overrides.yaml")
    if isinstance(listed, list):
        pairs = {}
        for item in listed:
            key, sep, value = str(item).partition("=")
            key = key.lstrip("+")
            if sep and not key.startswith("~") and key not in IGNORED_OVERRIDES:
                pairs[key] = value
        return pairs
    p = result.params
    return {k: str(p[k]) for k in ("calibration", "batches", "format", "method") if k in p}


def _config(job_dir: Path, result: JobResult) -> dict:
    """The job's composed config as a plain dict: the resolved copy the job wrote, else Hydra's; else what
    result.json's params say."""
    for path in (job_dir / "config_resolved.yaml", job_dir / ".hydra" / "config.yaml"):
        cfg = _load_yaml(path)
        if isinstance(cfg, dict) and "calibration" in cfg:
            return cfg
    p = result.params
    return {
        "calibration": {"name": p.get("calibration"), "factor": p.get("factor"), "seed": p.get("seed")},
        "batches": p.get("batches"), "format": {"name": p.get("format")}, "method": {"name": p.get("method")},
        "model": {"name": p.get("model")}, "data": {"name": p.get("data")}, "eval_data": {"name": p.get("eval_data")},
        "eval": {"seed": p.get("eval_seed"), "rows": p.get("eval_rows")},
        "quant": {k.split(".", 1)[1]: v for k, v in p.items() if k.startswith("quant.")},
    }


def _runtime_cwd(job_dir: Path) -> Path | None:
    hydra_cfg = _load_yaml(job_dir / ".hydra" / "hydra.yaml")
    try:
        return Path(hydra_cfg["hydra"]["runtime"]["cwd"])
    except (TypeError, KeyError):
        return None


def load_runs(sweep_dir: Path) -> tuple[list[Run], list[str], list[str]]:
    """Every job with a result.json (completed or failed), and a line per failed job and per unusable job."""
    runs: list[Run] = []
    failed: list[str] = []
    broken: list[str] = []
    for path in sorted(sweep_dir.glob(f"*/{RESULT_FILE}"), key=_job_order):
        job_dir = path.parent
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            broken.append(f"job {job_dir.name}: unreadable {RESULT_FILE} ({one_line(exc)})")
            continue
        try:
            result = JobResult.from_json(record)
        except ValueError as exc:  # what makes it unusable (calibrun.result.JobResult's checks)
            broken.append(f"job {job_dir.name}: {RESULT_FILE} {exc}")
            continue
        run = Run(job_dir, result, _overrides(job_dir, result), _config(job_dir, result), _runtime_cwd(job_dir))
        outside = run.outside() if run.ok else None
        if outside is not None:
            broken.append(f"job {job_dir.name}: {RESULT_FILE} {outside} (run left out)")
            continue
        if run.ok and not run.file("int8").is_file():
            broken.append(f"job {job_dir.name}: {RESULT_FILE} says ok but its int8 model {run.file('int8')} is "
                          "missing (run skipped)")
            continue
        if not run.ok:
            failed.append(f"job {job_dir.name}: {result.error or 'failed'}")
        runs.append(run)
    written = _written_order(sweep_dir)
    if written is not None:  # the order the user wrote, not the one the jobs started in (calibrun.sweep_order)
        runs.sort(key=lambda run: written(run.overrides))
    return runs, failed, broken


def _written_order(sweep_dir: Path):
    """calibrun.sweep_order.written_order for a basic sweep's multirun.yaml; None for another sweeper (a search's
    trials keep their numbers' order) or without a readable one."""
    cfg = _load_yaml(sweep_dir / "multirun.yaml")
    try:
        sweeper = cfg["hydra"]["sweeper"]
        if not str(sweeper["_target_"]).endswith(".BasicSweeper"):
            return None
        return written_order(sweeper_lines(sweeper.get("params"), cfg["hydra"]["overrides"]["task"]))
    except (TypeError, KeyError, AttributeError):
        return None


def swept_axes(runs: list[Run]) -> dict[str, list[str]]:
    """Override keys whose value differs between jobs, in the order the jobs list them, with their values in order
    of first appearance."""
    order: list[str] = []
    values: dict[str, list[str]] = {}
    for run in runs:
        for key, value in run.overrides.items():
            if key not in values:
                order.append(key)
                values[key] = []
            if value not in values[key]:
                values[key].append(value)
    return {k: values[k] for k in order
            if len(values[k]) > 1 or any(k not in run.overrides for run in runs)}


def _set_labels(runs: list[Run], axes: dict[str, list[str]]) -> None:
    seen: dict[str, int] = {}
    for run in runs:
        keys = list(axes) or list(run.overrides)
        text = " ".join(f"{k}={run.overrides[k]}" for k in keys if k in run.overrides) or f"job {run.job}"
        seen[text] = seen.get(text, 0) + 1
        run.label = text if seen[text] == 1 else f"{text} (job {run.job})"


def headline(runs: list[Run]) -> tuple[str, str]:
    """(metric, 'lower'|'higher'): what ranks the sweep's completed runs (headline_of). A lab model's run has no
    verdict headline: the lab is read by max_abs_error (docs/lab.md)."""
    return headline_of([run.metrics for run in runs],
                       [None if (run.config.get("model") or {}).get("name") == "lab"
                        else verdict.headline(run.result.verdict, run.metrics) for run in runs])


def headline_of(metrics: list[dict], verdicts: list[tuple[str, str] | None] | None = None) -> tuple[str, str]:
    """The sweep's headline from its runs' metric dicts (result.json's, or the MLflow runs' of the parent run's
    summary) and each run's verdict headline (calibrun.measure.verdict.headline: None for a lab run or a run without
    a verdict): the accuracy against labels when every run has it; else the metric every run's verdict is decided
    by, when they share one (the worst output's SQNR counts as one: `worst_output_sqnr_db`); else top-1 agreement
    when every run has it; else max_abs_error. An output's max_abs_error over every output reads nothing on a
    model whose outputs are class ids or logits: the verdict's metric is what the run was judged by."""
    every = bool(metrics)
    if every and all(isinstance(m.get("int8_accuracy"), (int, float)) for m in metrics):
        return "int8_accuracy", "higher"
    if every and verdicts is not None and len(verdicts) == len(metrics) and None not in verdicts \
            and len(set(verdicts)) == 1:
        return verdicts[0]
    for metric, better in HEADLINES[1:]:
        if every and all(isinstance(m.get(metric), (int, float)) for m in metrics):
            return metric, better
    return "max_abs_error", "lower"


def job_key(job) -> tuple:
    """A job's place in the sweep: by its number (Hydra's job folder `0`, `1`, ...), names after numbers."""
    job = str(job)
    return (0, int(job), "") if job.isdigit() else (1, 0, job)


def best_of(candidates, better: str):
    """The one rule for "best" (the report's runs.json and the parent run's tags): the best finite headline
    value; on a tie, the first job of the sweep (the lowest job number). `candidates`: (value, job, item);
    returns the item, or None when no value is finite."""
    scored = [c for c in candidates if finite(c[0]) is not None]
    if not scored:
        return None
    sign = -1.0 if better == "higher" else 1.0
    return min(scored, key=lambda c: (sign * c[0], job_key(c[1])))[2]


# --- the report -------------------------------------------------------------------------------------------------

class _Report:
    def __init__(self, sweep_dir: Path, work_dir: Path, final_dir: Path):
        every, failed, broken = load_runs(sweep_dir)
        self.axes = swept_axes(every)
        _set_labels(every, self.axes)
        self.every = every
        self.runs = {run.label: run for run in every if run.ok}  # completed runs by label
        self.summary = Summary(final_dir, ok=len(self.runs), failed=failed + broken, broken=broken)
        self.dir = work_dir
        self.lab: dict[tuple, Run] = {}
        for run in self.runs.values():
            if lab.difference(run.config) is not None:
                continue
            missing = [k for k in LAB_METRICS if not isinstance(run.metrics.get(k), (int, float))]
            if missing or run.result.eval_source is None or "fp32" not in run.result.files:
                line = f"job {run.job}: {RESULT_FILE} lacks {', '.join(missing) or 'eval_source/files.fp32'}"
            elif not run.file("fp32").is_file():
                line = f"job {run.job}: its fp32 model {run.file('fp32')} is missing (left out of the lab files)"
            else:
                line = run.tampered()
                line = line and f"job {run.job}: {line} (left out of the lab files)"
            if line is not None:
                self.summary.failed.append(line)
                self.summary.broken.append(line)
                continue
            key = run.lab_key()
            if key in self.lab:
                log.warning("%s appears twice in the sweep; the lab files use job %s", lab.label(*key),
                            self.lab[key].job)
                continue
            self.lab[key] = run

    def need(self, name: str, keys: list[tuple]) -> list[Run] | None:
        missing = [lab.label(*k) for k in keys if k not in self.lab]
        if missing and not self.lab:  # not a lab sweep at all: nothing to say at info level
            log.debug("report: no lab runs in this sweep, %s not written", name)
            return None
        if missing:
            self.summary.missing[name] = missing
            log.warning("report: skipping %s, missing runs: %s", name, "; ".join(missing))
            return None
        return [self.lab[k] for k in keys]

    def write(self, name: str, obj: dict) -> None:
        path = self.dir / name
        write_json(path, obj)
        self.summary.files.append(path)

    def bundle(self, run: Run, which: str, name: str) -> None:
        source = run.file(which)
        if not source.is_file():
            raise CalibrunError(f"job {run.job}: {source} is missing ({which} model named in its {RESULT_FILE})")
        target = self.dir / BUNDLE / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(target, suffix=".onnx") as tmp:
            shutil.copyfile(source, tmp)


def _row(run: Run, *keys: str) -> dict:
    values = {"batches": int(run.config["batches"]), **run.metrics}
    return {k: values[k] for k in keys}


def _check_report_dir(report_dir: Path) -> None:
    if report_dir.exists() and not report_dir.is_dir():
        raise CalibrunError(f"report.dir {report_dir} is a file, not a folder")
    if report_dir.is_dir() and any(report_dir.iterdir()) and not any((report_dir / m).exists()
                                                                      for m in REPORT_MARKERS):
        raise CalibrunError(f"report.dir {report_dir} is a folder with other files (not a calibrun report): "
                            "choose an empty or new folder")
    parent = report_dir.parent
    if parent.exists() and not parent.is_dir():
        raise CalibrunError(f"report.dir {report_dir}: {parent} is a file, not a folder")


def build(sweep_dir: str | Path, report_dir: str | Path | None = None) -> Summary:
    """Write every report file the sweep has runs for; return what was written, skipped and failed.

    The report is written into a temp folder beside `report_dir` and renamed onto it when complete, so a failure
    (or a kill) leaves the previous report or none, never a half-filled one."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise CalibrunError(f"sweep folder not found: {sweep_dir}")
    final = Path(report_dir) if report_dir else sweep_dir / "report"
    _check_report_dir(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CalibrunError(f"report.dir {final}: cannot create {final.parent}: {exc.strerror or exc}") from exc
    remove_orphans(final.parent)  # a report build that was killed left its temp folder there
    work = temp_name(final, ".tmp")
    try:
        work.mkdir()
    except OSError as exc:
        raise CalibrunError(f"report.dir {final}: cannot write in {final.parent}: {exc.strerror or exc}") from exc
    try:
        summary = _build_into(sweep_dir, work, final)
        if summary.ok:
            _swap(work, final)
            summary.files = [final / p.relative_to(work) for p in summary.files]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return summary


def _swap(work: Path, final: Path) -> None:
    """Rename `work` onto `final` (replacing an earlier report)."""
    old = None
    if final.exists():
        old = temp_name(final, ".old.tmp")
        os.rename(final, old)
    try:
        os.rename(work, final)
    except OSError:
        if old is not None:
            os.rename(old, final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _build_into(sweep_dir: Path, work: Path, final: Path) -> Summary:
    from calibrun.report import markdown as report

    r = _Report(sweep_dir, work, final)
    if not r.runs:
        log.debug("report: no completed runs in %s (no */%s with status ok)", sweep_dir, RESULT_FILE)
        return r.summary
    facts: dict = {"axes": r.axes, "lab_runs": r.lab}
    metric, better = headline(list(r.runs.values()))
    facts["headline"] = {"metric": metric, "better": better}
    table = _runs_table(r, metric, better)
    r.write(RUNS_FILE, table)
    facts["table"] = table

    calib_runs = r.need("calib_report.json", [(c, lab.MAIN_BATCHES, "qdq") for c in lab.CALIBRATIONS])
    if calib_runs:
        narrow, match, wide = calib_runs
        r.bundle(match, "fp32", "fp32.onnx")
        for name, run in zip(lab.CALIBRATIONS, calib_runs, strict=True):
            r.bundle(run, "int8", f"int8_{name}.onnx")
        r.write("match.json", _row(match, "span", "batches", "input_scale", "input_zero_point", "observed_span",
                                   "quantize_nodes", "dequantize_nodes"))
        for name, run in (("narrow", narrow), ("wide", wide)):
            r.write(f"{name}.json", {**_row(run, "span", "batches", "input_scale", "observed_span", "max_abs_error"),
                                     "match_max_abs_error": match.metrics["max_abs_error"]})
        errors = {name: run.metrics["max_abs_error"] for name, run in zip(lab.CALIBRATIONS, calib_runs, strict=True)}
        calib = {
            "eval": {"seed": int(match.config["eval"]["seed"]), "rows": int(match.config["eval"]["rows"])},
            **{name: _row(run, "span", "input_scale", "observed_span", "max_abs_error")
               for name, run in zip(lab.CALIBRATIONS, calib_runs, strict=True)},
            "best": min(errors, key=errors.get),
            "clipping_worse_than_coarse": errors["narrow"] > errors["wide"],
        }
        r.write("calib_report.json", calib)
        facts["calib"] = calib
        facts["eval_span"] = _eval_span(match)
        facts["narrow_zero_point"] = int(narrow.metrics["input_zero_point"])
        facts["factors"] = {name: float(run.config["calibration"]["factor"])
                            for name, run in zip(lab.CALIBRATIONS, calib_runs, strict=True)}

    samples = r.need("samples.json", [("narrow", b, "qdq") for b in lab.SAMPLE_BATCHES]
                     + [("match", lab.SMALL_BATCHES, "qdq")])
    if samples:
        *narrow_runs, match_small = samples
        for run in narrow_runs:
            r.bundle(run, "int8", f"samples/narrow_n{run.lab_key()[1]}.onnx")
        r.bundle(match_small, "int8", f"samples/match_n{lab.SMALL_BATCHES}.onnx")
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

    formats = r.need("format.json", [("match", lab.MAIN_BATCHES, "qdq"), ("match", lab.MAIN_BATCHES, "qoperator")])
    if formats:
        qdq, qop = formats
        r.bundle(qdq, "fp32", "fp32.onnx")
        r.bundle(qdq, "int8", "int8_match.onnx")
        r.bundle(qop, "int8", "int8_qop.onnx")
        difference = _format_difference(qdq, qop)
        fmt = {
            "qdq": {"bytes": int(qdq.metrics["model_bytes"]), "ops": qdq.result.ops,
                    "max_abs_error": qdq.metrics["max_abs_error"]},
            "qoperator": {"bytes": int(qop.metrics["model_bytes"]), "ops": qop.result.ops,
                          "max_abs_error": qop.metrics["max_abs_error"]},
            "same_input_scale": qdq.metrics["input_scale"] == qop.metrics["input_scale"],
            "max_abs_difference": difference,
            "difference_vs_error": difference / qdq.metrics["max_abs_error"],
        }
        r.write("format.json", fmt)
        facts["format"] = fmt

    facts["diagnosis"] = _diagnosis(r)
    r.write("diagnosis.json", facts["diagnosis"])
    r.summary.files.extend(report.write(work, r.runs, facts, r.summary))
    return r.summary


def _runs_table(r: _Report, metric: str, better: str) -> dict:
    """runs.json: every job of the sweep by its swept overrides, its headline metric and the main numbers."""
    rows = []
    for run in r.every:
        swept = {k: v for k, v in run.overrides.items() if k in r.axes}  # (the rest: the job's .hydra/overrides.yaml)
        row = {"job": run.job, "label": run.label, "overrides": swept, "status": run.result.status,
               "lab": run.ok and lab.difference(run.config) is None}
        if run.ok:
            row["verdict"] = (run.result.verdict or {}).get("status")  # ok | degraded | broken | None
        if run.ok:  # what the run measured; timings and cache hits (not the model's) stay in result.json and MLflow
            row["metrics"] = {k: v for k, v in run.metrics.items()
                              if isinstance(v, (int, float)) and not k.endswith("_seconds") and k != "cache_hit"}
        else:
            row["error"] = run.result.error or "failed"
        rows.append(row)
    best = best_of([(run.metrics.get(metric), run.job, run.label) for run in r.runs.values()], better)
    return {"axes": r.axes, "headline": {"metric": metric, "better": better}, "best": best, "runs": rows}


def _diagnosis(r: _Report) -> dict:
    """diagnosis.json: a verdict per run, and per group of QDQ runs that differ only in batches whether more samples
    would help (calibrun.measure.sweep_diagnosis)."""
    runs = {}
    for label, run in r.runs.items():
        table_file = run.result.files.get("diagnostics")
        table = json.loads((run.job_dir / table_file).read_text()) if table_file else None
        cfg = run.config
        runs[label] = {"calibration": cfg["calibration"]["name"], "batches": cfg["batches"],
                       "format": cfg["format"]["name"], **run_diagnosis(run.result.to_json(), table)}
    groups: dict[str, list[Run]] = {}
    for run in r.runs.values():
        if run.config["format"]["name"] != "qdq":
            continue
        rest = {k: v for k, v in run.overrides.items() if k in r.axes and k not in ("batches", "format")}
        name = rest["calibration"] if list(rest) == ["calibration"] else " ".join(f"{k}={v}" for k, v in rest.items())
        groups.setdefault(name or "all", []).append(run)
    samples = {}
    for name, group in sorted(groups.items()):
        if len({int(run.config["batches"]) for run in group}) < 2:
            continue
        points = [(int(run.config["batches"]) * int(run.params.get("rows_per_batch", lab.ROWS_PER_BATCH)),
                   run.metrics["span"]) for run in group if "span" in run.metrics]
        try:
            samples[name] = sample_trend(points, _eval_span(group[0]))
        except Exception as exc:  # the evaluation data moved or is gone: the trend needs its span
            log.warning("report: no sample trend for %s: %s", name, one_line(exc))
            continue
        if samples[name]["more_samples_help"]:
            advice = _more_batches(group)
            if advice is not None:
                samples[name]["recommendation"] = advice
    return {"runs": runs, "samples": samples}


def _streamed(config: dict) -> tuple[str, ...]:
    """The outputs a run fed back as a state (`eval_data.inputs.<name>.from_output`), as metric keys name them."""
    from calibrun.config import INPUT_KEYS
    from calibrun.data.inputs import named
    from calibrun.measure.errors import metric_key

    given = named((config.get("eval_data") or {}).get("inputs") or {}, INPUT_KEYS)
    return tuple(metric_key(conf["from_output"]) for conf in given.values()
                 if isinstance(conf, dict) and isinstance(conf.get("from_output"), str))


def _more_batches(group: list[Run]) -> dict | None:
    """When the trend says more samples help: the sweep's own measurement of it, the verdict's metric of the run
    with the most batches against the one with the fewest, offered only when it is better."""
    ordered = sorted(group, key=lambda run: int(run.config["batches"]))
    fewest, most = ordered[0], ordered[-1]
    rule = verdict.rule_for(most.metrics, streamed=_streamed(most.config))
    if rule is None:
        return None
    before, after = rule.value(fewest.metrics), rule.value(most.metrics)
    sign = 1.0 if rule.goal == "max" else -1.0
    if not (math.isfinite(before) and math.isfinite(after)) or sign * (after - before) <= 0:
        return None
    return {"change": f"batches={most.config['batches']}", "metric": rule.metric, "before": before, "after": after,
            "status_after": rule.status(after, most.metrics), "measured_by": [fewest.label, most.label]}


def _evaluation(run: Run):
    """The job's evaluation rows, rebuilt from what its result.json recorded, and its fp32 model."""
    from calibrun.data import evaluation_data
    from calibrun.model import open_float_model

    fp32 = open_float_model(run.file("fp32"))
    source = dict(run.result.eval_source)
    if source.get("path"):
        source["path"] = str(run.resolve(source["path"]))
    return fp32, evaluation_data(source, fp32, int(source["seed"]), int(source["rows"]))


def _eval_span(run: Run) -> float:
    """max - min of the primary input's evaluation rows, on which the errors were measured: recorded by the job
    (metrics.eval_span), else recomputed from its evaluation data."""
    recorded = run.metrics.get("eval_span")
    if isinstance(recorded, (int, float)):
        return float(recorded)
    fp32, evaluation = _evaluation(run)
    rows = evaluation.feeds[fp32.info.name]
    return float(rows.max() - rows.min())


def _format_difference(qdq: Run, qop: Run) -> float:
    """max |qdq output - qoperator output| on the evaluation rows."""
    from calibrun.measure import errors as measure
    from calibrun.measure.errors import max_abs_difference

    fp32, evaluation = _evaluation(qdq)
    feeds = evaluation.feeds
    a = measure.outputs(qdq.file("int8"), fp32, feeds, axes=evaluation.axes)
    b = measure.outputs(qop.file("int8"), fp32, feeds, axes=evaluation.axes)
    return max_abs_difference(a, b)


# --- the command ------------------------------------------------------------------------------------------------

DESCRIPTION = """\
Build (or rebuild) the report of a calibrun sweep from its job folders. Writes into SWEEP_DIR/report (or DIR):
runs.json and report.md/report.html (every run by its overrides, plots of the headline metric against each swept
axis), diagnosis.json, and when the sweep holds the lab's runs (python -m calibrun -m experiment=lab) the lab's
files calib_report.json, match/narrow/wide.json, samples.json, format.json with the model bundle."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints the usage as well)
        print(f"calibrun.report: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m calibrun.report", description=DESCRIPTION,
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="example: python -m calibrun.report multirun/2026-11-30/10-00-00 report.dir=/tmp/r")
    parser.add_argument("sweep_dir", metavar="SWEEP_DIR", help="a sweep folder (multirun/<date>/<time>)")
    parser.add_argument("options", nargs="*", metavar="report.dir=DIR",
                        help="where to write the report (default SWEEP_DIR/report)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    report_dir = None
    for option in args.options:
        key, sep, value = option.partition("=")
        if key != "report.dir" or not sep or not value:
            _parser().error(f"unknown option {option!r}: only report.dir=DIR")
        report_dir = value
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        summary = build(args.sweep_dir, report_dir)
    except Exception as exc:  # one line, no traceback: bad folders, unreadable files, library errors
        if os.environ.get("CALIBRUN_DEBUG"):
            raise
        print(f"calibrun.report: error: {one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    for line in summary.broken:
        print(f"calibrun.report: error: {line}", file=sys.stderr)
    if not summary.ok:
        print(f"calibrun.report: error: no completed runs in {args.sweep_dir} (no */{RESULT_FILE} with status ok)",
              file=sys.stderr)
        return 1
    for path in summary.files:
        print(path)
    for name, missing in summary.missing.items():
        print(f"skipped {name}: missing {'; '.join(missing)}", file=sys.stderr)
    return 1 if summary.broken else 0


if __name__ == "__main__":
    sys.exit(main())

# --- config: this concept's options (the `report` node; calibrun.config assembles the schema) ---

@dataclass
class ReportConf:
    dir: str | None = None  # None: SWEEP_DIR/report
