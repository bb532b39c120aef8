"""Real-model benchmark of calibrun's streaming measurement: memory against evaluation rows, time against plain
onnxruntime. Ratios measured side by side on this machine (not a test).

    python bench/real_models.py                      # ResNet-50-sized model (bench/resnet.py), then ocr_det
    python bench/real_models.py --quick              # small ResNet, few rows: a smoke run
    python bench/real_models.py --models ocr_det     # one of: resnet, ocr_det
    python bench/real_models.py --memory ocr_det1024 nudenet1280 resnet [--baseline CHECKOUT]   # see 3.

1. Peak RSS of a whole `python -m calibrun` job (diagnostics on, the default) at eval.rows=SMALL vs eval.rows=LARGE
   (16 vs 256). The calibration ranges are cached by a warm-up job first, so both measured jobs differ only in
   the evaluation rows (a calibration pass holds one calibration batch's activations, the same in both). Goal:
   ratio <= 1.2.
2. Whole job time (cache=off: calibration pass, quantize_static, evaluation with per-output metrics, task
   metrics and per-tensor diagnostics, result.json) vs plain onnxruntime doing the minimum: quantize_static with
   its MinMax calibrator over the same calibration batches, then fp32 and int8 inference over the evaluation
   rows in batches of 16. Goal: ratio <= 2.5.

3. `--memory` (issue 28, docs/memory.md): peak RSS (os.wait4) of plain fp32 onnxruntime inference of the evaluation
   rows one at a time, of calibrun's calibration pass alone (MinMax; and Entropy, shown without a goal) and of the
   default job (calibration,
   quantisation, evaluation, diagnostics; cache and tracking off), each a fresh child capped at --limit-gib of
   address space. Models with large activations: ocr_det (DBNet text segmentation) at 1024x1024 and nudenet
   (YOLOv8n) at 1280x1280, 3 calibration and 3 evaluation photos; ResNet-50 at 224 (lab rows: 4 batches of 16,
   16 evaluation rows). Goals: calibration <= 1.5x plain inference, default job <= 2x. `--baseline DIR` also runs
   the job with the calibrun code checked out in DIR (e.g. `git worktree add /tmp/old <commit>`).

Data: ResNet takes the lab rule (normal(0, 1) rows, calibration and evaluation); ocr_det takes scikit-image's
photos resized/cropped to 320 (calibration: the 12 photos; evaluation: a folder of LARGE images cycling through
the photos, each copy shifted, as PNG files decoded batch by batch).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def child(argv: list[str]) -> int:
    """Run `python -m calibrun ARGS` in this process; print {"seconds", "max_rss_mb", "code"} as the last line."""
    start = time.perf_counter()
    sys.argv = ["calibrun", *argv]
    code = 0
    try:
        runpy.run_module("calibrun", run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"seconds": time.perf_counter() - start, "max_rss_mb": rss, "code": code}), flush=True)
    return 0


def run_job(workdir: Path, overrides: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", *overrides, "tracking=off"], cwd=workdir,
                          capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise SystemExit(f"job failed: {overrides}\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1])
    if out["code"]:
        raise SystemExit(f"calibrun failed: {overrides}\n{proc.stderr[-3000:]}")
    return out


def plain_child(spec: dict) -> int:
    """Plain onnxruntime: quantize_static (MinMax calibration pass + quantisation) and fp32 + int8 inference."""
    start = time.perf_counter()  # imports included, as in the calibrun job
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    batches = _batches(spec, "calibration")
    input_name = ort.InferenceSession(spec["model"], providers=["CPUExecutionProvider"]).get_inputs()[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(batches)

        def get_next(self):
            batch = next(self.it, None)
            return None if batch is None else {input_name: batch}

    out = Path(spec["out"])
    quantize_static(spec["model"], str(out), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    options = ort.SessionOptions()
    sessions = [ort.InferenceSession(p, options, providers=["CPUExecutionProvider"]) for p in (spec["model"], str(out))]
    name = sessions[0].get_inputs()[0].name
    for batch in _batches(spec, "evaluation"):
        for sess in sessions:
            np.asarray(sess.run(None, {name: batch})[0])
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "max_rss_mb": rss, "code": 0}), flush=True)
    return 0


def _batches(spec: dict, kind: str):
    """The same arrays the calibrun job reads (lab rule, or the .npy files), 16 rows at a time."""
    import numpy as np

    if spec["data"] == "lab":
        shape = tuple(spec["shape"])
        if kind == "calibration":
            rng = np.random.default_rng(4242)
            return [rng.normal(0, 1, (16, *shape)).astype(np.float32) for _ in range(spec["batches"])]
        rng = np.random.default_rng(777)
        rows = spec["rows"]
        return (rng.normal(0, 1, (min(16, rows - s), *shape)).astype(np.float32) for s in range(0, rows, 16))
    from calibrun.data.images import ImageTransform

    transform = ImageTransform(resize=spec["size"], crop=spec["size"])
    files = sorted(Path(spec[f"{kind}_dir"]).iterdir())
    rows = len(files) if kind == "calibration" else spec["rows"]
    return (np.stack([transform(f) for f in files[s : min(s + 16, rows)]]) for s in range(0, rows, 16))


def run_plain(workdir: Path, spec: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--plain", json.dumps(spec)], cwd=workdir, capture_output=True,
                          text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise SystemExit(f"plain onnxruntime failed\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def photo_folders(folder: Path, rows: int) -> tuple[Path, Path]:
    """Calibration folder (scikit-image's 12 photos) and an evaluation folder of `rows` PNGs: the photos, each
    copy shifted a few pixels (so no two rows are the same)."""
    from PIL import Image

    from tests.trained import PHOTOS, TEXT_PHOTOS, photo_folder

    calib = photo_folder(folder / "calib", PHOTOS + TEXT_PHOTOS)
    evaluation = folder / "eval"
    evaluation.mkdir()
    files = sorted(calib.iterdir())
    for i in range(rows):
        with Image.open(files[i % len(files)]) as image:
            image = image.convert("RGB")
            shift = 4 * (i // len(files))
            image.crop((shift, 0, image.width, image.height)).save(evaluation / f"{i:04d}.png")
    return calib, evaluation


def bench_model(name: str, quick: bool, small: int, large: int, threads: int, diag_rows: int | None = None,
                memory_only: bool = False) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"calibrun-bench-{name}-"))
    common = [f"cache.dir={work / 'cache'}", f"ort.intra_op_threads={threads}"]
    if diag_rows is not None:
        common.append(f"diagnostics.rows={diag_rows}")
    if name == "resnet":
        sys.path.insert(0, str(ROOT / "bench"))
        from resnet import QUICK, RESNET50, cached_resnet

        config = QUICK if quick else RESNET50
        model = cached_resnet(config)
        batches = 4 if quick else 16
        shape = [3, config.image, config.image]
        job = ["model=file", f"model.path={model}", f"batches={batches}", *common]
        eval_for = lambda rows: [f"eval.rows={rows}"]  # noqa: E731
        spec = {"data": "lab", "shape": shape, "batches": batches}
    else:
        from tests.trained import model_path

        model = model_path("ocr_det")
        size = 64 if quick else 320
        calib, evaluation = photo_folders(work, large)
        batches = 1  # the 12 photos: one batch
        job = ["model=file", f"model.path={model}", f"batches={batches}", "data=images", f"data.path={calib}",
               f"data.resize={size}", f"data.crop={size}", "eval_data=images", f"eval_data.path={evaluation}",
               f"eval_data.resize={size}", f"eval_data.crop={size}", *common]
        eval_for = lambda rows: [f"eval.rows={rows}"]  # noqa: E731
        spec = {"data": "images", "calibration_dir": str(calib), "evaluation_dir": str(evaluation), "size": size}
    print(f"{name}: {model} ({os.path.getsize(model) / 1e6:.0f} MB), load {os.getloadavg()}", file=sys.stderr)
    run_job(work, [*job, *eval_for(small), "hydra.run.dir=warmup"])  # fills the calibration cache
    rss_small = run_job(work, [*job, *eval_for(small), "hydra.run.dir=small"])
    rss_large = run_job(work, [*job, *eval_for(large), "hydra.run.dir=large"])
    if memory_only:
        return {"model": name, "eval_rows": [small, large],
                "peak_rss_mb": [round(rss_small["max_rss_mb"]), round(rss_large["max_rss_mb"])],
                "rss_ratio": round(rss_large["max_rss_mb"] / rss_small["max_rss_mb"], 3),
                "load_after": [round(v, 2) for v in os.getloadavg()], "folder": str(work)}
    timed = run_job(work, [*job, *eval_for(large), "cache=off", "hydra.run.dir=timed"])
    plain = run_plain(work, {**spec, "model": str(model), "rows": large, "out": str(work / "plain_int8.onnx")})
    result = json.loads((work / "timed" / "result.json").read_text())
    return {
        "model": name, "eval_rows": [small, large], "calibration_batches": batches,
        "diagnostics_rows": result.get("used", {}).get("diagnostics_rows"),
        "peak_rss_mb": [round(rss_small["max_rss_mb"]), round(rss_large["max_rss_mb"])],
        "rss_ratio": round(rss_large["max_rss_mb"] / rss_small["max_rss_mb"], 3),
        "calibrun_seconds": round(timed["seconds"], 1), "plain_seconds": round(plain["seconds"], 1),
        "plain_peak_rss_mb": round(plain["max_rss_mb"]),
        "time_ratio": round(timed["seconds"] / plain["seconds"], 2),
        "diagnosis": result.get("diagnosis", {}).get("overall"),
        "load_after": [round(v, 2) for v in os.getloadavg()],
        "folder": str(work),
    }


# --- memory against plain inference (issue 28): large activations -------------------------------------------------
# name -> (model, image size, letterbox); each: 3 calibration and 3 evaluation photos of scikit-image at that size
LARGE = {
    "ocr_det1024": ("ocr_det", 1024, False),  # DBNet text segmentation (dense probability map) at 1024x1024
    "nudenet1280": ("nudenet", 1280, True),  # YOLOv8n detector at 1280x1280
}
GOAL_CALIBRATION, GOAL_JOB = 1.5, 2.0


def _usage(argv: list[str], cwd: Path, env: dict | None = None, limit: int | None = None) -> dict:
    """Run a child; its peak RSS (os.wait4) and wall seconds; `limit`: RLIMIT_AS bytes (prlimit), so that a run
    that would take the machine's memory fails instead."""
    sys.path.insert(0, str(ROOT / "bench"))
    from _common import wait_child

    if limit:
        argv = ["prlimit", f"--as={limit}", *argv]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    usage = wait_child(proc, start)
    return {"code": usage.returncode, "seconds": usage.wall, "peak_rss_mb": usage.peak_rss / 2**20,
            "stderr": err[-2000:]}


def plain_rows_child(spec: dict) -> int:
    """Plain onnxruntime: the fp32 model (default session options) over the evaluation rows, one row at a time."""
    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(spec["model"], providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    for array in _rows(spec, "evaluation"):
        for row in array:
            np.asarray(sess.run(None, {name: row[None]})[0])
    return 0


def calibrate_child(spec: dict) -> int:
    """calibrun's calibration pass alone (calibrun.quant.calibrate.run_calibration, MinMax, memory.budget auto) over the
    calibration rows the job reads."""
    from calibrun.quant.calibrate import CalibrationSpec, run_calibration

    batches = list(_rows(spec, "calibration"))
    run_calibration(spec["model"], batches, spec["input"], CalibrationSpec(method=spec.get("method", "minmax")))
    return 0


def _rows(spec: dict, kind: str):
    """The rows a job reads: the lab rule (ResNet) or the photos through calibrun's image pipeline, in batches of 16."""
    import numpy as np

    if spec["data"] == "lab":
        return _batches({**spec, "rows": spec["rows"]}, kind)
    from calibrun.data.images import ImageTransform

    transform = ImageTransform(resize=spec["size"], crop=spec["size"], letterbox=spec["letterbox"])
    files = sorted(Path(spec[f"{kind}_dir"]).iterdir())
    return (np.stack([transform(f) for f in files[s : s + 16]]) for s in range(0, len(files), 16))


def bench_memory(name: str, threads: int, baseline: Path | None, limit: int) -> dict:
    """Peak RSS and wall time of plain fp32 inference of the evaluation rows (one at a time), calibrun's calibration
    pass alone, and the default job (calibration, quantisation, evaluation, diagnostics; cache and tracking off),
    each a fresh child, side by side; with `baseline` (a checkout of earlier calibrun code) its job too."""
    from tests.trained import PHOTOS, TEXT_PHOTOS, model_path, photo_folder

    work = Path(tempfile.mkdtemp(prefix=f"calibrun-memory-{name}-"))
    common = ["tracking=off", "cache=off", f"ort.intra_op_threads={threads}"]
    if name == "resnet":
        sys.path.insert(0, str(ROOT / "bench"))
        from resnet import RESNET50, cached_resnet

        model = cached_resnet(RESNET50)
        spec = {"data": "lab", "shape": [3, 224, 224], "batches": 4, "rows": 16, "input": "x"}
        job = ["model=file", f"model.path={model}", "batches=4", "eval.rows=16"]
    else:
        base, size, letterbox = LARGE[name]
        model = model_path(base)
        photos = TEXT_PHOTOS[:3] if base == "ocr_det" else PHOTOS[:3]
        calib = photo_folder(work / "calib", photos)
        evaluation = photo_folder(work / "eval", PHOTOS[3:6])
        import onnx

        input_name = onnx.load(str(model), load_external_data=False).graph.input[0].name
        spec = {"data": "images", "calibration_dir": str(calib), "evaluation_dir": str(evaluation), "size": size,
                "letterbox": letterbox, "input": input_name}
        pipeline = [f"resize={size}", f"crop={size}", f"letterbox={str(letterbox).lower()}"]
        job = ["model=file", f"model.path={model}", "batches=1", "data=images", f"data.path={calib}",
               *[f"data.{p}" for p in pipeline], "eval_data=images", f"eval_data.path={evaluation}",
               *[f"eval_data.{p}" for p in pipeline], "eval.rows=3"]
    spec["model"] = str(model)
    me = [sys.executable, __file__]
    print(f"{name}: {model} ({os.path.getsize(model) / 1e6:.0f} MB), load {os.getloadavg()}", file=sys.stderr)
    plain = _usage([*me, "--plain-rows", json.dumps(spec)], work, limit=limit)
    calib_run = _usage([*me, "--calibrate", json.dumps(spec)], work, limit=limit)
    entropy_run = _usage([*me, "--calibrate", json.dumps({**spec, "method": "entropy"})], work, limit=limit)
    job_run = _usage([sys.executable, "-m", "calibrun", *job, *common, f"hydra.run.dir={work / 'job'}"], ROOT,
                     limit=limit)
    for label, run in (("plain", plain), ("calibration", calib_run), ("entropy calibration", entropy_run),
                       ("job", job_run)):
        if run["code"]:
            raise SystemExit(f"{name}: {label} failed\n{run['stderr']}")
    used = json.loads((work / "job" / "result.json").read_text())["used"].get("memory")
    row = {
        "model": name, "plain_peak_rss_mb": round(plain["peak_rss_mb"]),
        "calibration_peak_rss_mb": round(calib_run["peak_rss_mb"]),
        "calibration_ratio": round(calib_run["peak_rss_mb"] / plain["peak_rss_mb"], 2),
        "entropy_calibration_peak_rss_mb": round(entropy_run["peak_rss_mb"]),
        "entropy_calibration_ratio": round(entropy_run["peak_rss_mb"] / plain["peak_rss_mb"], 2),
        "entropy_calibration_time_ratio": round(entropy_run["seconds"] / plain["seconds"], 2),
        "job_peak_rss_mb": round(job_run["peak_rss_mb"]),
        "job_ratio": round(job_run["peak_rss_mb"] / plain["peak_rss_mb"], 2),
        "calibration_time_ratio": round(calib_run["seconds"] / plain["seconds"], 2),
        "job_time_ratio": round(job_run["seconds"] / plain["seconds"], 2),
        "plain_seconds": round(plain["seconds"], 1), "used_memory": used,
    }
    if baseline is not None:
        env = {**os.environ, "PYTHONPATH": str(baseline)}
        old = _usage([sys.executable, "-m", "calibrun", "-cp", str(baseline / "conf"), *job, *common,
                      f"hydra.run.dir={work / 'baseline'}"], baseline, env=env, limit=limit)
        row["baseline_job_peak_rss_mb"] = round(old["peak_rss_mb"]) if not old["code"] else None
        row["baseline_job_ratio"] = (round(old["peak_rss_mb"] / plain["peak_rss_mb"], 2) if not old["code"]
                                     else f"failed under the {limit / 2**30:.0f} GiB limit")
        row["baseline_job_time_ratio"] = round(old["seconds"] / plain["seconds"], 2)
    row["load_after"] = [round(v, 2) for v in os.getloadavg()]
    row["folder"] = str(work)
    return row


def memory_main(args) -> int:
    for name in args.memory:
        row = bench_memory(name, args.threads, args.baseline, int(args.limit_gib * 2**30))
        print(json.dumps(row), flush=True)
        ok = row["calibration_ratio"] <= GOAL_CALIBRATION and row["job_ratio"] <= GOAL_JOB
        print(f"{name}: plain inference {row['plain_peak_rss_mb']} MB; calibration {row['calibration_peak_rss_mb']} MB "
              f"= {row['calibration_ratio']}x (goal <= {GOAL_CALIBRATION}); default job {row['job_peak_rss_mb']} MB = "
              f"{row['job_ratio']}x (goal <= {GOAL_JOB}); time vs plain: calibration {row['calibration_time_ratio']}x, "
              f"job {row['job_time_ratio']}x; {'met' if ok else 'NOT met'}; entropy calibration (no goal) "
              f"{row['entropy_calibration_peak_rss_mb']} MB = {row['entropy_calibration_ratio']}x, "
              f"{row['entropy_calibration_time_ratio']}x the time", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    if argv[:1] == ["--plain"]:
        return plain_child(json.loads(argv[1]))
    if argv[:1] == ["--plain-rows"]:
        return plain_rows_child(json.loads(argv[1]))
    if argv[:1] == ["--calibrate"]:
        return calibrate_child(json.loads(argv[1]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", nargs="+", default=["resnet", "ocr_det"], choices=["resnet", "ocr_det"])
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: every core)")
    parser.add_argument("--memory-only", action="store_true", help="skip the timed job and plain onnxruntime")
    parser.add_argument("--diagnostics-rows", type=int, default=None,
                        help="diagnostics.rows for the calibrun jobs (default: calibrun's, 256)")
    parser.add_argument("--rows", type=int, nargs=2, metavar=("SMALL", "LARGE"), default=None,
                        help="evaluation rows of the two memory runs (default 16 256; --quick 16 48)")
    parser.add_argument("--memory", nargs="+", choices=["resnet", *LARGE], default=None,
                        help="instead: peak RSS of calibration and of the default job against plain inference")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="with --memory: also the job of this checkout of earlier calibrun code")
    parser.add_argument("--limit-gib", type=float, default=14.0, help="with --memory: RLIMIT_AS of every child")
    args = parser.parse_args(argv)
    if args.memory:
        return memory_main(args)
    small, large = (16, 48) if args.quick else (16, 256)  # eval.batch_size 16 in both: only the rows differ
    if args.rows:
        small, large = args.rows
    print(f"load before: {os.getloadavg()}", file=sys.stderr)
    for name in args.models:
        row = bench_model(name, args.quick, small, large, args.threads, args.diagnostics_rows, args.memory_only)
        print(json.dumps(row), flush=True)
        text = (f"{name}: peak RSS {row['peak_rss_mb'][0]} MB at eval.rows={small}, {row['peak_rss_mb'][1]} MB at "
                f"eval.rows={large}: ratio {row['rss_ratio']} (goal <= 1.2)")
        if "time_ratio" in row:
            text += (f"; whole job {row['calibrun_seconds']} s vs plain onnxruntime {row['plain_seconds']} s: "
                     f"ratio {row['time_ratio']} (goal <= 2.5)")
        print(text, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
