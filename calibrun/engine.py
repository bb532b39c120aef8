"""The engine both faces call (calibtool.py and the Hydra runner): calibrate, quantise, measure.

`FloatModel` is a float model opened once (its file, real graph inputs and sha256). Each function returns plain
dicts whose keys are the contract's; front ends only parse and print.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from calibrun.calibrate import CalibrationCache, CalibrationSpec, calibrated
from calibrun.data import MAX_ROWS, check_positive_int, evaluation_rows, fixed_rows, lab_batches
from calibrun.errors import CalibrunError, one_line
from calibrun.files import atomic_path, check_not_source, check_writable
from calibrun.graph import input_quant, op_counts, scales_summary
from calibrun.measure import evaluate as measure_evaluate
from calibrun.measure import run_feeds, session
from calibrun.model import (
    InputInfo,
    check_not_quantised,
    check_outputs,
    external_files,
    file_sha256,
    graph_inputs,
    load_model,
)
from calibrun.quantize import QuantOptions, quantize

DEFAULT_CACHE_DIR = ".calibrun-cache"


@dataclass(frozen=True)
class FloatModel:
    """A float model ready to calibrate: its file, its real graph inputs and the hash of its bytes."""

    path: Path
    inputs: tuple[InputInfo, ...]
    sha256: str

    @property
    def info(self) -> InputInfo:
        """The primary input: the one whose scale the contract reports."""
        return self.inputs[0]

    def lab_input(self) -> InputInfo:
        """The input the synthetic lab rule feeds: it serves exactly one float input."""
        if len(self.inputs) != 1:
            names = [i.name for i in self.inputs]
            raise CalibrunError(f"{self.path}: the lab data rule serves a single float input, the model has {names};"
                                " give a data source for each (data=npy)")
        if not self.info.is_float:
            raise CalibrunError(f"{self.path}: input {self.info.name!r} is not float32; the lab data rule needs one")
        if not self.info.shape:
            raise CalibrunError(f"{self.path}: input {self.info.name!r} has no known shape (rank 0 or missing); "
                                "the lab data rule needs [rows, ...]")
        return self.info


def open_float_model(path: str | Path, sha256: str | None = None) -> FloatModel:
    """A float model to calibrate or evaluate (refused: no input, no output, no float input, already
    quantised). `sha256`: the file's hash when the caller has just verified it (saves hashing it again)."""
    path = Path(path)
    model = load_model(path)
    inputs = tuple(graph_inputs(model))
    if not inputs:
        raise CalibrunError(f"{path} has no graph input")
    check_outputs(model, path)
    check_not_quantised(model, path)
    if not any(i.is_float for i in inputs):
        described = ", ".join(f"{i.name!r} is {TensorProto.DataType.Name(i.elem_type)}" for i in inputs)
        raise CalibrunError(f"{path}: no float32 input ({described})")
    return FloatModel(path, inputs, sha256 or file_sha256(path))


def check_loadable(fp32: FloatModel) -> FloatModel:
    """onnxruntime can build a session of the model (every op known, shapes consistent): checked before any
    work, so that a broken model is named as the user gave it, not as a temp copy deep in calibration."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # the exception carries the message; nothing else on stderr
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(fp32.path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise CalibrunError(f"onnxruntime cannot load {fp32.path}: {one_line(exc)}") from exc
    return fp32


def cache_from_env() -> CalibrationCache | None:
    """calibtool's cache: `CALIBRUN_CACHE` names the folder (default .calibrun-cache), `off` disables it."""
    folder = os.environ.get("CALIBRUN_CACHE", DEFAULT_CACHE_DIR)
    return None if folder.strip().lower() in {"off", "0", "false", ""} else CalibrationCache(folder)


def quantize_with(
    fp32: FloatModel,
    out: str | Path,
    data,
    spec: CalibrationSpec | None = None,
    options: QuantOptions | None = None,
    cache: CalibrationCache | None = None,
    ranges_copy: str | Path | None = None,
    threads: int = 0,
    input_may_stay_float: bool = False,
) -> dict:
    """Calibrate (cached) on `data` (a sized, re-iterable source with identity()), quantise, describe the model.

    `ranges_copy`: also keep the calibration ranges there (onnxruntime's cache format).
    `input_may_stay_float`: excluded nodes may leave the graph input in fp32 (its scale fields are then None).
    """
    spec = spec or CalibrationSpec()
    options = options or QuantOptions()
    out = check_writable(out)  # before calibrating, not after
    check_not_source(fp32.path, out, external_files(fp32.path))

    def check(tmp: Path) -> None:
        if not input_may_stay_float:
            input_quant(onnx.load(str(tmp)), where=f"quantised {fp32.path.name}")

    with calibrated(fp32.path, fp32.sha256, data, fp32.info.name, spec, cache, threads) as cal:
        quant_seconds = quantize(fp32.path, out, cal, options, check=check)
        if ranges_copy is not None:
            with atomic_path(ranges_copy) as tmp:
                shutil.copyfile(cal.ranges_path, tmp)
    written = onnx.load(str(out))
    try:
        summary = scales_summary(written, str(out))
    except CalibrunError:
        if not input_may_stay_float:
            raise
        ops = op_counts(written)
        summary = {"input_scale": None, "input_zero_point": None, "observed_span": None,
                   "quantize_nodes": ops.get("QuantizeLinear", 0), "dequantize_nodes": ops.get("DequantizeLinear", 0)}
    return {
        "out": str(out),
        "bytes": out.stat().st_size,
        "batches": cal.batches,
        "span": cal.span,
        "format": options.format,
        "ops": op_counts(written),
        **summary,
        "cache_hit": cal.hit,
        "cache_key": cal.key,
        "calibration_seconds": cal.seconds,
        "quantization_seconds": quant_seconds,
    }


def quantize_lab(fp32: FloatModel, out: str | Path, seed: int, factor: float, batches: int, spec=None,
                 options=None, cache=None, ranges_copy=None) -> dict:
    """Calibrate on the lab rule (DESIGN.md), quantise, and describe the written model."""
    data = lab_batches(fp32.lab_input(), seed, factor, batches)
    return quantize_with(fp32, out, data, spec, options, cache, ranges_copy)


def scales(path: str | Path) -> dict:
    return scales_summary(load_model(path), str(path))


def lab_feeds(fp32: FloatModel, seed: int, rows: int) -> dict[str, np.ndarray]:
    info = fp32.lab_input()
    return {info.name: evaluation_rows(info, seed, rows)}


def outputs(path: str | Path, fp32: FloatModel, feeds, threads: int = 0) -> list[np.ndarray]:
    """Every output of the model at `path` on `feeds` (a dict of arrays, or an EvalData): all rows in memory, for
    small comparisons (QDQ vs QOperator); the measurement itself streams (calibrun.measure.evaluate)."""
    if not isinstance(feeds, dict):
        feeds = feeds.feeds
    return run_feeds(session(path, threads), feeds, fixed_rows(fp32.info))


CONTRACT_KEYS = ("rows", "max_abs_error", "mean_abs_error", "max_abs_output")


def error(fp32_path: str | Path, int8_path: str | Path, seed: int, rows: int, threads: int = 0) -> dict:
    """The `error` contract: |fp32 - int8| over all output elements on the lab evaluation rows."""
    rows = check_positive_int(rows, "rows", MAX_ROWS)
    from calibrun.datasets import lab_evaluation

    fp32 = open_float_model(fp32_path)
    metrics = measure_evaluate(fp32.path, int8_path, lab_evaluation(fp32, seed, rows), None, threads,
                               progress=None)
    return {key: metrics[key] for key in CONTRACT_KEYS}
