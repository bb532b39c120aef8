"""Models exported for one row at a time: graph inputs that declare a free batch axis (`[batch, seq]`) while a node
inside was traced with one row (a Reshape to `[seq, 1, heads, dim]`), so onnxruntime fails on any batch of two or
more rows. Such an export is common (PyTorch's tracer bakes the batch it saw into shape constants) and runs as its
package runs it, one row per call.

`fails_on_two_rows` tells such a model apart from a model that fails for another reason (it runs one row, and two
rows of the same data fail); `pinned_copy` writes the model with each input's batch axis declared 1, which every
stage already treats as a model that pins its batch (calibrun.data.rows.pinned_rows): one row per run, `batches`
counting runs. The caller keeps each input's batch axis as it was inferred before (with the axis pinned, the rule
"the one axis that is not fixed" would pick another one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from calibrun.core.errors import one_line
from calibrun.core.files import temp_dir
from calibrun.data import rows as feed_rows
from calibrun.model import FloatModel, external_files, open_float_model
from calibrun.model.prepare import save_onnx


def fails_on_two_rows(path: str | Path, feeds: Mapping[str, np.ndarray], axes: Mapping[str, int | None],
                      threads: int = 0) -> str | None:
    """onnxruntime's one-line error for the first two rows of `feeds` when the model at `path` runs the first row
    alone; None when two rows run, one row fails too, or the feeds hold fewer than two rows."""
    from calibrun.model.sessions import session

    if feed_rows.count(feeds, axes) < 2:
        return None
    try:
        sess = session(path, threads, optimize=False, log_level=4)
    except Exception:  # noqa: BLE001 (a model onnxruntime cannot load: not this case; the first error stands)
        return None
    try:
        sess.run(None, feed_rows.take(feeds, axes, 0, 2))
        return None
    except Exception as exc:  # noqa: BLE001 (onnxruntime's own Fail/InvalidArgument types)
        two = one_line(exc)
    try:
        sess.run(None, feed_rows.take(feeds, axes, 0, 1))
    except Exception:  # noqa: BLE001 (one row fails too: the model is broken for another reason)
        return None
    return two


def failing(error: str) -> str:
    """onnxruntime's error on two rows, short: the node that failed (`its Reshape node 'node_view'`), else the
    error's start."""
    node = re.search(r"while running (\w+) node\. Name:'([^']*)'", error)
    if node is None:
        return error if len(error) <= 120 else error[:117] + "..."
    return f"its {node[1]} node {node[2]!r}" if node[2] else f"its {node[1]} node"


def pinned_copy(fp32: FloatModel, axes: Mapping[str, int | None], folder: Path, name: str = "fp32_one_row.onnx"
                ) -> FloatModel:
    """The model with the batch axis of each input that has rows (`axes`; None: a constant) declared 1, written
    as `folder/name` (weights inline, or in a data file beside it for a model that keeps them so); a copy already
    there is reused (the same model and axes give the same bytes: `name` says which, in a shared folder)."""
    target = folder / name
    if target.is_file():
        return open_float_model(target)
    model = onnx.load(str(fp32.path))
    for value in model.graph.input:
        axis = axes.get(value.name, 0)
        dims = value.type.tensor_type.shape.dim
        if axis is not None and axis < len(dims):
            dims[axis].Clear()
            dims[axis].dim_value = 1
    return write_copy(model, fp32, target)


def write_copy(model: onnx.ModelProto, fp32: FloatModel, target: Path) -> FloatModel:
    """`model`, a copy of `fp32` changed, written as `target` (weights inline, or in a data file beside it for a model
    that keeps them so) and opened. Callers reuse a copy already there before they load and change the model (the
    same model and change give the same bytes: `target`'s name says which, in a shared folder)."""
    folder = target.parent
    external = bool(external_files(fp32.path))
    with temp_dir("copy", folder) as tmp:  # written whole, the data first, then moved into place
        staged = Path(tmp) / target.name
        save_onnx(model, staged, external)
        data = Path(tmp, target.name + ".data")
        if data.is_file():  # (every tensor under the threshold: none)
            data.replace(folder / data.name)
        staged.replace(target)
    return open_float_model(target)


def _kind(error: str) -> str | None:
    """onnxruntime's error without what precedes it, its numbers (the rows a run had) and the failing node's name
    (calibrun names the nodes of the copy it prepares); None for no such error."""
    start = error.find("ONNXRuntimeError")
    if start < 0:
        return None
    return re.sub(r"\d+", "#", re.sub(r"Name:'[^']*'", "Name:", error[start:]))[:160]


def lab_rule_error(path: str | Path, failure: BaseException) -> BaseException:
    """calibtool's error for a model the lab rule's batches failed on: one naming the export for one row at a time
    when that is what it is (the contract's batches are 16 rows: calibtool does not change them), else `failure`.
    It is, when the model runs one row, fails on two, and `failure` is that same onnxruntime error on more rows
    (the same words, other numbers): a model that pins one row and failed for another reason (a file onnx refuses,
    an INT8 file of another network) keeps its own error."""
    from calibrun.core.errors import CalibrunError
    from calibrun.lab.data import evaluation_rows

    try:
        info = open_float_model(path).lab_input()
        error = fails_on_two_rows(path, {info.name: evaluation_rows(info, 0, 2)}, {info.name: 0})
    except Exception:  # noqa: BLE001 (the model is unusable in another way: the first failure stands)
        return failure
    if error is None or _kind(error) is None or _kind(error) != _kind(one_line(failure)):
        return failure
    return CalibrunError(f"{path}: onnxruntime fails on two rows at once and runs one ({failing(error)}): the model "
                         "was exported for one row at a time; calibtool's batches are 16 rows (its contract), python "
                         "-m calibrun model=file runs such a model one row per run")
