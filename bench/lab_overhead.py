"""What the calibrun lab sweep costs on top of bare onnxruntime: the same 24 quantisations, side by side.

    .venv/bin/python bench/lab_overhead.py              # full: 3 repeats + 2 breakdown sweeps (~3-5 min)
    .venv/bin/python bench/lab_overhead.py --quick      # 1 repeat, no breakdown sweeps (~1 min)
    .venv/bin/python bench/lab_overhead.py --repeat 5
    .venv/bin/python bench/lab_overhead.py --root /tmp/proto --sweep-only   # time another checkout (a prototype,
                                                                             # or a snapshot of a tree in flux)

The work: 3 calibrations (narrow 0.2, match 1.0, wide 10.0) x batches 1, 8, 64, 512 x formats QDQ/QOperator =
24 int8 models of the lab MLP (onnxruntime `quantize_static`, QInt8/QInt8, MinMax), each evaluated against
fp32 on `default_rng(777).normal(0, 1, (256, 16))` -- the lab rules of docs/lab.md.

Timed side by side in one run (repeats interleaved, medians reported):

(1)  sweep    `python -m calibrun -m +experiment=lab hydra.sweep.dir=TMP/sweep-i cache.dir=TMP/cache-i` with
              MLFLOW_TRACKING_URI=sqlite:///TMP/mlflow.db, as users run it: the whole process. The MLflow
              store is warm (a 1-job sweep against the same database runs first, so schema creation is not
              counted); every timed sweep gets a fresh cache folder, so its 12 calibrations really run.
(1b) notrack  the same sweep with `tracking=off`: splits MLflow from Hydra + aggregation.
(1c) nomodel  the same sweep with `tracking.log_model=false`: what the 24 MLflow LoggedModels cost.
(1d) nowriter the same tracked sweep with `CALIBRUN_TRACKING_WRITER=off`: MLflow imported and called in calibrun's
              own process, as before the tracking writer (docs/tracking.md): what the writer saves.
(2)  bare     the same 24 quantisations + evaluations with bare onnxruntime in one process (calibration data
              rebuilt by the docs/lab.md rule, a list-backed CalibrationDataReader, `quantize_static`, two
              InferenceSessions per model). No calibrun import in that process: the fp32 model file is
              written beforehand with `calibrun.model.build_lab_model`. Reported twice: the loop in-process,
              and the whole subprocess including interpreter start and imports.
(3)  engine   `calibrun.quant.quantize.quantize_lab` + `calibrun.measure.errors.error` for the same 24 combos
              (fresh cache folder: 12 calibrations, 12 cache hits), no Hydra, no MLflow; in-process and whole process.

(4)  floor    a process that only imports what the calibrun process of a tracked sweep imports (`calibrun.__main__`:
              calibrun, Hydra, onnxruntime; MLflow is imported by the tracking writer on the other core) and exits:
              no config, no job. Its ratio to (2) is about the least a tracked sweep can score.
(5)  mlflow   a process that only imports what the tracking writer imports before it can open the store (MLflow's
              SQLAlchemy store and client) and exits: the writer's own floor. A tracked sweep ends after its writer,
              which must import MLflow and then write 25 runs; the writer's CPU in the sweep ((1) - (1b) in CPU
              seconds) over (2) is about the least a tracked sweep can score on this machine, however fast the
              calibrun process is.

Each process is timed in wall seconds and in CPU seconds (user + sys of all its threads, from wait4); on a
shared machine the CPU figures are the steadier ones. Every result is checked: each sweep must produce 24 ok
jobs, a report, exactly 12 cache misses, and every combo's max_abs_error must be identical across sweep,
bare and engine.

Goals: calibrun sweep / bare onnxruntime process (incl. startup) <= 3x (the first issue's), <= 5x (issue 26), and the
sweep's start (process start to its first job) <= 2 s.

Breakdown (not with --quick), one more sweep each:
  - under `python -X importtime`: import cost per package (mlflow, hydra, onnxruntime, matplotlib, ...);
  - under `python -m cProfile`: the top cumulative items.
For where the time goes inside one job or one function, profile a sweep directly: bench/README.md has the
py-spy, cProfile and tracemalloc recipes (nothing here is keyed to calibrun's function names).

Tables go to stdout, progress to stderr. The machine load (/proc/loadavg) is printed next to each timing:
compare ratios from one run rather than absolute seconds across runs.
"""

from __future__ import annotations

import argparse
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

from _common import loadavg, log, wait_child

ROOT = Path(__file__).resolve().parent.parent
GOALS = (3.0, 5.0)  # the first issue's, issue 26's
START_GOAL = 2.0  # seconds from the process's start to its first job (issue 26)

CALIBRATIONS = (("narrow", 0.2), ("match", 1.0), ("wide", 10.0))
BATCHES = (1, 8, 64, 512)
FORMATS = ("qdq", "qoperator")
COMBOS = [(name, factor, b, fmt) for name, factor in CALIBRATIONS for b in BATCHES for fmt in FORMATS]
CALIB_SEED, EVAL_SEED, EVAL_ROWS, ROWS_PER_BATCH = 4242, 777, 256, 16


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
    """The 24 combos through calibrun functions (calibration cache in a fresh folder), no Hydra, no MLflow."""
    t0 = time.perf_counter()
    from calibrun.measure import errors as measure
    from calibrun.model import open_float_model
    from calibrun.quant.calibrate import CalibrationCache
    from calibrun.quant.quantize import QuantOptions, quantize_lab

    t1, c1 = time.perf_counter(), time.process_time()
    fp32 = open_float_model(model)
    cache = CalibrationCache(work / "cache")
    results, calib, quant, hits = {}, 0.0, 0.0, 0
    for i, (name, factor, batches, fmt) in enumerate(COMBOS):
        out = work / f"{i}.onnx"
        q = quantize_lab(fp32, out, CALIB_SEED, factor, batches, options=QuantOptions(format=fmt), cache=cache)
        e = measure.error(fp32.path, out, EVAL_SEED, EVAL_ROWS)
        results[label(name, batches, fmt)] = {k: e[k] for k in ("max_abs_error", "mean_abs_error")}
        calib += q["calibration_seconds"]
        quant += q["quantization_seconds"]
        hits += int(q["cache_hit"])
    t2, c2 = time.perf_counter(), time.process_time()
    return {"imports": t1 - t0, "loop": t2 - t1, "loop_cpu": c2 - c1, "results": results,
            "calibration_seconds": calib,
            "quantization_seconds": quant, "cache_hits": hits}


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
            start, epoch = time.perf_counter(), time.time()
            proc = subprocess.Popen(cmd, cwd=self.root, env=env or self.env(), stdout=out, stderr=err, text=True)
            usage = wait_child(proc, start)
            out.seek(0)
            err.seek(0)
            result = {"wall": usage.wall, "cpu": usage.cpu, "stdout": out.read(), "stderr": err.read(),
                      "epoch": epoch}
        if proc.returncode != 0:
            sys.stderr.write(result["stderr"][-4000:])
            raise SystemExit(f"{what} failed with exit code {proc.returncode}: {' '.join(cmd)}")
        return result

    # ---- setup ------------------------------------------------------------------------------------
    def setup(self) -> None:
        sys.path.insert(0, str(self.root))
        import onnx

        from calibrun.lab.model import LAB_FEATURES, LAB_INPUT, build_lab_model

        onnx.save_model(build_lab_model(), str(self.model))
        self.input_name, self.features = LAB_INPUT, LAB_FEATURES
        log(f"warming the MLflow store {self.db} and the file cache (1-job sweep)")
        warm = self.sweep_args("warm", ("calibration=match", "batches=1"))
        wall = self.run([self.python, "-m", "calibrun", *warm], "warm-up sweep")["wall"]
        log(f"warm-up sweep: {wall:.2f}s")

    # ---- the three measurements -------------------------------------------------------------------
    def sweep(self, tag: str, tracking: bool = True, *more: str, env: dict | None = None) -> dict:
        load = loadavg()
        extra = ("+experiment=lab", *more) if tracking else ("+experiment=lab", "tracking=off")
        r = self.run([self.python, "-m", "calibrun", *self.sweep_args(tag, extra)], f"sweep {tag}",
                     env={**self.env(), **(env or {})})
        return {"wall": r["wall"], "cpu": r["cpu"], "load": load, "results": self.sweep_results(tag),
                "phases": sweep_phases(r["stderr"], r["epoch"], r["wall"])}

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
        runs: dict[str, list[dict]] = {"sweep": [], "notrack": [], "nomodel": [], "nowriter": [], "bare": [],
                                       "engine": [], "floor": [], "mlflow": []}
        kinds = ["sweep", "notrack", "nomodel", "nowriter"]
        kinds += [] if self.args.sweep_only else ["bare", "engine", "floor", "mlflow"]
        for i in range(self.args.repeat):
            for kind in kinds:
                log(f"repeat {i + 1}/{self.args.repeat}: {kind} (load {loadavg()})")
                if kind == "nomodel":
                    r = self.sweep(f"{kind}-{i}", True, "tracking.log_model=false")
                elif kind == "nowriter":
                    r = self.sweep(f"{kind}-{i}", True, env={"CALIBRUN_TRACKING_WRITER": "off"})
                elif kind in ("sweep", "notrack"):
                    r = self.sweep(f"{kind}-{i}", tracking=kind == "sweep")
                elif kind in ("floor", "mlflow"):
                    r = self.floor(FLOOR_IMPORTS[kind])
                else:
                    r = self.child(kind, f"{i}")
                runs[kind].append(r)
                extra = f", in-process loop {r['loop']:.2f}s" if "loop" in r else ""
                log(f"  {kind}: {r['wall']:.2f}s wall, {r['cpu']:.2f}s cpu{extra}")
        return runs

    def floor(self, imports: str) -> dict:
        load = loadavg()
        r = self.run([self.python, "-c", imports], f"imports: {imports}")
        return {"wall": r["wall"], "cpu": r["cpu"], "load": load}

    # ---- breakdown runs ---------------------------------------------------------------------------
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


FLOOR_IMPORTS = {"floor": "import calibrun.__main__",  # the calibrun process (MLflow: the writer's)
                 "mlflow": "import mlflow.store.tracking.sqlalchemy_store; from mlflow import MlflowClient"}

LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def sweep_phases(stderr: str, epoch: float, wall: float) -> dict | None:
    """Wall seconds of a sweep's phases from its log's time stamps (Hydra's format, local time): start (interpreter,
    imports, master config, tracking store, parent run, Hydra's validation composition of every job) up to
    'Launching N jobs'; the jobs, up to the last job's result line; the end (report, parent run, interpreter exit)."""
    from datetime import datetime

    stamps = []
    for line in stderr.splitlines():
        match = LOG_TIME.match(line)
        if match:
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            stamps.append((at - epoch, line))
    launch = next((t for t, line in stamps if "Launching" in line), None)
    last_job = max((t for t, line in stamps if "result.json" in line), default=None)
    if launch is None or last_job is None:
        return None
    return {"start": launch, "jobs": last_job - launch, "end": wall - last_job}


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
        if kind in FLOOR_IMPORTS:  # imports only: no results
            continue
        for i, r in enumerate(rr):
            same = sum(r["results"][k]["max_abs_error"] == v["max_abs_error"] for k, v in reference.items())
            if same != len(COMBOS):
                lines.append(f"{kind} #{i}: {same}/{len(COMBOS)} identical")
    checked = sum(len(v) for k, v in runs.items() if k not in FLOOR_IMPORTS)
    return "; ".join(lines) or f"all {checked} runs: 24/24 identical"


def print_main(runs: dict, args) -> None:
    print(f"\n## calibrun lab sweep vs bare onnxruntime ({args.repeat} repeat(s), median; machine: "
          f"{os.cpu_count()} cores; load average at the start of each run in brackets)\n")
    print("wall = elapsed seconds; cpu = user + sys seconds of the process (all threads), less sensitive to other "
          "load on the machine\n")
    print(f"{'measurement':<64} {'wall s':>7} {'range':>11} {'cpu s':>7}  load (1/5/15 min)")
    rows = [("(1) calibrun sweep: python -m calibrun -m +experiment=lab", "sweep", "wall", "cpu"),
            ("(1b) the same sweep with tracking=off (no MLflow)", "notrack", "wall", "cpu"),
            ("(1c) the same sweep with tracking.log_model=false (no LoggedModel)", "nomodel", "wall", "cpu"),
            ("(1d) the same tracked sweep, MLflow in calibrun's process (no writer)", "nowriter", "wall", "cpu"),
            ("(2) bare onnxruntime: process incl. start + imports", "bare", "wall", "cpu"),
            ("    bare onnxruntime: in-process loop", "bare", "loop", "loop_cpu"),
            ("    bare onnxruntime: imports (numpy, onnxruntime.quantization)", "bare", "imports", None),
            ("(3) calibrun functions: process incl. start + imports", "engine", "wall", "cpu"),
            ("    calibrun functions: in-process loop", "engine", "loop", "loop_cpu"),
            ("    calibrun functions: imports (calibrun functions)", "engine", "imports", None),
            ("      loop part: calibration (12 misses + 12 cache hits)", "engine", "calibration_seconds", None),
            ("      loop part: quantize_static from the cached ranges", "engine", "quantization_seconds", None),
            ("(4) floor: imports of the calibrun process (MLflow: the writer's)", "floor", "wall", "cpu"),
            ("(5) the writer's floor: MLflow's import (store and client)", "mlflow", "wall", "cpu")]
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
    m = {f"{kind}.{key}": med(runs[kind], key) for kind in ("sweep", "notrack", "nowriter", "bare", "engine")
         if runs[kind] for key in ("wall", "cpu", "loop", "loop_cpu") if key in runs[kind][0]}
    ratio, cpu_ratio = m["sweep.wall"] / m["bare.wall"], m["sweep.cpu"] / m["bare.cpu"]
    print("\n### ratios (medians)")
    print(f"{'':<58} {'wall':>7} {'cpu':>7}")
    for name, a, b in [
        ("calibrun sweep / bare onnxruntime process (incl. startup)", "sweep.", "bare."),
        ("calibrun sweep tracking=off / bare onnxruntime process", "notrack.", "bare."),
        ("calibrun sweep without the writer / bare onnxruntime process", "nowriter.", "bare."),
        ("calibrun functions process / bare onnxruntime process", "engine.", "bare."),
        ("calibrun sweep / calibrun functions process", "sweep.", "engine."),
    ]:
        if a + "wall" in m:
            print(f"{name + ':':<58} {m[a + 'wall'] / m[b + 'wall']:6.2f}x {m[a + 'cpu'] / m[b + 'cpu']:6.2f}x")
    print(f"{'calibrun functions loop / bare onnxruntime loop (in-process):':<58} "
          f"{m['engine.loop'] / m['bare.loop']:6.2f}x {m['engine.loop_cpu'] / m['bare.loop_cpu']:6.2f}x")
    jobs = len(COMBOS)
    print(f"\nper-job overhead over bare onnxruntime ((sweep - bare process) / {jobs}): "
          f"{1000 * (m['sweep.wall'] - m['bare.wall']) / jobs:.0f} ms wall, "
          f"{1000 * (m['sweep.cpu'] - m['bare.cpu']) / jobs:.0f} ms cpu; of which MLflow ((sweep - tracking=off) / "
          f"{jobs}): {1000 * (m['sweep.wall'] - m['notrack.wall']) / jobs:.0f} ms wall, "
          f"{1000 * (m['sweep.cpu'] - m['notrack.cpu']) / jobs:.0f} ms cpu (process start, imports and the "
          f"report included: they are fixed costs spread over the {jobs} jobs)")
    phased = [r["phases"] for kind in ("sweep", "notrack", "nowriter") for r in runs[kind] if r.get("phases")]
    if phased:
        print("\nphases of the sweep (wall s, medians, from its log's time stamps):")
        for kind, name in (("sweep", "(1) tracked"), ("notrack", "(1b) tracking=off"), ("nowriter", "(1d) no writer")):
            ph = [r["phases"] for r in runs[kind] if r.get("phases")]
            if ph:
                part = {k: statistics.median(p[k] for p in ph) for k in ("start", "jobs", "end")}
                print(f"  {name:<20} start (imports, store, parent run, Hydra's validation pass) "
                      f"{part['start']:6.2f}; {jobs} jobs {part['jobs']:6.2f} ({1000 * part['jobs'] / jobs:.0f} ms "
                      f"a job); end (report, parent run, exit) {part['end']:6.2f}")
    if runs["floor"]:
        fw, fc = med(runs["floor"], "wall"), med(runs["floor"], "cpu")
        print(f"\nfloor: the calibrun process's imports alone / bare onnxruntime process = {fw / m['bare.wall']:.2f}x "
              f"wall, {fc / m['bare.cpu']:.2f}x cpu")
    if runs["mlflow"]:
        iw, ic = med(runs["mlflow"], "wall"), med(runs["mlflow"], "cpu")
        writer = m["sweep.cpu"] - m["notrack.cpu"]  # the tracked sweep's extra CPU: the writer's, nearly all
        print(f"writer's floor: MLflow's import alone {iw:.2f} s wall ({ic:.2f} s cpu) = {iw / m['bare.wall']:.2f}x "
              f"bare; the writer's CPU in the tracked sweep ((1) - (1b)) {writer:.2f} s = "
              f"{writer / m['bare.wall']:.2f}x bare: a tracked sweep ends after its writer (one process, its work in "
              f"order), so it scores about that or more here")
    for goal in GOALS:
        verdict = "MET" if ratio <= goal else "NOT MET"
        print(f"\ngoal: calibrun sweep <= {goal:.0f}x bare onnxruntime process (wall) -> {verdict}: {ratio:.2f}x wall, "
              f"{cpu_ratio:.2f}x cpu (the goal means a sweep of <= {goal * m['bare.wall']:.2f}s wall here)")
    started = [r["phases"]["start"] for r in runs["sweep"] if r.get("phases")]
    if started:
        first = statistics.median(started)
        print(f"goal: start to the first job <= {START_GOAL:.0f} s -> {'MET' if first <= START_GOAL else 'NOT MET'}: "
              f"{first:.2f} s (median; the machine's load is in the table above)")
    print("\n### where the sweep's time goes (medians; differences of the rows above)")
    print(f"  {'':<76} {'wall s':>7} {'%':>6} {'cpu s':>7} {'%':>6}")
    parts = [
        ("onnxruntime work (bare loop)", "bare.loop", None, "bare.loop_cpu", None),
        ("Python start + numpy/onnxruntime imports (bare process - bare loop)",
         "bare.wall", "bare.loop", "bare.cpu", "bare.loop_cpu"),
        ("calibrun engine vs bare onnxruntime (engine loop - bare loop)",
         "engine.loop", "bare.loop", "engine.loop_cpu", "bare.loop_cpu"),
        ("calibrun functions imports beyond bare ((engine - bare) process - loop)", "ENGINE_IMPORTS", None, None, None),
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


IMPORT_PACKAGES = ("hydra", "omegaconf", "numpy", "onnx", "onnxruntime", "onnxruntime.quantization",
                   "calibrun.runner", "mlflow", "sqlalchemy", "alembic", "pandas", "pyarrow", "fastapi",
                   "matplotlib", "matplotlib.pyplot")


def print_importtime(it: dict) -> None:
    entries = it["entries"]
    roots = [e for e in entries if e[0] == 0]
    total = sum(e[3] for e in roots)
    print(f"\n### breakdown 1: imports of the sweep process (python -X importtime; wall {it['wall']:.2f}s; "
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
        print(f"  {pkg:<42} {first[3]:6.2f}" if first else f"  {pkg:<42} not imported by the sweep")


def print_cprofile(wall: float, prof: Path, top: int = 30) -> None:
    import pstats

    stats = pstats.Stats(str(prof))
    total = stats.total_tt
    entries = stats.stats  # (file, line, func) -> (cc, nc, tt, ct, callers)
    print(f"\n### breakdown 2: cProfile of the sweep (wall {wall:.2f}s under the profiler, profiled total "
          f"{total:.2f}s; the profiler inflates Python-heavy code such as OmegaConf ~2x)\n")
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
