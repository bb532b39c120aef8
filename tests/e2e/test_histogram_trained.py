"""calibrun.quant.histogram against onnxruntime's own HistogramCollector on a trained model: the same histograms, the
same thresholds, the same ranges (the in-process tests on awkward and lab values are in tests/unit/test_histogram.py).

The reference is onnxruntime's code itself (`HistogramCollector`, `get_entropy_threshold`, `np.histogram`), run
on activations of the PP-OCRv4 text detector (tests/trained.py) on scikit-image's photos through calibrun's image
source, and on the lab. onnxruntime's entropy search costs about a second per tensor at 2048 bins, so the
full-model comparisons sample tensors or use fewer bins.
"""

from __future__ import annotations

import contextlib
import io
import random
from pathlib import Path

import numpy as np
import pytest
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.calibrate import CalibrationMethod, HistogramCollector, create_calibrator

from calibrun.data.images import ImageTransform, image_calibration
from calibrun.lab.data import lab_batches
from calibrun.lab.model import write_lab_model
from calibrun.model import open_float_model
from calibrun.quant import calibrate
from calibrun.quant.calibrate import CalibrationSpec, run_calibration, write_ranges
from calibrun.quant.histogram import FastHistogramCollector, entropy_threshold
from tests.conftest import run_python
from tests.trained import PHOTOS, TEXT_PHOTOS, model_path, photo_folder
from tests.unit.test_histogram import numpy_and_ours, reference_threshold

pytestmark = [
    pytest.mark.slow,  # a trained detector in-process, onnxruntime's reference collectors: seconds each
    # the detector has an empty tensor: onnxruntime's own percentile and distribution code (the reference here, and
    # what calibrun calls for those thresholds) divides by its zero count, with numpy's RuntimeWarning
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning:onnxruntime.quantization.calibrate"),
]


@pytest.fixture(scope="module")
def det_batches(tmp_path_factory) -> list[np.ndarray]:
    """12 real photos (scenes and pages of text) through calibrun's image source at 96x96, as 4 batches of 3."""
    folder = photo_folder(tmp_path_factory.mktemp("photos") / "p", PHOTOS + TEXT_PHOTOS)
    model = open_float_model(model_path("ocr_det"))
    source = image_calibration(folder, model.inputs, 1, transform=ImageTransform(resize=96, crop=96))
    (batch,) = [feed["x"] for feed in source]
    assert batch.shape == (12, 3, 96, 96)
    batches = [batch[i:i + 3] for i in range(0, 12, 3)]
    # The first three photos have no text: the detector's sigmoid map peaks at 5e-7 on them and at 1.0 on the
    # pages; onnxruntime's re-binning would then need ~2e9 bins (it fails after allocating 16 GB). A page first
    # keeps the comparison with onnxruntime possible (test_explosive_range_growth covers the other order).
    return [batches[1], batches[2], batches[0], batches[3]]


def activations(model: Path, batches, tmp: Path) -> list[dict[str, np.ndarray]]:
    """Every tensor onnxruntime's histogram calibrator would collect, per batch (its own augmented session)."""
    calibrator = create_calibrator(str(model), [], augmented_model_path=str(tmp / "augmented.onnx"),
                                   calibrate_method=CalibrationMethod.Entropy)
    session = calibrator.infer_session
    names = [o.name for o in session.get_outputs()]
    wanted = set(calibrator.tensors_to_calibrate)
    out = []
    for batch in batches:
        values = session.run(None, {session.get_inputs()[0].name: batch})
        out.append({n: v for n, v in zip(names, values, strict=True) if n in wanted})
    return out


@pytest.fixture(scope="module")
def det_activations(det_batches, tmp_path_factory):
    return activations(model_path("ocr_det"), det_batches, tmp_path_factory.mktemp("aug"))


def collected(collector_cls, method, acts, symmetric=False, num_bins=2048, **extra):
    collector = collector_cls(method=method, symmetric=symmetric, num_bins=num_bins, num_quantized_bins=128,
                              percentile=99.99, scenario="same", **extra)
    with contextlib.redirect_stdout(io.StringIO()):  # onnxruntime prints on every collect
        for batch in acts:
            collector.collect({name: [value] for name, value in batch.items()})
    return collector


def same(a, b) -> bool:
    """Equal values and dtype (NaN equal to NaN: an empty tensor's mean is NaN for onnxruntime too)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def assert_same_histograms(ref: dict, fast: dict) -> None:
    assert ref.keys() == fast.keys()
    for name in ref:
        assert len(ref[name]) == len(fast[name]), name
        for r, f in zip(ref[name], fast[name], strict=True):
            r, f = np.asarray(r), np.asarray(f)
            assert r.dtype == f.dtype, name
            assert np.array_equal(r, f), name


def test_binning_on_real_activations_equals_numpy(det_activations):
    checked = 0
    for name, value in det_activations[0].items():
        flat = value.reshape(-1)
        t = np.array(max(abs(flat.min()), abs(flat.max())) if flat.size else 0, dtype=flat.dtype)
        (ref_counts, ref_edges), (counts, edges) = numpy_and_ours(flat, 2048, (-t, t))
        assert np.array_equal(ref_counts, counts), name
        assert np.array_equal(ref_edges, edges), name
        checked += 1
    assert checked > 100


def test_binning_on_a_second_trained_model_equals_numpy(tmp_path):
    """NudeNet's YOLOv8n (SiLU activations, a letterboxed photo padded with zeros): every tensor binned over its
    symmetric range and, for symmetric percentile, |x| over its own range, as numpy bins them."""
    from calibrun.quant.histogram import histogram

    model = model_path("nudenet")
    folder = photo_folder(tmp_path / "p", ("astronaut.png", "camera.png"))
    info = open_float_model(model).inputs
    source = image_calibration(folder, info, 1, transform=ImageTransform(
        resize=160, crop=160, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), letterbox=True, pad_value=0.0))
    (batch,) = [next(iter(feed.values())) for feed in source]
    checked = 0
    for name, value in activations(model, [batch], tmp_path)[0].items():
        flat = value.reshape(-1)
        if not flat.size:
            continue
        lo, hi = flat.min(), flat.max()
        t = np.array(max(abs(lo), abs(hi)), dtype=flat.dtype)
        (ref_counts, ref_edges), (counts, edges) = numpy_and_ours(flat, 2048, (-t, t))
        assert np.array_equal(ref_counts, counts), name
        assert np.array_equal(ref_edges, edges), name
        absolute = np.absolute(flat)
        ref = np.histogram(absolute, 2048)
        bounds = (absolute.min(), absolute.max())
        got = histogram(flat, 2048, range=bounds, bounds=bounds, absolute=True)
        assert np.array_equal(ref[0], got[0]), name
        assert np.array_equal(ref[1], got[1]), name
        checked += 1
    assert checked > 200


@pytest.mark.parametrize(("method", "symmetric"), [("entropy", False), ("distribution", False),
                                                   ("percentile", True), ("percentile", False)])
def test_collector_gives_onnxruntimes_histograms_on_a_trained_detector(det_activations, method, symmetric):
    """4 batches of real photos: ranges grow between batches, so onnxruntime's re-binning is exercised."""
    acts = det_activations
    if method == "percentile" and symmetric:  # onnxruntime fails on an empty tensor there (nanmax of nothing)
        acts = [{n: v for n, v in batch.items() if v.size} for batch in acts]
    ref = collected(HistogramCollector, method, acts, symmetric)
    fast = collected(FastHistogramCollector, method, acts, symmetric, threads=2)
    grown = sum(len(h[0]) != 2048 for h in ref.histogram_dict.values())
    assert grown > 0  # some tensors' histograms were re-binned to a wider range
    assert_same_histograms(ref.histogram_dict, fast.histogram_dict)
    if method != "entropy":  # percentile and distribution: onnxruntime's own O(bins) code on equal histograms
        with contextlib.redirect_stdout(io.StringIO()):
            expected = ref.compute_collection_result()
        got = fast.compute_collection_result()
        assert expected.keys() == got.keys()
        for name in expected:
            e, g = expected[name], got[name]
            if method == "distribution":
                e, g = (e.avg, e.std, e.lowest, e.highest), (g.avg, g.std, g.lowest, g.highest)
            assert all(same(a, b) for a, b in zip(e, g, strict=True)), name


def test_explosive_range_growth_is_rebinned_not_fatal(det_batches, tmp_path):
    """Photos without text first: the sigmoid map's range grows 2e6-fold. onnxruntime would need ~2e9 bins;
    calibrun keeps the bin count, and every value is still counted within the final range."""
    acts = activations(model_path("ocr_det"), [det_batches[2], det_batches[0]], tmp_path)
    name = "sigmoid_0.tmp_0"
    first, second = (float(np.abs(a[name]).max()) for a in acts)
    assert second / first > 1e5  # the situation the test is about
    fast = collected(FastHistogramCollector, "entropy", acts)
    hist, edges, lo, hi, threshold = fast.histogram_dict[name]
    assert hist.size == 2048
    assert edges.size == 2049
    assert hist.sum() == sum(a[name].size for a in acts)
    assert float(edges[-1]) >= second
    assert float(threshold) == pytest.approx(second)
    lowest, highest = entropy_threshold(fast.histogram_dict[name], 128)
    assert 0 <= float(lowest) < float(highest) <= second


def test_an_empty_tensor_does_not_stop_percentile(det_activations):
    empty = [name for name, value in det_activations[0].items() if value.size == 0]
    assert empty  # the detector has one (onnxruntime's symmetric percentile fails on it)
    fast = collected(FastHistogramCollector, "percentile", det_activations[:2], symmetric=True)
    assert all(fast.histogram_dict[name][0].sum() == 0 for name in empty)


def test_threads_do_not_change_the_histograms(det_activations):
    one = collected(FastHistogramCollector, "entropy", det_activations[:2], threads=1)
    two = collected(FastHistogramCollector, "entropy", det_activations[:2], threads=2)
    assert_same_histograms(one.histogram_dict, two.histogram_dict)


def test_entropy_thresholds_equal_onnxruntimes_on_a_trained_detector(det_activations):
    """512 bins on every tensor of the detector (the reference's loops take ~0.1 s a tensor there)."""
    fast = collected(FastHistogramCollector, "entropy", det_activations, num_bins=512)
    names = sorted(fast.histogram_dict)
    random.Random(1).shuffle(names)
    differ = []
    for name in names[:30]:
        hist = fast.histogram_dict[name]
        expected = reference_threshold(hist, 128)
        got = entropy_threshold(hist, 128)
        if not (expected[0] == got[0] and expected[1] == got[1]):
            differ.append(name)
        assert got[0].dtype == expected[0].dtype
        assert got[1].dtype == expected[1].dtype
    assert differ == []


def test_entropy_thresholds_equal_onnxruntimes_at_2048_bins(det_activations):
    fast = collected(FastHistogramCollector, "entropy", det_activations[:2])
    names = sorted(fast.histogram_dict)
    for name in random.Random(2).sample(names, 2):
        hist = fast.histogram_dict[name]
        expected, got = reference_threshold(hist, 128), entropy_threshold(hist, 128)
        assert (expected[0], expected[1]) == (got[0], got[1]), name
    # and the search is a search: for many tensors the threshold is not simply the whole range
    cut = [n for n in names if float(entropy_threshold(fast.histogram_dict[n], 128)[1]) < fast.histogram_dict[n][3]]
    assert len(cut) > len(names) // 4


def assert_same_ranges(ours, theirs) -> None:
    """Every field onnxruntime stores per tensor (lowest, highest, hist, bins or hist_edges, avg, std)."""
    assert ours.calibration_method == theirs.calibration_method
    assert ours.data.keys() == theirs.data.keys()
    for name in ours.data:
        mine, ref = ours.data[name].to_dict(), theirs.data[name].to_dict()
        assert mine.keys() == ref.keys(), name
        assert all(same(mine[k], ref[k]) for k in mine if k != "CLS"), name


class _FreshOutputs:
    """The calibration session as onnxruntime uses it: fresh outputs every batch (no ReusedOutputs)."""

    def __init__(self, session, sets: int = 1):
        self.session = session

    def __getattr__(self, name):
        return getattr(self.session, name)

    def rewind(self) -> None:
        pass

    def release(self) -> None:
        pass


def reference_calibration(monkeypatch, *args, **kwargs):
    """run_calibration as onnxruntime calibrates: its own collector (calibrun's is not installed), on the
    session's fresh outputs."""
    with monkeypatch.context() as patch:
        patch.setattr(calibrate, "_fast_collector", lambda calibrator, threads, budget=None: None)
        patch.setattr(calibrate, "ReusedOutputs", _FreshOutputs)
        with contextlib.redirect_stdout(io.StringIO()):
            return run_calibration(*args, **kwargs)


def quantized_bytes(model: Path, tensors, span, path: Path) -> bytes:
    cache = write_ranges(path.with_suffix(".json"), tensors, {}, span)
    quantize_static(str(model), str(path), None, quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, calibrate_method=tensors.calibration_method,
                    calibration_cache_path=str(cache))
    return path.read_bytes()


@pytest.mark.parametrize("method", ["entropy", "percentile", "distribution"])
def test_lab_int8_models_are_byte_identical_to_onnxruntimes(tmp_path, monkeypatch, method):
    model = write_lab_model(tmp_path / "lab.onnx")
    info = open_float_model(model).inputs[0]
    # entropy at 512 bins: onnxruntime's reference search takes ~1 s a tensor at the default 2048 (the thresholds at
    # 2048 are compared above); the rest of the pipeline does not depend on the bins
    spec = CalibrationSpec(method=method, num_bins=512 if method == "entropy" else None)
    data = lab_batches(info, 4242, 0.2, 8)
    ours, span = run_calibration(model, data, info.name, spec)
    theirs, ref_span = reference_calibration(monkeypatch, model, data, info.name, spec)
    assert span == ref_span
    assert_same_ranges(ours, theirs)
    assert quantized_bytes(model, ours, span, tmp_path / "ours.onnx") == \
        quantized_bytes(model, theirs, span, tmp_path / "theirs.onnx")


@pytest.mark.parametrize("method", ["entropy", "percentile", "distribution"])
def test_detector_ranges_equal_onnxruntimes(det_batches, monkeypatch, method):
    model = model_path("ocr_det")
    # symmetric percentile is calibrun's default, but onnxruntime's own collector fails on this model with it (an
    # empty tensor: nanmax of nothing); its histograms are compared without that tensor in the collector test
    # entropy at 160 bins (17 candidate thresholds around 128 quantized bins): onnxruntime's reference search is
    # Python loops quadratic in the bins (~0.09 s a tensor at 512, ~60 s for the model's 649 tensors); every tensor
    # still goes through both pipelines, and the thresholds at 512 and 2048 bins are compared on sampled tensors
    # above. distribution needs 512 (onnxruntime's minimum).
    bins = {"entropy": 160, "distribution": 512, "percentile": 2048}[method]
    spec = CalibrationSpec(method=method, num_bins=bins,
                           symmetric=False if method == "percentile" else None)
    ours, span = run_calibration(model, det_batches, "x", spec)
    theirs, ref_span = reference_calibration(monkeypatch, model, det_batches, "x", spec)
    assert span == ref_span
    assert_same_ranges(ours, theirs)


def test_refused_settings_stop_the_app_before_any_work(tmp_path):
    proc = run_python(["-m", "calibrun", "method=entropy", "method.num_quantized_bins=2048", "tracking=off",
                       f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode != 0
    assert "method.num_quantized_bins" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "int8.onnx").exists()
    assert not (tmp_path / ".calibrun-cache").exists()


def test_threshold_search_reports_progress_per_tensor(det_activations):
    calls = []
    fast = collected(FastHistogramCollector, "entropy", det_activations[:1], num_bins=256, progress=calls.append)
    fast.compute_collection_result()
    assert calls == list(range(1, len(fast.histogram_dict) + 1))


@pytest.fixture(scope="module")
def small_det_batches(tmp_path_factory) -> list[np.ndarray]:
    """Real photos (scenes and pages of text) at 64x64 for the trained text detector: 4 batches of 2 and a last
    batch of 1 (a shape change; alone in its chunk of 2, as onnxruntime's collector cannot stack a chunk of two
    shapes). Pages first, as in det_batches (range growth)."""
    folder = photo_folder(tmp_path_factory.mktemp("photos") / "p", PHOTOS + TEXT_PHOTOS)
    model = open_float_model(model_path("ocr_det"))
    source = image_calibration(folder, model.inputs, 1, transform=ImageTransform(resize=64, crop=64))
    (photos,) = [feed["x"] for feed in source]
    pages = photos[len(PHOTOS):]
    ordered = np.concatenate([pages, photos[:5]])
    return [np.ascontiguousarray(ordered[i:i + 2]) for i in (0, 2, 4, 6)] + [np.ascontiguousarray(ordered[8:9])]


def test_reused_outputs_give_the_ranges_of_fresh_outputs(small_det_batches, tmp_path):
    """calibrun.model.sessions.ReusedOutputs on 649 tensors (the graph input and an empty tensor among them), chunks of
    2 and a shape change: the ranges of onnxruntime's own collect_data on fresh outputs (tests/unit/
    test_calibration_outputs.py has every method and chunk on the lab model)."""
    from tests.unit.test_calibration_outputs import assert_identical, reference

    model = model_path("ocr_det")
    spec = CalibrationSpec(method="percentile", chunk=2, num_bins=512)
    ours, _ = run_calibration(model, small_det_batches, "x", spec)
    theirs = reference(model, small_det_batches, "x", spec, tmp_path)
    assert len(theirs) > 500
    assert_identical(dict(ours.items()), theirs)
