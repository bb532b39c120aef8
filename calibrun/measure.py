"""Errors of an int8 model against its fp32 original on the evaluation data, in float64."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calibrun.errors import CalibrunError, one_line


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


def split_feeds(feeds: dict[str, np.ndarray], fixed: int | None) -> list[dict[str, np.ndarray]]:
    """The feeds as one run (symbolic first axis) or as runs of `fixed` rows (a model that pins its first axis)."""
    if fixed is None:
        return [feeds]
    rows = len(next(iter(feeds.values())))
    if rows % fixed:
        raise CalibrunError(f"rows ({rows}) must be a multiple of the model's fixed first axis ({fixed})")
    return [{k: v[i : i + fixed] for k, v in feeds.items()} for i in range(0, rows, fixed)]


def run_feeds(sess, feeds: dict[str, np.ndarray], fixed: int | None) -> list[np.ndarray]:
    """Run all rows of `feeds`; a model that pins its first axis to `fixed` is fed `fixed` rows at a time."""
    chunks = [sess.run(None, part) for part in split_feeds(feeds, fixed)]
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


def classification(fp32_outputs: list[np.ndarray], int8_outputs: list[np.ndarray], labels=None) -> dict:
    """Top-1 agreement of int8 with fp32 on the first output ([rows, classes]); with labels, both accuracies."""
    ref, got = fp32_outputs[0], int8_outputs[0]
    if ref.ndim != 2 or ref.shape[1] < 2:
        raise CalibrunError(f"a classifier's first output must be [rows, classes], got shape {ref.shape}")
    ref_top, got_top = ref.argmax(axis=1), got.argmax(axis=1)
    metrics = {"top1_agreement": float(np.mean(ref_top == got_top))}
    if labels is not None:
        labels = np.asarray(labels).reshape(-1)
        if len(labels) != len(ref_top):
            raise CalibrunError(f"{len(labels)} labels for {len(ref_top)} evaluation rows")
        metrics["fp32_accuracy"] = float(np.mean(ref_top == labels))
        metrics["int8_accuracy"] = float(np.mean(got_top == labels))
    return metrics
