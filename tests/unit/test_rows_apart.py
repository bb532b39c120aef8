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
