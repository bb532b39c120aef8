"""Atomic file writes: every file calibrun writes appears whole or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from calibrun.errors import CalibrunError


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path beside `target`; rename it onto `target` only if the block succeeds.

    The temp file lives in the target's folder so the final `os.replace` is atomic on one filesystem.
    """
    target = Path(target)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise CalibrunError(f"cannot write {target}: folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=suffix + ".tmp")
    except OSError as exc:
        raise CalibrunError(f"cannot write {target}: {exc.strerror or exc}") from exc
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()


def write_json(target: str | os.PathLike, obj, indent: int | None = 2) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(json.dumps(obj, indent=indent, sort_keys=False) + "\n")


def write_bytes(target: str | os.PathLike, data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
