"""Atomic file writes: every file calibrun writes appears whole or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from calibrun.errors import CalibrunError


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_read_umask()  # what open() would give; mkstemp alone gives 0600


def check_writable(target: str | os.PathLike) -> Path:
    """Fail before any expensive work when `target` cannot be written: its folder is missing, or it is a folder."""
    target = Path(target)
    if not target.parent.is_dir():
        problem = "is not a folder" if target.parent.exists() else "does not exist"
        raise CalibrunError(f"cannot write {target}: {target.parent} {problem}")
    if target.is_dir():
        raise CalibrunError(f"cannot write {target}: it is a folder")
    return target


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path beside `target`; rename it onto `target` only if the block succeeds.

    The temp file lives in the target's folder so the final `os.replace` is atomic on one filesystem.
    """
    target = check_writable(target)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=suffix + ".tmp")
    except OSError as exc:
        raise CalibrunError(f"cannot write {target}: {exc.strerror or exc}") from exc
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, _FILE_MODE)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()


def write_json(target: str | os.PathLike, obj, indent: int | None = 2) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(json.dumps(obj, indent=indent) + "\n")
