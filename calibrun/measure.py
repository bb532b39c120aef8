"""Errors of an int8 model against its fp32 original on the evaluation data, in float64."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calibrun.errors import CalibrunError, one_line
from calibrun.model import InputInfo


def session(path: str | Path, intra_op_threads: int = 0):
    """An onnxruntime CPU session with a clear error when the file cannot be loaded."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        first = one_line(exc)
        raise CalibrunError(f"onnxruntime cannot load {path}: {first}") from exc


def run_rows(sess, info: InputInfo, rows: np.ndarray, fixed: int | None) -> list[np.ndarray]:
    """Run all rows; a model that pins its first axis to `fixed` is fed `fixed` rows at a time."""
    if fixed is None:
        return [np.asarray(o) for o in sess.run(None, {info.name: rows})]
    if len(rows) % fixed:
        raise CalibrunError(f"rows ({len(rows)}) must be a multiple of the model's fixed first axis ({fixed})")
    chunks = [sess.run(None, {info.name: rows[i : i + fixed]}) for i in range(0, len(rows), fixed)]
    return [np.concatenate([np.asarray(c[k]) for c in chunks]) for k in range(len(chunks[0]))]


def compare(fp32_outputs: list[np.ndarray], int8_outputs: list[np.ndarray]) -> dict:
    """max/mean |fp32 - int8| over every element of every output, and max |fp32 output|."""
    if len(fp32_outputs) != len(int8_outputs):
        raise CalibrunError(f"models have {len(fp32_outputs)} and {len(int8_outputs)} outputs")
    diffs, refs = [], []
    for ref, got in zip(fp32_outputs, int8_outputs, strict=True):
        if ref.shape != got.shape:
            raise CalibrunError(f"output shapes differ: {ref.shape} vs {got.shape}")
        ref64 = ref.astype(np.float64).ravel()
        diffs.append(np.abs(ref64 - got.astype(np.float64).ravel()))
        refs.append(np.abs(ref64))
    diff = np.concatenate(diffs)
    return {
        "max_abs_error": float(diff.max()),
        "mean_abs_error": float(diff.mean()),
        "max_abs_output": float(np.concatenate(refs).max()),
    }


def max_abs_difference(a_outputs: list[np.ndarray], b_outputs: list[np.ndarray]) -> float:
    """max |a - b| over all output elements (QDQ vs QOperator)."""
    return compare(a_outputs, b_outputs)["max_abs_error"]
