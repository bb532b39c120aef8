"""The provider contract: `make_reader(arrays, input_name)` -> an onnxruntime CalibrationDataReader.

`get_next()` serves `{input_name: array}` in order and then `None` forever. An item that is already a feed
(a mapping of input name -> array, for models with several inputs) is served as it is. `__len__` and
`set_range(start, end)` let a calibration pass feed the calibrator in chunks (bounded memory).
Lists and tuples are indexed; any other iterable is consumed lazily, so a generated data set is never
held in memory whole. A re-iterable source (one whose `iter()` returns a fresh iterator) may be
rewound by `set_range`; a one-shot iterator only moves forward.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from onnxruntime.quantization import CalibrationDataReader


class ArrayReader(CalibrationDataReader):
    def __init__(self, arrays: Iterable[np.ndarray], input_name: str):
        self.input_name = input_name
        self._source = arrays
        self._indexed = isinstance(arrays, Sequence)
        self._reiterable = self._indexed or iter(arrays) is not arrays
        self._it = None if self._indexed else iter(arrays)
        self._pos = 0  # index of the next item the source would give
        self._end = math.inf  # set_range's end (exclusive)
        self._exhausted = False

    def __len__(self) -> int:
        try:
            return len(self._source)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError("this reader's source is an iterator of unknown length") from None

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._exhausted or self._pos >= self._end:
            return None
        if self._indexed:
            if self._pos >= len(self._source):  # type: ignore[arg-type]
                self._exhausted = True
                return None
            item = self._source[self._pos]  # type: ignore[index]
        else:
            try:
                item = next(self._it)
            except StopIteration:
                self._exhausted = True
                return None
        self._pos += 1
        return dict(item) if isinstance(item, Mapping) else {self.input_name: item}

    def set_range(self, start_index: int, end_index: int) -> None:
        """Serve items start_index..end_index-1 next (onnxruntime's strided calibration calls this)."""
        if start_index < 0 or end_index < start_index:
            raise ValueError(f"bad range [{start_index}, {end_index})")
        if not self._indexed and start_index < self._pos:
            if not self._reiterable:
                raise ValueError(f"cannot rewind a one-shot iterator from {self._pos} to {start_index}")
            self._it = iter(self._source)
            self._pos = 0
        if not self._indexed and start_index > self._pos:
            skipped = sum(1 for _ in itertools.islice(self._it, start_index - self._pos))
            self._pos += skipped
        if self._indexed:
            self._pos = start_index
        self._end = end_index
        self._exhausted = False


def make_reader(arrays: Iterable[np.ndarray], input_name: str) -> ArrayReader:
    """A fresh reader over `arrays` (a list, tuple or any iterable of arrays, or of feeds) for input `input_name`."""
    return ArrayReader(arrays, input_name)
