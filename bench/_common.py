"""Helpers the bench scripts share: progress lines, the machine's load and idle share, a child's CPU time and peak
RSS, and writing a generated model once.

Imported as `from _common import ...`: a bench script runs as `python bench/NAME.py`, so bench/ is on sys.path.
Only the standard library at module level (the bare-onnxruntime children of lab_overhead.py import this too and
must not pay for numpy or calibrun).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CACHE_DIR = Path(__file__).resolve().parent / ".cache"  # generated models, reused across runs (not in git)


def log(message: str) -> None:
    """A progress line on stderr, with the time of day."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, "1.02 0.88 0.75" ("n/a" where the system has none)."""
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def machine_line() -> str:
    """What to print beside every timing: the load and the number of cores."""
    return f"load {loadavg()} on {os.cpu_count()} cores"


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat (0, 0 where unavailable)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    total = sum(fields) / tick
    return total - (fields[3] + fields[4]) / tick, total  # idle + iowait are not busy


def idle_share(seconds: float = 3.0) -> float:
    """The share of all cores that was idle over the next `seconds` (1.0 where /proc/stat is unavailable)."""
    busy0, total0 = machine_cpu()
    time.sleep(seconds)
    busy1, total1 = machine_cpu()
    return 1 - (busy1 - busy0) / (total1 - total0) if total1 > total0 else 1.0


def wait_for_idle(wanted: float, timeout: float = 600.0) -> float:
    """Sample the idle share every 3 s until it reaches `wanted` (or `timeout` passes); return the last sample."""
    deadline = time.monotonic() + timeout
    while True:
        idle = idle_share(3.0)
        if idle >= wanted or time.monotonic() > deadline:
            return idle


@dataclass
class ChildUsage:
    """What the kernel reports for a finished child (os.wait4): exit code, wall and CPU seconds, peak RSS."""

    returncode: int
    wall: float  # from the call to wait_child's start argument (or to the wait) until it ended
    cpu: float  # user + sys of all its threads
    peak_rss: int  # bytes: ru_maxrss of the child itself (not of its own children)


def wait_child(proc: subprocess.Popen, start: float | None = None) -> ChildUsage:
    """Reap `proc` with os.wait4 and return its usage; `start` is a time.perf_counter() taken before it started.

    The child must not have been waited for already (Popen.wait/communicate would reap it first)."""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start if start is not None else float("nan")
    proc.returncode = os.waitstatus_to_exitcode(status)
    return ChildUsage(proc.returncode, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)  # Linux: KiB


def write_model(path: str | Path, model) -> Path:
    """Save an onnx.ModelProto at `path` atomically (temp file in the same folder, then rename); readable by all."""
    import onnx

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        onnx.save_model(model, tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
