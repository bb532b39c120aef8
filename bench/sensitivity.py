"""Sensitivity analysis cost: seconds per analysed tensor, and its ratio to one int8 evaluation pass.

    .venv/bin/python bench/sensitivity.py                      # det_yolox, ocr_det and nudenet, both strategies
    .venv/bin/python bench/sensitivity.py --models det_yolox --rows 2 --limit 10   # a quick smoke run
    .venv/bin/python bench/sensitivity.py --models nudenet --rows 5 --groups 20   # + the pre-pass on every pair
    .venv/bin/python bench/sensitivity.py --workers 2     # + the switch ranking in 2 processes (analysis.workers)
    .venv/bin/python bench/sensitivity.py --backends processes,ray   # + on 2 Ray actors (analysis.backend=ray)

For each trained model (tests/trained.py: wheels from the package index, photos from scikit-image), the model is
prepared, calibrated on the photos (minmax) and quantised to QDQ int8 as calibrun does, then
`calibrun.analysis.sensitivity.rank` runs side by side with the two strategies on the same evaluation batches:

    switch  one model with a run-time switch (Where) per QDQ pair: ONE onnxruntime session for every trial
    edit    one model per pair with that pair removed: a model write and a session per trial

Printed per model and strategy: pairs analysed, setup seconds (switch model build + session), seconds per
tensor (one trial = one pass over the evaluation batches with one pair out), `int8 pass s` = one plain int8
evaluation of the model file (a new optimised session + the batches, fp32 reference from disk, what the fallback pays
per step besides quantize_static), `infer s` = the batches alone in an existing session, and the two ratios of
seconds per tensor to each. `--limit N` analyses only the first N pairs (both strategies get the same pairs).
With `--groups N` a third row per model ranks EVERY pair with the switch strategy and the coarse pre-pass over N
groups (analysis.groups): its seconds per tensor are the whole ranking's trial time over all pairs, `trials` how many
passes it made. With `--workers N` (default 2) a row ranks the same pairs with the switch strategy in N worker
processes (`analysis.workers=N`, `--threads` threads each) and a line gives the ranking's wall on 1 worker against
N, and whether every metric is identical; `--backends processes,ray` does it for each backend (Ray: one Ray of this
machine started before the first model, as a cluster a user runs would be, so its start is not in the walls). A
model with a task metric (nudenet: tests.detection:yolov8_agreement, task.det_f1) is ranked by it, the others by
max_abs_error. The machine's load average is printed: other processes skew every figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SETUPS = {  # model -> image transform (resize, crop, mean, std, letterbox) as the model wants it; photos; metric
    "det_yolox": dict(resize=416, crop=416, mean=[0.0, 0.0, 0.0], std=[1 / 255] * 3),
    "ocr_det": dict(resize=320, crop=320, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    # NudeNet's YOLOv8n as its package feeds it (RGB /255 padded with 0), on the photos of its end-to-end test
    "nudenet": dict(resize=320, crop=320, mean=[0.0, 0.0, 0.0], std=[1.0] * 3, letterbox=True,
                    photos=("astronaut.png", "camera.png", "color.png", "moon.png", "phantom.png"),
                    task="tests.detection:yolov8_agreement", metric="task.det_f1", goal="max"),
}


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="det_yolox,ocr_det,nudenet")
    parser.add_argument("--rows", type=int, default=4, help="evaluation images (photos)")
    parser.add_argument("--limit", type=int, default=40, help="pairs analysed per model (0: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--groups", type=int, default=0, help="also rank every pair with this many groups first")
    parser.add_argument("--workers", type=int, default=2, help="also rank the same pairs with the switch strategy in "
                        "this many worker processes (analysis.workers; 1: not)")
    parser.add_argument("--backends", default="processes", help="analysis.backend of the worker rows: processes, "
                        "ray or both (processes,ray)")
    args = parser.parse_args()
    backends = args.backends.split(",")
    if "ray" in backends:
        import ray

        ray.init(include_dashboard=False, log_to_driver=False)

    import onnx

    from calibrun.analysis import sensitivity as sens
    from calibrun.analysis.evaluate import Evaluator
    from calibrun.data.images import ImageTransform, image_calibration, image_evaluation
    from calibrun.lab.data import fixed_rows
    from calibrun.measure.tasks import Custom
    from calibrun.model import open_float_model, prepare
    from calibrun.model.pairs import find_pairs
    from calibrun.model.sessions import session
    from calibrun.quant.quantize import quantize_with
    from tests.trained import model_path, photo_folder

    print(f"load average before: {load()}  (cpus: {os.cpu_count()})")
    print(f"{'model':10} {'strategy':8} {'pairs':>5} {'setup s':>8} {'s/tensor':>9} {'int8 pass s':>11} {'ratio':>6} "
          f"{'infer s':>8} {'ratio':>6}")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="calibrun.bench.") as tmp:
            tmp = Path(tmp)
            prepared = prepare.prepare_model(model_path(name), tmp / "fp32.onnx")
            fp32 = open_float_model(prepared.path)
            s = SETUPS[name]
            photos = photo_folder(tmp / "photos", *([s["photos"]] if "photos" in s else []))
            info = fp32.info
            transform = ImageTransform(resize=s["resize"], crop=s["crop"], mean=tuple(s["mean"]),
                                       std=tuple(s["std"]), grayscale=False, letterbox=s.get("letterbox", False))
            metric, goal = s.get("metric", "max_abs_error"), s.get("goal", "min")
            task = Custom(s["task"]) if "task" in s else None
            data = image_calibration(photos, fp32.inputs, 4, 1.0, transform)
            int8 = tmp / "int8.onnx"
            quantize_with(fp32, int8, data, threads=args.threads, input_may_stay_float=True)
            evaluation = image_evaluation(photos, fp32.inputs, args.rows, transform)
            rows = fixed_rows(info) or args.rows
            pairs = find_pairs(onnx.load(str(int8)), onnx.load(str(fp32.path)))
            with Evaluator(fp32.path, evaluation, rows, threads=args.threads, task=task) as ev:
                ev.model(int8)  # warm-up
                start = time.perf_counter()
                ev.model(int8)
                one_pass = time.perf_counter() - start  # what evaluating a model file costs: session + inference
                sess = session(int8, args.threads)
                start = time.perf_counter()
                ev.run(lambda feeds, s=sess: s.run(ev.output_names, feeds))
                inference = time.perf_counter() - start  # inference over the batches only
                only = {p.tensor for p in pairs[: args.limit]} if args.limit else None
                runs = [("switch", only, 0, 1), ("edit", only, 0, 1)]
                if args.workers > 1:
                    runs += [(f"switch/w{args.workers}" + ("" if b == "processes" else f"/{b}"), only, 0, args.workers)
                             for b in backends]
                if args.groups:
                    runs.append((f"switch/g{args.groups}", None, args.groups, 1))
                done = {}
                for label, subset, groups, workers in runs:
                    backend = "ray" if label.endswith("/ray") else "processes"
                    result = sens.rank(fp32.path, int8, ev, metric, goal, label.split("/")[0],
                                       threads=args.threads * workers, only=subset, groups=groups, workers=workers,
                                       backend=backend)
                    done[label] = result
                    per = result["seconds_per_tensor"]
                    print(f"{name:10} {label:8} {result['tensors']:5d} {result['setup_seconds']:8.2f} "
                          f"{per:9.3f} {one_pass:11.3f} {per / one_pass:6.2f} {inference:8.3f} "
                          f"{per / inference:6.2f}   trials {result['trials']}, {metric} top: "
                          f"{result['ranking'][0]['tensor']} ({result['ranking'][0]['gain']})", flush=True)
                for label in [r[0] for r in runs if "/w" in r[0]]:  # the ranking's wall, 1 worker against N
                    one, many = done["switch"], done[label]
                    same = [r["metric"] for r in one["ranking"]] == [r["metric"] for r in many["ranking"]]
                    print(f"  {name}: ranking wall {one['seconds']:.2f} s on 1 worker, {many['seconds']:.2f} s on "
                          f"{many['workers']} {many['backend']} workers ({args.threads} thread(s) each): "
                          f"{one['seconds'] / many['seconds']:.2f}x; every metric identical: "
                          f"{'yes' if same else 'NO'}", flush=True)
            print(f"  ({len(pairs)} pairs in the model; load average now: {load()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
