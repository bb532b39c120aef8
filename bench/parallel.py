"""Parallel local sweeps: the basic launcher against the joblib launcher, on a conv net, in one run.

    .venv/bin/pip install -e '.[parallel]'
    .venv/bin/python bench/parallel.py              # 12 jobs per setting, about 1 minute on 2 idle cores
    .venv/bin/python bench/parallel.py --rounds 3 --wait-idle 0.85   # the figures reported: 3 rounds, quiet CPU
    .venv/bin/python bench/parallel.py --batches 8 --formats qdq --eval-rows 32   # 3 jobs: a quick smoke run
    .venv/bin/python bench/parallel.py --trained --rounds 2   # the cache across workers: YOLOv8n, joblib and Ray

`--trained`: the sweep a user scales out, `method=minmax,percentile,entropy format=qdq,qoperator` (6 jobs, 3
distinct calibrations) on NudeNet's YOLOv8n (tests/trained.py, 320x320) with 12 of scikit-image's photos, the
calibration cache ON and shared: 1 worker (basic launcher) against 2 joblib workers and 2 Ray workers (a local Ray
on loopback, 2 CPUs), one onnxruntime thread per job. Each setting's calibrations are counted from the jobs'
result.json (`cache_hit` 0) and must be exactly 3 (exit 1 otherwise); the seconds jobs waited for another's
calibration are summed. Goals: joblib / 1 and ray / 1 >= 1.7 on 2 cores.

The same sweep (`model=file` on a small conv net, `cache=off` so that every job really calibrates,
calibration=narrow,match,wide x batches x format) runs three times, back to back, each as its own
`python -m calibrun -m ...` in a fresh temp folder with its own MLflow SQLite store:

    1x1  basic launcher (jobs one after the other), ort.intra_op_threads=1
    1x2  basic launcher,                            ort.intra_op_threads=2
    2x1  hydra/launcher=joblib hydra.launcher.n_jobs=2, ort.intra_op_threads=1

Timing: jobs per second over the *jobs window*, from the start of the first job's MLflow run to the end of
the last one (read back from the store). This leaves out Python start-up, config composition, joblib's
worker start, the report and the parent run: only the jobs themselves. The whole-process wall time is
printed beside it. Each setting must leave one FINISHED parent run and the same number of FINISHED child
runs (checked; exit 1 otherwise). Goals on 2 cores: 2x1 / 1x1 >= 1.6 and 2x1 / 1x2 >= 1.0.
/proc/loadavg is printed before each setting: other processes on the machine skew every figure. With
`--rounds N` the three settings run N times in turn (1x1 1x2 2x1 1x1 ...), every run is listed, and the
ratios use each setting's best round (the one least disturbed by the rest of the machine). Each row also
shows the CPU seconds the sweep used (`cpu s`: the calibrun process and its workers) and `others`: the CPU
the rest of the machine used meanwhile, as a share of all cores (from /proc/stat). `--wait-idle 0.9` waits
before each setting until the machine is 90% idle over 3 s (at most 10 minutes).

The conv net (built with onnx.helper, cached in bench/.cache/): input [N, 3, 64, 64], five 3x3 Conv + Relu
(16, 32/2, 32, 64/2, 64 channels; /2 = stride 2), GlobalAveragePool, Flatten, Gemm -> 10. About 30 M
multiply-adds per image: one calibration batch (16 images) is about a GFLOP. A job (16 or 32 batches, 64
evaluation images; QDQ jobs also run the per-tensor diagnostics) takes about 0.7-1.3 s on one idle core.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from _common import CACHE_DIR, loadavg, machine_cpu, wait_for_idle, write_model
from onnx import TensorProto, helper, numpy_helper

GENERATOR_VERSION = 1  # bump when the graph or the weights change
IMAGE = 64
LAYERS = ((3, 16, 1), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1))  # (in, out, stride)
CLASSES = 10
SETTINGS = (  # label, workers, threads, launcher overrides
    ("1x1", 1, 1, []),
    ("1x2", 1, 2, []),
    ("2x1", 2, 1, ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]),
)
GOALS = {"2x1 / 1x1": 1.6, "2x1 / 1x2": 1.0}
TRAINED_SETTINGS = (  # label, workers, threads, launcher overrides
    ("1", 1, 1, []),
    ("joblib2", 2, 1, ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]),
    ("ray2", 2, 1, ["hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2",
                    "+hydra.launcher.ray.init._node_ip_address=127.0.0.1",
                    "+hydra.launcher.ray.init.include_dashboard=false", "+hydra.launcher.ray.remote.num_cpus=1"]),
)
TRAINED_GOALS = {"joblib2 / 1": 1.7, "ray2 / 1": 1.7}
TRAINED_CALIBRATIONS = 3


def trained_sweep(work: Path) -> tuple[Path, list[str]]:
    """NudeNet's YOLOv8n and the overrides of the 6-job sweep (images as its package feeds them)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.trained import PHOTOS, TEXT_PHOTOS, model_path, photo_folder

    photos = photo_folder(work / "photos", PHOTOS + TEXT_PHOTOS)
    rows = len(list(photos.iterdir()))
    sweep = ["method=minmax,percentile,entropy", "format=qdq,qoperator", f"batches={rows}", f"eval.rows={rows}"]
    for key in ("data", "eval_data"):  # 320x320 RGB, /255, letterboxed and padded with 0
        sweep += [f"{key}=images", f"{key}.path={photos}", f"{key}.crop=320", f"{key}.letterbox=true",
                  f"{key}.pad_value=0", f"{key}.mean=[0,0,0]", f"{key}.std=[1,1,1]"]
    return model_path("nudenet"), sweep


def calibrations(sweep_dir: Path) -> tuple[int, float]:
    """(jobs that calibrated, seconds jobs waited for another's calibration) from the jobs' result.json."""
    import json

    metrics = [json.loads(p.read_text())["metrics"] for p in sweep_dir.glob("*/result.json")]
    return (sum(1 for m in metrics if not m.get("cache_hit")),
            sum(m.get("calibration_wait_seconds", 0.0) for m in metrics))


def build_convnet(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i, (cin, cout, stride) in enumerate(LAYERS):
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.05).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"conv{i}.weight"), numpy_helper.from_array(b, f"conv{i}.bias")]
        nodes.append(helper.make_node("Conv", [x, f"conv{i}.weight", f"conv{i}.bias"], [f"conv{i}"], name=f"conv{i}",
                                      kernel_shape=[3, 3], strides=[stride, stride], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"relu{i}"))
        x = f"relu{i}"
    cin = LAYERS[-1][1]
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1))
    fc_w = (rng.standard_normal((CLASSES, cin)) * np.sqrt(1.0 / cin)).astype(np.float32)
    inits += [numpy_helper.from_array(fc_w, "fc.weight"), numpy_helper.from_array(np.zeros(CLASSES, np.float32),
                                                                                   "fc.bias")]
    nodes.append(helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1))
    graph = helper.make_graph(
        nodes, "bench_convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, IMAGE, IMAGE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="calibrun-bench")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def cached_convnet(folder: Path = CACHE_DIR) -> Path:
    """The conv net under bench/.cache/, written once (temp file + rename) and reused."""
    path = folder / f"convnet-v{GENERATOR_VERSION}-i{IMAGE}.onnx"
    return path if path.is_file() else write_model(path, build_convnet())


def child_runs(db: Path) -> tuple[int, list[tuple[int, int]]]:
    """(parent runs FINISHED, [(start_ms, end_ms) of each FINISHED child run]); raises on anything else."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("calibrun")
    runs = list(client.search_runs([experiment.experiment_id], max_results=10_000))
    bad = [r.info.run_name for r in runs if r.info.status != "FINISHED"]
    if bad:
        raise RuntimeError(f"runs not FINISHED in {db}: {bad}")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [(r.info.start_time, r.info.end_time) for r in runs if "mlflow.parentRunId" in r.data.tags]
    return len(parents), children


def run_setting(label: str, threads: int, launcher: list[str], sweep: list[str], model: Path, work: Path,
                round_: int, wait_idle: float, trained: bool = False) -> dict:
    folder = work / f"{label}-r{round_}"
    folder.mkdir()
    db = folder / "mlflow.db"
    cache = [f"cache.dir={folder / 'cache'}"] if trained else ["cache=off"]
    cmd = [sys.executable, "-m", "calibrun", "-m", "model=file", f"model.path={model}", *cache, *sweep,
           f"ort.intra_op_threads={threads}", *launcher, f"hydra.sweep.dir={folder / 'sweep'}"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{db}", "RAY_USAGE_STATS_ENABLED": "0",
           "HOME": str(folder)}  # Ray 2.60's local ray.init writes ~/.ray/auth_token: not into the user's home
    idle = wait_for_idle(wait_idle) if wait_idle else None
    load = loadavg()
    idle_note = "" if idle is None else f", idle {idle:.0%}"
    print(f"[{label} round {round_}] loadavg {load}{idle_note}: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    mine0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, total0 = machine_cpu()
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    busy1, total1 = machine_cpu()
    mine1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    mine = (mine1.ru_utime + mine1.ru_stime) - (mine0.ru_utime + mine0.ru_stime)
    # CPU the rest of the machine used meanwhile, as a share of all cores: the disturbance of this measurement
    others = max(0.0, (busy1 - busy0) - mine) / (total1 - total0) if total1 > total0 else float("nan")
    if proc.returncode != 0:
        raise RuntimeError(f"{label}: calibrun exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    try:
        parents, children = child_runs(db)
    except RuntimeError as exc:
        raise RuntimeError(f"{label}: {exc}\n{proc.stderr[-3000:]}") from exc
    window = (max(end for _, end in children) - min(start for start, _ in children)) / 1000
    calibrated, waited = calibrations(folder / "sweep")
    per_job = sum(end - start for start, end in children) / len(children) / 1000
    print(f"[{label} round {round_}] {len(children)} jobs in a {window:.2f} s window, wall {wall:.2f} s, "
          f"{calibrated} calibrations, {waited:.1f} s waited", file=sys.stderr, flush=True)
    return {"label": label, "round": round_, "load": load, "parents": parents, "jobs": len(children),
            "window": window, "wall": wall, "per_job": per_job, "jobs_per_s": len(children) / window,
            "wall_jobs_per_s": len(children) / wall, "others": others, "cpu": mine, "calibrated": calibrated,
            "waited": waited}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibrations", default="narrow,match,wide")
    parser.add_argument("--batches", default="16,32", help="calibration batches (16 images each) per job")
    parser.add_argument("--formats", default="qdq,qoperator")
    parser.add_argument("--eval-rows", type=int, default=64, help="evaluation images per job")
    parser.add_argument("--rounds", type=int, default=1, help="run the three settings this many times, in turn")
    parser.add_argument("--wait-idle", type=float, default=0.0, metavar="SHARE",
                        help="before each setting, wait (up to 10 min) until the machine is this idle, e.g. 0.9")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (sweeps and MLflow stores)")
    parser.add_argument("--trained", action="store_true",
                        help="YOLOv8n, method x format, the cache shared: 1 worker vs 2 joblib vs 2 Ray workers")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="calibrun-bench-parallel."))
    settings, goals = (TRAINED_SETTINGS, TRAINED_GOALS) if args.trained else (SETTINGS, GOALS)
    if args.trained:
        model, sweep = trained_sweep(work)
        expected = 6
    else:
        sweep = [f"calibration={args.calibrations}", f"batches={args.batches}", f"format={args.formats}",
                 f"eval.rows={args.eval_rows}"]
        expected = len(args.calibrations.split(",")) * len(args.batches.split(",")) * len(args.formats.split(","))
        model = cached_convnet()
    print(f"model {model}; {expected} jobs per setting; {os.cpu_count()} cores", file=sys.stderr)

    try:
        results = [run_setting(label, threads, launcher, sweep, model, work, round_, args.wait_idle, args.trained)
                   for round_ in range(1, args.rounds + 1) for label, _, threads, launcher in settings]
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\n{expected} jobs per setting ({' '.join(sweep)}, {'cache shared' if args.trained else 'cache=off'}); "
          "jobs/s over the jobs window "
          "(first MLflow child run start -> last end), whole-process wall beside it\n")
    print(f"{'setting':<8}{'round':>6}  {'loadavg before':<17}{'runs':>6}{'window s':>10}{'jobs/s':>9}{'s/job':>8}"
          f"{'wall s':>9}{'wall jobs/s':>13}{'cpu s':>8}{'others':>8}{'calib':>7}{'wait s':>8}")
    for r in results:
        print(f"{r['label']:<8}{r['round']:>6}  {r['load']:<17}{r['jobs']:>6}{r['window']:>10.2f}"
              f"{r['jobs_per_s']:>9.3f}{r['per_job']:>8.2f}{r['wall']:>9.2f}{r['wall_jobs_per_s']:>13.3f}"
              f"{r['cpu']:>8.1f}{r['others']:>8.0%}{r['calibrated']:>7}{r['waited']:>8.1f}")
    by = {label: max((r for r in results if r["label"] == label), key=lambda r: r["jobs_per_s"])
          for label, *_ in settings}
    print()
    if args.rounds > 1:
        print("best round per setting: " + ", ".join(f"{k} round {v['round']} {v['jobs_per_s']:.3f} jobs/s"
                                                    for k, v in by.items()))
    ok = True
    for name, goal in goals.items():
        top, bottom = (s.strip() for s in name.split("/"))
        ratio = by[top]["jobs_per_s"] / by[bottom]["jobs_per_s"]
        wall_ratio = by[top]["wall_jobs_per_s"] / by[bottom]["wall_jobs_per_s"]
        verdict = "met" if ratio >= goal else "NOT met"
        print(f"{name}: {ratio:.2f}x (goal >= {goal}: {verdict}); whole process {wall_ratio:.2f}x")
    counts = {r["jobs"] for r in results}
    parents = {r["parents"] for r in results}
    if counts != {expected} or parents != {1}:
        print(f"run counts differ: children {[r['jobs'] for r in results]} (expected {expected}), "
              f"parents {[r['parents'] for r in results]}")
        ok = False
    else:
        print(f"run counts match: 1 parent + {expected} FINISHED children in each setting")
    if args.trained:
        counts = [r["calibrated"] for r in results]
        if set(counts) != {TRAINED_CALIBRATIONS}:
            print(f"calibrations differ: {counts} (expected {TRAINED_CALIBRATIONS} in each setting)")
            ok = False
        else:
            print(f"calibrations: {TRAINED_CALIBRATIONS} in each setting")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
