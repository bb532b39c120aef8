"""Histogram calibration (entropy, percentile, distribution) on a trained conv net: calibrun vs onnxruntime.

    python bench/histogram.py                 # ocr_det at 640x640, 4 batches of 3 photos, all three methods
    python bench/histogram.py --quick         # 160x160, 2 batches, a few sampled tensors (< 2 minutes)
    python bench/histogram.py --size 320 --batches 4 --rows 3 --methods entropy --ref-tensors 10
    python bench/histogram.py --model nudenet --methods entropy --ref-tensors 5     # 320x320, 4 batches of 8
    python bench/histogram.py --model det_yolox --methods entropy --ref-tensors 5   # 416x416, 8 batches of 1

`--model` is one of tests/trained.py's trained detectors (MODELS below: its image transform and default size,
batches and photos per batch): `ocr_det` (PP-OCRv4 text detector, DBNet; ~650 calibrated tensors), `nudenet`
(YOLOv8n, SiLU; ~290) or `det_yolox` (ddddocr's YOLOX-style detector, fixed 416x416 input, batch 1; ~280). The
data: scikit-image's photos and pages of text through calibrun's image source (`ImageTransform`), split into
`--batches` batches of `--rows` photos (flipped copies when more are needed). Whole calibration / plain inference
depends on how many activation values a model computes per FLOP (every value is binned): compare the models'
"values binned per batch" and ns/value lines. For each method, in one process and over the same batches:

* plain:      onnxruntime inference of the model (same session options as the calibration session).
* calibrun:   `calibrun.quant.calibrate.run_calibration` as a job runs it (augmented session, collection, thresholds),
              split into collection and threshold search.
* floor:      the whole calibration split into (a) the augmented session alone over the same batches (every
              output fetched as numpy, then discarded), (b) what collection adds on top of (a), (c) the threshold
              search, each as a ratio to plain inference. (a) / plain is the best any collector can reach with
              onnxruntime's augmented-model design (every calibrated tensor becomes a graph output). Plain
              inference (with and without graph optimisation) and (a) are each the fastest of 3 passes, taken
              in turns; (b) is the calibration's collection (one pass) minus (a).
* collection: calibrun's FastHistogramCollector.collect vs onnxruntime's HistogramCollector.collect on the same
              augmented-session outputs, batch by batch (histograms checked equal).
* search:     the threshold search on the SAME histograms: calibrun's vs onnxruntime's compute_entropy /
              compute_percentile / compute_distribution. onnxruntime's entropy search takes about a second per
              tensor at 2048 bins, so it runs on `--ref-tensors` sampled tensors (calibrun's on the same sample
              for the ratio); its whole-model time is extrapolated and marked `~`. Thresholds checked equal.

Ratios are printed side by side; the machine load and core count are printed with them. Goals (issue 14):
entropy search >= 50x faster than onnxruntime's, whole calibration <= 1.5x plain inference.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import onnxruntime as ort  # noqa: E402
from _common import log, machine_line  # noqa: E402
from onnxruntime.quantization.calibrate import HistogramCollector, create_calibrator  # noqa: E402

from calibrun.data.images import IMAGENET_MEAN, IMAGENET_STD, ImageTransform, image_calibration  # noqa: E402
from calibrun.model import open_float_model, private_model_copy  # noqa: E402
from calibrun.model.sessions import ReusedOutputs  # noqa: E402
from calibrun.quant.calibrate import CalibrationSpec, _fast_collector, _lean_session  # noqa: E402
from calibrun.quant.histogram import FastHistogramCollector  # noqa: E402
from tests.trained import PHOTOS, TEXT_PHOTOS, model_path, photo_folder  # noqa: E402

# model -> image transform as the model wants it, default image side, batches, photos per batch
MODELS = {
    "ocr_det": dict(mean=IMAGENET_MEAN, std=IMAGENET_STD, letterbox=False, size=640, batches=4, rows=3),
    # NudeNet's YOLOv8n as its package feeds it: RGB / 255, letterboxed, padded with 0
    "nudenet": dict(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), letterbox=True, size=320, batches=4, rows=8),
    # ddddocr's detector: pixels 0..255, input fixed at [1, 3, 416, 416]
    "det_yolox": dict(mean=(0.0, 0.0, 0.0), std=(1 / 255,) * 3, letterbox=False, size=416, batches=8, rows=1),
}


def make_batches(size: int, batches: int, rows: int, tmp: Path, model_name: str = "ocr_det") -> list[np.ndarray]:
    """`batches` batches of `rows` photos for `model_name`'s single input, at `size` x `size`."""
    setup = MODELS[model_name]
    model = open_float_model(model_path(model_name))
    input_name = model.inputs[0].name
    folder = photo_folder(tmp / "photos", PHOTOS + TEXT_PHOTOS)
    transform = ImageTransform(resize=size, crop=size, mean=setup["mean"], std=setup["std"],
                               letterbox=setup["letterbox"])
    source = image_calibration(folder, model.inputs, 1, transform=transform)
    (photos,) = [feed[input_name] for feed in source]
    pool = np.concatenate([photos, photos[..., ::-1]])  # flipped copies when more photos are needed
    order = list(range(len(pool)))
    if model_name == "ocr_det":
        # Photos without text first make onnxruntime's own collector fail (the sigmoid map's range then grows
        # ~1e6-fold: billions of bins; see calibrun/quant/histogram.py MAX_GROWN_BINS), so the photos the detector
        # finds most text in come first.
        session = ort.InferenceSession(str(model_path("ocr_det")), providers=["CPUExecutionProvider"])
        peak = [float(session.run(None, {"x": pool[i:i + 1]})[0].max()) for i in range(len(pool))]
        order = sorted(order, key=lambda i: -peak[i])
    need = batches * rows
    picked = [pool[order[i % len(order)]] for i in range(need)]
    return [np.ascontiguousarray(np.stack(picked[i * rows:(i + 1) * rows])) for i in range(batches)]


def _session(model, threads: int, optimize: bool):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if not optimize:  # as onnxruntime's calibration session runs (tensor names must survive)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def inference_seconds(model: Path, batches, spec: CalibrationSpec, threads: int, tmp: Path, rounds: int = 3,
                      input_name: str = "x"):
    """(plain, plain without graph optimisation, augmented session alone, values per batch): seconds of one pass
    over the batches, each the fastest of `rounds` passes taken in turn (a burst of load on a shared machine
    hits all three alike). The augmented session is the calibration's (`_lean_session`), every output fetched
    and discarded; values: the elements of the calibrated outputs of a batch (what collection bins)."""
    calibrator = create_calibrator(private_model_copy(model, tmp), spec.op_types_calibrated(),
                                   augmented_model_path=str(tmp / "augmented.onnx"),
                                   calibrate_method=spec.calibrate_method, extra_options=spec.calibrator_options())
    _lean_session(calibrator, threads)
    augmented = calibrator.infer_session
    names = [o.name for o in augmented.get_outputs()]
    wanted = set(calibrator.tensors_to_calibrate)
    sessions = [_session(model, threads, True), _session(model, threads, False), augmented]
    values = sum(v.size for n, v in zip(names, augmented.run(None, {input_name: batches[0]}), strict=True)
                 if n in wanted)
    for session in sessions[:2]:  # warm-up, as the calibration session's first run is not free either
        session.run(None, {input_name: batches[0]})
    best = [math.inf] * len(sessions)
    for _ in range(rounds):
        for i, session in enumerate(sessions):
            start = time.perf_counter()
            for batch in batches:
                session.run(None, {input_name: batch})
            best[i] = min(best[i], time.perf_counter() - start)
    return (*best, values)


class _Reader:
    def __init__(self, batches, name):
        self.batches, self.name, self.pos, self.end = batches, name, 0, len(batches)

    def get_next(self):
        if self.pos >= self.end:
            return None
        self.pos += 1
        return {self.name: self.batches[self.pos - 1]}

    def set_range(self, start, end):
        self.pos, self.end = start, end


def calibrun_run(model: Path, batches, spec: CalibrationSpec, threads: int, input_name: str = "x"):
    """run_calibration's steps, timed: (total, setup, collect, search, collector, seconds of each batch's
    collection)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench.hist.") as tmp:
        calibrator = create_calibrator(private_model_copy(model, tmp), spec.op_types_calibrated(),
                                       augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                       calibrate_method=spec.calibrate_method,
                                       extra_options=spec.calibrator_options())
        _lean_session(calibrator, threads)
        _fast_collector(calibrator, threads)
        calibrator.infer_session = ReusedOutputs(calibrator.infer_session)  # as run_calibration (one batch a chunk)
        reader = _Reader(batches, input_name)
        setup = time.perf_counter() - start
        per_batch = []
        for i in range(len(batches)):
            reader.set_range(i, i + 1)
            batch_start = time.perf_counter()
            calibrator.collect_data(reader)
            per_batch.append(time.perf_counter() - batch_start)
        collect = sum(per_batch)
        search_start = time.perf_counter()
        calibrator.compute_data()
        search = time.perf_counter() - search_start
        collector = calibrator.collector
    return time.perf_counter() - start, setup, collect, search, collector, per_batch


def collection_compare(model: Path, batches, spec: CalibrationSpec, threads: int, tmp: Path, input_name: str = "x"):
    """Seconds of calibrun's and onnxruntime's collect on the same outputs; histograms equal?; calibrun's CPU
    seconds (all threads) and the number of values it binned."""
    calibrator = create_calibrator(private_model_copy(model, tmp), spec.op_types_calibrated(),
                                   augmented_model_path=str(tmp / "augmented.onnx"),
                                   calibrate_method=spec.calibrate_method, extra_options=spec.calibrator_options())
    _lean_session(calibrator, threads)
    names = [o.name for o in calibrator.infer_session.get_outputs()]
    wanted = set(calibrator.tensors_to_calibrate)
    kwargs = dict(method=calibrator.method, symmetric=calibrator.symmetric, num_bins=calibrator.num_bins,
                  num_quantized_bins=calibrator.num_quantized_bins, percentile=calibrator.percentile,
                  scenario=calibrator.scenario)
    ours, theirs = FastHistogramCollector(threads=threads, **kwargs), HistogramCollector(**kwargs)
    t_ours = t_theirs = cpu_ours = 0.0
    binned = 0
    for batch in batches:
        values = calibrator.infer_session.run(None, {input_name: batch})
        # without the empty tensor the detector has: onnxruntime's symmetric percentile fails on it
        outputs = {n: [v] for n, v in zip(names, values, strict=True) if n in wanted and v.size}
        binned += sum(v[0].size for v in outputs.values())
        start, cpu_start = time.perf_counter(), time.process_time()
        ours.collect(outputs)
        middle = time.perf_counter()
        cpu_ours += time.process_time() - cpu_start
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                theirs.collect(outputs)
        except ValueError as exc:  # onnxruntime's re-binning on a range that grew too far
            return t_ours, None, f"onnxruntime failed: {exc}", cpu_ours, binned
        t_ours += middle - start
        t_theirs += time.perf_counter() - middle
        del values, outputs
    equal = all(
        all(np.array_equal(a, b) for a, b in zip(ours.histogram_dict[k], theirs.histogram_dict[k], strict=True))
        for k in theirs.histogram_dict
    )
    return t_ours, t_theirs, equal, cpu_ours, binned


def search_compare(collector: FastHistogramCollector, spec: CalibrationSpec, sample: int):
    """(ours on the sample, theirs on the sample, ours on all, tensors, sample size, thresholds equal)."""
    names = sorted(collector.histogram_dict)
    if spec.method == "entropy" and sample < len(names):
        names = random.Random(0).sample(names, sample)
    hists = {n: collector.histogram_dict[n] for n in names}

    def make(cls):
        c = cls(collector.method, collector.symmetric, collector.num_bins, collector.num_quantized_bins,
                collector.percentile, collector.scenario)
        c.histogram_dict = hists
        return c

    ours, theirs = make(FastHistogramCollector), make(HistogramCollector)
    start = time.perf_counter()
    mine = ours.compute_collection_result()
    middle = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        ref = theirs.compute_collection_result()
    end = time.perf_counter()

    def key(v):
        if hasattr(v, "avg"):
            return (v.avg, v.std, v.lowest, v.highest)
        return tuple(v[:2])

    equal = all(all(np.array_equal(a, b, equal_nan=True) for a, b in zip(key(mine[n]), key(ref[n]), strict=True))
                for n in names)
    start_all = time.perf_counter()
    collector.compute_collection_result()
    all_ours = time.perf_counter() - start_all
    return middle - start, end - middle, all_ours, len(collector.histogram_dict), len(names), equal


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="ocr_det",
                        help="trained detector (default ocr_det); sets the defaults of --size, --batches, --rows")
    parser.add_argument("--quick", action="store_true", help="160x160 (det_yolox: 416), 2 batches, 5 sampled tensors")
    parser.add_argument("--size", type=int, help="image side (multiple of 32; ocr_det 640, nudenet 320, "
                        "det_yolox 416 only)")
    parser.add_argument("--batches", type=int, help="default: ocr_det 4, nudenet 4, det_yolox 8")
    parser.add_argument("--rows", type=int, help="photos per batch (default: ocr_det 3, nudenet 8, det_yolox 1 only)")
    parser.add_argument("--methods", default="entropy,percentile,distribution")
    parser.add_argument("--ref-tensors", type=int, default=20,
                        help="tensors onnxruntime's entropy search is timed on (about 1 s each at 2048 bins)")
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: every core)")
    args = parser.parse_args(argv)
    setup = MODELS[args.model]
    if args.quick:
        args.size = args.size or (setup["size"] if args.model == "det_yolox" else 160)
        args.batches, args.ref_tensors = args.batches or 2, 5
    args.size, args.batches, args.rows = (args.size or setup["size"], args.batches or setup["batches"],
                                          args.rows or setup["rows"])
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    model = model_path(args.model)
    input_name = open_float_model(model).inputs[0].name
    print(f"model {args.model} (trained) at {args.size}x{args.size}; {args.batches} batches x {args.rows} "
          f"photos; onnxruntime {ort.__version__}; threads {args.threads or 'all'}")
    print(f"start: {machine_line()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench.histogram.") as tmp_name:
        tmp = Path(tmp_name)
        batches = make_batches(args.size, args.batches, args.rows, tmp, args.model)
        for method in methods:
            spec = CalibrationSpec(method=method)
            sub = tmp / method
            (sub / "alone").mkdir(parents=True)
            log(f"{method}: plain inference and the augmented session alone, in turns")
            plain, plain_noopt, augmented, per_batch = inference_seconds(model, batches, spec, args.threads,
                                                                         sub / "alone", input_name=input_name)
            log(f"{method}: calibrun calibration")
            total, setup, collect, search, collector, per_batch_s = calibrun_run(model, batches, spec, args.threads,
                                                                                 input_name)
            log(f"{method}: collection, calibrun vs onnxruntime")
            c_ours, c_theirs, c_equal, c_cpu, binned = collection_compare(model, batches, spec, args.threads, sub,
                                                                          input_name)
            if c_theirs is None:
                print(f"{method}: {c_equal}", flush=True)
                c_theirs = math.nan
            log(f"{method}: threshold search, calibrun vs onnxruntime")
            s_ours, s_theirs, s_all, tensors, sampled, s_equal = search_compare(collector, spec, args.ref_tensors)
            theirs_all = s_theirs * tensors / sampled
            approx = "~" if sampled < tensors else ""
            # onnxruntime's whole calibration, estimated as ours with its collection and search swapped in
            ort_total = total - collect - search + (collect - c_ours + c_theirs) + theirs_all
            rows.append((method, spec.calibrator_options(), plain, plain_noopt, total, setup, collect, search,
                         c_ours, c_theirs, c_equal, s_ours, s_theirs, s_all, tensors, sampled, s_equal,
                         theirs_all, approx, ort_total, augmented, per_batch, c_cpu, binned, per_batch_s))
    print(f"end:   {machine_line()}")
    print()
    for (method, options, plain, plain_noopt, total, setup, collect, search, c_ours, c_theirs, c_equal, s_ours,
         s_theirs, s_all, tensors, sampled, s_equal, theirs_all, approx, ort_total, augmented, per_batch, c_cpu,
         binned, per_batch_s) in rows:
        print(f"## {method} {options}")
        print(f"  plain inference over the batches      {plain:8.2f} s   (without graph optimisation, as the "
              f"calibration session runs: {plain_noopt:.2f} s)")
        print(f"  calibrun calibration (whole)          {total:8.2f} s  = {total / plain:5.2f}x plain   "
              f"(setup {setup:.2f} s, collection {collect:.2f} s, search {search:.2f} s)")
        adds = collect - augmented
        print(f"  floor (a) augmented session alone     {augmented:8.2f} s  = {augmented / plain:5.2f}x plain   "
              f"<- the best any collector can do with onnxruntime's augmented model")
        print(f"        (b) collection on top of (a)    {adds:8.2f} s  = {adds / plain:5.2f}x plain   "
              f"({per_batch / 1e6:.0f}M values binned per batch)")
        if len(per_batch_s) > 1:
            later = sorted(per_batch_s[1:])[len(per_batch_s[1:]) // 2]
            print(f"            first batch's collection    {per_batch_s[0]:8.2f} s, later batches {later:.2f} s each "
                  f"(median): the first batch's outputs land on fresh pages, (a) is measured warm")
        print(f"        (c) threshold search            {search:8.2f} s  = {search / plain:5.2f}x plain")
        print(f"  collection alone                      {c_ours / binned * 1e9:8.2f} ns/value wall, "
              f"{c_cpu / binned * 1e9:.2f} ns/value CPU (all threads; {binned / 1e6:.0f}M values)")
        plain_ns, bin_ns = plain / (per_batch * len(per_batch_s)) * 1e9, c_ours / binned * 1e9
        print(f"  plain inference per calibrated value  {plain_ns:8.2f} ns  ({per_batch / 1e6:.0f}M values per batch): "
              f"binning alone at {bin_ns:.2f} ns/value adds {bin_ns / plain_ns:.2f}x plain")
        print(f"  onnxruntime calibration (estimated)  {approx}{ort_total:8.2f} s  = {ort_total / plain:5.2f}x plain")
        print(f"  collection on the same outputs        calibrun {c_ours:7.2f} s  onnxruntime {c_theirs:7.2f} s  "
              f"= {c_theirs / c_ours:5.1f}x faster   histograms equal: {c_equal}")
        print(f"  threshold search, {sampled:3d}/{tensors} tensors  calibrun {s_ours:7.3f} s  onnxruntime "
              f"{s_theirs:7.2f} s  = {s_theirs / s_ours:6.1f}x faster   thresholds equal: {s_equal}")
        print(f"  threshold search, all {tensors} tensors  calibrun {s_all:7.2f} s  onnxruntime "
              f"{approx}{theirs_all:7.1f} s")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
