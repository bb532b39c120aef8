"""Streaming evaluation (calibrun.measure.evaluate): the same numbers whatever the batch size, the lab rows
generated batch by batch bit for bit, per-output metrics checked against a direct computation (memory on a trained
model and real lab jobs: tests/e2e/test_measure_runs.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibrun.core.errors import CalibrunError
from calibrun.data import EvalData, lab_evaluation
from calibrun.lab.data import evaluation_pieces, evaluation_rows
from calibrun.lab.model import write_lab_model
from calibrun.measure import errors as measure
from calibrun.measure.tensor_stats import StreamingDiagnostics
from calibrun.model import open_float_model
from calibrun.quant.calibrate import CalibrationCache
from calibrun.quant.quantize import quantize_lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("measure")
    fp32 = open_float_model(write_lab_model(root / "lab.onnx"))
    cache = CalibrationCache(root / "cache")
    narrow = quantize_lab(fp32, root / "narrow.onnx", seed=4242, factor=0.2, batches=8, cache=cache)
    return {"root": root, "fp32": fp32, "int8": narrow["out"], "cache": cache,
            "ranges": cache.path(narrow["cache_key"])}


@pytest.mark.parametrize("sizes", [[256], [7, 100, 149], [1] * 5 + [251], [16] * 16])
def test_lab_rows_in_batches_are_the_same_rows(lab, sizes):
    info = lab["fp32"].info
    whole = evaluation_rows(info, 777, 256)
    parts = list(evaluation_pieces(info, 777, 256)(sizes))
    assert [len(p) for p in parts] == sizes
    np.testing.assert_array_equal(np.concatenate(parts), whole)  # bit for bit


def test_eval_data_serves_batches_and_labels():
    feeds = {"x": np.arange(20, dtype=np.float32).reshape(10, 2)}
    data = EvalData.from_arrays(feeds, labels=np.arange(10))
    got = list(data.batches(4))
    assert [len(f["x"]) for f, _ in got] == [4, 4, 2]
    assert [list(labels) for _, labels in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    np.testing.assert_array_equal(data.feeds["x"], feeds["x"])


def _direct(fp32, int8_path, rows):
    ref = measure.outputs(fp32.path, fp32, {fp32.info.name: rows})[0].astype(np.float64)
    got = measure.outputs(int8_path, fp32, {fp32.info.name: rows})[0].astype(np.float64)
    return ref, got


@pytest.mark.parametrize("batch_size", [1, 16, 100, 256])
def test_batch_size_does_not_change_the_numbers(lab, batch_size):
    fp32 = lab["fp32"]
    evaluation = lab_evaluation(fp32, 777, 256)
    m = measure.evaluate(fp32.path, lab["int8"], evaluation, batch_size=batch_size, progress=None)
    ref, got = _direct(fp32, lab["int8"], evaluation_rows(fp32.info, 777, 256))
    diff = np.abs(ref - got)
    assert m["rows"] == 256
    assert m["eval_batches"] == math.ceil(256 / batch_size)
    assert m["max_abs_error"] == float(diff.max())  # exact: a maximum does not depend on the order
    assert m["mean_abs_error"] == pytest.approx(float(diff.mean()), rel=1e-12)
    assert m["max_abs_output"] == float(np.abs(ref).max())
    name = "out.y."
    assert m[name + "max_abs_error"] == float(diff.max())
    assert m[name + "relative_error"] == pytest.approx(diff.max() / (ref.max() - ref.min()), rel=1e-12)
    assert m[name + "sqnr_db"] == pytest.approx(10 * math.log10((ref**2).sum() / ((ref - got) ** 2).sum()), rel=1e-9)
    cosine = (ref * got).sum() / np.sqrt((ref**2).sum() * (got**2).sum())
    assert m[name + "cosine"] == pytest.approx(cosine, rel=1e-12)
    rows = evaluation_rows(fp32.info, 777, 256)
    assert (m["eval_min"], m["eval_max"]) == (float(rows.min()), float(rows.max()))
    assert m["eval_span"] == float(rows.max()) - float(rows.min())


def test_contract_error_unchanged(lab):
    """calibtool's `error`: exactly its four keys, the same numbers as one unbatched run."""
    fp32 = lab["fp32"]
    result = measure.error(fp32.path, lab["int8"], 777, 256)
    assert set(result) == {"rows", "max_abs_error", "mean_abs_error", "max_abs_output"}
    ref, got = _direct(fp32, lab["int8"], evaluation_rows(fp32.info, 777, 256))
    assert result["max_abs_error"] == float(np.abs(ref - got).max())


def test_identical_models_report_no_error(lab):
    fp32 = lab["fp32"]
    m = measure.evaluate(fp32.path, fp32.path, lab_evaluation(fp32, 777, 64), progress=None)
    assert m["max_abs_error"] == 0.0
    assert m["out.y.sqnr_db"] == measure.SQNR_CAP
    assert m["out.y.cosine"] == pytest.approx(1.0)


def test_multi_part_output_metrics_per_entry():
    """An output [N, T, 3]: one set of metrics per entry of the last axis, each from its own slice."""
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(4, 5, 3)) * np.array([100.0, 1.0, 0.01])
    got = ref + rng.normal(size=ref.shape) * 0.01
    errors = measure.OutputErrors(["det"])
    errors.update([ref[:2]], [got[:2]])
    errors.update([ref[2:]], [got[2:]])
    m = errors.metrics()
    for k in range(3):
        r, g = ref[..., k], got[..., k]
        assert m[f"out.det.ch{k}.max_abs_error"] == pytest.approx(np.abs(r - g).max(), rel=1e-12)
        assert m[f"out.det.ch{k}.sqnr_db"] == pytest.approx(10 * math.log10((r**2).sum() / ((r - g) ** 2).sum()))
    # the pooled SQNR hides the small part: the last entry's SQNR is far below the whole output's
    assert m["out.det.ch2.sqnr_db"] < m["out.det.sqnr_db"] - 40


def test_diagnostics_stop_after_max_rows(lab):
    """diagnostics.rows: the first rows only, and no batch read past them; the statistics are those of exactly those
    rows, and with every row the same as fed batch by batch."""
    fp32 = lab["fp32"]
    rows = evaluation_rows(fp32.info, 777, 256)
    evaluation = lab_evaluation(fp32, 777, 256)
    taken = []
    batches = evaluation.batches
    evaluation.batches = lambda size: (taken.append(size) or batch for batch in batches(size))
    with StreamingDiagnostics(fp32.path, lab["int8"], lab["ranges"], max_rows=40) as diag:
        x = diag.over(evaluation, batch_size=32, progress=None)[0]
        assert diag.rows_seen == 40
    assert taken == [32, 32]  # 40 rows: two batches of 32 read, not eight
    assert x["elements"] == 40 * rows.shape[1]
    assert (x["eval_min"], x["eval_max"]) == (float(rows[:40].min()), float(rows[:40].max()))
    with StreamingDiagnostics(fp32.path, lab["int8"], lab["ranges"]) as whole, \
            StreamingDiagnostics(fp32.path, lab["int8"], lab["ranges"]) as fed:
        every = whole.over(lab_evaluation(fp32, 777, 256), batch_size=32, progress=None)
        for start in range(0, 256, 32):
            fed.update({fp32.info.name: rows[start:start + 32]})
        assert every == fed.rows()


def _under(ref: np.ndarray, got: np.ndarray, rows: range) -> float:
    """The share of rows whose error energy per value is over 1% of the output's mean signal energy (20 dB)."""
    signal = np.square(ref).mean()
    return sum(np.square(ref[i] - got[i]).mean() * 100 > signal for i in rows) / len(rows)


def test_rows_whose_error_breaks_the_ok_bound_are_counted_row_by_row():
    """An error concentrated on every 4th row: the pool averages it above 20 dB, the rows do not; counted batch by
    batch, and per Concat part against that part's own signal."""
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(40, 6, 4))
    noise = np.where(np.arange(40) % 4 == 0, 0.15, 0.01)[:, None, None]  # every 4th row: 15x the error
    got = ref + rng.normal(size=ref.shape) * noise
    errors = measure.OutputErrors(["logits"], {"logits": (1, [(0, 2), (2, 6)])})
    for start in range(0, 40, 16):
        errors.update([ref[start:start + 16]], [got[start:start + 16]], rows=len(ref[start:start + 16]))
    m = errors.metrics()
    assert m["out.logits.rows_under_20db"] == _under(ref, got, range(40))
    assert m["out.logits.rows_under_20db"] == pytest.approx(0.25)  # those rows, and only they
    assert m["out.logits.sqnr_db"] > 20  # the pool does not see them
    part = ref[:, 2:], got[:, 2:]
    assert m["out.logits.concat1.rows_under_20db"] == _under(*part, range(40))
    # without the row count (a caller that cannot tell rows) no share is made up
    blind = measure.OutputErrors(["logits"])
    blind.update([ref], [got])
    assert "out.logits.rows_under_20db" not in blind.metrics()


def test_a_nearly_silent_row_is_not_flagged_for_a_small_error():
    """A detector's scores on a photo without objects are ~0: the same small absolute error is far above 10% of
    that row's own signal, not of the output's. Identical rows count as the cap (not under)."""
    ref = np.zeros((4, 50))
    ref[0, :5] = 0.9  # one photo with detections
    ref[1:] = 1e-4  # three without
    got = ref + 1e-3
    got[3] = ref[3]  # int8 equal on the last
    errors = measure.OutputErrors(["scores"])
    errors.update([ref], [got], rows=4)
    assert errors.metrics()["out.scores.rows_under_20db"] == 0.0
    got[2] = 0.5  # a false detection: an error over 10% of the output's signal
    errors = measure.OutputErrors(["scores"])
    errors.update([ref], [got], rows=4)
    assert errors.metrics()["out.scores.rows_under_20db"] == 0.25


@pytest.mark.parametrize(("shape", "rows", "declared", "axis"), [
    ((16, 1000), 16, ["N", 1000], 0),
    ((20, 16, 37), 16, [20, "N", 37], 1),  # time-major CTC logits: rows on axis 1
    ((2, 2, 128), 2, [2, "N", 128], 1),  # a state [2, N, 128] in a batch of 2: the free axis, not the fixed one
    ((1, 3549, 6), 1, [1, 3549, 6], 0),  # a model that pins its batch to 1
    ((16, 4), 16, None, 0),
    ((4, 16), 16, None, 1),
    ((1000,), 16, None, None),  # no axis of the batch's length: no rows to tell apart
    ((16, 4), None, None, None),
])
def test_row_axis_of_an_output(shape, rows, declared, axis):
    assert measure.row_axis(shape, rows, declared) == axis


def test_an_output_whose_size_depends_on_the_data_is_compared_as_a_set_of_rows():
    """NonMaxSuppression's selections [K, 3]: fp32 and int8 select different numbers of boxes. Such an output is left
    out of the element-wise errors where the sizes differ (the job no longer fails on it), its rows are compared as
    sets (2 shared of 4 distinct rows here), and the share of batches where the sizes differ is kept."""
    errors = measure.OutputErrors(["sel", "boxes"])
    boxes = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    ref = np.array([[0, 0, 1], [0, 0, 2], [0, 0, 5]])
    got = np.array([[0, 0, 2], [0, 0, 1], [0, 0, 7]])  # the same size: compared element by element too
    errors.update([ref, boxes], [got, boxes + 0.5])
    errors.update([ref[:2], boxes], [ref, boxes])  # fp32 two rows, int8 three
    m = errors.metrics()
    assert m["out.sel.size_mismatch"] == pytest.approx(0.5)
    assert m["out.sel.row_iou"] == pytest.approx((2 + 2) / (4 + 3))  # batch 1: {1, 2} of {1, 2, 5, 7}; batch 2: 2 of 3
    assert m["out.sel.max_abs_error"] == 2.0  # batch 1 only: 5 vs 7 in its last row
    assert "out.boxes.size_mismatch" not in m
    assert m["out.boxes.max_abs_error"] == 0.5

    empty = measure.OutputErrors(["sel", "boxes"])  # int8 selects nothing: the rows fp32 selected are all lost
    empty.update([ref, boxes], [ref[:0], boxes])
    assert empty.metrics()["out.sel.row_iou"] == 0.0

    only = measure.OutputErrors(["sel"])
    only.update([ref[:2]], [ref])
    with pytest.raises(CalibrunError, match=r"the size of \['sel'\] depends on the data"):
        only.metrics()
    assert measure.compare([ref[:2], boxes], [ref, boxes + 1])["max_abs_error"] == 1.0  # the boxes alone
    with pytest.raises(CalibrunError, match="no output could be compared"):
        measure.compare([ref[:2]], [ref])


def test_an_output_of_strings_is_compared_as_equal_or_not():
    """A classifier's class names (skl2onnx's `label`, STRING): no distance between 'setosa' and 'virginica', so the
    share of equal elements; the numeric outputs beside it keep their metrics, and the contract's compare skips it."""
    errors = measure.OutputErrors(["label", "p"])
    ref, got = np.array(["a", "b", "c", "a"]), np.array(["a", "b", "a", "a"])
    errors.update([ref, np.ones((4, 2))], [got, np.ones((4, 2)) * 1.5])
    m = errors.metrics()
    assert m["out.label.agreement"] == 0.75
    assert "out.label.max_abs_error" not in m
    assert m["max_abs_error"] == 0.5
    assert measure.compare([ref, np.ones(2)], [got, np.zeros(2)])["max_abs_error"] == 1.0


def test_each_model_is_fed_its_floats_in_the_type_it_declares():
    """calibtool's `error` runs a float16 model as given beside the float32 int8 model of its widening: a float array
    is cast to the type each session declares, anything else (integers, bool, a matching type) is passed as it is."""
    from calibrun.measure.errors import floats_as_declared

    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    ids = np.arange(2, dtype=np.int64)
    fed = floats_as_declared({"x": x, "ids": ids, "same": x}, {"x": np.float16, "same": np.float32})
    assert fed["x"].dtype == np.float16
    np.testing.assert_array_equal(fed["x"], x.astype(np.float16))
    assert fed["ids"] is ids
    assert fed["same"] is x


def test_rows_that_do_not_fill_a_pinned_batch_are_refused_with_counts_that_do():
    """calibtool's `error FP32 INT8 SEED ROWS` on a model that pins its batch at 3 (onnx's PyTorch ELU test model):
    ROWS is the contract's, so it is not trimmed; the line names the nearest counts that fill whole batches."""
    feeds = {"x": np.zeros((16, 4), np.float32)}
    with pytest.raises(CalibrunError, match=r"^rows \(16\) must be a multiple of the model's fixed batch axis \(3\): "
                                            r"15 or 18, for example$"):
        measure.split_feeds(feeds, 3)
    assert measure.not_whole_batches(2, 3).endswith(": 3, for example")
    assert [len(run["x"]) for run in measure.split_feeds({"x": np.zeros((15, 4), np.float32)}, 3)] == [3] * 5


def test_a_vector_outputs_sqnr_around_its_mean_over_the_rows():
    """An output [N, 2] whose values sit near a level every row shares: its SQNR against the rows' variation, from
    running sums over batches of any size (one row at a time too), equals the one computed on all rows at once; an
    output that is the same on every row, or one row alone, gets none; a map [N, C, H, W] gets none."""
    rng = np.random.default_rng(1)
    ref = 0.83 + 0.05 * rng.normal(size=(40, 2))
    got = ref + 0.01 * rng.normal(size=ref.shape)
    centred = 10 * math.log10(((ref - ref.mean(axis=0)) ** 2).sum() / ((ref - got) ** 2).sum())
    for step in (40, 7, 1):
        errors = measure.OutputErrors(["variable"])
        for start in range(0, 40, step):
            errors.update([ref[start:start + step]], [got[start:start + step]], rows=len(ref[start:start + step]))
        m = errors.metrics()
        assert m["out.variable.centred_sqnr_db"] == pytest.approx(centred, rel=1e-9)
        assert m["out.variable.sqnr_db"] > centred + 20  # the shared level: 0.83 against a spread of 0.05
    same = measure.OutputErrors(["c"])
    same.update([np.full((5, 3), 0.5)], [np.full((5, 3), 0.51)], rows=5)
    assert "out.c.centred_sqnr_db" not in same.metrics()
    one = measure.OutputErrors(["v"])
    one.update([ref[:1]], [got[:1]], rows=1)
    assert "out.v.centred_sqnr_db" not in one.metrics()
    maps = measure.OutputErrors(["m"])
    maps.update([rng.normal(size=(4, 1, 3, 3))], [rng.normal(size=(4, 1, 3, 3))], rows=4)
    assert "out.m.centred_sqnr_db" not in maps.metrics()


def test_each_value_of_a_vector_output_against_its_own_variation():
    """One scale for every value of an output: a value that varies little over the rows gets few int8 levels. Each
    value's SQNR around its own mean (`worst_value_sqnr_db`) and the share of values under 20 dB
    (`values_under_20db`), from running sums over batches of any size, equal the ones computed on all rows at once;
    a value fp32 gives every row alike is not counted."""
    rng = np.random.default_rng(2)
    spread = np.array([1.0, 1.0, 1.0, 0.02, 0.0])  # the fourth varies 50 times less, the fifth not at all
    ref = 0.3 + spread * rng.normal(size=(64, 5))
    got = ref + 0.01 * rng.normal(size=ref.shape)  # the same absolute error on every value: one int8 step
    own = [10 * math.log10(((ref[:, k] - ref[:, k].mean()) ** 2).sum() / ((ref[:, k] - got[:, k]) ** 2).sum())
           for k in range(4)]
    assert min(own) == own[3] < 20 < min(own[:3])
    for step in (64, 5, 1):
        errors = measure.OutputErrors(["actions"])
        for start in range(0, 64, step):
            errors.update([ref[start:start + step]], [got[start:start + step]], rows=len(ref[start:start + step]))
        m = errors.metrics()
        assert m["out.actions.worst_value_sqnr_db"] == pytest.approx(own[3], rel=1e-6)
        assert m["out.actions.values_under_20db"] == pytest.approx(1 / 4)  # of the four values that vary
        assert m["out.actions.centred_sqnr_db"] > 30  # pooled, the values that vary much hide it
    scalar = measure.OutputErrors(["score"])  # one value a row: the centred SQNR says it all
    scalar.update([ref[:, 0]], [got[:, 0]], rows=64)
    assert "out.score.values_under_20db" not in scalar.metrics()
    assert "out.actions.unit_norm" not in m


def test_an_output_of_unit_vectors_is_marked_a_direction():
    """`unit_norm` where fp32 gives every row (every batch) a vector of L2 norm 1, as F.normalize makes an embedding;
    not where one row is off by more than float32 rounding."""
    rng = np.random.default_rng(3)
    ref = rng.normal(size=(40, 16)).astype(np.float32)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    got = ref + np.float32(0.01) * rng.normal(size=ref.shape).astype(np.float32)
    for last in (1.0, 1.01):
        errors = measure.OutputErrors(["emb"])
        off = ref.copy()
        off[-1] *= last
        for start in range(0, 40, 16):
            errors.update([off[start:start + 16]], [got[start:start + 16]], rows=len(off[start:start + 16]))
        assert errors.metrics().get("out.emb.unit_norm") == (1.0 if last == 1.0 else None)


@pytest.mark.parametrize(("shape", "rows", "declared", "names", "axis"), [
    ((16, 16, 4), 16, ["time", "batch", 4], frozenset({"batch"}), 1),  # the model names its rows: not the time axis
    ((16, 16, 4), 16, ["time", "batch", 4], frozenset(), 0),  # no name to go by: axis 0, as before
    ((16, 16, 4), 16, ["N", "N", 4], frozenset({"N"}), 0),  # two axes of the name: the sizes decide, as before
    ((16, 20, 4), 16, ["time", "batch", 4], frozenset({"batch"}), 0),  # the named axis is not the batch's length
])
def test_row_axis_follows_the_name_the_model_gives_its_batch(shape, rows, declared, names, axis):
    assert measure.row_axis(shape, rows, declared, names) == axis


def test_batch_names_are_the_inputs_batch_axes_names():
    from calibrun.data.rows import batch_names

    shapes = {"x": ["batch", 100, "time"], "state": [2, "n", 128], "sr": [], "k": [4]}
    assert batch_names(shapes, {"x": 0, "state": 1, "sr": None, "k": None}) == {"batch", "n"}
    assert batch_names(shapes, {"x": 2}) == {"time"}  # the axis set by batch_axis, whatever its name
    assert batch_names({"x": [16, 100]}, None) == frozenset()  # a fixed batch has no name


def test_a_time_major_output_of_the_batch_length_is_measured_along_its_named_rows(tmp_path):
    """An output [time, batch, 4] whose time axis has as many steps as the batch has rows (16): the per-row share is
    counted along the axis the model names `batch`, as an input's. Here the int8 stand-in clips at +-50, which only
    row 0 reaches: 1 of 16 rows is under 20 dB. Along the time axis every step holds row 0's values, and the share
    would read 1."""
    import onnx
    from onnx import TensorProto, helper

    from calibrun.analysis.evaluate import Evaluator
    from calibrun.data.npy import npy_evaluation
    from calibrun.model import graph_inputs, load_model

    def model(path, clipping: bool):
        bounds = [helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("lo", -50.0), ("hi", 50.0))]
        nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["r"])] if clipping else []
        nodes.append(helper.make_node("Transpose", ["r" if clipping else "x"], ["y"], perm=[2, 0, 1]))
        graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             ["batch", 4, "time"])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["time", "batch", 4])],
                                  bounds if clipping else [])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
        return path

    fp32, got = model(tmp_path / "fp32.onnx", False), model(tmp_path / "int8.onnx", True)
    x = np.random.default_rng(0).normal(0, 1, (16, 4, 16)).astype(np.float32)
    x[0] *= 10000  # row 0: the only row that reaches the clip
    np.save(tmp_path / "x.npy", x)
    evaluation = npy_evaluation(tmp_path / "x.npy", graph_inputs(load_model(fp32)), rows=16)
    m = measure.evaluate(fp32, got, evaluation, progress=None)
    assert m["out.y.rows_under_20db"] == pytest.approx(1 / 16)
    with Evaluator(fp32, evaluation, 16) as evaluator:  # the recommendations' measurements
        assert evaluator.model(got)["out.y.rows_under_20db"] == pytest.approx(1 / 16)
def test_sqnr_of_an_infinite_or_vanishing_ratio_is_a_number_not_an_error():
    """A divisor quantised to zero makes an int8 value infinite: the noise energy is inf and the SQNR -inf (it had
    raised 'math domain error' from log10(0) and failed the job: riann's headroom candidate, session 36); a
    ratio under float64's range is the floor, -SQNR_CAP; NaN stays NaN."""
    import math

    from calibrun.measure.errors import SQNR_CAP, _sqnr

    assert _sqnr(1.0, math.inf) == -math.inf
    assert _sqnr(1e-300, 1e300) == -SQNR_CAP
    assert math.isnan(_sqnr(1.0, math.nan))
    assert _sqnr(1.0, 0.0) == SQNR_CAP
    assert _sqnr(100.0, 1.0) == 20.0


def test_int8_values_that_are_inf_or_nan_are_counted_and_leave_no_cosine():
    """riann's int8 model gave Inf on a quarter of its rows: its cosine had read 1.0 (min(1, nan) is 1 in Python)
    beside an SQNR of -inf; now the cosine is NaN and the share of such values is a metric of its own."""
    ref = np.ones((8, 3), np.float32)
    got = ref.copy()
    got[:2] = np.inf
    got[2, 0] = np.nan
    errors = measure.OutputErrors(["output"])
    errors.update([ref], [got], rows=8)
    m = errors.metrics()
    assert m["out.output.int8_nonfinite"] == pytest.approx(7 / 24)
    assert math.isnan(m["out.output.cosine"])
    assert not math.isfinite(m["out.output.sqnr_db"])  # -inf, or NaN with a NaN among them: broken either way
    clean = measure.OutputErrors(["output"])
    clean.update([ref], [ref + 0.01], rows=8)
    assert "out.output.int8_nonfinite" not in clean.metrics()
    assert clean.metrics()["out.output.cosine"] == pytest.approx(1.0)


def test_an_output_fp32_gives_as_one_value_everywhere_is_flagged():
    errors = measure.OutputErrors(["image", "logits"])
    flat = np.full((4, 3, 2, 2), 0.5, np.float32)
    varied = np.arange(12, dtype=np.float32).reshape(4, 3)
    errors.update([flat, varied], [flat, varied + 0.01], rows=4)
    m = errors.metrics()
    assert m["out.image.fp32_constant"] == 1.0
    assert "out.logits.fp32_constant" not in m
