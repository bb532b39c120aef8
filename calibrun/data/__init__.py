"""A job's data, chosen by config: the calibration batches and the evaluation rows (lab rule or user files).

Sources are plain dicts (the `data` / `eval_data` config nodes) so the aggregator can rebuild the evaluation
rows of a finished job from its result.json. The rooms: lab.py (the lab rule of docs/lab.md and the bounds every
count is checked against), npy.py (.npy/.npz files), images.py (image folders), batches.py (the batch protocol
they all serve: FeedBatches for calibration, EvalData for evaluation), inputs.py (each input's type, batch axis and
constants: `data.inputs.<name>.*`), rows.py (counting and splitting rows along the batch axes; docs/data.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from calibrun.core.errors import CalibrunError
from calibrun.data import images, inputs, npy
from calibrun.data.batches import EvalData, FeedBatches
from calibrun.data.images import ImageTransform
from calibrun.data.inputs import input_dtype
from calibrun.lab.data import evaluation_pieces, lab_batches
from calibrun.model import FloatModel

__all__ = ["SOURCES", "EvalData", "FeedBatches", "Source", "calibration_data", "evaluation_data", "lab_evaluation"]


IMAGE_KEYS = tuple(f.name for f in dataclasses.fields(ImageTransform))  # what only data=images reads


def source_record(node: Mapping) -> dict:
    """A data source's config node as a record of what it reads: the image transform's options only for images
    (the config schema gives every source their defaults; a .npz source never resized or cropped anything)."""
    return {k: v for k, v in node.items() if node.get("name") == "images" or k not in IMAGE_KEYS}


def _transform(source: Mapping) -> ImageTransform:
    return ImageTransform.from_config(source)


def _path(source: Mapping) -> Path:
    return Path(str(source["path"])).expanduser()


def calibration_data(source: Mapping, fp32: FloatModel, seed: int, factor: float, batches: int):
    """A sized, lazy, re-iterable source of calibration batches with identity() (it enters the cache key)."""
    found = _source(source)
    _fed_back(source, fp32, "data")  # refused: calibration rows feed the state their data holds
    return found.calibration(source, fp32, seed, factor, batches)


def lab_evaluation(fp32: FloatModel, seed: int, rows: int) -> EvalData:
    """The lab rule's evaluation rows, generated batch by batch (the same rows as one draw)."""
    info = fp32.lab_input()
    pieces = evaluation_pieces(info, seed, rows)
    dtype = input_dtype(info)  # float32; float16 or double for a model that declares it (cast from float32)

    def feeds(sizes):
        for array in pieces(sizes):
            yield {info.name: array if array.dtype == dtype else array.astype(dtype)}

    return EvalData(rows, feeds, None, None, {"source": "lab", "seed": seed, "rows": rows}, [info.name])


def evaluation_data(source: Mapping, fp32: FloatModel, seed: int, rows: int) -> EvalData:
    """The evaluation rows (the real distribution), served batch by batch, and labels when the source has them; the
    inputs fed back from an output (`eval_data.inputs.<name>.from_output`) in its `state`."""
    data = _source(source).evaluation(source, fp32, seed, rows)
    data.state = _fed_back(source, fp32, "eval_data")
    return data


def _fed_back(source: Mapping, fp32: FloatModel, key: str) -> dict[str, str]:
    node = source.get("inputs")
    if not node:
        return {}
    from calibrun.model.structure import structure

    given = inputs.overrides(node, fp32.inputs, key)
    return inputs.fed_back(given, fp32.inputs, structure(fp32.path).graph.output, key)


@dataclass(frozen=True)
class Source:
    """A data source: how it serves calibration batches and evaluation rows from its config node."""

    calibration: Callable[[Mapping, FloatModel, int, float, int], FeedBatches]
    evaluation: Callable[[Mapping, FloatModel, int, int], EvalData]


# name (the `data` / `eval_data` group option) -> source; a new source is an entry here and a conf/data/ yaml
SOURCES: dict[str, Source] = {
    "lab": Source(lambda s, fp32, seed, factor, batches: lab_batches(fp32.lab_input(), seed, factor, batches),
                  lambda s, fp32, seed, rows: lab_evaluation(fp32, seed, rows)),
    "npy": Source(lambda s, fp32, seed, factor, batches: npy.npy_calibration(
                      _path(s), fp32.inputs, batches, factor, s.get("inputs"), "data"),
                  lambda s, fp32, seed, rows: npy.npy_evaluation(
                      _path(s), fp32.inputs, rows, s.get("inputs"), "eval_data")),
    "images": Source(lambda s, fp32, seed, factor, batches: images.image_calibration(
                         _path(s), fp32.inputs, batches, factor, _transform(s), s.get("inputs"), "data"),
                     lambda s, fp32, seed, rows: images.image_evaluation(
                         _path(s), fp32.inputs, rows, _transform(s), s.get("inputs"), "eval_data")),
}


def _source(source: Mapping) -> Source:
    try:
        found = SOURCES[source["name"]]
    except KeyError:
        raise CalibrunError(f"unknown data source {source['name']!r} (known: {sorted(SOURCES)})") from None
    if source["name"] == "lab" and source.get("inputs"):
        raise CalibrunError("config data.inputs / eval_data.inputs: the lab data rule feeds one float input; "
                            "inputs' values and batch axes need data=npy or data=images")
    return found
