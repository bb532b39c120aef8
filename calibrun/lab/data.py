"""The lab's data rules (docs/lab.md), and the bounds every data source checks.

Calibration: rng = default_rng(seed); per batch (rng.normal(0, 1, batch_shape) * factor).astype(float32).
Evaluation:  default_rng(seed).normal(0, 1, (rows, *shape[1:])).astype(float32), never scaled.
The bounds and their checks (check_seed, check_factor, check_positive_int) are calibrun.core.bounds'.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from omegaconf import MISSING

from calibrun.core.bounds import MAX_BATCHES, MAX_ROWS, check_factor, check_positive_int, check_seed
from calibrun.core.errors import CalibrunError
from calibrun.lab import CALIB_SEED, ROWS_PER_BATCH
from calibrun.model import InputInfo


def sample_shape(info: InputInfo) -> tuple[int, ...]:
    """The shape of one row: the input shape without its first axis (every axis fixed)."""
    shape = []
    for axis, dim in enumerate(info.shape[1:], start=1):
        if isinstance(dim, int) and dim > 0:
            shape.append(dim)
        else:
            raise CalibrunError(
                f"input {info.name!r} axis {axis} is symbolic ({dim or '?'}): the lab data rule only makes rows "
                "of a fixed shape; give the model a fixed size there, or calibrate on your own data with calibrun "
                "(data=npy: the arrays' shape fills it; data=images: data.crop gives height and width)"
            )
    return tuple(shape)


def fixed_rows(info: InputInfo) -> int | None:
    """The number the model pins its first axis to, or None when that axis is symbolic."""
    first = info.shape[0]
    return first if isinstance(first, int) and first > 0 else None


def batch_shape(info: InputInfo) -> tuple[int, ...]:
    """One calibration batch: 16 rows, or `b` rows when the model pins its first axis to `b`."""
    return (fixed_rows(info) or ROWS_PER_BATCH, *sample_shape(info))


class LabBatches:
    """The calibration batches of the lab rule: sized, lazy and re-iterable (each pass restarts the rng).

    Nothing is held in memory beyond the batch being served, so a pass over 512 image batches costs one batch.
    """

    def __init__(self, seed: int, factor: float, batches: int, shape: tuple[int, ...], dtype=np.float32):
        self.seed = check_seed(seed)
        self.factor = check_factor(factor)
        self.batches = check_positive_int(batches, "batches", MAX_BATCHES)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)  # the input's type: the float32 rows cast to it (a double input's model)

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[np.ndarray]:
        rng = np.random.default_rng(self.seed)
        for index in range(self.batches):
            # Cast after multiplying: the rule outside tools rebuild.
            with np.errstate(over="ignore"):  # reported below as one error, not a numpy warning
                batch = (rng.normal(0, 1, self.shape) * self.factor).astype(np.float32)
            if not np.all(np.isfinite(batch)):
                raise CalibrunError(f"calibration batch {index}: N(0, 1) * factor {self.factor:g} overflows float32")
            yield batch if self.dtype == np.float32 else batch.astype(self.dtype)

    def identity(self) -> dict:
        """Everything that decides these arrays (enters the calibration cache key)."""
        return {
            "source": "lab",
            "seed": self.seed,
            "factor": self.factor,
            "batches": self.batches,
            "rows_per_batch": self.shape[0],
            "batch_shape": list(self.shape),
            **({"dtype": str(self.dtype)} if self.dtype != np.float32 else {}),
        }


def lab_batches(info: InputInfo, seed: int, factor: float, batches: int) -> LabBatches:
    from calibrun.data.inputs import input_dtype  # (calibrun.data imports this module)

    return LabBatches(seed, factor, batches, batch_shape(info), input_dtype(info))


def evaluation_rows(info: InputInfo, seed: int, rows: int) -> np.ndarray:
    """The real distribution: N(0, 1), never multiplied by a calibration factor."""
    seed = check_seed(seed)
    rows = check_positive_int(rows, "rows", MAX_ROWS)
    shape = (rows, *sample_shape(info))
    return np.random.default_rng(seed).normal(0, 1, shape).astype(np.float32)


def evaluation_pieces(info: InputInfo, seed: int, rows: int):
    """The lab evaluation rows as a `sizes -> iterator of arrays` source: one generator drawn batch after batch.

    numpy's normal stream is sequential, so drawing (a, f) then (b, f) gives exactly the rows of one (a + b, f)
    draw, and the float32 cast is element-wise: the batches concatenate to `evaluation_rows(...)` bit for bit.
    """
    seed = check_seed(seed)
    rows = check_positive_int(rows, "rows", MAX_ROWS)
    shape = sample_shape(info)

    def pieces(sizes):
        if sum(sizes) > rows:
            raise CalibrunError(f"{sum(sizes)} evaluation rows asked of {rows}")
        rng = np.random.default_rng(seed)
        for size in sizes:
            yield rng.normal(0, 1, (size, *shape)).astype(np.float32)

    return pieces

# --- config: this concept's options (the `calibration` node; calibrun.config assembles the schema) ---

@dataclass
class CalibrationConf:
    name: str = MISSING
    factor: float = MISSING
    seed: int = CALIB_SEED
