"""calibrun.measure.rows_apart: a batch's outputs against its two halves' (pure arrays)."""

import numpy as np

from calibrun.measure.rows_apart import ROUNDING, _differs


def test_independent_rows_join_back_to_the_batch_within_float_rounding():
    whole = np.arange(32, dtype=np.float32).reshape(16, 2)
    assert _differs(whole, whole[:8], whole[8:]) is None
    assert _differs(whole, whole[:8], whole[8:] * (1 + ROUNDING / 10)) is None
    state = np.ones((2, 16, 3), np.float32)  # rows on axis 1 (a recurrent state output)
    assert _differs(state, state[:, :8], state[:, 8:]) is None


def test_rows_of_one_sequence_are_told_by_values_counts_or_pooling():
    whole = np.linspace(-1, 1, 32, dtype=np.float32).reshape(16, 2)
    assert "changes when its batch is split in two" in _differs(whole, whole[:8], whole[8:] + 0.1)
    assert _differs(np.zeros((12, 4), np.float32), np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32)) == \
        "has (12, 4) for the batch but (4, 4) and (4, 4) for its halves"
    pooled = np.ones(24, np.float32)
    assert _differs(pooled, pooled, pooled) == "has no axis of rows: it pools over the rows fed"


def test_integer_outputs_are_not_compared():
    indices = np.arange(10, dtype=np.int64).reshape(5, 2)  # an in-graph NMS numbers its boxes by batch row
    assert _differs(indices, indices[:2] + 7, indices[2:]) is None


def test_a_model_that_runs_no_probe_of_8_rows_is_probed_at_the_jobs_batch(tmp_path):
    """A convolution over 10 frames (madmom's onset CNN needs 15 for one output) runs neither 8 rows nor their
    halves: the probe found nothing to say and the verdict claimed every frame measured. At the job's batch of 16 the
    whole runs and its halves do not: the rows depend on each other. One that runs neither size cannot be told; one
    that runs 8 rows is probed at 8, as before."""
    from types import SimpleNamespace

    from calibrun.measure.rows_apart import rows_depend
    from tests.modelzoo import frame_conv, save

    frames = np.random.default_rng(0).standard_normal((48, 8)).astype(np.float32)
    evaluation = SimpleNamespace(axes={"x": 0}, batches=lambda n: iter([({"x": frames[:n]}, None)]))
    model = save(frame_conv(width=10), tmp_path / "wide.onnx")
    assert rows_depend(model, evaluation) is None  # the probe alone: 8 rows do not run
    assert rows_depend(model, evaluation, batch=16) == "runs 16 rows but not 8 of them"
    assert rows_depend(model, evaluation, batch=9) is None  # neither 8 nor 9 rows run: cannot be told
    narrow = save(frame_conv(width=5), tmp_path / "narrow.onnx")
    assert rows_depend(narrow, evaluation, batch=16) == "runs 8 rows but not 4 of them"  # 8 rows run: as before


def test_the_rows_run_whole_are_at_most_what_the_memory_budget_lets_a_run_hold(tmp_path, monkeypatch):
    """lineless-table-rec's LORE holds some 450 MB a 768x768 row: the probe's 8 rows whole took its job to 4.2 GB,
    6.6x plain inference a row at a time. Under a budget that holds one row a run, 2 rows run whole (the fewest that
    split), and the probe still tells rows of one sequence apart."""
    from types import SimpleNamespace

    from calibrun.measure import errors
    from calibrun.measure.rows_apart import rows_depend
    from tests.modelzoo import frame_conv, save

    frames = np.random.default_rng(1).standard_normal((48, 8)).astype(np.float32)
    evaluation = SimpleNamespace(axes={"x": 0}, batches=lambda n: iter([({"x": frames[:n]}, None)]))
    model = save(frame_conv(width=2), tmp_path / "pairs.onnx")
    fed = []

    class Session:  # onnxruntime's session, the rows of each run recorded
        def __init__(self):
            import onnxruntime as ort

            self.inner = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])

        def get_outputs(self):
            return self.inner.get_outputs()

        def run(self, names, feeds):
            fed.append(len(feeds["x"]))
            return self.inner.run(names, feeds)

    monkeypatch.setattr(errors, "rows_per_run", lambda *args, **kwargs: 1)
    assert rows_depend(model, evaluation, sess=Session(), budget=1) == "runs 2 rows but not 1 of them"
    assert max(fed) == 2
    fed.clear()
    monkeypatch.setattr(errors, "rows_per_run", lambda *args, **kwargs: 64)  # room for all 8: as before
    assert rows_depend(model, evaluation, sess=Session()) == \
        "output 'y' has (7, 4) for the batch but (3, 4) and (3, 4) for its halves (8 rows, then 4 and 4)"
    assert max(fed) == 8


def test_axes_note_names_rows_counted_off_axis_0():
    from calibrun.measure.rows_apart import axes_note

    assert axes_note(None) == ""
    assert axes_note({"x": 0, "sr": None}) == ""  # axis 0 and a constant: nothing to say
    note = axes_note({"input1": 3, "sr": None})
    assert note.startswith("; the rows are counted along axis 3 of input 'input1'")
    assert note.endswith("set data.inputs.input1.batch_axis and eval_data.inputs.input1.batch_axis to the axis it "
                         "batches on")
