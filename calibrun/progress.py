"""Progress on stderr for passes that last longer than a couple of seconds."""

from __future__ import annotations

import sys
import time


class Progress:
    """`update(done)` prints `label: done/total <unit> (rate <unit>/s)` once the pass has run `after` seconds,
    then at most once every `every` seconds, and always at the end."""

    def __init__(self, label: str, total: int, after: float = 2.0, every: float = 5.0, stream=None,
                 unit: str = "batches"):
        self.label, self.total, self.after, self.every, self.unit = label, total, after, every, unit
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
        print(f"{self.label}: {done}/{self.total} {self.unit} ({rate:.1f} {self.unit}/s)", file=self.stream,
              flush=True)
        self.printed = True
