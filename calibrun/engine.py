"""The engine both faces call (calibtool.py and the Hydra runner): quantise with the lab data, measure.

Each function returns plain dicts whose keys are the contract's; front ends only parse and print.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import onnx

from calibrun.calibrate import CalibrationCache, CalibrationSpec, calibrated
from calibrun.data import check_positive_int, evaluation_rows, fixed_rows, lab_batches
from calibrun.errors import CalibrunError
from calibrun.files import check_writable
from calibrun.graph import input_quant, op_counts, scales_summary
from calibrun.measure import compare, run_rows, session
from calibrun.model import InputInfo, file_sha256, float_input, load_model
from calibrun.quantize import QuantOptions, quantize

DEFAULT_CACHE_DIR = ".calibrun-cache"


@dataclass(frozen=True)
class FloatModel:
    """A float model ready to calibrate: its file, its real input and the hash of its bytes."""

    path: Path
    info: InputInfo
    sha256: str


def open_float_model(path: str | Path) -> FloatModel:
    path = Path(path)
    model = load_model(path)
    return FloatModel(path, float_input(model, path), file_sha256(path))


def cache_from_env() -> CalibrationCache | None:
    """calibtool's cache: `CALIBRUN_CACHE` names the folder (default .calibrun-cache), `off` disables it."""
    folder = os.environ.get("CALIBRUN_CACHE", DEFAULT_CACHE_DIR)
    return None if folder.strip().lower() in {"off", "0", "false", ""} else CalibrationCache(folder)


def quantize_lab(
    fp32: FloatModel,
    out: str | Path,
    seed: int,
    factor: float,
    batches: int,
    spec: CalibrationSpec | None = None,
    options: QuantOptions | None = None,
    cache: CalibrationCache | None = None,
    axis_sizes=None,
) -> dict:
    """Calibrate (cached) on the lab rule, quantise, and describe the written model."""
    spec = spec or CalibrationSpec()
    options = options or QuantOptions()
    out = check_writable(out)  # before calibrating, not after
    data = lab_batches(fp32.info, seed, factor, batches, axis_sizes)

    def check(tmp: Path) -> None:
        input_quant(onnx.load(str(tmp)), where=f"quantised {fp32.path.name}")

    with calibrated(fp32.path, fp32.sha256, data, fp32.info.name, spec, cache) as cal:
        quant_seconds = quantize(fp32.path, out, cal, options, check=check)
    written = onnx.load(str(out))
    summary = scales_summary(written, str(out))
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


def scales(path: str | Path) -> dict:
    return scales_summary(load_model(path), str(path))


def evaluation_outputs(path: str | Path, info: InputInfo, seed: int, rows: int, threads: int = 0, axis_sizes=None):
    data = evaluation_rows(info, seed, rows, axis_sizes)
    return run_rows(session(path, threads), info, data, fixed_rows(info))


def error(fp32_path: str | Path, int8_path: str | Path, seed: int, rows: int, threads: int = 0,
          axis_sizes=None) -> dict:
    """The `error` contract: |fp32 - int8| over all output elements on the evaluation rows."""
    rows = check_positive_int(rows, "rows")
    fp32 = open_float_model(fp32_path)
    int8_model = load_model(int8_path)
    int8_inputs = [i.name for i in int8_model.graph.input]
    if fp32.info.name not in int8_inputs:
        raise CalibrunError(f"{int8_path} has no input {fp32.info.name!r} (inputs: {int8_inputs})")
    ref = evaluation_outputs(fp32.path, fp32.info, seed, rows, threads, axis_sizes)
    got = evaluation_outputs(int8_path, fp32.info, seed, rows, threads, axis_sizes)
    return {"rows": rows, **compare(ref, got)}
