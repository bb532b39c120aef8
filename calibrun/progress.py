"""Progress on stderr for passes that last longer than a couple of seconds."""

from __future__ import annotations

import sys
import time


class Progress:
    """`update(done)` prints `label: done/total batches (rate/s)` once the pass has run `after` seconds."""

    def __init__(self, label: str, total: int, after: float = 2.0, every: float = 5.0, stream=None):
        self.label, self.total, self.after, self.every = label, total, after, every
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self._last = None
        self.printed = False

    def update(self, done: int) -> None:
        now = time.perf_counter()
        elapsed = now - self.start
        final = done >= self.total
        if elapsed < self.after or (not final and self._last is not None and now - self._last < self.every):
            return
        self._last = now
        rate = done / elapsed if elapsed > 0 else 0.0
        print(f"{self.label}: {done}/{self.total} batches ({rate:.1f} batches/s)", file=self.stream, flush=True)
        self.printed = True
