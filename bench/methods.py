"""Calibration time by method on trained models, side by side (issue 26 item 2: Entropy at 2048 bins <= 2.5x MinMax).

    python bench/methods.py                               # ocr_det, nudenet, det_yolox on scikit-image's photos
    python bench/methods.py --models ocr_det --photos 24 --methods minmax,entropy,percentile --rounds 3

For each model: calibrun's `run_calibration` with each method on the same calibration rows (the photos through
calibrun's image source at the model's size), in this process, rounds interleaved (minmax, entropy, minmax, ...);
the best wall and CPU time of each, and each method's ratio to MinMax. The photos are the test suite's
(scikit-image's, tests/trained.py), repeated in order up to `--photos` rows. Where the ratio misses, look at the
rows per collection: histogram methods collect once per batch, so a model pinned to one image a batch (det_yolox)
updates every tensor's 2048 bins once per image; the threshold search is a fixed cost per tensor besides.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import log, machine_line  # noqa: E402

SIZES = {"ocr_det": 320, "nudenet": 320, "det_yolox": 416}  # each model's input side in the zoo and the tests
GOAL = 2.5  # entropy / minmax


def calibrate(model, batches: list, method: str) -> tuple[float, float]:
    """(wall s, CPU s) of one calibration."""
    import calibrun.quant.calibrate as cc

    start, cpu = time.perf_counter(), time.process_time()
    cc.run_calibration(model.path, batches, model.inputs[0].name, cc.CalibrationSpec(method=method))
    return time.perf_counter() - start, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--methods", default="minmax,entropy", help="comma-separated; minmax is always measured")
    parser.add_argument("--photos", type=int, default=12, help="calibration rows (the suite's photos, repeated)")
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each method (the best is kept)")
    args = parser.parse_args()

    from calibrun.data.images import ImageTransform, image_calibration
    from calibrun.model import open_float_model
    from tests.trained import PHOTOS, TEXT_PHOTOS, model_path, photo_folder

    methods = ["minmax", *[m for m in args.methods.split(",") if m and m != "minmax"]]
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in SIZES]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {sorted(SIZES)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="calibrun-bench-methods.") as tmp:
        pool = sorted(photo_folder(Path(tmp) / "pool", PHOTOS + TEXT_PHOTOS).glob("*.png"))
        chosen = Path(tmp) / "chosen"
        chosen.mkdir()
        files = [pool[i % len(pool)] for i in range(args.photos)]
        for i, path in enumerate(files):
            (chosen / f"{i:03d}_{path.name}").write_bytes(path.read_bytes())
        log(f"{len(files)} photos; {machine_line()}")
        for name in names:
            model = open_float_model(model_path(name))
            size = SIZES[name]
            # as many batches as rows: calibrun caps the count at what the rows fill (16 a batch, or the model's
            # pinned batch size: det_yolox takes one image at a time)
            source = image_calibration(chosen, model.inputs, len(files),
                                       transform=ImageTransform(resize=size, crop=size))
            batches = list(source)
            best: dict[str, tuple[float, float]] = {}
            for round_ in range(args.rounds):
                for method in methods:
                    wall, cpu = calibrate(model, batches, method)
                    log(f"{name} round {round_ + 1}: {method} {wall:.2f} s wall, {cpu:.2f} s CPU")
                    if method not in best or wall < best[method][0]:
                        best[method] = (wall, cpu)
            rows.append((name, size, best))
    print(f"\ncalibration time by method, best of {args.rounds}, {args.photos} rows; {machine_line()}")
    print(f"{'model':<10} {'size':>5} " + " ".join(f"{m + ' s':>14}" for m in methods)
          + " " + " ".join(f"{m + '/minmax':>16}" for m in methods[1:]))
    for name, size, best in rows:
        base = best["minmax"][0]
        times = " ".join(f"{best[m][0]:>7.2f} ({best[m][1]:.1f})" for m in methods)
        ratios = " ".join(f"{best[m][0] / base:>15.2f}x" for m in methods[1:])
        print(f"{name:<10} {size:>5} {times} {ratios}")
    if "entropy" in methods:
        for name, _, best in rows:
            ratio = best["entropy"][0] / best["minmax"][0]
            print(f"goal entropy <= {GOAL}x minmax on {name}: {ratio:.2f}x ({'met' if ratio <= GOAL else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
