"""calibrun.quant.histogram against onnxruntime's own HistogramCollector: the same histograms, the same thresholds.

The reference is onnxruntime's code itself (`HistogramCollector`, `get_entropy_threshold`, `np.histogram`), here
on awkward values and the lab, in-process; the comparisons on a trained detector's activations and the lab's
int8 bytes per method are in tests/e2e/test_histogram_trained.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import quantize_static
from onnxruntime.quantization.calibrate import CalibrationMethod, HistogramCollector, create_calibrator
from onnxruntime.quantization.calibrate import entropy as ort_entropy
from onnxruntime.quantization.quant_utils import smooth_distribution

from calibrun.core.errors import CalibrunError
from calibrun.lab.data import lab_batches
from calibrun.lab.model import write_lab_model
from calibrun.model import open_float_model
from calibrun.quant.calibrate import CalibrationSpec, run_calibration, write_ranges
from calibrun.quant.histogram import _block_sums, bin_counts, entropy_threshold, exact_kl, histogram

# ---------------------------------------------------------------------------------------------- binning


def numpy_and_ours(data, bins, range_=None):
    ref = np.histogram(data, bins, range=range_)
    ours = histogram(data, bins, range=range_)
    return ref, ours


@pytest.mark.parametrize("bins", [1, 2, 7, 128, 2048, 65536])
def test_binning_equals_numpy_on_awkward_values(bins):
    rng = np.random.default_rng(3)
    t = np.float32(3.7)
    edges = np.histogram_bin_edges(np.empty(0, np.float32), bins, range=(-t, t))
    tiny = np.array([0.0, -0.0, 1e-30, -1e-30, 1e-45, -1e-45, np.finfo(np.float32).tiny], np.float32)
    near = np.concatenate([np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, np.float32(-np.inf)),
                           edges]).astype(np.float32)
    data = np.concatenate([rng.normal(0, 1, 200_000).astype(np.float32), tiny, near,
                           np.zeros(50_000, np.float32), np.float32([-t, t, 9.0, -9.0, np.nan, np.inf])])
    rng.shuffle(data)
    (ref_counts, ref_edges), (counts, ours_edges) = numpy_and_ours(data, bins, (-t, t))
    assert np.array_equal(ref_edges, ours_edges)
    assert ref_edges.dtype == ours_edges.dtype
    assert np.array_equal(ref_counts, counts)
    assert counts.sum() == np.count_nonzero(np.abs(data) <= t)  # NaN, inf and +-9 are outside


def test_binning_equals_numpy_for_a_constant_tensor_and_its_auto_range():
    for data in (np.zeros(1000, np.float32), np.full(1000, 2.5, np.float32)):
        t = np.array(np.abs(data).max(), np.float32)
        (ref_counts, ref_edges), (counts, edges) = numpy_and_ours(data, 2048, (-t, t))  # range 0: +-0.5
        assert np.array_equal(ref_counts, counts)
        assert np.array_equal(ref_edges, edges)
        (ref_counts, ref_edges), (counts, edges) = numpy_and_ours(np.abs(data), 2048)
        assert np.array_equal(ref_counts, counts)
        assert np.array_equal(ref_edges, edges)


def test_binning_with_explicit_edges_equals_numpy():
    """The percentile merge: edges extended by np.arange (not exactly uniform), data beyond them dropped."""
    rng = np.random.default_rng(5)
    first = np.abs(rng.normal(0, 1, 10_000).astype(np.float32))
    _, edges = np.histogram(first, 2048)
    edges = edges.astype(np.float32)
    width = edges[1] - edges[0]
    edges = np.hstack((edges, np.arange(edges[-1] + width, np.float32(9.0) + width, width)))
    data = np.abs(rng.normal(0, 3, 300_000).astype(np.float32))
    data[:100] = edges[:100]
    assert np.array_equal(np.histogram(data, bins=edges)[0], bin_counts(data, edges))


def edge_heavy(edges: np.ndarray, rng, size: int) -> np.ndarray:
    """Values on and one float beside every edge, zeros and negative zeros, repeated, shuffled."""
    e = edges.astype(np.float32)
    near = np.concatenate([e, np.nextafter(e, np.float32(np.inf)), np.nextafter(e, np.float32(-np.inf))])
    data = np.concatenate([np.repeat(near, 3), np.zeros(size, np.float32), -np.zeros(size // 4, np.float32),
                           rng.uniform(float(e[0]), float(e[-1]), size).astype(np.float32)])
    rng.shuffle(data)
    return data


@pytest.mark.parametrize(
    "range_",
    [(-1.0, 1.0), (-3.7, 3.7), (-1e-3, 2.5), (-2.0, 1e-7), (0.0, 6.0), (-6.0, 0.0), (1000.0, 1001.5),
     (-1e30, 1e30), (-1.5e38, 1.5e38), (-1e-37, 1e-37), (-1e-44, 1e-44), (0.1, 0.1 + 2**-20)],
)
@pytest.mark.parametrize("bins", [1, 3, 128, 2048, 2049, 65536])
def test_binning_equals_numpy_on_edges_zeros_and_extreme_ranges(range_, bins):
    """Zeros on the middle edge of a symmetric range (ReLU outputs), near (not on) an edge of asymmetric ones,
    values on every edge and one float either side, offset, huge, tiny and subnormal ranges."""
    rng = np.random.default_rng(bins)
    first, last = np.float32(range_[0]), np.float32(range_[1])
    try:
        edges = np.histogram_bin_edges(np.empty(0, np.float32), bins, range=(first, last))
    except ValueError as exc:  # numpy refuses bins narrower than a float allows: so does calibrun, the same way
        with pytest.raises(ValueError, match=str(exc)):
            histogram(np.zeros(3, np.float32), bins, range=(first, last))
        return
    data = edge_heavy(edges, rng, 40_000)
    inside = data[(data >= first) & (data <= last)]
    for values in (data, inside):
        (ref_counts, ref_edges), (counts, edges_) = numpy_and_ours(values, bins, (first, last))
        assert np.array_equal(ref_edges, edges_)
        assert np.array_equal(ref_counts, counts)
    bounds = (inside.min(), inside.max())
    assert np.array_equal(np.histogram(inside, bins, range=(first, last))[0],
                          histogram(inside, bins, range=(first, last), bounds=bounds)[0])


def test_binning_of_many_blocks_of_zeros_and_a_constant(monkeypatch):
    """A ReLU-like tensor over many blocks (half zeros, the range's maximum repeated), then NaN in some blocks."""
    from calibrun.quant import histogram as module

    monkeypatch.setattr(module, "_BLOCK", 1000)
    rng = np.random.default_rng(11)
    data = np.maximum(rng.normal(0, 1, 50_000), 0).astype(np.float32)
    data[::7] = data.max()
    t = np.array(data.max(), np.float32)
    (ref_counts, _), (counts, _) = numpy_and_ours(data, 2048, (-t, t))
    assert np.array_equal(ref_counts, counts)
    data[[5, 17_000, 49_999]] = np.nan
    (ref_counts, _), (counts, _) = numpy_and_ours(data, 2048, (-t, t))
    assert np.array_equal(ref_counts, counts)
    assert counts.sum() == data.size - 3


@pytest.mark.parametrize("block", [1000, 1 << 17])
@pytest.mark.parametrize("t", [62.65438, 62.914524, 3.7])
def test_zeros_near_but_not_on_the_middle_edge(monkeypatch, block, t):
    """numpy's middle edge of (-t, t) is not always 0: at t=62.65438 (1000 bins) it is +3.8e-6, so zeros belong
    to the bin below it; at 62.914524 it is -3.8e-6. ReLU-like tensors (most values zero) over many blocks."""
    from calibrun.quant import histogram as module

    monkeypatch.setattr(module, "_BLOCK", block)
    t = np.array(t, np.float32)
    edges = np.histogram_bin_edges(np.empty(0, np.float32), 1000, range=(-t, t))
    if float(t) != np.float32(3.7):
        assert edges[500] != 0  # the situation the test is about
    rng = np.random.default_rng(4)
    data = np.maximum(rng.normal(0, 20, 300_000), 0).astype(np.float32)
    data[:: 5] = -data[:: 5]
    data[1::7] = -0.0
    data[-1] = t
    (ref_counts, _), (counts, _) = numpy_and_ours(data, 1000, (-t, t))
    assert np.array_equal(ref_counts, counts)
    bounds = (data.min(), data.max())
    assert np.array_equal(ref_counts, histogram(data, 1000, range=(-t, t), bounds=bounds)[0])


@pytest.mark.parametrize("seed", range(20))
def test_binning_equals_numpy_on_random_ranges_and_scales(seed):
    rng = np.random.default_rng(100 + seed)
    bins = int(rng.choice([2, 10, 100, 1000, 2048, 4096, 40_000]))
    scale = float(10.0 ** rng.uniform(-30, 30))
    lo, hi = sorted(rng.normal(0, 1, 2) * scale)
    first, last = np.float32(lo), np.float32(hi)
    if not first < last:
        return
    edges = np.histogram_bin_edges(np.empty(0, np.float32), bins, range=(first, last))
    data = np.concatenate([edge_heavy(edges, rng, 5_000),
                           (rng.normal(0, 1, 20_000) * scale).astype(np.float32)])
    (ref_counts, _), (counts, _) = numpy_and_ours(data, bins, (first, last))
    assert np.array_equal(ref_counts, counts)


def test_float16_goes_to_numpy_and_the_collector_equals_onnxruntimes():
    rng = np.random.default_rng(8)
    batches = [{"t": [np.maximum(rng.normal(0, s, 5000), 0).astype(np.float16)]} for s in (1.0, 3.0)]
    # 128 bins: at 2048 float16 edges are not increasing and numpy (so onnxruntime) refuses
    ref = HistogramCollector("entropy", False, 128, 64, 99.99, "same")
    from calibrun.quant.histogram import FastHistogramCollector

    fast = FastHistogramCollector("entropy", False, 128, 64, 99.99, "same", threads=2)
    for batch in batches:
        with contextlib.redirect_stdout(io.StringIO()):  # onnxruntime prints on every collect
            ref.collect(batch)
        fast.collect(batch)
    for r, f in zip(ref.histogram_dict["t"], fast.histogram_dict["t"], strict=True):
        assert np.asarray(r).dtype == np.asarray(f).dtype
        assert np.array_equal(r, f)


@pytest.mark.parametrize("block", [1000, 1 << 17])
def test_symmetric_percentile_collector_equals_onnxruntimes(monkeypatch, block):
    """|data| binned block by block: data straddling zero without a zero (the first edge is min |x|), one-sided
    data, ranges that grow (edges extended), NaN in a later batch, an all-zero tensor."""
    from calibrun.quant import histogram as module

    monkeypatch.setattr(module, "_BLOCK", block)
    rng = np.random.default_rng(12)

    def straddling(scale, size=30_000):
        values = rng.normal(0.5, scale, size).astype(np.float32)
        return values[values != 0]

    batches = [
        {"s": straddling(1.0), "pos": rng.uniform(0.3, 2, 9000).astype(np.float32),
         "neg": -rng.uniform(0.3, 2, 9000).astype(np.float32), "z": np.zeros(500, np.float32)},
        {"s": straddling(3.0), "pos": rng.uniform(0.1, 3, 9000).astype(np.float32),
         "neg": -rng.uniform(0.3, 5, 9000).astype(np.float32), "z": np.zeros(500, np.float32)},
        {"s": np.concatenate([straddling(2.0), np.float32([np.nan])]),
         "pos": rng.uniform(0.1, 1, 9000).astype(np.float32),
         "neg": -rng.uniform(0.3, 1, 9000).astype(np.float32), "z": np.ones(500, np.float32)},
    ]
    ref = HistogramCollector("percentile", True, 2048, 128, 99.99, "same")
    fast = module.FastHistogramCollector("percentile", True, 2048, 128, 99.99, "same", threads=2)
    for batch in batches:
        with contextlib.redirect_stdout(io.StringIO()):
            ref.collect({k: [v] for k, v in batch.items()})
        fast.collect({k: [v] for k, v in batch.items()})
    assert ref.histogram_dict["pos"][1].size > 2049  # the range grew: edges extended
    for name in batches[0]:
        for r, f in zip(ref.histogram_dict[name], fast.histogram_dict[name], strict=True):
            assert np.asarray(r).dtype == np.asarray(f).dtype, name
            assert np.array_equal(r, f, equal_nan=True), name


def test_threads_take_the_largest_tensors_first_and_keep_the_order():
    from calibrun.quant.histogram import FastHistogramCollector

    rng = np.random.default_rng(9)
    outputs = {f"t{i}": [rng.normal(0, 1, size).astype(np.float32)] for i, size in enumerate([10, 70_000, 3, 500])}
    one = FastHistogramCollector("entropy", False, 256, 128, 99.99, "same", threads=1)
    two = FastHistogramCollector("entropy", False, 256, 128, 99.99, "same", threads=2)
    one.collect(outputs)
    two.collect(outputs)
    assert list(two.histogram_dict) == list(outputs)
    for name in outputs:
        assert all(np.array_equal(a, b) for a, b in zip(one.histogram_dict[name], two.histogram_dict[name],
                                                         strict=True))


# ---------------------------------------------------------------------------------------------- entropy


def reference_threshold(histogram_, q_bins):
    return HistogramCollector("entropy", False, 0, q_bins, 0, "same").get_entropy_threshold(histogram_, q_bins)


@pytest.mark.parametrize("q_bins", [2, 3, 127, 128, 255])
def test_entropy_thresholds_on_awkward_histograms(q_bins):
    """Sparse (tiny tensors), one-sided, all-zero, odd-sized and outlier-heavy histograms."""
    rng = np.random.default_rng(q_bins)
    cases = []
    for bins in (256, 257, 300):
        edges = np.linspace(-2, 2, bins + 1).astype(np.float32)
        lo, hi = np.float32(-1.7), np.float32(1.9)
        dense = rng.poisson(rng.uniform(0, 50, bins)).astype(np.int64)
        sparse = np.zeros(bins, np.int64)
        sparse[rng.integers(0, bins, 5)] = rng.integers(1, 1000, 5)
        one_sided = dense.copy()
        one_sided[: bins // 2] = 0
        spikes = np.zeros(bins, np.int64)
        spikes[[0, bins // 2, bins - 1]] = [10**9, 10**7, 3]
        for hist in (dense, sparse, one_sided, spikes, np.zeros(bins, np.int64)):
            cases.append((hist, edges, lo, hi))
    for case in cases:
        if q_bins // 2 > case[0].size // 2:
            continue
        expected, got = reference_threshold(case, q_bins), entropy_threshold(case, q_bins)
        assert (expected[0], expected[1]) == (got[0], got[1])


def reference_kl(hist, i, q_bins):
    """onnxruntime's get_entropy_threshold loop body for candidate i: its p and q, smooth_distribution, entropy."""
    zero = hist.size // 2
    start, end = zero - i, min(zero + i + 1, hist.size)
    sliced = hist[start:end]
    p = sliced.copy()
    p[0] += hist[:start].sum()
    p[-1] += hist[end:].sum()
    nonzeros = (p != 0).astype(np.int64)
    merged = sliced.size // q_bins
    quantized = sliced[:q_bins * merged].reshape(q_bins, merged).sum(axis=1)
    quantized[-1] += sliced[q_bins * merged:].sum()
    norm = nonzeros[:q_bins * merged].reshape(q_bins, merged).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = np.where(norm != 0, quantized / np.where(norm != 0, norm, 1), 0.0)
    q = np.zeros(p.size, dtype=np.int64)
    q[:q_bins * merged] = np.repeat(spread.astype(np.int64), merged)
    try:
        p_s, q_s = smooth_distribution(p), smooth_distribution(q)
    except AssertionError:
        return np.inf
    if p_s is None or q_s is None:
        return np.inf
    return float(np.array(ort_entropy(p_s, q_s), dtype=np.float32))


def test_exact_kl_is_onnxruntimes_value_bit_for_bit():
    """calibrun's leaner smoothing and entropy give the very float32 KL of onnxruntime's functions, smoothing that
    fails (eps1 >= 1: many zeros) and empty distributions included."""
    rng = np.random.default_rng(11)
    hists = [rng.poisson(rng.uniform(0, 80, 512)).astype(np.int64),
             np.where(rng.random(512) < 0.97, 0, rng.integers(1, 10**6, 512)),  # sparse: smoothing fails
             np.zeros(512, np.int64)]
    hists[0][[0, 255, 511]] = [10**9, 10**8, 7]
    compared = 0
    for hist in hists:
        for i in range(64, 257, 3):
            expected, got = reference_kl(hist, i, 128), exact_kl(hist, i, 128, np.float32)
            assert got == expected or (np.isnan(got) and np.isnan(expected)), (i, got, expected)
            compared += np.isfinite(expected)
    assert compared > 60  # finite values were compared, not only the unusable candidates


def test_block_sums_read_the_prefix_sums_on_each_candidates_grid():
    prefix = np.cumsum(np.random.default_rng(2).integers(0, 50, 700)).astype(np.float64)
    starts = np.arange(300, 40, -1)  # consecutive candidates: one bin lower each
    merged = (700 - 2 * starts) // 16  # runs of equal block widths
    got = _block_sums(prefix, starts, merged, 16)
    bounds = starts[:, None] + np.arange(17) * merged[:, None]
    np.testing.assert_array_equal(got, np.diff(prefix[bounds], axis=1))


# ---------------------------------------------------------------------------------------------- the lab


def test_entropy_defaults_make_a_model_other_than_minmax(tmp_path):
    """With onnxruntime's 128/128 entropy is minmax; with calibrun's defaults it chooses narrower ranges."""
    model = write_lab_model(tmp_path / "lab.onnx")
    info = open_float_model(model).inputs[0]
    data = lab_batches(info, 4242, 1.0, 8)
    entropy, span = run_calibration(model, data, info.name, CalibrationSpec(method="entropy"))
    minmax, _ = run_calibration(model, data, info.name, CalibrationSpec(method="minmax"))
    narrower = [n for n in entropy.data if np.max(entropy.data[n].highest) < np.max(minmax.data[n].highest)]
    assert narrower


# ---------------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"method": "entropy", "num_quantized_bins": 0}, "method.num_quantized_bins"),
        ({"method": "entropy", "num_quantized_bins": -3}, "method.num_quantized_bins"),
        ({"method": "entropy", "num_quantized_bins": 2048}, "method.num_quantized_bins"),  # one candidate
        ({"method": "entropy", "num_bins": 128}, "method.num_quantized_bins"),  # onnxruntime's 128/128
        ({"method": "entropy", "num_quantized_bins": 4096}, "method.num_quantized_bins"),
        ({"method": "entropy", "num_bins": 65537}, "method.num_bins"),
        ({"method": "percentile", "num_bins": 0}, "method.num_bins"),
        ({"method": "percentile", "percentile": 0}, "method.percentile"),
        ({"method": "percentile", "percentile": 100.5}, "method.percentile"),
        ({"method": "distribution", "num_bins": 256}, "method.num_bins"),
        ({"method": "distribution", "scenario": "p4"}, "method.scenario"),
        ({"method": "minmax", "per_channel": True}, "method.per_channel"),
        ({"method": "entropy", "per_channel": True}, "method.per_channel"),
    ],
)
def test_degenerate_settings_are_refused_naming_the_key(options, key):
    with pytest.raises(CalibrunError) as info:
        CalibrationSpec(**options)
    assert str(info.value).startswith(f"config {key}:")
    assert "\n" not in str(info.value)


def test_per_channel_activation_ranges_really_break_onnxruntime(tmp_path):
    """Why method.per_channel is refused: onnxruntime's quantizer fails on the ranges its calibrator makes."""
    model = write_lab_model(tmp_path / "lab.onnx")
    info = open_float_model(model).inputs[0]
    name = onnx.load(str(model)).graph.input[0].name
    calibrator = create_calibrator(str(model), [], augmented_model_path=str(tmp_path / "aug.onnx"),
                                   calibrate_method=CalibrationMethod.MinMax, extra_options={"per_channel": True})
    from calibrun.quant.reader import make_reader

    calibrator.collect_data(make_reader(list(lab_batches(info, 4242, 1.0, 2)), name))
    tensors = calibrator.compute_data()
    cache = write_ranges(tmp_path / "ranges.json", tensors, {}, 1.0)
    with pytest.raises(ValueError, match="truth value of an array"):
        quantize_static(str(model), str(tmp_path / "int8.onnx"), None, calibration_cache_path=str(cache))


def test_histogram_algorithm_is_in_the_key_of_histogram_methods_only():
    from calibrun.quant.histogram import ALGORITHM

    assert "histogram" not in CalibrationSpec(method="minmax").key_fields()  # minmax cache entries stay valid
    for method in ("entropy", "percentile", "distribution"):
        assert CalibrationSpec(method=method).key_fields()["histogram"] == ALGORITHM
    assert CalibrationSpec(method="entropy").calibrator_options()["num_bins"] == 2048


@pytest.mark.parametrize("method", ["entropy", "percentile", "distribution"])
def test_a_chunk_of_batches_with_different_row_counts_is_calibrated(tmp_path, method, capsys):
    """`method.chunk=2` over 16, 16, 16 and 7 rows: the last chunk holds 16 and 7 rows, which onnxruntime's collector
    cannot stack (numpy: "inhomogeneous shape"). Its values are all binned: the ranges equal those of the same rows
    in one batch of 23. onnxruntime prints its percentile and distribution settings: not on calibrun's stdout."""
    model = write_lab_model(tmp_path / "lab.onnx")
    rng = np.random.default_rng(5)
    rows = [rng.normal(0, 1, (n, 16)).astype(np.float32) for n in (16, 16, 16, 7)]
    spec = CalibrationSpec(method=method, chunk=2)
    ragged, _ = run_calibration(model, [{"x": r} for r in rows], "x", spec)
    joined, _ = run_calibration(model, [{"x": r} for r in [*rows[:2], np.concatenate(rows[2:])]], "x", spec)
    assert {k: tuple(map(float, v.range_value)) for k, v in ragged.items()} == \
        {k: tuple(map(float, v.range_value)) for k, v in joined.items()}
    assert capsys.readouterr().out == ""


# ---------------------------------------------------------------------------------------------- in pieces


def _chunks(rng) -> list[dict[str, np.ndarray]]:
    """Three chunks of awkward tensors: straddling and one-sided values, ranges that grow a little and a lot
    (re-binning past MAX_GROWN_BINS), zeros, NaN in a later chunk, float16, an empty tensor."""
    def straddling(scale, size=20_000):
        values = rng.normal(0.5, scale, size).astype(np.float32)
        return values[values != 0]

    return [
        {"s": straddling(1.0), "pos": rng.uniform(0.3, 2, 9000).astype(np.float32), "z": np.zeros(500, np.float32),
         "tiny": np.full(300, 5e-7, np.float32), "h": rng.normal(0, 1, 4000).astype(np.float16),
         "e": np.zeros(0, np.float32)},
        {"s": straddling(3.0), "pos": rng.uniform(0.1, 3, 9000).astype(np.float32), "z": np.zeros(500, np.float32),
         "tiny": rng.uniform(0, 1, 300).astype(np.float32), "h": rng.normal(0, 2, 4000).astype(np.float16),
         "e": np.zeros(0, np.float32)},
        {"s": np.concatenate([straddling(2.0), np.float32([np.nan])]),
         "pos": rng.uniform(0.1, 1, 9000).astype(np.float32), "z": np.ones(500, np.float32),
         "tiny": rng.uniform(0, 2, 300).astype(np.float32), "h": rng.normal(0, 0.5, 4000).astype(np.float16),
         "e": np.zeros(0, np.float32)},
    ]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize(("method", "symmetric"), [("entropy", False), ("distribution", False),
                                                   ("percentile", False), ("percentile", True)])
def test_a_chunk_collected_in_pieces_is_the_whole_chunks_histogram(method, symmetric, overlap):
    """Two passes over any split of a chunk (calibrun.quant.histogram_runs.collect_pieces: the ranges, then the
    counts) give the histogram of the whole chunk, bit for bit, chunk after chunk; also with each piece taken while
    the next one is made (`overlap`)."""
    from calibrun.quant.histogram import FastHistogramCollector
    from calibrun.quant.histogram_runs import collect_pieces

    chunks = _chunks(np.random.default_rng(21))
    # 512 bins (distribution's least): at 2048 float16 edges are not increasing and numpy refuses
    whole = FastHistogramCollector(method, symmetric, 512, 128, 99.99, "same", threads=1)
    pieces = FastHistogramCollector(method, symmetric, 512, 128, 99.99, "same", threads=1)
    calls = []
    for index, chunk in enumerate(chunks):
        names = [n for n in chunk if not (method == "percentile" and symmetric and n == "e" and index == 0)]
        with np.errstate(invalid="ignore"), contextlib.suppress(RuntimeWarning):
            whole.collect({n: [chunk[n]] for n in names})

        def split(chunk=chunk, names=names):  # two groups of tensors, each in three runs of unequal size
            calls.append(1)
            for group in (names[: len(names) // 2], names[len(names) // 2:]):
                for lo, hi in ((0, 0.2), (0.2, 0.7), (0.7, 1.0)):
                    yield {n: chunk[n][int(lo * chunk[n].size): int(hi * chunk[n].size)] for n in group}

        with np.errstate(invalid="ignore"):
            collect_pieces(pieces, split, overlap)
    assert len(calls) == 2 * len(chunks)  # two passes a chunk
    assert whole.histogram_dict.keys() == pieces.histogram_dict.keys()
    for name, entry in whole.histogram_dict.items():
        for w, p in zip(entry, pieces.histogram_dict[name], strict=True):
            assert np.asarray(w).dtype == np.asarray(p).dtype, name
            assert np.array_equal(w, p, equal_nan=True), name
    with np.errstate(invalid="ignore", divide="ignore"):  # onnxruntime's statistics of the empty tensor
        assert whole.compute_collection_result().keys() == pieces.compute_collection_result().keys()


@pytest.mark.parametrize("method", ["entropy", "percentile", "distribution"])
def test_histogram_calibration_over_the_budget_runs_in_pieces_with_the_same_ranges(tmp_path, method):
    """A chunk whose tensors exceed memory.budget: the model cut into pieces, rows one run at a time, two passes;
    the ranges are the whole chunk's (here the kernels round a row alike in any batch: equal to float32 rounding)."""
    from calibrun.core.memory import MiB
    from tests.unit.test_memory import _chain

    path = tmp_path / "chain.onnx"
    onnx.save(_chain(width=64), str(path))
    rng = np.random.default_rng(5)
    batches = [rng.normal(size=(6, 1, 48, 48)).astype(np.float32) for _ in range(2)]
    spec = CalibrationSpec(method=method)
    whole_used, split_used = {}, {}
    whole, _ = run_calibration(path, batches, "x", spec, budget=2**30, used=whole_used)
    split, _ = run_calibration(path, batches, "x", spec, budget=MiB, used=split_used)
    assert whole_used["calibration_groups"] == 1
    assert whole_used["calibration_rows_per_run"] == 6
    assert split_used["calibration_groups"] > 1  # 64 channels of 48x48 floats: 590 KB a row, over half of 1 MiB
    assert split_used["calibration_rows_per_run"] < 6
    assert whole.keys() == split.keys()
    for name in whole:
        np.testing.assert_allclose(split[name].range_value, whole[name].range_value, rtol=1e-5, atol=1e-6)


def test_tensors_the_rows_do_not_reach_are_counted_once_per_batch():
    """A Constant node's output (weights kept in Constant nodes, as PaddlePaddle exports them) or a tensor of constant
    inputs only is the same in every run of rows: the pieces count it once per batch, as onnxruntime's calibrator
    sees it (on rapidocr's text detector at 1024, counting it per run changed 69 of 649 entropy ranges)."""
    from onnx import TensorProto, helper

    from calibrun.quant.histogram_runs import _varying

    nodes = [helper.make_node("Constant", [], ["w"], value=helper.make_tensor("v", TensorProto.FLOAT, [2], [1, 2])),
             helper.make_node("Mul", ["w", "scale"], ["ws"]),
             helper.make_node("Add", ["x", "ws"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2]),
                                           helper.make_tensor_value_info("scale", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])])
    model = helper.make_model(graph)
    assert _varying(model, {"x": 0, "scale": None}) == {"x", "a", "y"}
    assert _varying(model, None) == {"x", "scale", "ws", "a", "y"}  # every input batched: only the Constant stays


def test_entropy_thresholds_searched_in_forked_processes_are_the_same():
    """compute_entropy with threads searches the tensors in forked processes (Linux): the thresholds of every tensor
    are those of the search in this process, in the same order, and progress reaches every tensor."""
    import sys

    from calibrun.quant import histogram as module

    rng = np.random.default_rng(30)
    one = module.FastHistogramCollector("entropy", False, 2048, 128, 99.99, "same", threads=1)
    for k in range(40):
        values = rng.standard_t(3 + k % 5, 20_000).astype(np.float32) * (1 + k)
        one.collect({f"t{k}": [np.maximum(values, 0) if k % 3 == 0 else values]})
    items = list(one.histogram_dict.items())
    seen = []
    forked = module._forked_thresholds(items, 128, 2, seen.append)
    if sys.platform == "linux":
        assert forked is not None
        assert seen == list(range(1, 41))
    expected = [module.entropy_threshold(h, 128) for _, h in items]
    assert forked is None or [tuple(map(float, f)) for f in forked] == [tuple(map(float, e)) for e in expected]
    two = module.FastHistogramCollector("entropy", False, 2048, 128, 99.99, "same", threads=2)
    two.histogram_dict = one.histogram_dict
    assert {k: tuple(map(float, v[:2])) for k, v in two.compute_entropy().items()} == \
        {k: tuple(map(float, v[:2])) for k, v in one.compute_entropy().items()}
    assert module._forked_thresholds(items[:5], 128, 2, None) is None  # few tensors: searched in this process


@pytest.mark.parametrize("method", ["entropy", "percentile", "distribution"])
@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "pieces"])
def test_a_tensor_with_an_infinite_value_gets_its_min_and_max_and_no_histogram(method, pieces):
    """An additive attention mask holds -inf where it masks: numpy (so onnxruntime's collector) refuses an infinite
    range and the whole calibration failed. That tensor now keeps no histogram and its range is its min and max
    (over every chunk, -inf included; calibrun.quant.quantize keeps its nodes in float); the other tensors' ranges
    are exactly those of the collector without it, whole chunks or in pieces."""
    from calibrun.quant.histogram import FastHistogramCollector
    from calibrun.quant.histogram_runs import collect_pieces

    rng = np.random.default_rng(3)
    mask = [np.where(rng.random(400) < 0.3, -np.inf, 0.0).astype(np.float32) for _ in range(2)]
    mask[1][0] = 2.0  # a later chunk widens the finite end too
    values = [rng.normal(0, s, 4000).astype(np.float32) for s in (1.0, 2.0)]

    def collector():
        return FastHistogramCollector(method, method == "percentile", 512, 128, 99.9, "same", threads=2)

    with_mask, alone = collector(), collector()
    for m, v in zip(mask, values, strict=True):
        for found, batch in ((with_mask, {"mask": [m], "v": [v]}), (alone, {"v": [v]})):
            with contextlib.redirect_stdout(io.StringIO()):
                if pieces:
                    halves = [{k: a[0][: len(a[0]) // 2] for k, a in batch.items()},
                              {k: a[0][len(a[0]) // 2:] for k, a in batch.items()}]
                    collect_pieces(found, lambda halves=halves: iter(halves))
                else:
                    found.collect(batch)
    with contextlib.redirect_stdout(io.StringIO()):
        result, reference = with_mask.compute_collection_result(), alone.compute_collection_result()
    assert "mask" not in with_mask.histogram_dict
    low, high = result["mask"].range_value
    assert (float(low), float(high)) == (-np.inf, 2.0)

    def ends(found):  # a (low, high, hist, edges) tuple, or a TensorData (distribution)
        return found[:2] if isinstance(found, tuple) else found.range_value

    for got, want in zip(ends(result["v"]), ends(reference["v"]), strict=True):
        assert np.array_equal(got, want)


# ---------------------------------------------------------------------------------------------- the worker process


def _with_worker(monkeypatch, method: str, symmetric: bool):
    """A collector with its binning worker process (calibrun.quant.histogram_worker), made for any batch size."""
    from calibrun.quant import histogram_worker
    from calibrun.quant.histogram import FastHistogramCollector

    monkeypatch.setattr(histogram_worker, "_FORK_LEAST", 1000)  # before the fork: the worker sees it too
    collector = FastHistogramCollector(method, symmetric, 512, 128, 99.99, "same", threads=2)
    collector.worker = histogram_worker.HistogramWorker(collector)
    return collector


def _same_histograms(a, b) -> None:
    assert a.histogram_dict.keys() == b.histogram_dict.keys()
    for name, entry in a.histogram_dict.items():
        for x, y in zip(entry, b.histogram_dict[name], strict=True):
            assert np.asarray(x).dtype == np.asarray(y).dtype, name
            assert np.array_equal(x, y, equal_nan=True), name


@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "pieces"])
@pytest.mark.parametrize(("method", "symmetric"), [("entropy", False), ("distribution", False),
                                                   ("percentile", False), ("percentile", True)])
def test_the_worker_process_bins_and_searches_as_this_one_does(monkeypatch, method, symmetric, pieces):
    """About half of each batch binned in the worker (the collector's own functions on a copy of the collector made by
    the fork, the batch through the shared mapping), whole or in pieces, and half of the entropy search there: the
    histograms and the ranges of one process, bit for bit, chunk after chunk (ranges that grow, NaN, float16, an
    empty tensor)."""
    from calibrun.quant.histogram import FastHistogramCollector
    from calibrun.quant.histogram_runs import collect_pieces

    alone = FastHistogramCollector(method, symmetric, 512, 128, 99.99, "same", threads=1)
    helped = _with_worker(monkeypatch, method, symmetric)
    used = []
    split = helped.worker._split
    monkeypatch.setattr(helped.worker, "_split", lambda *a: used.append(split(*a)) or used[-1])
    try:
        for index, chunk in enumerate(_chunks(np.random.default_rng(21))):
            names = [n for n in chunk if not (method == "percentile" and symmetric and n == "e" and index == 0)]
            with np.errstate(invalid="ignore"), contextlib.suppress(RuntimeWarning):
                alone.collect({n: [chunk[n]] for n in names})
                if pieces:
                    collect_pieces(helped, lambda chunk=chunk, names=names: iter([{n: chunk[n] for n in names}]))
                else:
                    helped.collect({n: [chunk[n]] for n in names})
        assert used
        assert all(found is not None for found in used)  # the worker took part in every batch
        _same_histograms(alone, helped)
        with np.errstate(invalid="ignore", divide="ignore"):
            want, got = alone.compute_collection_result(), helped.compute_collection_result()
        assert want.keys() == got.keys()
        for name in want:  # (lowest, highest, ...) per tensor, or TensorData where it has no histogram
            a, b = (getattr(r, "range_value", r) for r in (want[name], got[name]))
            for x, y in zip(a, b, strict=True):
                assert np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True), name
    finally:
        helped.worker.close()


def test_a_worker_that_dies_leaves_its_part_to_this_process(monkeypatch, caplog):
    """Killed between batches (out of memory, a stray kill): one warning line, the batch binned here, the same
    histograms; the worker is not used again."""
    from calibrun.quant.histogram import FastHistogramCollector

    chunks = _chunks(np.random.default_rng(4))
    alone = FastHistogramCollector("entropy", False, 512, 128, 99.99, "same", threads=1)
    helped = _with_worker(monkeypatch, "entropy", False)
    pid = helped.worker.pid
    with np.errstate(invalid="ignore"):
        for index, chunk in enumerate(chunks):
            if index == 1:
                os.kill(pid, signal.SIGKILL)
            alone.collect({n: [v] for n, v in chunk.items()})
            helped.collect({n: [v] for n, v in chunk.items()})
    _same_histograms(alone, helped)
    assert helped.worker.pid is None
    assert [r.getMessage() for r in caplog.records if "worker process ended" in r.getMessage()]
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left


def test_an_error_in_the_worker_is_raised_here_and_close_ends_it(monkeypatch):
    from calibrun.quant.histogram import FastHistogramCollector

    here = os.getpid()
    original = FastHistogramCollector._value

    def fails_there(self, tensor, data_arr):
        if os.getpid() != here:
            raise ValueError(f"binning {tensor} failed")
        return original(self, tensor, data_arr)

    monkeypatch.setattr(FastHistogramCollector, "_value", fails_there)
    helped = _with_worker(monkeypatch, "entropy", False)
    pid = helped.worker.pid
    chunk = _chunks(np.random.default_rng(4))[0]
    with pytest.raises(ValueError, match="binning .* failed"):
        helped.collect({n: [v] for n, v in chunk.items()})
    helped.worker.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
