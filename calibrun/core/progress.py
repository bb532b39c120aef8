"""Progress on stderr, formatted by tqdm (percent, count, elapsed<remaining, rate): a line at a time, so that it
reads the same in a terminal, a log file and a CI log, between Hydra's log lines.

- `Progress`: a pass over batches or tensors (calibration, evaluation, the histogram search) that lasts longer
  than a couple of seconds.
- `SweepProgress`: a sweep's jobs, done / total with the time left (calibrun.sweep updates it as each job ends).
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


def meter(label: str, done: int, total: int | None, elapsed: float, unit: str) -> str:
    """tqdm's progress line: `label:  40%|####      | 4/10 [00:02<00:03,  2.00batches/s]`."""
    return tqdm.format_meter(done, total, elapsed, prefix=label, unit=unit, ascii=True)


class Progress:
    """`update(done)` prints tqdm's line (percent, done/total, elapsed<remaining, rate) once the pass has run
    `after` seconds, then at most once every `every` seconds, and always at the end."""

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
        print(meter(self.label, done, self.total, elapsed, self.unit), file=self.stream, flush=True)
        self.printed = True


class SweepProgress:
    """A sweep's jobs: `job_done()` prints `calibrun: sweep:  50%|...| 2/4 [00:10<00:10, 5.00s/job]` (the total is
    None when the sweeper decides as it goes: done and elapsed only)."""

    def __init__(self, total: int | None, stream=None):
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.start: float | None = None  # the first job's start (the store's set-up is not a job's time)

    def job_started(self) -> None:
        if self.start is None:
            self.start = time.perf_counter()

    def job_done(self) -> str:
        self.job_started()
        self.done += 1
        line = meter("calibrun: sweep", self.done, self.total, time.perf_counter() - self.start, "job")
        print(line, file=self.stream, flush=True)
        return line
