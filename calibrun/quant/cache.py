"""One content-addressed cache for what calibrun computes once and reuses, with one key scheme: a record dict
(everything that decides the content, nothing else) -> the sha256 of its canonical JSON (`key_of`), and one
subfolder of `cache.dir` per kind:

    ranges/<key>.json, <key>.key.json     calibration ranges (calibrun.quant.calibrate.CalibrationCache)
    models/<key>.onnx, <key>.steps.json   prepared models (calibrun.model.prepared)
    <kind>/<key>.lock                     held by the process computing that entry (`claim`)
    digits/                               the digits example's model and data (fixed inputs: made once)

An entry is used only once it checks out against what was recorded with it (ranges: their key record and
checksum; prepared models: the sha256 of their bytes); anything else is a miss and is computed again.
Entries of the earlier layout (ranges at the top of cache.dir, prepared models named
`<sha256>-prep<N>-ort<version>.onnx`) are never read: each is computed once more into its subfolder, with a
log line naming the old file that was left unused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from calibrun.core.errors import CalibrunError

log = logging.getLogger("calibrun")

DEFAULT_DIR = ".calibrun-cache"  # cache.dir (config) and CALIBRUN_CACHE (calibtool) default to it
KINDS = ("ranges", "models", "digits")
KEY_CHARS = 32  # hex digits of the sha256 in a key (128 bits)
WAIT_SECONDS = 1800.0  # cache.wait: how long a process waits for another one computing the same entry
MAX_WAIT = 86_400.0  # cache.wait's bound (a day): a wait must end


def key_of(record: Mapping) -> str:
    """The key of a record: sha256 of its canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_CHARS]


def folder(root: str | Path, kind: str, create: bool = False) -> Path:
    """The subfolder of the cache `root` that holds entries of `kind` (created when `create`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown cache kind {kind!r} (kinds: {', '.join(KINDS)})")
    path = Path(root) / kind
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CalibrunError(f"cannot create cache folder {path}: {exc.strerror or exc}") from exc
    return path


def vanished(exc: BaseException, root: str | Path) -> str | None:
    """What to say where `exc` is a file of the cache under `root` not found (a folder removed while a job used it:
    the prepared model it quantises, a range file it had just written), else None."""
    name = getattr(exc, "filename", None)
    if not isinstance(exc, FileNotFoundError) or not name:
        return None
    try:
        Path(name).expanduser().resolve().relative_to(Path(root).expanduser().resolve())
    except (ValueError, OSError):
        return None
    return (f"{name} is gone from the calibration cache ({root}) while the job used it: was the cache folder removed "
            "or cleaned meanwhile? Run the job again (it computes what is missing)")


def folders(root: str | Path) -> list[Path]:
    """The cache root and every subfolder (where a killed run may have left temp files)."""
    return [Path(root), *(Path(root) / kind for kind in KINDS)]


@contextlib.contextmanager
def claim(lock_file: Path, wait: float, what: str) -> Iterator[float]:
    """Hold `lock_file` (filelock: an OS lock, released when its process ends, however it ends) for the block, so
    that a second process that misses the same entry waits here for the first one's result and then finds it in
    the cache instead of computing it again. Yields the seconds waited. A lock not had within `wait` seconds (a
    process hung while it computes), or a folder that cannot be locked, is a warning, and the block runs without
    the lock: at worst the entry is computed twice, never a deadlock. `what`: the work, for the warning."""
    from filelock import FileLock, Timeout

    lock = FileLock(lock_file)
    start = time.perf_counter()
    try:
        lock.acquire(timeout=wait)
    except Timeout:
        log.warning("cache: another process has been %s for %.0f s (%s); doing it here too", what, wait, lock_file)
        yield time.perf_counter() - start
        return
    except OSError as exc:
        log.warning("cache: cannot lock %s (%s); %s without the lock", lock_file, exc.strerror or exc, what)
        yield time.perf_counter() - start
        return
    try:
        yield time.perf_counter() - start
    finally:
        lock.release()

# --- config: this concept's options (the `cache` node; calibrun.config assembles the schema) ---

@dataclass
class CacheConf:
    enabled: bool = True
    dir: str = DEFAULT_DIR
    wait: float = WAIT_SECONDS  # seconds to wait for another process computing the same entry, then compute it too
