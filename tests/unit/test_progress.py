"""Progress on stderr: silent for short passes; for long ones tqdm's line (percent, done/total,
elapsed<remaining, rate); a sweep's jobs done / total with the time left."""

from __future__ import annotations

import io

from calibrun.core import progress as progress_module
from calibrun.core.progress import Progress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make(monkeypatch, total=10, after=2.0, every=1.0):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "perf_counter", clock)
    stream = io.StringIO()
    return Progress("calibrating", total, after=after, every=every, stream=stream), clock, stream


def test_a_short_pass_prints_nothing(monkeypatch):
    bar, clock, stream = make(monkeypatch)
    for done in range(1, 11):
        clock.now = done * 0.1
        bar.update(done)
    assert stream.getvalue() == ""


def test_a_long_pass_reports_batches_and_rate_at_most_once_a_second(monkeypatch):
    bar, clock, stream = make(monkeypatch)
    for done in range(1, 11):
        clock.now = done * 0.5  # 2 batches a second, 5 s in all
        bar.update(done)
    lines = stream.getvalue().splitlines()
    # first report once 2 s have passed: percent, count, elapsed<remaining (ETA), rate
    assert lines[0] == "calibrating:  40%|####      | 4/10 [00:02<00:03,  2.00batches/s]"
    assert lines[-1] == "calibrating: 100%|##########| 10/10 [00:05<00:00,  2.00batches/s]"  # the end, always
    assert len(lines) == 4  # 4, 6, 8, 10: throttled to one line a second


def test_the_unit_word_names_what_is_counted(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "perf_counter", clock)
    stream = io.StringIO()
    bar = Progress("choosing entropy ranges", 400, after=2.0, every=5.0, stream=stream, unit="tensors")
    for done in range(1, 401):
        clock.now = done * 0.05  # 20 tensors a second, 20 s in all
        bar.update(done)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "choosing entropy ranges:  10%|#         | 40/400 [00:02<00:18, 20.00tensors/s]"
    assert lines[-1] == "choosing entropy ranges: 100%|##########| 400/400 [00:20<00:00, 20.00tensors/s]"
    assert len(lines) == 5  # at 2 s, then every 5 s (7, 12, 17), and the end


def test_a_sweep_reports_jobs_done_of_the_total_and_the_time_left(monkeypatch):
    from calibrun.core.progress import SweepProgress

    clock = Clock()
    monkeypatch.setattr(progress_module.time, "perf_counter", clock)
    stream = io.StringIO()
    sweep = SweepProgress(4, stream=stream)
    clock.now = 100.0  # the store's set-up before the first job does not count
    sweep.job_started()
    for done in range(1, 5):
        clock.now = 100.0 + 3 * done
        sweep.job_done()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "calibrun: sweep:  25%|##5       | 1/4 [00:03<00:09,  3.00s/job]"
    assert lines[-1] == "calibrun: sweep: 100%|##########| 4/4 [00:12<00:00,  3.00s/job]"
