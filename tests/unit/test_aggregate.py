"""The aggregator for any sweep: runs keyed by their own overrides, runs.json, plots per swept axis, report.html,
the lab's runs picked by the lab's fixed settings, and bad sweep folders as one line (issue 12 item 2, issue 13
item 8).

These tests build sweep folders by hand (job folders as Hydra and calibrun.runner write them); the real sweeps
(subprocesses, real onnxruntime, trained models) are in tests/e2e/test_aggregate_sweeps.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from calibrun import lab
from calibrun.config import Config
from calibrun.core.errors import CalibrunError
from calibrun.report import aggregate
from calibrun.report import markdown as report

PNG = b"\x89PNG\r\n\x1a\n"


# --- sweep folders by hand --------------------------------------------------------------------------------------

def job_config(**changes) -> dict:
    """A job's composed config (the schema's defaults), with dotted `changes`; calibration name sets its factor."""
    cfg = OmegaConf.to_container(OmegaConf.structured(Config))
    cfg["calibration"].update(name="match", factor=1.0)
    cfg["method"]["chunk"] = 16
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = cfg
        for part in parents:
            node = node[part]
        node[last] = value
        if dotted == "calibration.name":
            cfg["calibration"]["factor"] = lab.FACTORS.get(value, 3.0)
    return cfg


FP32_BYTES = b"fp32 placeholder"
INT8_BYTES = b"not read by the aggregator for a run outside the lab"


def fake_job(sweep: Path, num: int, overrides: dict[str, str], error: float, *, config: dict | None = None,
             status: str = "ok", int8: bool = True, metrics: dict | None = None) -> Path:
    """A job folder: .hydra/overrides.yaml, config_resolved.yaml, result.json (and an int8.onnx placeholder)."""
    job = sweep / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"{k}={v}" for k, v in overrides.items()]))
    cfg = config or job_config(**{k if "." in k or k == "batches" else f"{k}.name": (int(v) if k == "batches" else v)
                                  for k, v in overrides.items() if k in ("calibration", "batches", "format", "method")})
    (job / "config_resolved.yaml").write_text(yaml.safe_dump(cfg))
    if status != "ok":
        (job / "result.json").write_text(json.dumps({"status": "failed", "error": "boom", "params": {}}))
        return job
    result = {
        "status": "ok",
        "params": {"calibration": cfg["calibration"]["name"], "batches": cfg["batches"],
                   "model_sha256": hashlib.sha256(FP32_BYTES).hexdigest()},
        "metrics": {"max_abs_error": error, "mean_abs_error": error / 4, "input_scale": 0.01, "span": 2.0,
                    "eval_span": 7.0, "input_zero_point": 0, "observed_span": 2.55, "quantize_nodes": 3,
                    "dequantize_nodes": 5, "model_bytes": 100, **(metrics or {})},
        "files": {"int8": "int8.onnx", "fp32": "fp32.onnx", "int8_sha256": hashlib.sha256(INT8_BYTES).hexdigest()},
        "eval_source": {"name": "lab", "seed": 777, "rows": 256},
        "ops": {"MatMul": 2},
    }
    (job / "result.json").write_text(json.dumps(result))
    (job / "fp32.onnx").write_bytes(FP32_BYTES)
    if int8:
        (job / "int8.onnx").write_bytes(INT8_BYTES)
    return job


@pytest.fixture
def method_sweep(tmp_path: Path) -> Path:
    """The README's `-m method=minmax,entropy,percentile calibration=wide`, with wide's factor: 3 runs that share
    calibration, batches and format (the old aggregator kept one of them)."""
    sweep = tmp_path / "sweep"
    for num, (method, error) in enumerate([("minmax", 0.33), ("entropy", 0.27), ("percentile", 0.31)]):
        fake_job(sweep, num, {"method": method, "calibration": "wide", "batches": "64"}, error,
                 config=job_config(**{"method.name": method, "calibration.name": "wide"}))
    return sweep


def test_method_sweep_report_holds_every_run_by_its_overrides(method_sweep):
    summary = aggregate.build(method_sweep)
    assert summary.ok == 3
    assert summary.failed == []
    assert summary.broken == []
    out = method_sweep / "report"
    runs = json.loads((out / "runs.json").read_text())
    assert runs["axes"] == {"method": ["minmax", "entropy", "percentile"]}
    assert [r["label"] for r in runs["runs"]] == ["method=minmax", "method=entropy", "method=percentile"]
    assert [r["metrics"]["max_abs_error"] for r in runs["runs"]] == [0.33, 0.27, 0.31]
    assert runs["headline"] == {"metric": "max_abs_error", "better": "lower"}
    assert runs["best"] == "method=entropy"
    # minmax/wide/64/qdq with the lab's fixed settings is a lab run; the other two are not
    assert [r["lab"] for r in runs["runs"]] == [True, False, False]
    text = (out / "report.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| ") and line.endswith(" ok |")]
    assert [line.split(" | ")[0] for line in table] == ["| minmax", "| entropy", "| percentile"]
    assert "| entropy | - | **0.27** |" in text  # these fixtures' results hold no verdict: "-"
    assert [r["verdict"] for r in runs["runs"]] == [None, None, None]
    assert text.splitlines()[2] == "**Verdict:** none of the 3 run(s) has a verdict."
    plot = out / "max_abs_error_vs_method.png"
    assert plot.read_bytes()[:8] == PNG
    assert f"![{plot.stem}]({plot.name})" in text
    assert {p.name for p in summary.files} >= {"runs.json", "report.md", "report.html", plot.name}
    assert all(p.parent == out and p.is_file() for p in summary.files)


def test_report_html_embeds_every_plot(method_sweep):
    aggregate.build(method_sweep)
    out = method_sweep / "report"
    page = (out / "report.html").read_text()
    sources = re.findall(r'<img alt="[^"]*" src="([^"]+)"', page)
    plots = sorted(out.glob("*.png"))
    assert len(sources) == len(plots) >= 1
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    assert base64.b64decode(sources[0].split(",", 1)[1]) == plots[0].read_bytes()
    assert "<table>" in page
    assert "<h2>Runs</h2>" in page
    assert "<strong>0.27</strong>" in page


def test_to_html_escapes_and_renders_the_markdown_report_md_uses(tmp_path):
    page = report.to_html("# T\n\nA <b> & **bold** `code` *it*\n\n- one\n- two\n\n| a | b |\n|---|---:|\n| x | 1 |\n"
                          "\n![gone](gone.png)\n", tmp_path)
    assert "<h1>T</h1>" in page
    assert "A &lt;b&gt; &amp; <strong>bold</strong> <code>code</code> <em>it</em>" in page
    assert "<ul>\n<li>one</li>\n<li>two</li>\n</ul>" in page
    assert '<th>a</th>\n<th style="text-align:right">b</th>' in page  # numbers right-aligned
    assert '<td>x</td>\n<td style="text-align:right">1</td>' in page
    assert "[missing image gone.png]" in page


def test_axes_plots_colour_by_another_axis(tmp_path):
    sweep = tmp_path / "sweep"
    num = 0
    for calibration in ("narrow", "wide"):
        for batches in ("1", "8", "64"):
            fake_job(sweep, num, {"calibration": calibration, "batches": batches, "method": "entropy"},
                     0.1 * (num + 1))
            num += 1
    aggregate.build(sweep)
    runs = json.loads((sweep / "report" / "runs.json").read_text())
    assert runs["axes"] == {"calibration": ["narrow", "wide"], "batches": ["1", "8", "64"]}
    assert len({r["label"] for r in runs["runs"]}) == 6
    for axis in ("calibration", "batches"):
        assert (sweep / "report" / f"max_abs_error_vs_{axis}.png").read_bytes()[:8] == PNG
    # no lab run (method entropy): no lab file, and the report says why
    assert not (sweep / "report" / "calib_report.json").exists()
    assert "none of the lab's runs" in (sweep / "report" / "report.md").read_text()
    # diagnosis: one sample trend per calibration, from the recorded eval span
    diagnosis = json.loads((sweep / "report" / "diagnosis.json").read_text())
    assert set(diagnosis["samples"]) == {"narrow", "wide"}
    assert diagnosis["samples"]["narrow"]["eval_span"] == 7.0


def test_task_metric_is_the_headline_when_every_run_has_it(tmp_path):
    sweep = tmp_path / "sweep"
    fake_job(sweep, 0, {"calibration": "narrow"}, 0.5, metrics={"top1_agreement": 0.9})
    fake_job(sweep, 1, {"calibration": "wide"}, 0.9, metrics={"top1_agreement": 0.95})
    aggregate.build(sweep)
    runs = json.loads((sweep / "report" / "runs.json").read_text())
    assert runs["headline"] == {"metric": "top1_agreement", "better": "higher"}
    assert runs["best"] == "calibration=wide"
    assert (sweep / "report" / "top1_agreement_vs_calibration.png").is_file()


def test_a_user_models_sweep_is_ranked_by_what_its_verdicts_were_decided_by(tmp_path):
    """Runs of a user's model judged by their worst output's SQNR (another output in each run) are ranked by it,
    not by max_abs_error (here the other way round); the lab model keeps max_abs_error; runs judged by different
    metrics, or one without a verdict, fall back to the old rule."""
    def worst(value: float, output: str) -> dict:
        return {"status": "ok" if value >= 20 else "broken", "metric": f"out.{output}.sqnr_db", "value": value,
                "goal": "max", "because": "..."}

    sweep = tmp_path / "sweep"
    user = {"model.name": "file", "model.path": "m.onnx"}
    for num, (name, error, db, output) in enumerate([("narrow", 0.1, 8.0, "boxes"), ("wide", 9.0, 31.0, "scores")]):
        job = fake_job(sweep, num, {"calibration": name}, error, metrics={f"out.{output}.sqnr_db": db,
                                                                           "worst_output_sqnr_db": db},
                       config=job_config(**{"calibration.name": name, **user}))
        result = json.loads((job / "result.json").read_text())
        (job / "result.json").write_text(json.dumps({**result, "verdict": worst(db, output)}))
    aggregate.build(sweep)
    runs = json.loads((sweep / "report" / "runs.json").read_text())
    assert runs["headline"] == {"metric": "worst_output_sqnr_db", "better": "higher"}
    assert runs["best"] == "calibration=wide"
    assert (sweep / "report" / "worst_output_sqnr_db_vs_calibration.png").is_file()
    metrics = [{"max_abs_error": 0.1}, {"max_abs_error": 9.0}]
    ranked = ("worst_output_sqnr_db", "higher")
    assert aggregate.headline_of(metrics, [ranked, ranked]) == ranked
    assert aggregate.headline_of(metrics, [ranked, None]) == ("max_abs_error", "lower")  # a lab run, or no verdict
    assert aggregate.headline_of(metrics, [ranked, ("task.cer", "lower")]) == ("max_abs_error", "lower")
    labelled = [{**m, "int8_accuracy": 0.9} for m in metrics]
    assert aggregate.headline_of(labelled, [ranked, ranked]) == ("int8_accuracy", "higher")  # labels first


# --- the lab's runs, by the lab's fixed settings ----------------------------------------------------------------

def test_lab_difference_names_the_setting_that_is_not_the_lab():
    assert lab.difference(job_config(**{"calibration.name": "narrow"})) is None
    assert lab.difference(job_config(**{"calibration.name": "narrow", "calibration.factor": 0.3})) == \
        "calibration.factor=0.3"
    assert lab.difference(job_config(**{"method.name": "entropy"})) == "method.name=entropy"
    assert lab.difference(job_config(**{"quant.per_channel": True})) == "quant.per_channel=True"
    assert lab.difference(job_config(**{"eval.rows": 64})) == "eval.rows=64"
    assert lab.difference(job_config(**{"calibration.seed": 1})) == "calibration.seed=1"
    assert lab.difference(job_config(**{"model.name": "file"})) == "model.name=file"
    assert lab.difference(job_config(**{"method.symmetric": False})) is None  # onnxruntime's minmax default


def test_lab_difference_accepts_the_composed_default_config():
    """What conf/ composes for calibration=narrow (method/minmax.yaml sets chunk 16, symmetric null) is the lab."""
    from hydra import compose, initialize_config_module

    from calibrun.config import register

    register()
    with initialize_config_module(config_module="calibrun.conf", version_base=None):
        for overrides, expected in [(["calibration=narrow"], None), (["experiment=lab", "batches=512"], None),
                                    (["method=percentile"], "method.name=percentile"),
                                    (["quant.reduce_range=true"], "quant.reduce_range=True")]:
            cfg = OmegaConf.to_container(compose(config_name="config", overrides=overrides), resolve=True)
            assert lab.difference(cfg) == expected, overrides


def test_clip_range_is_the_grid_of_the_activation_type():
    """The narrow/wide text names the lab's integer type and its range, read from one table (no hard-coded int8)."""
    from calibrun.quant.quantize import QUANT_TYPES

    assert set(report.INT_GRIDS) == set(QUANT_TYPES)  # a new activation type needs its grid here
    assert report.INT_GRIDS["QInt8"] == ("int8", -128, 127)
    assert report.INT_GRIDS["QUInt16"] == ("uint16", 0, 65535)
    assert report._clip_range(0.5, 10, report.INT_GRIDS["QUInt8"]) == (-5.0, 122.5)
    assert report._clip_range(0.5, 0, report.INT_GRIDS["QInt16"]) == (-16384.0, 16383.5)
    assert report.INT_GRIDS[lab.FIXED["quant.activation_type"]] == report.LAB_GRID


def test_lab_files_use_only_the_lab_runs_of_a_wider_sweep(tmp_path):
    """narrow/match/wide x minmax/entropy at 64 batches: calib_report.json is built from the minmax runs."""
    sweep = tmp_path / "sweep"
    errors = {}
    num = 0
    for method in ("minmax", "entropy"):
        for calibration in lab.CALIBRATIONS:
            error = round(0.1 + num * 0.05, 3)
            errors[(method, calibration)] = error
            cfg = job_config(**{"calibration.name": calibration, "method.name": method})
            fake_job(sweep, num, {"calibration": calibration, "method": method}, error, config=cfg)
            num += 1
    summary = aggregate.build(sweep)
    calib = json.loads((sweep / "report" / "calib_report.json").read_text())
    assert {c: calib[c]["max_abs_error"] for c in lab.CALIBRATIONS} == \
        {c: errors[("minmax", c)] for c in lab.CALIBRATIONS}
    assert calib["eval"] == {"seed": lab.EVAL_SEED, "rows": lab.EVAL_ROWS}
    assert (sweep / "report" / "bundle" / "int8_wide.onnx").read_bytes() == (sweep / "2" / "int8.onnx").read_bytes()
    assert set(summary.missing) == {"samples.json", "format.json"}
    assert len(json.loads((sweep / "report" / "runs.json").read_text())["runs"]) == 6


# --- bad sweep folders: one line, non-zero exit, nothing half-written -------------------------------------------

def run_main(capsys, *argv) -> tuple[int, str]:
    code = aggregate.main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_malformed_result_is_named_and_skipped(method_sweep, capsys):
    (method_sweep / "1" / "result.json").write_text('{"status": "ok", "metrics": ')
    (method_sweep / "2" / "result.json").write_text('{"status": "ok", "params": {}, "metrics": {}, "files": {}}')
    code, err = run_main(capsys, method_sweep)
    assert code == 1
    assert "Traceback" not in err
    assert "calibrun.report: error: job 1: unreadable result.json" in err
    assert "calibrun.report: error: job 2: result.json has no numeric metrics.max_abs_error" in err
    runs = json.loads((method_sweep / "report" / "runs.json").read_text())
    assert [r["job"] for r in runs["runs"]] == ["0"]


def test_missing_int8_of_an_ok_job_is_named_and_skipped(method_sweep, capsys):
    (method_sweep / "1" / "int8.onnx").unlink()
    code, err = run_main(capsys, method_sweep)
    assert code == 1
    assert re.search(r"job 1: result.json says ok but its int8 model \S+/1/int8.onnx is missing", err)
    assert "Traceback" not in err
    assert [r["job"] for r in json.loads((method_sweep / "report" / "runs.json").read_text())["runs"]] == ["0", "2"]


@pytest.mark.parametrize("kind", ["file", "foreign-folder"])
def test_bad_report_dir_is_one_line(method_sweep, tmp_path, capsys, kind):
    target = tmp_path / "target"
    if kind == "file":
        target.write_text("keep me")
    else:
        target.mkdir()
        (target / "notes.txt").write_text("keep me")
    code, err = run_main(capsys, method_sweep, f"report.dir={target}")
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert str(target) in err
    assert ("is a file" in err) if kind == "file" else ("not a calibrun report" in err)
    assert (target if kind == "file" else target / "notes.txt").read_text() == "keep me"


def test_a_failing_build_leaves_the_previous_report_whole(method_sweep, monkeypatch):
    aggregate.build(method_sweep)
    out = method_sweep / "report"
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken_write(*args, **kwargs):
        raise OSError("disk full")

    fake_job(method_sweep, 3, {"method": "distribution", "calibration": "wide", "batches": "64"}, 0.4)
    monkeypatch.setattr(report, "write", broken_write)
    with pytest.raises(OSError, match="disk full"):
        aggregate.build(method_sweep)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in method_sweep.iterdir()) == ["0", "1", "2", "3", "report"]  # no temp folder


def test_rebuild_replaces_the_previous_report(method_sweep):
    aggregate.build(method_sweep)
    (method_sweep / "report" / "stale.png").write_bytes(b"old")
    fake_job(method_sweep, 3, {"method": "distribution", "calibration": "wide", "batches": "64"}, 0.4)
    aggregate.build(method_sweep)
    assert not (method_sweep / "report" / "stale.png").exists()
    assert len(json.loads((method_sweep / "report" / "runs.json").read_text())["runs"]) == 4


def test_failed_jobs_are_listed_and_not_plotted(method_sweep):
    fake_job(method_sweep, 3, {"method": "distribution", "calibration": "wide", "batches": "64"}, 0, status="failed")
    summary = aggregate.build(method_sweep)
    assert summary.failed == ["job 3: boom"]
    assert summary.broken == []
    runs = json.loads((method_sweep / "report" / "runs.json").read_text())
    assert runs["runs"][3] == {"job": "3", "label": "method=distribution", "status": "failed", "lab": False,
                               "overrides": {"method": "distribution"},  # the swept ones
                               "error": "boom"}
    assert "| distribution | - | n/a |" in (method_sweep / "report" / "report.md").read_text()  # no verdict, no number


def test_missing_sweep_and_usage(tmp_path, capsys):
    code, err = run_main(capsys, tmp_path / "nope")
    assert code == 1
    assert err.strip() == f"calibrun.report: error: sweep folder not found: {tmp_path / 'nope'}"
    with pytest.raises(SystemExit) as exc:
        aggregate.main([str(tmp_path), "colour=red"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().startswith("calibrun.report: error: unknown option 'colour=red'")


# --- more folders by hand ---------------------------------------------------------------------------------------------

def test_report_dir_error_in_a_sweep_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(CalibrunError, match="is a file"):
        aggregate.build(tmp_path, tmp_path / "afile")


def test_runs_json_holds_no_timings(method_sweep):
    """runs.json compares what the runs measured: a resumed sweep's report equals a clean one's."""
    fake_job(method_sweep, 3, {"method": "distribution", "calibration": "wide", "batches": "64"}, 0.4,
             metrics={"calibration_seconds": 1.5, "quantization_seconds": 0.2, "cache_hit": 1})
    aggregate.build(method_sweep)
    row = json.loads((method_sweep / "report" / "runs.json").read_text())["runs"][3]
    assert "max_abs_error" in row["metrics"]
    assert not {"calibration_seconds", "quantization_seconds", "cache_hit"} & set(row["metrics"])


def test_resume_is_not_an_axis_nor_an_override(tmp_path):
    """A resumed sweep (some jobs launched with resume=true) reports exactly what a clean sweep reports."""
    sweep = tmp_path / "sweep"
    fake_job(sweep, 0, {"calibration": "narrow", "resume": "true"}, 0.5)
    fake_job(sweep, 1, {"calibration": "wide"}, 0.3)
    aggregate.build(sweep)
    runs = json.loads((sweep / "report" / "runs.json").read_text())
    assert runs["axes"] == {"calibration": ["narrow", "wide"]}
    assert [r["overrides"] for r in runs["runs"]] == [{"calibration": "narrow"}, {"calibration": "wide"}]


def test_lab_run_without_its_fp32_model_is_named_and_left_out(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for num, calibration in enumerate(lab.CALIBRATIONS):
        fake_job(sweep, num, {"calibration": calibration}, 0.1 * (num + 1))
    (sweep / "1" / "fp32.onnx").unlink()
    code, err = run_main(capsys, sweep)
    assert code == 1
    assert "job 1: its fp32 model" in err
    assert "Traceback" not in err
    assert not (sweep / "report" / "calib_report.json").exists()  # needs match, whose fp32 is gone
    assert not (sweep / "report" / "bundle").exists()
    assert len(json.loads((sweep / "report" / "runs.json").read_text())["runs"]) == 3


def test_a_sweep_without_completed_runs_is_one_line(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    fake_job(sweep, 0, {"calibration": "narrow"}, 0, status="failed")
    (sweep / "1").mkdir()  # a job killed before it wrote anything
    code, err = run_main(capsys, sweep)
    assert code == 1
    assert err.strip() == f"calibrun.report: error: no completed runs in {sweep} (no */result.json with status ok)"
    assert not (sweep / "report").exists()


def test_the_report_lists_a_basic_sweeps_runs_as_the_user_wrote_them_not_as_they_started(tmp_path):
    """calibrun.sweep_order starts the costliest calibration first (job 0 is entropy); the report keeps the order of
    the user's `method=minmax,percentile,entropy format=qdq,qoperator`, the format varying slowest."""
    sweep = tmp_path / "sweep"
    started = [("entropy", "qdq"), ("percentile", "qdq"), ("minmax", "qdq"), ("entropy", "qoperator"),
               ("percentile", "qoperator"), ("minmax", "qoperator")]
    for num, (method, fmt) in enumerate(started):
        fake_job(sweep, num, {"method": method, "format": fmt}, 0.1 + num / 100,  # per channel: not lab runs
                 config=job_config(**{"method.name": method, "format.name": fmt, "quant.per_channel": True}))
    multirun = {"hydra": {"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                                      "params": None},
                          "overrides": {"task": ["method=minmax,percentile,entropy", "format=qdq,qoperator"]}}}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(multirun))
    aggregate.build(sweep)
    runs = json.loads((sweep / "report" / "runs.json").read_text())
    assert [r["job"] for r in runs["runs"]] == ["2", "1", "0", "5", "4", "3"]
    assert runs["axes"] == {"method": ["minmax", "percentile", "entropy"], "format": ["qdq", "qoperator"]}
    # another sweeper (a search's trials): the job numbers' order
    multirun["hydra"]["sweeper"]["_target_"] = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(multirun))
    aggregate.build(sweep)
    runs = json.loads((sweep / "report" / "runs.json").read_text())
    assert [r["job"] for r in runs["runs"]] == ["0", "1", "2", "3", "4", "5"]


def test_the_report_s_diagnosis_table_gives_the_model_s_diagnosis_beside_the_input_s():
    """An entropy run whose input is sound clips inside (97% of its added noise): the table said "sound" alone."""
    from calibrun.report.markdown import _diagnosis_section

    run = {"verdict": "sound", "overall": "clipping", "max_abs_error": 0.5,
           "input": {"clipped_fraction": 0.0, "grid_used": 0.9, "sqnr_db": 40.0},
           "culprits": [{"tensor": "t", "node": "n", "verdict": "clipping", "noise_share": 0.97}]}
    floating = {**run, "verdict": "coarse", "input": None}
    table = _diagnosis_section({"runs": {"entropy": run, "float input": floating}, "samples": {}})
    rows = [line for line in table.splitlines() if line.startswith("| entropy") or line.startswith("| float input")]
    assert rows[0].split(" | ")[1:2] == ["**sound**"]
    assert rows[0].split(" | ")[5] == "clipping"
    assert rows[1].split(" | ")[1] == "- (not quantised)"


def test_a_sweeps_more_batches_rule_reads_through_the_states_its_runs_fed_back():
    """The aggregator's rule (more batches, the worst output) leaves out the outputs a run fed back as a state, as the
    job's verdict does: read from the run's config, a dotted input name nested as the config nests it."""
    from calibrun.report.aggregate import _streamed

    config = {"eval_data": {"inputs": {"input": {"1": {"from_output": "state:0"}}, "h": {"from_output": "hn"},
                                       "sr": {"value": 16000}}}}
    assert _streamed(config) == ("state_0", "hn")
    assert _streamed({"eval_data": {"inputs": {}}}) == _streamed({}) == ()
