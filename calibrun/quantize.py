"""Quantisation from calibrated ranges: onnxruntime's `quantize_static` fed through `calibration_cache_path`.

Everything here is post-calibration: changing any of these options reuses the calibration cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

from calibrun.calibrate import METHODS, Calibration, private_model_copy
from calibrun.errors import CalibrunError
from calibrun.files import atomic_path, temp_dir

FORMATS = {"qdq": QuantFormat.QDQ, "qoperator": QuantFormat.QOperator}
QUANT_TYPES = {name: QuantType[name] for name in ("QInt8", "QUInt8", "QInt16", "QUInt16")}


@dataclass(frozen=True)
class QuantOptions:
    format: str = "qdq"
    activation_type: str = "QInt8"
    weight_type: str = "QInt8"
    per_channel: bool = False
    reduce_range: bool = False
    activation_symmetric: bool = False
    nodes_to_exclude: tuple[str, ...] = ()
    op_types_to_quantize: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.format not in FORMATS:
            raise CalibrunError(f"format must be one of {sorted(FORMATS)}, got {self.format!r}")
        for key in ("activation_type", "weight_type"):
            if getattr(self, key) not in QUANT_TYPES:
                raise CalibrunError(f"{key} must be one of {sorted(QUANT_TYPES)}, got {getattr(self, key)!r}")
        sixteen = {"QInt16", "QUInt16"}
        if self.format == "qoperator" and {self.activation_type, self.weight_type} & sixteen:
            raise CalibrunError("16-bit types need format=qdq (onnxruntime has no 16-bit QOperator ops)")
        if self.activation_type == "QInt8" and self.weight_type == "QUInt8":
            raise CalibrunError("onnxruntime does not support QInt8 activations with QUInt8 weights")


def quantize(
    model_path: str | Path,
    out_path: str | Path,
    calibration: Calibration,
    options: QuantOptions,
    check: Callable[[Path], None] | None = None,
) -> float:
    """Write the quantised model to `out_path` atomically; return the seconds quantize_static took.

    `check(tmp_path)` may inspect the written model before it is renamed into place; if it raises,
    nothing is left at `out_path`.
    """
    out_path = Path(out_path)
    start = time.perf_counter()
    with atomic_path(out_path, suffix=".onnx") as tmp, temp_dir("q") as private:
        quantize_static(
            str(private_model_copy(model_path, private)),  # a copy: see private_model_copy
            str(tmp),
            calibration_data_reader=None,  # the ranges come from the cache file: no calibration here
            quant_format=FORMATS[options.format],
            op_types_to_quantize=_op_types_to_quantize(options, calibration),
            per_channel=options.per_channel,
            reduce_range=options.reduce_range,
            activation_type=QUANT_TYPES[options.activation_type],
            weight_type=QUANT_TYPES[options.weight_type],
            nodes_to_exclude=list(options.nodes_to_exclude),
            calibrate_method=METHODS[calibration.method],
            extra_options={"ActivationSymmetric": options.activation_symmetric},
            calibration_cache_path=calibration.ranges_path,
        )
        seconds = time.perf_counter() - start
        if check is not None:
            check(tmp)
    return seconds


def _op_types_to_quantize(options: QuantOptions, calibration: Calibration) -> list[str]:
    """quantize_static needs ranges for every op it quantises: never ask for op types that were not calibrated.

    (quantize_static's own calibration calibrates exactly `op_types_to_quantize`; this keeps that invariant.)
    """
    wanted = list(options.op_types_to_quantize or [])
    if calibration.op_types is None:  # every op type was calibrated
        return wanted
    if not wanted:
        return sorted(calibration.op_types)
    missing = sorted(set(wanted) - set(calibration.op_types))
    if missing:
        raise CalibrunError(f"op types {missing} are to be quantised but were not calibrated "
                            f"(calibration op_types: {sorted(calibration.op_types)})")
    return wanted
