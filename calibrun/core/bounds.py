"""The bounds of every count and number a user gives (config, calibtool, the data sources) and their checks.

Light on purpose (no numpy, onnx or onnxruntime import): calibtool refuses a bad argument before it loads anything
heavy. numpy's integers are `numbers.Integral`, so they pass the integer checks as Python's int does.
"""

from __future__ import annotations

import math
import numbers

from calibrun.core.errors import CalibrunError

# Upper bounds of every count a user gives (config and calibtool): beyond them a run would take days, hold
# more memory than a machine has, or hang; each is named in the message that refuses it.
MAX_BATCHES = 100_000  # 1.6 million calibration rows
MAX_ROWS = 1_000_000  # evaluation rows
MAX_SEED = 2**32 - 1  # numpy's legacy bound, what most tools accept
MAX_FACTOR = 1e30  # N(0, 1) * factor must stay far inside float32 (3.4e38)
MIN_FACTOR = 1e-30  # below this the calibration data is all zeros (or denormal) in float32
FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max
# a value this far out is infinity's stand-in, not a magnitude: within a factor of two of float32's largest (twice it
# overflows). PyTorch and Hugging Face exports fill a mask with torch.finfo(float32).min, -3.4e38, where -inf would
# give a fully masked row NaN; a grid that holds it spreads 256 levels over 6.8e38 (a step of 1.3e36), so every score
# beside it lands on one level, a 16-bit grid's ends dequantise beyond float32 (inf), and no histogram of 2048 finite
# bins spans it. calibrun.quant.quantize keeps such a tensor's nodes in float; the histogram methods give it none.
STAND_IN = FLOAT32_MAX / 2


def inside_stand_in(low: float, high: float) -> bool:
    """Whether a range [low, high] stays short of infinity's stand-in (STAND_IN) on both sides: False for one that
    reaches it, is infinite, or is NaN (calibrun.quant.quantize keeps such a tensor's nodes in float; the histogram
    methods give it no histogram)."""
    return low > -STAND_IN and high < STAND_IN


def check_seed(seed: int, name: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= MAX_SEED:
        raise CalibrunError(f"{name} must be an integer in 0..{MAX_SEED} (2**32 - 1), got {_short(seed)}")
    return int(seed)


def check_positive_int(value: int, name: str, maximum: int | None = None) -> int:
    """An integer >= 1 (and <= `maximum`); the message names `name` and the bound."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise CalibrunError(f"{name} must be an integer >= 1, got {_short(value)}")
    if maximum is not None and value > maximum:
        raise CalibrunError(f"{name} must be at most {maximum}, got {_short(value)}")
    return int(value)


def check_factor(factor: float, name: str = "factor") -> float:
    try:
        value = float(factor)
    except (TypeError, ValueError, OverflowError):
        raise CalibrunError(f"{name} must be a number > 0, got {_short(factor)}") from None
    if not math.isfinite(value) or value <= 0:
        raise CalibrunError(f"{name} must be a finite number > 0, got {_short(factor)}")
    if not MIN_FACTOR <= value <= MAX_FACTOR:
        raise CalibrunError(f"{name} must be in {MIN_FACTOR:g}..{MAX_FACTOR:g} (N(0, 1) * factor is cast to "
                            f"float32), got {_short(factor)}")
    return value


def _short(value) -> str:
    """A value for a message: never thousands of digits (nor Python's refusal to print an int of over 4300)."""
    try:
        text = repr(value)
    except ValueError:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
