"""A job's data, chosen by config: the calibration batches and the evaluation rows (lab rule or user files).

Sources are plain dicts (the `data` / `eval_data` config nodes) so the aggregator can rebuild the evaluation
rows of a finished job from its result.json. The rooms: lab.py (the lab rule of DESIGN.md and the bounds every
count is checked against), npy.py (.npy/.npz files), images.py (image folders), batches.py (the batch protocol
they all serve: FeedBatches for calibration, EvalData for evaluation).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from calibrun.data import images, npy
from calibrun.data.batches import EvalData, FeedBatches
from calibrun.data.images import ImageTransform
from calibrun.data.lab import evaluation_pieces, lab_batches
from calibrun.errors import CalibrunError
from calibrun.model import FloatModel

__all__ = ["EvalData", "FeedBatches", "calibration_data", "evaluation_data", "lab_evaluation"]


def _transform(source: Mapping) -> ImageTransform:
    return ImageTransform.from_config(source)


def _path(source: Mapping) -> Path:
    return Path(str(source["path"])).expanduser()


def calibration_data(source: Mapping, fp32: FloatModel, seed: int, factor: float, batches: int):
    """A sized, lazy, re-iterable source of calibration batches with identity() (it enters the cache key)."""
    name = source["name"]
    if name == "lab":
        return lab_batches(fp32.lab_input(), seed, factor, batches)
    if name == "npy":
        return npy.npy_calibration(_path(source), fp32.inputs, batches, factor)
    if name == "images":
        return images.image_calibration(_path(source), fp32.inputs, batches, factor, _transform(source))
    raise CalibrunError(f"unknown data source {name!r}")


def lab_evaluation(fp32: FloatModel, seed: int, rows: int) -> EvalData:
    """The lab rule's evaluation rows, generated batch by batch (the same rows as one draw)."""
    info = fp32.lab_input()
    pieces = evaluation_pieces(info, seed, rows)

    def feeds(sizes):
        for array in pieces(sizes):
            yield {info.name: array}

    return EvalData(rows, feeds, None, None, {"source": "lab", "seed": seed, "rows": rows}, [info.name])


def evaluation_data(source: Mapping, fp32: FloatModel, seed: int, rows: int) -> EvalData:
    """The evaluation rows (the real distribution), served batch by batch, and labels when the source has them."""
    name = source["name"]
    if name == "lab":
        return lab_evaluation(fp32, seed, rows)
    if name == "npy":
        return npy.npy_evaluation(_path(source), fp32.inputs, rows)
    if name == "images":
        return images.image_evaluation(_path(source), fp32.inputs, rows, _transform(source))
    raise CalibrunError(f"unknown data source {name!r}")
