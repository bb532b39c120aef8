"""Rows of a feed: each input's batch axis, along which rows are counted, sliced and joined.

`axes` maps an input name to its batch axis, or to None for a constant (fed whole with every run, never split).
A name `axes` does not hold (or `axes=None`) has its rows on axis 0, as every feed had before batch axes existed.
Every place that counts or splits the rows of a feed (calibration batches, the memory budget's runs, evaluation,
diagnostics) goes through here. The rule that picks an input's axis is `infer_axis` (docs/data.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from calibrun.core.errors import CalibrunError

Axes = Mapping[str, int | None]


def is_fixed(dim) -> bool:
    """A graph dimension with a known size (a symbolic name, None, 0 or -1 is not)."""
    return isinstance(dim, int) and not isinstance(dim, bool) and dim > 0


def infer_axis(shape: Sequence) -> int | None:
    """The batch axis of an input of graph shape `shape`: its one axis that is not fixed (symbolic or -1), else
    axis 0; None for a scalar (rank 0: it has no rows, it can only be a constant)."""
    if not shape:
        return None
    free = [axis for axis, dim in enumerate(shape) if not is_fixed(dim)]
    return free[0] if len(free) == 1 else 0


def batch_names(shapes: Mapping[str, Sequence | None], axes: Axes | None) -> frozenset[str]:
    """The symbolic names the inputs give their batch axes (`shapes`: each input's graph shape; a constant has no
    batch axis). An output axis of the same name holds the rows: the model says so (calibrun.measure.errors.row_axis),
    where the sizes alone cannot tell a time axis of the batch's length from the rows."""
    names = set()
    for name, shape in shapes.items():
        axis = axis_of(axes, name)
        if shape and axis is not None and axis < len(shape) and isinstance(shape[axis], str) and shape[axis]:
            names.add(shape[axis])
    return frozenset(names)


def axis_of(axes: Axes | None, name: str) -> int | None:
    return 0 if axes is None else axes.get(name, 0)


def along(array: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    """array[start:stop] along `axis` (a view)."""
    return array[(slice(None),) * axis + (slice(start, stop),)]


def count(feeds: Mapping[str, np.ndarray], axes: Axes | None = None) -> int:
    """The rows of a feed: the size of the first batched input along its batch axis."""
    for name, array in feeds.items():
        axis = axis_of(axes, name)
        if axis is not None:
            return int(np.shape(array)[axis])
    raise CalibrunError(f"no input of the feed has rows: {', '.join(feeds)} are all constants")


def take(feeds: Mapping[str, np.ndarray], axes: Axes | None, start: int, stop: int) -> dict[str, np.ndarray]:
    """Rows start..stop-1 of every batched input; constants as they are."""
    out = {}
    for name, array in feeds.items():
        axis = axis_of(axes, name)
        out[name] = array if axis is None else along(array, axis, start, stop)
    return out


def runs(feeds: Mapping[str, np.ndarray], axes: Axes | None, per_run: int):
    """(start, stop, feeds of rows start..stop-1) for the feeds' rows in runs of `per_run` (the last may be shorter):
    the feeds themselves when one run holds every row."""
    total = count(feeds, axes)
    for start in range(0, total, per_run):
        stop = min(start + per_run, total)
        yield start, stop, feeds if per_run >= total else take(feeds, axes, start, stop)


def join(parts: Sequence[Mapping[str, np.ndarray]], axes: Axes | None = None) -> dict[str, np.ndarray]:
    """Feeds concatenated along each input's batch axis (a constant taken from the first)."""
    out = {}
    for name in parts[0]:
        axis = axis_of(axes, name)
        arrays = [part[name] for part in parts]
        out[name] = arrays[0] if axis is None or len(arrays) == 1 else np.concatenate(arrays, axis=axis)
    return out


def pinned_rows(shapes: Mapping[str, Sequence], axes: Axes | None = None) -> int | None:
    """The rows the model pins its batch axes to (`shapes`: input name -> graph shape), None when they are free.
    Inputs that pin different sizes cannot share one batch: an error naming them."""
    pinned = {}
    for name, shape in shapes.items():
        axis = axis_of(axes, name)
        if axis is not None and shape and axis < len(shape) and is_fixed(shape[axis]):
            pinned[name] = int(shape[axis])
    if len(set(pinned.values())) > 1:
        raise CalibrunError(f"the model pins different batch sizes on its inputs' batch axes: {pinned}")
    return next(iter(pinned.values()), None)
