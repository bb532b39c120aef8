"""The provider contract of docs/lab.md: calibrun.quant.reader.make_reader(arrays, input_name)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from calibrun.quant.reader import make_reader
from tests.modelzoo import calibration_batches, mlp, pinned_input_quant, save

NAME = "input.1"


def batches(n: int, features: int = 3) -> list[np.ndarray]:
    """n distinguishable batches: batch i is filled with i."""
    return [np.full((2, features), i, dtype=np.float32) for i in range(n)]


def drain(reader, limit: int = 1000) -> list[np.ndarray]:
    """Everything get_next serves up to the first None."""
    served = []
    for _ in range(limit):
        item = reader.get_next()
        if item is None:
            return served
        assert isinstance(item, dict)
        assert list(item) == [NAME]
        served.append(item[NAME])
    raise AssertionError("get_next never returned None")


def ids(served: list[np.ndarray]) -> list[int]:
    return [int(a.flat[0]) for a in served]


def assert_none_forever(reader, calls: int = 50) -> None:
    for _ in range(calls):
        assert reader.get_next() is None


class Reiterable:
    """A re-iterable source without __len__ (each iter() is a fresh pass); counts the items produced."""

    def __init__(self, arrays):
        self.arrays = arrays
        self.produced = 0

    def __iter__(self):
        for a in self.arrays:
            self.produced += 1
            yield a


class SizedReiterable(Reiterable):
    def __len__(self):
        return len(self.arrays)


# --- order, end, input kinds ---


@pytest.mark.parametrize("kind", ["list", "tuple", "generator", "iterator", "reiterable", "sized"])
def test_serves_every_batch_in_order_then_none_forever(kind):
    arrays = batches(7)
    source = {
        "list": lambda: list(arrays),
        "tuple": lambda: tuple(arrays),
        "generator": lambda: (a for a in arrays),
        "iterator": lambda: iter(arrays),
        "reiterable": lambda: Reiterable(arrays),
        "sized": lambda: SizedReiterable(arrays),
    }[kind]()
    reader = make_reader(source, NAME)
    served = drain(reader)
    assert ids(served) == list(range(7))
    for got, want in zip(served, arrays, strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.float32
    assert_none_forever(reader)


@pytest.mark.parametrize("kind", ["list", "tuple", "generator", "iterator"])
def test_empty_input_gives_none_at_once(kind):
    source = {"list": [], "tuple": (), "generator": (a for a in []), "iterator": iter([])}[kind]
    reader = make_reader(source, NAME)
    assert_none_forever(reader)


def test_generator_is_consumed_lazily():
    pulled = []

    def gen():
        for i, a in enumerate(batches(5)):
            pulled.append(i)
            yield a

    reader = make_reader(gen(), NAME)
    assert pulled == []
    reader.get_next()
    assert pulled == [0]
    reader.get_next()
    assert pulled == [0, 1]


def test_generator_that_raises_is_not_swallowed_but_end_is_none():
    """The end of a generator is None (never StopIteration); a real error in the source propagates."""

    def gen():
        yield np.zeros((1, 1), np.float32)
        raise RuntimeError("source broke")

    reader = make_reader(gen(), NAME)
    assert reader.get_next() is not None
    with pytest.raises(RuntimeError, match="source broke"):
        reader.get_next()


def test_is_a_real_subclass_of_onnxruntime_reader():
    reader = make_reader([], NAME)
    # isinstance alone is weak: CalibrationDataReader's __subclasshook__ accepts anything with get_next.
    assert CalibrationDataReader in type(reader).__mro__
    assert isinstance(reader, CalibrationDataReader)


def test_reader_iteration_protocol_from_base_class():
    reader = make_reader(batches(4), NAME)
    assert ids([item[NAME] for item in reader]) == [0, 1, 2, 3]


# --- __len__ ---


@pytest.mark.parametrize("n", [0, 1, 9])
def test_len_of_sized_sources(n):
    assert len(make_reader(batches(n), NAME)) == n
    assert len(make_reader(tuple(batches(n)), NAME)) == n
    assert len(make_reader(SizedReiterable(batches(n)), NAME)) == n


def test_len_does_not_consume():
    reader = make_reader(SizedReiterable(batches(3)), NAME)
    assert len(reader) == 3
    assert ids(drain(reader)) == [0, 1, 2]


def test_len_of_a_generator_is_a_type_error():
    with pytest.raises(TypeError):
        len(make_reader((a for a in batches(3)), NAME))


# --- set_range ---


@pytest.mark.parametrize("kind", ["list", "tuple", "sized"])
def test_set_range_serves_chunks(kind):
    arrays = batches(10)
    source = {"list": arrays, "tuple": tuple(arrays), "sized": SizedReiterable(arrays)}[kind]
    reader = make_reader(source, NAME)
    chunks = []
    for start in range(0, 10, 4):
        reader.set_range(start, min(start + 4, 10))
        chunks.append(ids(drain(reader)))
        assert_none_forever(reader, 5)
    assert chunks == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("kind", ["list", "sized", "generator"])
def test_set_range_end_beyond_length_stops_at_the_end(kind):
    arrays = batches(5)
    source = {"list": arrays, "sized": SizedReiterable(arrays), "generator": (a for a in arrays)}[kind]
    reader = make_reader(source, NAME)
    reader.set_range(3, 50)
    assert ids(drain(reader)) == [3, 4]
    assert_none_forever(reader)


@pytest.mark.parametrize("kind", ["list", "reiterable", "sized"])
def test_set_range_rewinds_a_reiterable_source(kind):
    arrays = batches(6)
    source = {"list": arrays, "reiterable": Reiterable(arrays), "sized": SizedReiterable(arrays)}[kind]
    reader = make_reader(source, NAME)
    assert ids(drain(reader)) == [0, 1, 2, 3, 4, 5]
    reader.set_range(1, 3)
    assert ids(drain(reader)) == [1, 2]
    reader.set_range(0, 6)
    assert ids(drain(reader)) == [0, 1, 2, 3, 4, 5]
    assert_none_forever(reader)


def test_set_range_on_a_reiterable_does_not_rebuild_more_than_needed():
    source = SizedReiterable(batches(8))
    reader = make_reader(source, NAME)
    reader.set_range(0, 4)
    drain(reader)
    reader.set_range(4, 8)
    assert ids(drain(reader)) == [4, 5, 6, 7]
    # Moving forward continues the same pass: every item produced once (+ nothing re-generated).
    assert source.produced == 8


@pytest.mark.parametrize("kind", ["generator", "iterator"])
def test_one_shot_iterator_moves_forward_but_refuses_to_rewind(kind):
    arrays = batches(10)
    source = (a for a in arrays) if kind == "generator" else iter(arrays)
    reader = make_reader(source, NAME)
    reader.set_range(0, 3)
    assert ids(drain(reader)) == [0, 1, 2]
    reader.set_range(5, 7)  # forward: items 3 and 4 are skipped
    assert ids(drain(reader)) == [5, 6]
    with pytest.raises(ValueError, match="rewind"):
        reader.set_range(2, 4)


@pytest.mark.parametrize(("start", "end"), [(-1, 2), (3, 2)])
def test_set_range_rejects_bad_ranges(start, end):
    with pytest.raises(ValueError, match="range"):
        make_reader(batches(4), NAME).set_range(start, end)


# --- onnxruntime's quantize_static takes the reader ---


FEATURES = 6


@pytest.fixture
def fp32_model(tmp_path):
    return save(mlp(features=FEATURES, hidden=12, outputs=3, input_name=NAME), tmp_path / "fp32.onnx")


def calibration_set() -> list[np.ndarray]:
    """Lab-rule batches, with the widest batch last so a reader that stops early changes the scale."""
    arrays = calibration_batches(seed=11, factor=1.0, batches=12, features=FEATURES)
    arrays[-1] = arrays[-1] * np.float32(6.0)
    return arrays


def expected_scale(arrays: list[np.ndarray]) -> float:
    hi = max(float(a.max()) for a in arrays)
    lo = min(float(a.min()) for a in arrays)
    return (max(hi, 0.0) - min(lo, 0.0)) / 255


def quantize_with(reader, src, out, extra_options=None):
    quantize_static(
        str(src),
        str(out),
        reader,
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        extra_options=extra_options or {},
    )
    onnx.checker.check_model(onnx.load(str(out)))
    return pinned_input_quant(out)


@pytest.mark.parametrize("kind", ["list", "tuple", "generator"])
def test_quantize_static_accepts_the_reader(fp32_model, tmp_path, kind):
    arrays = calibration_set()
    source = {"list": arrays, "tuple": tuple(arrays), "generator": (a for a in arrays)}[kind]
    scale, _ = quantize_with(make_reader(source, NAME), fp32_model, tmp_path / "int8.onnx")
    assert scale == pytest.approx(expected_scale(arrays), rel=1e-6)


@pytest.mark.parametrize(("kind", "stride"), [("list", 4), ("tuple", 3), ("sized", 6), ("list", 12)])
def test_quantize_static_strided_calibration_uses_len_and_set_range(fp32_model, tmp_path, kind, stride):
    arrays = calibration_set()
    source = {"list": arrays, "tuple": tuple(arrays), "sized": SizedReiterable(arrays)}[kind]
    strided, strided_zp = quantize_with(
        make_reader(source, NAME), fp32_model, tmp_path / "strided.onnx", {"CalibStridedMinMax": stride}
    )
    whole, whole_zp = quantize_with(make_reader(arrays, NAME), fp32_model, tmp_path / "whole.onnx")
    assert strided == pytest.approx(expected_scale(arrays), rel=1e-6)
    assert strided == whole
    assert strided_zp == whole_zp
    # Every chunk really was a different slice: only the last one holds the widest batch.
    first_chunk_only = expected_scale(arrays[:stride]) if stride < len(arrays) else None
    if first_chunk_only is not None:
        assert strided != pytest.approx(first_chunk_only, rel=1e-3)


def test_quantize_static_strided_refuses_a_generator(fp32_model, tmp_path):
    arrays = calibration_set()
    with pytest.raises(TypeError):
        quantize_with(
            make_reader((a for a in arrays), NAME), fp32_model, tmp_path / "x.onnx", {"CalibStridedMinMax": 4}
        )
