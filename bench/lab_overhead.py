"""What the calibrun lab sweep costs on top of bare onnxruntime: the same 24 quantisations, side by side.

    .venv/bin/python bench/lab_overhead.py              # full: 3 repeats + 3 breakdown sweeps (~3-5 min)
    .venv/bin/python bench/lab_overhead.py --quick      # 1 repeat, no breakdown sweeps (~1 min)
    .venv/bin/python bench/lab_overhead.py --repeat 5
    .venv/bin/python bench/lab_overhead.py --root /tmp/proto --sweep-only   # time another checkout (a prototype,
                                                                             # or a snapshot of a tree in flux)

The work: 3 calibrations (narrow 0.2, match 1.0, wide 10.0) x batches 1, 8, 64, 512 x formats QDQ/QOperator =
24 int8 models of the lab MLP (onnxruntime `quantize_static`, QInt8/QInt8, MinMax), each evaluated against
fp32 on `default_rng(777).normal(0, 1, (256, 16))` -- the lab rules of DESIGN.md section 1.

Timed side by side in one run (repeats interleaved, medians reported):

(1)  sweep    `python -m calibrun -m +experiment=lab hydra.sweep.dir=TMP/sweep-i cache.dir=TMP/cache-i` with
              MLFLOW_TRACKING_URI=sqlite:///TMP/mlflow.db, as users run it: the whole process. The MLflow
              store is warm (a 1-job sweep against the same database runs first, so schema creation is not
              counted); every timed sweep gets a fresh cache folder, so its 12 calibrations really run.
(1b) notrack  the same sweep with `tracking=off`: splits MLflow from Hydra + aggregation.
(1c) nomodel  the same sweep with `tracking.log_model=false`: what the 24 MLflow LoggedModels cost.
(2)  bare     the same 24 quantisations + evaluations with bare onnxruntime in one process (calibration data
              rebuilt by the DESIGN.md rule, a list-backed CalibrationDataReader, `quantize_static`, two
              InferenceSessions per model). No calibrun import in that process: the fp32 model file is
              written beforehand with `calibrun.model.build_lab_model`. Reported twice: the loop in-process,
              and the whole subprocess including interpreter start and imports.
(3)  engine   `calibrun.engine.quantize_lab` + `calibrun.engine.error` for the same 24 combos (fresh cache
              folder: 12 calibrations, 12 cache hits), no Hydra, no MLflow; in-process and whole process.

Each process is timed in wall seconds and in CPU seconds (user + sys of all its threads, from wait4); on a
shared machine the CPU figures are the steadier ones. Every result is checked: each sweep must produce 24 ok
jobs, a report, exactly 12 cache misses, and every combo's max_abs_error must be identical across sweep,
bare and engine.

Goal: calibrun sweep / bare onnxruntime process (incl. startup) <= 3x.

Breakdown (not with --quick), one more sweep each:
  - instrumented in-process (functions of Hydra, calibrun and the MLflow tracker wrapped with timers):
    where the sweep's wall time goes per phase, at low overhead, and the cost of each lever;
  - under `python -X importtime`: import cost per package (mlflow, hydra, onnxruntime, matplotlib, ...);
  - under `python -m cProfile`: selected functions and the top cumulative items.

Tables go to stdout, progress to stderr. The machine load (/proc/loadavg) is printed next to each timing:
compare ratios from one run rather than absolute seconds across runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL = 3.0

CALIBRATIONS = (("narrow", 0.2), ("match", 1.0), ("wide", 10.0))
BATCHES = (1, 8, 64, 512)
FORMATS = ("qdq", "qoperator")
COMBOS = [(name, factor, b, fmt) for name, factor in CALIBRATIONS for b in BATCHES for fmt in FORMATS]
CALIB_SEED, EVAL_SEED, EVAL_ROWS, ROWS_PER_BATCH = 4242, 777, 256, 16


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def label(name: str, batches: int, fmt: str) -> str:
    return f"{name}/{batches}/{fmt}"


# --------------------------------------------------------------------------------------------------
# Children: each runs in its own process. Only stdlib is imported at module level, so the bare child's
# startup is Python + numpy + onnxruntime and nothing else.
# --------------------------------------------------------------------------------------------------


def child_bare(work: Path, model: Path, input_name: str, features: int) -> dict:
    """The 24 quantisations with bare onnxruntime. Prints imports/loop seconds and the errors."""
    t0 = time.perf_counter()
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    t1, c1 = time.perf_counter(), time.process_time()

    class ListReader(CalibrationDataReader):
        def __init__(self, arrays):
            self.arrays = iter(arrays)

        def get_next(self):
            array = next(self.arrays, None)
            return None if array is None else {input_name: array}

    formats = {"qdq": QuantFormat.QDQ, "qoperator": QuantFormat.QOperator}
    options = ort.SessionOptions()
    options.log_severity_level = 3

    def outputs(path: Path, rows):
        sess = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        return sess.run(None, {input_name: rows})

    results = {}
    for i, (name, factor, batches, fmt) in enumerate(COMBOS):
        rng = np.random.default_rng(CALIB_SEED)
        data = [(rng.normal(0, 1, (ROWS_PER_BATCH, features)) * factor).astype(np.float32) for _ in range(batches)]
        out = work / f"{i}.onnx"
        quantize_static(str(model), str(out), ListReader(data), quant_format=formats[fmt],
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax)
        rows = np.random.default_rng(EVAL_SEED).normal(0, 1, (EVAL_ROWS, features)).astype(np.float32)
        ref, got = outputs(model, rows), outputs(out, rows)
        diff = np.concatenate([np.abs(r.astype(np.float64).ravel() - g.astype(np.float64).ravel())
                               for r, g in zip(ref, got, strict=True)])
        results[label(name, batches, fmt)] = {"max_abs_error": float(diff.max()), "mean_abs_error": float(diff.mean())}
    t2, c2 = time.perf_counter(), time.process_time()
    return {"imports": t1 - t0, "loop": t2 - t1, "loop_cpu": c2 - c1, "results": results}


def child_engine(work: Path, model: Path) -> dict:
    """The 24 combos through calibrun.engine (calibration cache in a fresh folder), no Hydra, no MLflow."""
    t0 = time.perf_counter()
    from calibrun import engine
    from calibrun.calibrate import CalibrationCache
    from calibrun.quantize import QuantOptions

    t1, c1 = time.perf_counter(), time.process_time()
    fp32 = engine.open_float_model(model)
    cache = CalibrationCache(work / "cache")
    results, calib, quant, hits = {}, 0.0, 0.0, 0
    for i, (name, factor, batches, fmt) in enumerate(COMBOS):
        out = work / f"{i}.onnx"
        q = engine.quantize_lab(fp32, out, CALIB_SEED, factor, batches, options=QuantOptions(format=fmt), cache=cache)
        e = engine.error(fp32.path, out, EVAL_SEED, EVAL_ROWS)
        results[label(name, batches, fmt)] = {k: e[k] for k in ("max_abs_error", "mean_abs_error")}
        calib += q["calibration_seconds"]
        quant += q["quantization_seconds"]
        hits += int(q["cache_hit"])
    t2, c2 = time.perf_counter(), time.process_time()
    return {"imports": t1 - t0, "loop": t2 - t1, "loop_cpu": c2 - c1, "results": results,
            "calibration_seconds": calib,
            "quantization_seconds": quant, "cache_hits": hits}


class Timers:
    """Inclusive wall seconds per wrapped function (a list of call durations per label)."""

    def __init__(self):
        self.calls: dict[str, list[float]] = defaultdict(list)

    def wrap(self, owner, attr: str, name: str) -> None:
        calls = self.calls[name]
        original = getattr(owner, attr, None)
        if original is None:  # not in this version of calibrun: reported with 0 calls
            return

        @functools.wraps(original)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                calls.append(time.perf_counter() - start)

        setattr(owner, attr, timed)


def child_phases(out: Path, hydra_args: list[str]) -> None:
    """`python -m calibrun` in this process with timers around its phases; the timers go to `out` (JSON)."""
    import runpy

    t0 = time.perf_counter()
    timers = Timers()
    # What `python -m calibrun` imports before main() runs (calibrun/__main__.py's imports).
    import hydra._internal.config_loader_impl as hydra_loader
    import hydra._internal.hydra as hydra_hydra
    import hydra.core.utils as hydra_utils
    import hydra.plugins.sweeper as hydra_sweeper

    import calibrun.aggregate as aggregate
    import calibrun.calibrate as calibrate
    import calibrun.engine as engine
    import calibrun.report as report
    import calibrun.runner as runner
    import calibrun.sweep as sweep
    import calibrun.tracking as tracking

    t1 = time.perf_counter()
    w = timers.wrap
    w(hydra_hydra.Hydra, "compose_config", "hydra: compose the multirun config (once)")
    w(hydra_sweeper.Sweeper, "validate_batch_is_legal", "hydra: validate_batch_is_legal (composes all 24)")
    w(hydra_loader.ConfigLoaderImpl, "load_sweep_config", "hydra: load_sweep_config (compose one job)")
    # Hydra's plugin discovery re-imports basic_launcher, which then binds hydra.core.utils.run_job afresh
    w(hydra_utils, "run_job", "hydra: run_job")
    w(hydra_utils, "configure_log", "hydra: configure_log (per job)")
    w(hydra_utils, "_save_config", "hydra: save .hydra/*.yaml")
    w(sweep.SweepCallback, "on_multirun_start", "callback: on_multirun_start")
    w(sweep.SweepCallback, "on_multirun_end", "callback: on_multirun_end")
    w(runner, "run", "runner.run (one job)")
    w(runner, "write_lab_model", "runner: write_lab_model")
    # calibrun's engine API is growing: time whichever entry point the runner calls
    w(engine, "quantize_with" if hasattr(engine, "quantize_with") else "quantize_lab", "engine: calibrate + quantize")
    w(calibrate, "run_calibration", "calibrate.run_calibration (miss)")
    w(engine, "quantize", "quantize.quantize (quantize_static)")
    w(engine, "evaluate" if hasattr(engine, "evaluate") else "error", "engine: evaluate vs fp32")
    w(tracking.Tracker, "__init__", "Tracker() (MlflowClient + experiment)")
    w(tracking.Tracker, "start_run", "Tracker.start_run")
    w(tracking.Tracker, "log", "Tracker.log (log_batch)")
    w(tracking.Tracker, "log_artifact", "Tracker.log_artifact")
    for attr, name in (("log_model", "Tracker.log_model (LoggedModel)"), ("log_datasets", "Tracker.log_datasets"),
                       ("log_table", "Tracker.log_table")):
        if hasattr(tracking.Tracker, attr):
            w(tracking.Tracker, attr, name)
    w(tracking.Tracker, "finish", "Tracker.finish")
    w(aggregate, "build", "aggregate.build")
    w(report, "_plots", "report._plots (matplotlib)")
    w(aggregate, "_format_difference", "aggregate._format_difference")
    w(aggregate._Report, "bundle", "aggregate bundle copy")
    sys.argv = ["calibrun", *hydra_args]
    code = 0
    try:
        runpy.run_module("calibrun", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        t2 = time.perf_counter()
        out.write_text(json.dumps({"imports": t1 - t0, "main": t2 - t1, "calls": timers.calls, "code": code}))
    sys.exit(code)


# --------------------------------------------------------------------------------------------------
# The parent: runs the children, checks them, prints the tables.
# --------------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        self.args = args
        self.python = args.python
        self.root = args.root.resolve()
        self.tmp = Path(tempfile.mkdtemp(prefix="calibrun-lab-overhead."))
        self.db = self.tmp / "mlflow.db"
        self.model = self.tmp / "fp32.onnx"

    def env(self, with_root: bool = True) -> dict:
        env = dict(os.environ)
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{self.db}"
        if with_root:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.root), env.get("PYTHONPATH")) if p)
        return env

    def sweep_args(self, tag: str, extra: tuple[str, ...] = ("+experiment=lab",)) -> list[str]:
        return ["-m", *extra, f"hydra.sweep.dir={self.tmp / ('sweep-' + tag)}",
                f"cache.dir={self.tmp / ('cache-' + tag)}"]

    def run(self, cmd: list[str], what: str, env: dict | None = None) -> dict:
        """Run a child; its wall time, CPU time (user + sys, all its threads, from wait4) and output."""
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            start = time.perf_counter()
            proc = subprocess.Popen(cmd, cwd=self.root, env=env or self.env(), stdout=out, stderr=err, text=True)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - start
            proc.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            result = {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "stdout": out.read(), "stderr": err.read()}
        if proc.returncode != 0:
            sys.stderr.write(result["stderr"][-4000:])
            raise SystemExit(f"{what} failed with exit code {proc.returncode}: {' '.join(cmd)}")
        return result

    # ---- setup ------------------------------------------------------------------------------------
    def setup(self) -> None:
        sys.path.insert(0, str(self.root))
        import onnx

        from calibrun.model import LAB_FEATURES, LAB_INPUT, build_lab_model

        onnx.save_model(build_lab_model(), str(self.model))
        self.input_name, self.features = LAB_INPUT, LAB_FEATURES
        log(f"warming the MLflow store {self.db} and the file cache (1-job sweep)")
        warm = self.sweep_args("warm", ("calibration=match", "batches=1"))
        wall = self.run([self.python, "-m", "calibrun", *warm], "warm-up sweep")["wall"]
        log(f"warm-up sweep: {wall:.2f}s")

    # ---- the three measurements -------------------------------------------------------------------
    def sweep(self, tag: str, tracking: bool = True, *more: str) -> dict:
        load = loadavg()
        extra = ("+experiment=lab", *more) if tracking else ("+experiment=lab", "tracking=off")
        r = self.run([self.python, "-m", "calibrun", *self.sweep_args(tag, extra)], f"sweep {tag}")
        return {"wall": r["wall"], "cpu": r["cpu"], "load": load, "results": self.sweep_results(tag)}

    def sweep_results(self, tag: str) -> dict:
        sweep_dir = self.tmp / f"sweep-{tag}"
        results, misses = {}, 0
        for path in sweep_dir.glob("*/result.json"):
            r = json.loads(path.read_text())
            if r.get("status") != "ok":
                raise SystemExit(f"sweep {tag}: job {path.parent.name} failed: {r.get('error')}")
            p, m = r["params"], r["metrics"]
            results[label(p["calibration"], int(p["batches"]), p["format"])] = {
                "max_abs_error": m["max_abs_error"], "mean_abs_error": m["mean_abs_error"]}
            misses += int(not m["cache_hit"])
        if len(results) != len(COMBOS):
            raise SystemExit(f"sweep {tag}: {len(results)} ok jobs, expected {len(COMBOS)}")
        if misses != len(COMBOS) // len(FORMATS):
            raise SystemExit(f"sweep {tag}: {misses} calibrations ran, expected {len(COMBOS) // len(FORMATS)}")
        if not (sweep_dir / "report" / "report.md").is_file():
            raise SystemExit(f"sweep {tag}: no report/report.md")
        return results

    def child(self, kind: str, tag: str) -> dict:
        work = self.tmp / f"{kind}-{tag}"
        work.mkdir()
        model = work / "fp32.onnx"
        shutil.copyfile(self.model, model)  # each child its own copy (quantize_static writes beside it)
        cmd = [self.python, str(Path(__file__).resolve()), "--child", kind, str(work), str(model)]
        if kind == "bare":
            cmd += [self.input_name, str(self.features)]
        load = loadavg()
        # the bare child gets no PYTHONPATH to the calibrun checkout: it must not need it
        r = self.run(cmd, f"{kind} {tag}", env=self.env(with_root=kind != "bare"))
        data = json.loads(r["stdout"].strip().splitlines()[-1])
        return {**data, "wall": r["wall"], "cpu": r["cpu"], "load": load}

    def measure(self) -> dict:
        runs: dict[str, list[dict]] = {"sweep": [], "notrack": [], "nomodel": [], "bare": [], "engine": []}
        kinds = ["sweep", "notrack", "nomodel"]
        kinds += [] if self.args.sweep_only else ["bare", "engine"]
        for i in range(self.args.repeat):
            for kind in kinds:
                log(f"repeat {i + 1}/{self.args.repeat}: {kind} (load {loadavg()})")
                if kind == "nomodel":
                    r = self.sweep(f"{kind}-{i}", True, "tracking.log_model=false")
                elif kind in ("sweep", "notrack"):
                    r = self.sweep(f"{kind}-{i}", tracking=kind == "sweep")
                else:
                    r = self.child(kind, f"{i}")
                runs[kind].append(r)
                extra = f", in-process loop {r['loop']:.2f}s" if "loop" in r else ""
                log(f"  {kind}: {r['wall']:.2f}s wall, {r['cpu']:.2f}s cpu{extra}")
        return runs

    # ---- breakdown runs ---------------------------------------------------------------------------
    def phases(self) -> dict:
        out = self.tmp / "phases.json"
        cmd = [self.python, str(Path(__file__).resolve()), "--child", "phases", str(out), "--",
               *self.sweep_args("phases")]
        log(f"breakdown: instrumented sweep (load {loadavg()})")
        load = loadavg()
        r = self.run(cmd, "instrumented sweep")
        self.sweep_results("phases")
        startup = statistics.median(
            self.run([self.python, str(Path(__file__).resolve()), "--child", "noop"], "no-op child")["wall"]
            for _ in range(3))
        return {**json.loads(out.read_text()), "wall": r["wall"], "cpu": r["cpu"], "load": load, "startup": startup}

    def importtime(self) -> dict:
        log(f"breakdown: sweep under -X importtime (load {loadavg()})")
        r = self.run([self.python, "-X", "importtime", "-m", "calibrun", *self.sweep_args("importtime")],
                     "importtime sweep")
        return {"wall": r["wall"], "entries": parse_importtime(r["stderr"])}

    def cprofile(self) -> tuple[float, Path]:
        prof = self.tmp / "sweep.prof"
        log(f"breakdown: sweep under cProfile (load {loadavg()})")
        r = self.run([self.python, "-m", "cProfile", "-o", str(prof), "-m", "calibrun",
                      *self.sweep_args("cprofile")], "cProfile sweep")
        return r["wall"], prof


IMPORT_LINE = re.compile(r"import time:\s*(\d+)\s*\|\s*(\d+)\s*\|( +)(\S.*)$")


def parse_importtime(stderr: str) -> list[tuple[int, str, float, float]]:
    """(depth, module, self s, cumulative s) per `import time:` line, in order."""
    entries = []
    for line in stderr.splitlines():
        match = IMPORT_LINE.match(line)
        if match:
            self_us, cum_us, indent, name = match.groups()
            entries.append(((len(indent) - 1) // 2, name.strip(), int(self_us) / 1e6, int(cum_us) / 1e6))
    return entries


# --------------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------------


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def spread(runs: list[dict], key: str) -> str:
    values = [r[key] for r in runs]
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else "-"


def check_identical(runs: dict) -> str:
    reference = runs["sweep"][0]["results"]
    lines = []
    for kind, rr in runs.items():
        for i, r in enumerate(rr):
            same = sum(r["results"][k]["max_abs_error"] == v["max_abs_error"] for k, v in reference.items())
            if same != len(COMBOS):
                lines.append(f"{kind} #{i}: {same}/{len(COMBOS)} identical")
    return "; ".join(lines) or f"all {sum(len(v) for v in runs.values())} runs: 24/24 identical"


def print_main(runs: dict, args) -> None:
    print(f"\n## calibrun lab sweep vs bare onnxruntime ({args.repeat} repeat(s), median; machine: "
          f"{os.cpu_count()} cores; load average at the start of each run in brackets)\n")
    print("wall = elapsed seconds; cpu = user + sys seconds of the process (all threads), less sensitive to other "
          "load on the machine\n")
    print(f"{'measurement':<64} {'wall s':>7} {'range':>11} {'cpu s':>7}  load (1/5/15 min)")
    rows = [("(1) calibrun sweep: python -m calibrun -m +experiment=lab", "sweep", "wall", "cpu"),
            ("(1b) the same sweep with tracking=off (no MLflow)", "notrack", "wall", "cpu"),
            ("(1c) the same sweep with tracking.log_model=false (no LoggedModel)", "nomodel", "wall", "cpu"),
            ("(2) bare onnxruntime: process incl. start + imports", "bare", "wall", "cpu"),
            ("    bare onnxruntime: in-process loop", "bare", "loop", "loop_cpu"),
            ("    bare onnxruntime: imports (numpy, onnxruntime.quantization)", "bare", "imports", None),
            ("(3) calibrun.engine: process incl. start + imports", "engine", "wall", "cpu"),
            ("    calibrun.engine: in-process loop", "engine", "loop", "loop_cpu"),
            ("    calibrun.engine: imports (calibrun.engine)", "engine", "imports", None),
            ("      loop part: calibration (12 misses + 12 cache hits)", "engine", "calibration_seconds", None),
            ("      loop part: quantize_static from the cached ranges", "engine", "quantization_seconds", None)]
    for name, kind, key, cpu_key in rows:
        rr = runs[kind]
        if rr:
            cpu = f"{med(rr, cpu_key):7.2f}" if cpu_key else f"{'':>7}"
            print(f"{name:<64} {med(rr, key):7.2f} {spread(rr, key):>11} {cpu}  "
                  f"[{'; '.join(r['load'] for r in rr)}]")
    print(f"\nresults check (max_abs_error per combo vs sweep #0): {check_identical(runs)}")
    if not runs["bare"]:
        return
    if runs["nomodel"]:
        per_job = (med(runs["sweep"], "wall") - med(runs["nomodel"], "wall")) / len(COMBOS)
        per_job_cpu = (med(runs["sweep"], "cpu") - med(runs["nomodel"], "cpu")) / len(COMBOS)
        print(f"\nMLflow LoggedModel (mlflow.onnx.log_model) per job: {1000 * per_job:.0f} ms wall, "
              f"{1000 * per_job_cpu:.0f} ms cpu ((1) - (1c)) / {len(COMBOS)}, the first one's mlflow.onnx import "
              f"included)")
    m = {f"{kind}.{key}": med(runs[kind], key) for kind in ("sweep", "notrack", "bare", "engine")
         for key in ("wall", "cpu", "loop", "loop_cpu") if key in runs[kind][0]}
    ratio, cpu_ratio = m["sweep.wall"] / m["bare.wall"], m["sweep.cpu"] / m["bare.cpu"]
    print("\n### ratios (medians)")
    print(f"{'':<58} {'wall':>7} {'cpu':>7}")
    for name, a, b in [
        ("calibrun sweep / bare onnxruntime process (incl. startup)", "sweep.", "bare."),
        ("calibrun sweep tracking=off / bare onnxruntime process", "notrack.", "bare."),
        ("calibrun.engine process / bare onnxruntime process", "engine.", "bare."),
        ("calibrun sweep / calibrun.engine process", "sweep.", "engine."),
    ]:
        print(f"{name + ':':<58} {m[a + 'wall'] / m[b + 'wall']:6.2f}x {m[a + 'cpu'] / m[b + 'cpu']:6.2f}x")
    print(f"{'calibrun.engine loop / bare onnxruntime loop (in-process):':<58} "
          f"{m['engine.loop'] / m['bare.loop']:6.2f}x {m['engine.loop_cpu'] / m['bare.loop_cpu']:6.2f}x")
    verdict = "MET" if max(ratio, cpu_ratio) <= GOAL else "NOT MET"
    print(f"\ngoal: calibrun sweep <= {GOAL:.0f}x bare onnxruntime process -> {verdict}: {ratio:.2f}x wall, "
          f"{cpu_ratio:.2f}x cpu (the goal means a sweep of <= {GOAL * m['bare.wall']:.2f}s wall here)")
    print("\n### where the sweep's time goes (medians; differences of the rows above)")
    print(f"  {'':<76} {'wall s':>7} {'%':>6} {'cpu s':>7} {'%':>6}")
    parts = [
        ("onnxruntime work (bare loop)", "bare.loop", None, "bare.loop_cpu", None),
        ("Python start + numpy/onnxruntime imports (bare process - bare loop)",
         "bare.wall", "bare.loop", "bare.cpu", "bare.loop_cpu"),
        ("calibrun engine vs bare onnxruntime (engine loop - bare loop)",
         "engine.loop", "bare.loop", "engine.loop_cpu", "bare.loop_cpu"),
        ("calibrun.engine imports beyond bare ((engine - bare) process - loop)", "ENGINE_IMPORTS", None, None, None),
        ("Hydra, job folders, aggregation + report (sweep tracking=off - engine)",
         "notrack.wall", "engine.wall", "notrack.cpu", "engine.cpu"),
        ("MLflow: import, store, 25 runs, artifacts (sweep - sweep tracking=off)",
         "sweep.wall", "notrack.wall", "sweep.cpu", "notrack.cpu"),
    ]
    for name, a, b, c, d in parts:
        if a == "ENGINE_IMPORTS":
            wall = (m["engine.wall"] - m["engine.loop"]) - (m["bare.wall"] - m["bare.loop"])
            cpu = (m["engine.cpu"] - m["engine.loop_cpu"]) - (m["bare.cpu"] - m["bare.loop_cpu"])
        else:
            wall = m[a] - (m[b] if b else 0.0)
            cpu = m[c] - (m[d] if d else 0.0)
        print(f"  {name:<76} {wall:7.2f} {100 * wall / m['sweep.wall']:5.1f}% {cpu:7.2f} "
              f"{100 * cpu / m['sweep.cpu']:5.1f}%")
    print(f"  {'= calibrun sweep':<76} {m['sweep.wall']:7.2f} {'':>6} {m['sweep.cpu']:7.2f}")


PHASE_TREE = [  # (timer label, depth); inclusive wall times
    ("hydra: compose the multirun config (once)", 1),
    ("callback: on_multirun_start", 1),
    ("hydra: validate_batch_is_legal (composes all 24)", 1),
    ("LAUNCH_COMPOSE", 1),
    ("hydra: run_job", 1),
    ("hydra: configure_log (per job)", 2),
    ("hydra: save .hydra/*.yaml", 2),
    ("runner.run (one job)", 2),
    ("runner: write_lab_model", 3),
    ("engine: calibrate + quantize", 3),
    ("calibrate.run_calibration (miss)", 4),
    ("quantize.quantize (quantize_static)", 4),
    ("engine: evaluate vs fp32", 3),
    ("Tracker() (MlflowClient + experiment)", 3),
    ("Tracker.start_run", 3),
    ("Tracker.log (log_batch)", 3),
    ("Tracker.log_artifact", 3),
    ("Tracker.log_model (LoggedModel)", 3),
    ("Tracker.log_datasets", 3),
    ("Tracker.log_table", 3),
    ("Tracker.finish", 3),
    ("callback: on_multirun_end", 1),
    ("aggregate.build", 2),
    ("report._plots (matplotlib)", 3),
    ("aggregate._format_difference", 3),
    ("aggregate bundle copy", 3),
]


def print_phases(ph: dict) -> None:
    calls = ph["calls"]

    def total(key: str) -> float:
        return sum(calls.get(key, []))

    def count(key: str) -> int:
        return len(calls.get(key, []))

    wall = ph["wall"]
    # load_sweep_config runs 24x inside validate_batch_is_legal, then once before each run_job
    compose = calls.get("hydra: load_sweep_config (compose one job)", [])
    # ... unless calibrun hands the validation pass's configs to the launcher (sweep.compose_each_job_once)
    launch_compose = compose[len(compose) // 2:] if len(compose) > len(calls.get("runner.run (one job)", [])) else []
    exit_s = wall - ph["startup"] - ph["imports"] - ph["main"]
    print(f"\n### breakdown 1: instrumented sweep (timers around functions; wall {wall:.2f}s, load {ph['load']})\n")
    print(f"{'phase (inclusive wall seconds)':<68} {'calls':>5} {'total s':>8} {'per call':>9} {'% wall':>7}")

    def row(name: str, depth: int, seconds: float, n: int | None = None) -> None:
        per = f"{seconds / n:9.3f}" if n else f"{'':>9}"
        share = 100 * seconds / wall
        print(f"{'  ' * depth + name:<68} {'' if n is None else n:>5} {seconds:8.2f} {per} {share:6.1f}%")

    row("interpreter start (a no-op child of this script)", 1, ph["startup"])
    row("imports before main (hydra, onnx, onnxruntime, calibrun)", 1, ph["imports"])
    accounted = ph["startup"] + ph["imports"] + exit_s
    for name, depth in PHASE_TREE:
        if name == "LAUNCH_COMPOSE":
            row("hydra: compose each job again, before its run_job", depth, sum(launch_compose), len(launch_compose))
            accounted += sum(launch_compose)
            continue
        row(name, depth, total(name), count(name))
        if depth == 1:
            accounted += total(name)
        if name == "Tracker() (MlflowClient + experiment)" and count(name):
            row("first call: `import mlflow` + SQLAlchemy store (on_multirun_start)", depth + 1, calls[name][0], 1)
    row("other (Hydra setup, sweeper, launcher, between the timers)", 1, wall - accounted)
    row("interpreter exit (wall - start - in-process)", 1, exit_s)

    jobs = count("runner.run (one job)") or 1
    first_tracker = calls.get("Tracker() (MlflowClient + experiment)", [0.0])[0]
    tracker_calls = sum(total(k) for k in calls if k.startswith("Tracker")) - first_tracker
    validate = total("hydra: validate_batch_is_legal (composes all 24)")
    hydra_job = total("hydra: run_job") - total("runner.run (one job)")
    engine = total("engine: calibrate + quantize") + total("engine: evaluate vs fp32")
    composition = validate + sum(launch_compose)
    print(f"\nper job (mean of {jobs}): calibrun engine {1000 * engine / jobs:.0f} ms; MLflow calls "
          f"{1000 * tracker_calls / jobs:.0f} ms; Hydra composition {1000 * composition / jobs:.0f} ms (twice) "
          f"+ run_job {1000 * hydra_job / jobs:.0f} ms; write_lab_model "
          f"{1000 * total('runner: write_lab_model') / jobs:.0f} ms")
    print("\nlevers (each is a cost measured above, so at most what removing it saves):")
    levers = [
        ("Hydra validate_batch_is_legal: every job composed twice (custom sweeper)", validate),
        ("MLflow import + SQLAlchemy store init (first Tracker)", first_tracker),
        ("MLflow calls of the 25 runs (start_run, log_batch, artifacts, finish)", tracker_calls),
        ("Tracker() re-created per job (MlflowClient + get_experiment_by_name)",
         total("Tracker() (MlflowClient + experiment)") - first_tracker),
        ("MLflow log_artifact copies", total("Tracker.log_artifact")),
        ("MLflow LoggedModels (mlflow.onnx.log_model, first one imports mlflow.onnx)",
         total("Tracker.log_model (LoggedModel)")),
        ("report plots (matplotlib import + 2 PNGs)", total("report._plots (matplotlib)")),
        ("interpreter exit (module teardown)", exit_s),
        ("write_lab_model per job (build + check + save + one session)", total("runner: write_lab_model")),
        ("Hydra .hydra/*.yaml + configure_log per job", total("hydra: save .hydra/*.yaml")
         + total("hydra: configure_log (per job)")),
    ]
    for name, seconds in sorted(levers, key=lambda kv: -kv[1]):
        print(f"  {name:<76} {seconds:6.2f}s {100 * seconds / wall:5.1f}%")


IMPORT_PACKAGES = ("hydra", "omegaconf", "numpy", "onnx", "onnxruntime", "onnxruntime.quantization",
                   "calibrun.runner", "mlflow", "sqlalchemy", "alembic", "pandas", "pyarrow", "fastapi",
                   "matplotlib", "matplotlib.pyplot")


def print_importtime(it: dict) -> None:
    entries = it["entries"]
    roots = [e for e in entries if e[0] == 0]
    total = sum(e[3] for e in roots)
    print(f"\n### breakdown 2: imports of the sweep process (python -X importtime; wall {it['wall']:.2f}s; "
          f"importtime inflates them a little)\n")
    print(f"all imports (sum of top-level cumulative): {total:.2f}s")
    by_top: dict[str, float] = defaultdict(float)
    for _, name, self_s, _ in entries:
        by_top[name.split(".")[0]] += self_s
    print(f"\n{'package (self time of all its modules)':<44} {'s':>6}")
    for name, seconds in sorted(by_top.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {name:<42} {seconds:6.2f}")
    print(f"\n{'first import of (cumulative: what it pulled in)':<44} {'s':>6}")
    for pkg in IMPORT_PACKAGES:
        first = next((e for e in entries if e[1] == pkg), None)
        if first is not None:
            print(f"  {pkg:<42} {first[3]:6.2f}")


PROFILE_ITEMS = [
    ("hydra/_internal/hydra.py", "multirun"),
    ("hydra/plugins/sweeper.py", "validate_batch_is_legal"),
    ("hydra/_internal/config_loader_impl.py", "load_sweep_config"),
    ("hydra/_internal/defaults_list.py", "create_defaults_list"),
    ("hydra/core/utils.py", "run_job"),
    ("hydra/core/utils.py", "configure_log"),
    ("hydra/core/utils.py", "_save_config"),
    ("calibrun/runner.py", "run"),
    ("calibrun/runner.py", "job_params"),
    ("calibrun/model.py", "write_lab_model"),
    ("calibrun/engine.py", "quantize_lab"),
    ("calibrun/engine.py", "quantize_with"),
    ("calibrun/calibrate.py", "run_calibration"),
    ("calibrun/calibrate.py", "private_model_copy"),
    ("calibrun/quantize.py", "quantize"),
    ("calibrun/engine.py", "error"),
    ("calibrun/engine.py", "evaluate"),
    ("calibrun/tracking.py", "__init__"),
    ("calibrun/tracking.py", "start_run"),
    ("calibrun/tracking.py", "log"),
    ("calibrun/tracking.py", "log_artifact"),
    ("calibrun/tracking.py", "finish"),
    ("calibrun/sweep.py", "on_multirun_start"),
    ("calibrun/sweep.py", "on_multirun_end"),
    ("calibrun/aggregate.py", "build"),
    ("calibrun/report.py", "_plots"),
]


def print_cprofile(wall: float, prof: Path, top: int = 30) -> None:
    import pstats

    stats = pstats.Stats(str(prof))
    total = stats.total_tt
    entries = stats.stats  # (file, line, func) -> (cc, nc, tt, ct, callers)
    print(f"\n### breakdown 3: cProfile of the sweep (wall {wall:.2f}s under the profiler, profiled total "
          f"{total:.2f}s; the profiler inflates Python-heavy code such as OmegaConf ~2x)\n")
    print(f"{'selected function':<64} {'calls':>6} {'cum s':>7} {'% prof':>7}")
    for suffix, func in PROFILE_ITEMS:
        for (file, _line, name), (_cc, nc, _tt, ct, _callers) in entries.items():
            if name == func and file.replace(os.sep, "/").endswith(suffix):
                print(f"  {suffix.split('/')[-1] + ':' + func:<62} {nc:>6} {ct:7.2f} {100 * ct / total:6.1f}%")
    imports = [(k, v) for k, v in entries.items() if k[2] == "_find_and_load"]
    if imports:
        print(f"  {'(all imports: importlib _find_and_load)':<62} {imports[0][1][1]:>6} "
              f"{max(v[3] for _, v in imports):7.2f} {100 * max(v[3] for _, v in imports) / total:6.1f}%")
    print(f"\ntop {top} cumulative (functions under 95% of the total; wrappers above it left out):")
    ranked = sorted(((v[3], v[1], k) for k, v in entries.items() if v[3] < 0.95 * total), reverse=True)[:top]
    for ct, nc, (file, line, name) in ranked:
        where = re.sub(r".*site-packages/", "", file)
        where = where.replace(str(ROOT) + "/", "")
        print(f"  {ct:7.2f}s {nc:>7}  {where}:{line}({name})")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        kind = argv[1]
        if kind == "bare":
            print(json.dumps(child_bare(Path(argv[2]), Path(argv[3]), argv[4], int(argv[5]))))
        elif kind == "engine":
            print(json.dumps(child_engine(Path(argv[2]), Path(argv[3]))))
        elif kind == "noop":
            pass
        elif kind == "phases":
            child_phases(Path(argv[2]), argv[argv.index("--") + 1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="timed repeats of each measurement (default 3)")
    parser.add_argument("--quick", action="store_true", help="1 repeat, no breakdown runs")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="calibrun checkout whose sweep is timed (default: this one); for prototypes")
    parser.add_argument("--sweep-only", action="store_true",
                        help="time only the sweeps (1) and (1b), e.g. to compare checkouts")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the children (default: this one)")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat = 1
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    bench = Bench(args)
    log(f"temp folder {bench.tmp}; calibrun checkout {bench.root}; load {loadavg()}")
    try:
        bench.setup()
        runs = bench.measure()
        print_main(runs, args)
        if not args.quick and not args.sweep_only:
            print_phases(bench.phases())
            print_importtime(bench.importtime())
            print_cprofile(*bench.cprofile())
        print(f"\nload average at the end: {loadavg()}; temp folder: "
              f"{bench.tmp if args.keep else '(removed)'}")
    finally:
        if not args.keep:
            shutil.rmtree(bench.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
