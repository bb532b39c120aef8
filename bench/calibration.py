"""Calibration benchmark on a ResNet-50-class model: memory, speed and the cache, side by side in one run.

    python bench/calibration.py                      # full: ResNet-50 shape, 8/64/512 batches (long)
    python bench/calibration.py --quick              # small model and counts, < 2 minutes (smoke test)
    python bench/calibration.py --batches 8,64 --time-batches 16 --chunks 16,1

(a) Peak RSS of Entropy calibration at each batch count: calibrun's `run_calibration` on the lazy lab data
    (`lab_batches(info, 4242, 1.0, n)`, 16 images per batch) for each `--chunks` value, against bare
    `onnxruntime.quantization.quantize_static(calibrate_method=Entropy)` fed a list-backed reader, and plain
    inference as a reference. Every measurement runs in a fresh subprocess; its peak RSS is the
    `ru_maxrss` that `os.wait4` reports for it. A measurement whose estimate exceeds `--mem-limit-gb` is
    skipped; a watchdog kills a child whose RSS passes `--kill-gb` or that leaves the machine short of memory.
(b) Time of calibration (`run_calibration`, MinMax and Entropy) against plain inference over the same
    `--time-batches` batches, with a breakdown of where the calibration time goes.
(c) `calibrun.quant.quantize.quantize_lab` with a fresh cache folder, twice (miss, then hit), each in a fresh process.

Tables go to stdout; progress and estimates go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from _common import log, wait_child

SEED, FACTOR = 4242, 1.0
GB = 1e9
GOAL_FLAT, GOAL_SPEED, GOAL_HIT = 1.1, 1.2, 0.25


# --------------------------------------------------------------------------------------------------
# The child side: one measurement per process.
# --------------------------------------------------------------------------------------------------


class _Timers:
    """Wall-clock seconds per phase, filled by the wrappers below."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.in_collect = False

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start


class _TimedBatches:
    """Wraps a sized, re-iterable batch source; the time spent producing batches goes to `data`."""

    def __init__(self, source, timers: _Timers):
        self.source, self.timers = source, timers

    def __len__(self):
        return len(self.source)

    def identity(self):
        return self.source.identity()

    def __iter__(self):
        it = iter(self.source)
        while True:
            with self.timers.phase("data"):
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item


def _instrument_calibrator(factory, timers: _Timers):
    """Wrap onnxruntime's `create_calibrator` so setup, session.run, collect and compute are timed."""

    def create(*args, **kwargs):
        with timers.phase("setup"):
            calibrator = factory(*args, **kwargs)
        collect, compute = calibrator.collect_data, calibrator.compute_data

        def timed_collect(reader):
            timers.in_collect = True
            try:
                with timers.phase("collect_data"):
                    return collect(reader)
            finally:
                timers.in_collect = False

        def timed_compute():
            if timers.in_collect:
                return compute()
            with timers.phase("compute_data"):
                return compute()

        if calibrator.infer_session is not None:  # onnxruntime's own calibrator opened its session here
            _time_runs(calibrator.infer_session, timers)
        calibrator.collect_data = timed_collect
        calibrator.compute_data = timed_compute
        return calibrator

    return create


def _time_runs(sess, timers: _Timers) -> None:
    run = sess.run

    def timed_run(*a, **k):
        with timers.phase("session.run"):
            return run(*a, **k)

    sess.run = timed_run


def _instrument_lean_session(original, timers: _Timers):
    """calibrun opens the calibrator's session itself after create_calibrator (calibrate._lean_session): time its
    runs there."""

    def lean_session(calibrator, threads):
        original(calibrator, threads)
        _time_runs(calibrator.infer_session, timers)

    return lean_session


def _max_bins(tensors) -> int:
    bins = 0
    for data in tensors.values():
        hist = getattr(data, "hist", None)
        if hist is not None:
            bins = max(bins, int(np.asarray(hist).size))
    return bins


def _child_calibrun(job: dict, timers: _Timers) -> dict:
    import calibrun.quant.calibrate as cc
    from calibrun.lab.data import lab_batches
    from calibrun.model import float_input, load_model

    cc.create_calibrator = _instrument_calibrator(cc.create_calibrator, timers)
    cc._lean_session = _instrument_lean_session(cc._lean_session, timers)
    info = float_input(load_model(job["model"]), job["model"])
    data = _TimedBatches(lab_batches(info, SEED, FACTOR, job["batches"]), timers)
    spec = cc.CalibrationSpec(method=job["method"], chunk=job["chunk"])
    start, cpu_start = time.perf_counter(), time.process_time()
    tensors, span = cc.run_calibration(job["model"], data, info.name, spec)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "cpu": time.process_time() - cpu_start, "tensors": len(tensors.data),
            "max_bins": _max_bins(tensors), "span": span}


class _ListReader:
    """The textbook CalibrationDataReader: every batch in a Python list, served in order."""

    def __init__(self, feeds: list[dict]):
        self.feeds, self.pos = feeds, 0

    def get_next(self):
        if self.pos >= len(self.feeds):
            return None
        self.pos += 1
        return self.feeds[self.pos - 1]

    def __len__(self):
        return len(self.feeds)

    def set_range(self, start_index: int, end_index: int):
        raise NotImplementedError


def _child_bare(job: dict, timers: _Timers) -> dict:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat

    ortq = sys.modules["onnxruntime.quantization.quantize"]  # the package re-exports a function of that name

    from calibrun.lab.data import lab_batches
    from calibrun.model import float_input, load_model

    ortq.create_calibrator = _instrument_calibrator(ortq.create_calibrator, timers)
    info = float_input(load_model(job["model"]), job["model"])
    start, cpu_start = time.perf_counter(), time.process_time()
    with timers.phase("data"):
        feeds = [{info.name: array} for array in lab_batches(info, SEED, FACTOR, job["batches"])]
    method = {"entropy": CalibrationMethod.Entropy, "minmax": CalibrationMethod.MinMax}[job["method"]]
    with tempfile.TemporaryDirectory(prefix="bench.bare.") as tmp:
        ortq.quantize_static(job["model"], str(Path(tmp) / "int8.onnx"), _ListReader(feeds),
                             quant_format=QuantFormat.QDQ, calibrate_method=method)
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu_start}


def _child_plain(job: dict, timers: _Timers) -> dict:
    import onnxruntime as ort

    from calibrun.lab.data import lab_batches
    from calibrun.model import float_input, load_model

    info = float_input(load_model(job["model"]), job["model"])
    data = _TimedBatches(lab_batches(info, SEED, FACTOR, job["batches"]), timers)
    start, cpu_start = time.perf_counter(), time.process_time()
    with timers.phase("setup"):
        options = ort.SessionOptions()
        if not job.get("optimize", True):
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(job["model"], options, providers=["CPUExecutionProvider"])
    for array in data:
        with timers.phase("session.run"):
            session.run(None, {info.name: array})
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu_start}


def _child_quantize_lab(job: dict, timers: _Timers) -> dict:
    from calibrun.model import open_float_model
    from calibrun.quant.calibrate import CalibrationCache, CalibrationSpec
    from calibrun.quant.quantize import quantize_lab

    start, cpu_start = time.perf_counter(), time.process_time()
    model = open_float_model(job["model"])
    spec = CalibrationSpec(method=job["method"], chunk=job["chunk"])
    result = quantize_lab(model, job["out"], SEED, FACTOR, job["batches"], spec=spec,
                          cache=CalibrationCache(job["cache"]))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    timers.seconds["calibration"] = result["calibration_seconds"]
    timers.seconds["quantize_static"] = result["quantization_seconds"]
    return {"seconds": seconds, "cpu": cpu, "hit": result["cache_hit"], "bytes": result["bytes"]}


CHILDREN = {"calibrun": _child_calibrun, "bare": _child_bare, "plain": _child_plain,
            "quantize_lab": _child_quantize_lab}


def _vm_hwm() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child_main(job_json: str, result_path: str) -> int:
    job = json.loads(job_json)
    timers = _Timers()
    result = CHILDREN[job["kind"]](job, timers)
    result["phases"] = dict(timers.seconds)
    result["vm_hwm"] = _vm_hwm()
    result["loadavg_1min_at_end"] = os.getloadavg()[0]
    Path(result_path).write_text(json.dumps(result))
    return 0


# --------------------------------------------------------------------------------------------------
# The parent side: estimates, subprocesses with a memory watchdog, tables.
# --------------------------------------------------------------------------------------------------


def _mem_available() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 62


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_child(job: dict, kill_bytes: float, reserve_bytes: float) -> dict:
    """One measurement in a fresh process; returns its result with `peak` (bytes) or an `error`."""
    with tempfile.NamedTemporaryFile(prefix="bench.result.", suffix=".json", delete=False) as handle:
        result_path = handle.name
    try:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", json.dumps(job), result_path],
            stdout=subprocess.DEVNULL,  # onnxruntime's calibrators print a line per collect call
            stderr=sys.stderr,
        )
        killed: list[str] = []
        done = threading.Event()

        def watchdog():
            while not done.wait(0.2):
                rss = _rss(proc.pid)
                if rss > kill_bytes:
                    killed.append(f"killed at {rss / GB:.1f} GB RSS (limit {kill_bytes / GB:.0f} GB)")
                elif _mem_available() < reserve_bytes:
                    killed.append(f"killed at {rss / GB:.1f} GB RSS (machine had < {reserve_bytes / GB:.1f} GB free)")
                else:
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                return

        thread = threading.Thread(target=watchdog, daemon=True)
        thread.start()
        peak = wait_child(proc).peak_rss
        done.set()
        thread.join()
        if killed or proc.returncode != 0:
            reason = killed[0] if killed else f"exit status {proc.returncode}"
            return {"error": reason, "peak": peak}
        result = json.loads(Path(result_path).read_text())
        result["peak"] = peak
        return result
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(result_path)


class ModelFacts:
    """What the estimates need: bytes of the calibrated activations per batch, the largest one, the file."""

    def __init__(self, path: Path):
        import onnx
        from onnx import shape_inference

        from calibrun.lab.data import ROWS_PER_BATCH
        from calibrun.model import float_input
        from calibrun.quant.calibrate import CalibrationSpec

        model = shape_inference.infer_shapes(onnx.load(str(path)))
        self.info = float_input(model, path)
        ops = set(CalibrationSpec().op_types_calibrated())
        values = {v.name: v for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]}
        initializers = {init.name for init in model.graph.initializer}
        names = set()
        for node in model.graph.node:
            if node.op_type in ops:
                names.update(t for t in [*node.input, *node.output] if t in values and t not in initializers)
        sizes = []
        for name in names:
            dims = [d.dim_value for d in values[name].type.tensor_type.shape.dim[1:]]
            sizes.append(math.prod(dims) * 4 * ROWS_PER_BATCH)
        self.tensors = len(names)
        self.batch_activations = float(sum(sizes))  # what one batch's calibration outputs occupy
        self.largest = float(max(sizes))
        self.input_batch = float(math.prod(self.info.shape[1:]) * 4 * ROWS_PER_BATCH)
        self.file_bytes = float(path.stat().st_size)
        self.nodes = len(model.graph.node)

    def base(self) -> float:
        """Interpreter + onnxruntime + a few in-memory copies of the model (load, shape inference, session)."""
        return 0.4 * GB + 4 * self.file_bytes

    def calibration_peak(self, held_batches: int) -> float:
        """Held session outputs of `held_batches` batches, plus the stacked and flattened copy of one tensor."""
        return self.base() + held_batches * (self.batch_activations + self.input_batch + 2 * self.largest)


def human_gb(value: float) -> str:
    return f"{value / GB:.2f} GB"


def parse_counts(text: str) -> list[int]:
    counts = sorted({int(part) for part in text.split(",") if part.strip()})
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return counts


class Bench:
    def __init__(self, args, model_path: Path, facts: ModelFacts):
        self.args, self.model, self.facts = args, str(model_path), facts
        self.sec_per_batch: dict[str, float] = {}
        self.started = time.perf_counter()

    def measure(self, label: str, job: dict, estimate_seconds: float | None = None) -> dict:
        job = {"model": self.model, **job}
        eta = f", estimated ~{estimate_seconds:.0f} s" if estimate_seconds else ""
        log(f"{label}{eta} (bench running for {time.perf_counter() - self.started:.0f} s)")
        result = run_child(job, self.args.kill_gb * GB, self.args.reserve_gb * GB)
        if "error" in result:
            log(f"  {label}: FAILED ({result['error']})")
        else:
            log(f"  {label}: {result['seconds']:.1f} s, peak RSS {human_gb(result['peak'])}")
            print(f"# {label}: " + json.dumps(result, sort_keys=True), flush=True)
        return result

    def guess_seconds(self, kind: str, batches: int) -> float | None:
        per = self.sec_per_batch.get(kind)
        return None if per is None else 5 + per * batches


def best_run(results: list[dict]) -> dict:
    """The run with the least wall time (outside load only ever adds time); all wall/CPU times recorded."""
    good = [r for r in results if "error" not in r]
    if not good:
        return results[0]
    best = dict(min(good, key=lambda r: r["seconds"]))
    best["all_seconds"] = [round(r["seconds"], 2) for r in good]
    best["all_cpu"] = [round(r.get("cpu", math.nan), 2) for r in good]
    return best


def _cell_memory(result: dict | None, skipped: str | None) -> str:
    if skipped:
        return skipped
    if result is None:
        return "-"
    if "error" in result:
        reached = f", peak {human_gb(result['peak'])} until then" if result.get("peak") else ""
        return f"FAILED: {result['error']}{reached}"
    return f"{human_gb(result['peak'])} ({result['seconds']:.0f} s)"


def _phase_line(result: dict, batches: int) -> str:
    phases = result.get("phases", {})
    total = result.get("seconds", 0.0)
    run = phases.get("session.run", 0.0)
    collect = phases.get("collect_data", 0.0)
    parts = []
    for key, value in (("setup", phases.get("setup", 0.0)),
                       ("data", phases.get("data", 0.0)),
                       ("session.run", run),
                       ("collect (histograms/reduce, span check)", max(collect - run - phases.get("data", 0.0), 0.0)
                        if collect else 0.0),
                       ("compute_data", phases.get("compute_data", 0.0))):
        if value:
            parts.append(f"{key} {value:.1f}s")
    accounted = sum(phases.get(k, 0.0) for k in ("setup", "compute_data")) + (collect or run + phases.get("data", 0))
    parts.append(f"other {max(total - accounted, 0.0):.1f}s")
    return f"{total:.1f} s total ({total / batches:.2f} s/batch): " + ", ".join(parts)


def section_memory(bench: Bench, out: list[str]) -> None:
    args, facts = bench.args, bench.facts
    counts = args.batches
    rows: list[tuple[str, str, dict[int, tuple[dict | None, str | None]]]] = []
    limit = args.mem_limit_gb * GB

    def skip_text(estimate: float) -> str | None:
        return f"skipped (would need {estimate / GB:.1f} GB)" if estimate > limit else None

    # Plan every cell first, then run them smallest batch count first, so a long largest count comes last.
    Cells = dict[int, tuple[dict | None, str | None]]
    plan: list[tuple[int, str, Cells, dict]] = []
    n0 = counts[0]
    plain_cells: Cells = {}
    plan.append((n0, f"(a) plain inference, {n0} batches", plain_cells, {"kind": "plain", "batches": n0}))
    for chunk in args.chunks:
        cells: Cells = {}
        for n in counts:
            estimate = facts.calibration_peak(min(n, chunk))
            label = f"(a) calibrun entropy chunk={chunk}, {n} batches (estimate {human_gb(estimate)})"
            if skip_text(estimate):
                log(f"{label}: {skip_text(estimate)}")
                cells[n] = (None, skip_text(estimate))
                continue
            plan.append((n, label, cells, {"kind": "calibrun", "method": "entropy", "batches": n, "chunk": chunk}))
        default = " (CalibrationSpec default)" if chunk == 1 else ""  # batches_per_collect: 1 for histograms
        rows.append((f"calibrun run_calibration, chunk={chunk}{default}", "calibrun", cells))
    cells = {}
    for n in counts:
        estimate = facts.calibration_peak(n) + n * facts.input_batch
        label = f"(a) bare quantize_static entropy, {n} batches (estimate {human_gb(estimate)})"
        if skip_text(estimate):
            log(f"{label}: {skip_text(estimate)}")
            cells[n] = (None, skip_text(estimate))
            continue
        plan.append((n, label, cells, {"kind": "bare", "method": "entropy", "batches": n}))
    rows.append(("bare quantize_static, list reader", "bare", cells))
    rows.append(("plain InferenceSession (reference)", "plain", plain_cells))

    guesses = [bench.guess_seconds("plain" if job["kind"] == "plain" else "entropy", n) for n, *_, job in plan]
    if all(g is not None for g in guesses):
        log(f"(a) {len(plan)} measurements, estimated ~{sum(guesses) / 60:.0f} min in all")
    plan.sort(key=lambda item: item[0])
    for n, label, target, job in plan:
        guess = bench.guess_seconds("plain" if job["kind"] == "plain" else "entropy", n)
        target[n] = (bench.measure(label, job, guess), None)

    out.append("")
    out.append(f"(a) Peak RSS of Entropy calibration ({facts.tensors} calibrated tensors, "
               f"{human_gb(facts.batch_activations)} of them per 16-image batch); cells: peak RSS (wall time)")
    header = ["", *[f"{n} batches" for n in counts], "peak(largest)/peak(smallest) measured"]
    table = [header]
    ratios = {}
    for label, _kind, cells in rows:
        line = [label]
        for n in counts:
            result, skipped = cells.get(n, (None, None))
            line.append(_cell_memory(result, skipped))
        measured = [n for n in counts if cells.get(n, (None, None))[0] and "error" not in cells[n][0]]
        if len(measured) >= 2:
            ratio = cells[measured[-1]][0]["peak"] / cells[measured[0]][0]["peak"]
            ratios[label] = (ratio, measured[0], measured[-1])
            line.append(f"{ratio:.3f} ({measured[-1]} vs {measured[0]})")
        else:
            line.append("n/a")
        table.append(line)
    out.extend(_format_table(table))
    for label, (ratio, lo, hi) in ratios.items():
        if label.startswith("calibrun"):
            verdict = "meets" if ratio <= GOAL_FLAT else "MISSES"
            out.append(f"  {label}: peak({hi})/peak({lo}) = {ratio:.3f} -> {verdict} the goal <= {GOAL_FLAT}")
    for label, _kind, cells in rows:
        if label.startswith("calibrun"):
            for n in counts:
                result = cells.get(n, (None, None))[0]
                if result and "error" not in result:
                    out.append(f"  {label}, {n} batches: {_phase_line(result, n)}; "
                               f"largest histogram {result.get('max_bins', 0)} bins")


def section_time(bench: Bench, out: list[str]) -> None:
    n = bench.args.time_batches
    chunk = bench.args.time_chunk
    repeat = bench.args.repeat
    jobs: dict[str, tuple[str, dict]] = {
        "plain": (f"(b) plain inference, {n} batches", {"kind": "plain", "batches": n}),
        "plain_noopt": (f"(b) plain inference without graph optimisation, {n} batches",
                        {"kind": "plain", "batches": n, "optimize": False}),
    }
    skipped: dict[str, dict] = {}
    for method in ("minmax", "entropy"):
        estimate = bench.facts.calibration_peak(min(n, chunk) if method == "entropy" else 1)
        if estimate > bench.args.mem_limit_gb * GB:
            skipped[method] = {"error": f"skipped (would need {estimate / GB:.1f} GB; lower --time-chunk)"}
            continue
        jobs[method] = (f"(b) calibrun {method} chunk={chunk}, {n} batches",
                        {"kind": "calibrun", "method": method, "batches": n, "chunk": chunk})
    runs: dict[str, list[dict]] = defaultdict(list)
    guess_kind = {"plain": "plain", "plain_noopt": "plain", "minmax": "minmax", "entropy": "entropy"}
    for rep in range(repeat):  # round-robin, so a burst of outside load does not hit every run of one job
        for key, (label, job) in jobs.items():
            suffix = f" [run {rep + 1}/{repeat}]" if repeat > 1 else ""
            result = bench.measure(label + suffix, job, bench.guess_seconds(guess_kind[key], n))
            runs[key].append(result)
            if "error" not in result and key in ("plain", "minmax", "entropy"):
                bench.sec_per_batch.setdefault(key, result["seconds"] / n)
    best = {key: best_run(results) for key, results in runs.items()}
    plain, plain_noopt = best["plain"], best["plain_noopt"]
    results = {method: best.get(method) or skipped[method] for method in ("minmax", "entropy")}

    out.append("")
    out.append(f"(b) Calibration time vs plain inference over the same {n} batches (chunk={chunk}); "
               f"best (least wall time) of {repeat} run(s) each, runs interleaved")
    table = [["", "wall s", "s/batch", "wall vs plain", "CPU s", "CPU vs plain", "peak RSS", "goal (wall)"]]
    base = plain.get("seconds") if "error" not in plain else None
    cpu_base = plain.get("cpu") if "error" not in plain else None
    for label, result, goal in (("plain InferenceSession (all graph optimisations)", plain, ""),
                                ("plain InferenceSession (ORT_DISABLE_ALL)", plain_noopt, ""),
                                ("calibrun run_calibration MinMax", results["minmax"], "<= 1.2"),
                                ("calibrun run_calibration Entropy", results["entropy"], "<= 1.2")):
        if "error" in result:
            table.append([label, result["error"], "", "", "", "", "", goal])
            continue
        ratio = result["seconds"] / base if base else math.nan
        cpu_ratio = result.get("cpu", math.nan) / cpu_base if cpu_base else math.nan
        verdict = "" if not goal else ("meets" if ratio <= GOAL_SPEED else "MISSES")
        table.append([label, f"{result['seconds']:.1f}", f"{result['seconds'] / n:.2f}",
                      f"{ratio:.2f}x", f"{result.get('cpu', math.nan):.1f}", f"{cpu_ratio:.2f}x",
                      human_gb(result["peak"]), f"{goal} {verdict}".strip()])
    out.extend(_format_table(table))
    if repeat > 1:
        out.append("  every run, wall s / CPU s: " + "; ".join(
            f"{key} {best[key].get('all_seconds')} / {best[key].get('all_cpu')}" for key in best))
    out.append("  where the time goes:")
    for label, result in (("plain", plain), ("plain ORT_DISABLE_ALL", plain_noopt),
                          ("MinMax", results["minmax"]), ("Entropy", results["entropy"])):
        if "error" not in result:
            out.append(f"    {label}: {_phase_line(result, n)}")


def section_cache(bench: Bench, out: list[str]) -> None:
    args = bench.args
    n = args.cache_batches
    misses, hits = [], []
    for rep in range(args.repeat):
        suffix = f" [run {rep + 1}/{args.repeat}]" if args.repeat > 1 else ""
        cache_root = Path(tempfile.mkdtemp(prefix="cache-bench.", dir=args.work))
        try:
            job = {"kind": "quantize_lab", "batches": n, "method": args.cache_method, "chunk": args.time_chunk,
                   "cache": str(cache_root / "cache"), "out": str(cache_root / "int8.onnx")}
            misses.append(bench.measure(f"(c) quantize_lab {args.cache_method}, {n} batches, fresh cache (miss)"
                                        + suffix, job, bench.guess_seconds(args.cache_method, n)))
            hits.append(bench.measure(f"(c) quantize_lab {args.cache_method}, {n} batches, same cache (hit)"
                                      + suffix, job))
        finally:
            shutil.rmtree(cache_root, ignore_errors=True)
    miss, hit = best_run(misses), best_run(hits)
    out.append("")
    out.append(f"(c) Cache: quantize_lab ({args.cache_method}, chunk={args.time_chunk}, {n} batches), "
               f"open_float_model + quantize_lab, each in a fresh process; best of {args.repeat} run(s)")
    table = [["", "seconds", "calibration s", "quantize_static s", "cache_hit", "peak RSS"]]
    for label, result in (("miss (fresh cache folder)", miss), ("hit (same folder)", hit)):
        if "error" in result:
            table.append([label, result["error"], "", "", "", ""])
            continue
        phases = result["phases"]
        table.append([label, f"{result['seconds']:.2f}", f"{phases.get('calibration', 0):.2f}",
                      f"{phases.get('quantize_static', 0):.2f}", str(result["hit"]), human_gb(result["peak"])])
    out.extend(_format_table(table))
    if "error" not in miss and "error" not in hit:
        ratio = hit["seconds"] / miss["seconds"]
        verdict = "meets" if ratio < GOAL_HIT else "MISSES"
        cpu_ratio = hit.get("cpu", math.nan) / miss.get("cpu", math.nan)
        if args.repeat > 1:
            out.append(f"  every run, wall s: miss {miss.get('all_seconds')}, hit {hit.get('all_seconds')}")
        out.append(f"  hit/miss = {ratio:.3f} wall ({cpu_ratio:.3f} CPU) -> {verdict} the goal < {GOAL_HIT}"
                   f" (hit: {hit['phases'].get('quantize_static', 0):.1f} s of it is quantize_static itself)")


def _format_table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        lines.append("  " + " | ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            lines.append("  " + "-+-".join("-" * width for width in widths))
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1], argv[2])
    parser = argparse.ArgumentParser(description="calibrun calibration benchmark (memory, speed, cache)")
    parser.add_argument("--quick", action="store_true",
                        help="small model (64x64 images, narrow stages) and counts 2,4,8: a < 2 minute smoke test")
    parser.add_argument("--batches", type=parse_counts, help="batch counts for (a) (default 8,64,512)")
    parser.add_argument("--chunks", type=parse_counts,
                        help="run_calibration chunk sizes measured in (a) (default 1,16: 16 is the spec default)")
    parser.add_argument("--time-batches", type=int, help="batches for (b) (default 16)")
    parser.add_argument("--time-chunk", type=int, default=1,
                        help="chunk for (b) and (c); Entropy holds chunk x one batch of activations (default 1)")
    parser.add_argument("--cache-batches", type=int, help="batches for (c) (default 16)")
    parser.add_argument("--cache-method", default="minmax", choices=["minmax", "entropy"],
                        help="calibration method for (c) (default minmax, quantize_lab's default)")
    parser.add_argument("--sections", default="time,cache,memory",
                        help="which of time,cache,memory to run, in this order (default all)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each (b) and (c) measurement, interleaved; the fastest is reported (default 1)")
    parser.add_argument("--mem-limit-gb", type=float, default=16.0,
                        help="skip a measurement whose estimated peak exceeds this (default 16)")
    parser.add_argument("--kill-gb", type=float, default=20.0, help="kill a child whose RSS passes this (default 20)")
    parser.add_argument("--reserve-gb", type=float, default=1.0,
                        help="kill the child when the machine has less than this available (default 1)")
    parser.add_argument("--model", type=Path, help="use this model instead of the generated ResNet")
    args = parser.parse_args(argv)

    from resnet import CACHE_DIR, QUICK, RESNET50, cached_resnet

    args.batches = args.batches or ([2, 4, 8] if args.quick else [8, 64, 512])
    args.chunks = args.chunks or [1, 16]
    args.time_batches = args.time_batches or (4 if args.quick else 16)
    args.cache_batches = args.cache_batches or (4 if args.quick else 16)
    args.work = CACHE_DIR
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    config = QUICK if args.quick else RESNET50
    model_path = args.model or cached_resnet(config)
    facts = ModelFacts(model_path)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]

    out = [
        f"calibrun calibration benchmark: {model_path.name} ({facts.file_bytes / 1e6:.1f} MB, {facts.nodes} nodes, "
        f"input {list(facts.info.shape)}), 16 images per batch, lab data seed {SEED} factor {FACTOR}",
        f"machine: {os.cpu_count()} CPUs, {_mem_available() / GB:.1f} GB available at start; "
        f"numpy {np.__version__}, onnxruntime {__import__('onnxruntime').__version__}",
        f"estimates: {human_gb(facts.batch_activations)} of calibrated activations per batch "
        f"({facts.tensors} tensors), skip above {args.mem_limit_gb:.0f} GB, kill above {args.kill_gb:.0f} GB",
    ]
    for line in out:
        log(line)
    bench = Bench(args, model_path, facts)
    for section in sections:
        {"time": section_time, "cache": section_cache, "memory": section_memory}[section](bench, out)
    out.append("")
    out.append(f"total benchmark time {time.perf_counter() - bench.started:.0f} s; "
               f"1-min load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
               "(above the CPU count, other processes competed and wall times are inflated: compare CPU s)")
    print("\n".join(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
