"""Atomic file writes (every file calibrun writes appears whole or not at all), checks that a target is writable and
is not the source, private temp folders, the removal of the temp files and folders that killed runs left, and the
names of the files a job folder holds (the runner writes them, the aggregator reads them)."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from calibrun.core import interrupts
from calibrun.core.errors import CalibrunError

# A job folder's files
RESULT_FILE = "result.json"
RANGES_FILE = "ranges.json"
DIAGNOSTICS_FILE = "diagnostics.json"

_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # the device is full (or the quota, the file size limit)
FULL_MARGIN = 64 * 1024  # bytes: a device with less free space counts as full (a library that wrote short)


def is_full(exc: BaseException) -> bool:
    """The error is a full device (ENOSPC, a quota, the file size limit)."""
    return isinstance(exc, OSError) and exc.errno in _FULL


def device_full(folder: str | os.PathLike) -> bool:
    """The device of `folder` has (almost) no space left: for libraries that write a short file without an error
    (onnx's shape inference), found out when the file is read back."""
    try:
        return shutil.disk_usage(folder).free < FULL_MARGIN
    except OSError:
        return False


def full_error(folder: str | os.PathLike, what: str) -> CalibrunError:
    """The one line for a full device: the folder that is full, then what could not be done."""
    return CalibrunError(f"folder {folder} is full (No space left on device): {what}")


def _host() -> str:
    """This host's name, plus its PID namespace when it has one: processes of other namespaces (containers,
    sandboxes) sharing a folder are invisible to `os.kill(pid, 0)`, so their temp files count as another host's
    and are never judged dead by their process id."""
    name = socket.gethostname().replace(".", "_")
    try:
        namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return name
    digits = "".join(c for c in namespace if c.isdigit())
    return f"{name}~{digits}" if digits else name


_HOST = _host()
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<host>[^.]+)\.(?P<pid>\d+)\.[0-9a-f]{8}(\.[^.]+)*\.(tmp|prepare)$")
# Private temp folders in the system temp dir (`temp_dir`): calibrun.<kind>.<host>.<pid>.<tempfile's random part>
_TEMP_DIR = re.compile(r"^calibrun\.(?P<kind>[a-z]+)\.(?P<host>[^.]+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+$")


def temp_name(target: Path, suffix: str) -> Path:
    """`.NAME.HOST.PID.RANDOM<suffix>` beside `target`: the host and process let `remove_orphans` tell a temp
    file of a killed process from one still being written."""
    return target.parent / f".{target.name}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}{suffix}"


def _alive(pid: int) -> bool:
    """Whether process `pid` runs. A zombie does not: a killed process whose parent died with it (the tracking
    writer of a SIGKILLed run) waits to be reaped by init, which can take a while in a container."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def remove_orphans(folder: str | os.PathLike) -> list[Path]:
    """Remove the temp files and folders that a killed calibrun process (SIGKILL, power loss) left in `folder`:
    those of this host whose process is gone. Those of live processes and of other hosts are left alone."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        match = _TEMP.match(entry.name)
        if match is None or match["host"] != _HOST or _alive(int(match["pid"])):
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def temp_dir(kind: str, folder: str | os.PathLike | None = None) -> tempfile.TemporaryDirectory:
    """A private temp folder `calibrun.<kind>.<host>.<pid>.XXXXXXXX` (in the system temp dir unless `folder`),
    removed when the block ends (or at `cleanup()`). The host and process in its name let `remove_temp_orphans`
    clear it after a SIGKILL. Created as one step with the registration of its removal (`interrupts.deferred`):
    a Ctrl-C that landed in between left the folder behind (seen once in a whole-suite run of calibtool's test)."""
    with interrupts.deferred():
        return tempfile.TemporaryDirectory(prefix=f"calibrun.{kind}.{_HOST}.{os.getpid()}.", dir=folder)


def remove_temp_orphans(folder: str | os.PathLike | None = None) -> list[Path]:
    """Remove the private temp folders (`temp_dir`) of killed calibrun processes of this host from the system
    temp dir (or `folder`)."""
    removed = []
    folder = Path(folder or tempfile.gettempdir())
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_DIR.match(entry.name)
        if match is None or match["host"] != _HOST or _alive(int(match["pid"])):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            continue  # someone else's (another user's) folder: not ours to remove
        removed.append(entry)
    return removed


def check_writable(target: str | os.PathLike) -> Path:
    """Fail before any expensive work when `target` cannot be written: its folder is missing, or it is a folder."""
    target = Path(target)
    if not target.parent.is_dir():
        problem = "is not a folder" if target.parent.exists() else "does not exist"
        raise CalibrunError(f"cannot write {target}: {target.parent} {problem}")
    if target.is_dir():
        raise CalibrunError(f"cannot write {target}: it is a folder")
    return target


def check_not_source(source: str | os.PathLike, target: str | os.PathLike, data_files=()) -> None:
    """Refuse to write `target` when it is `source` (the same path, a symlink or hard link to it) or one of its
    external data files (`data_files`, and `source.data` by default): the input would be overwritten by its
    own output."""
    source, target = Path(source), Path(target)
    candidates = [source, source.with_name(source.name + ".data"), *map(Path, data_files)]
    for path in candidates:
        same = os.path.abspath(path) == os.path.abspath(target)
        if not same and path.exists() and target.exists():
            try:
                same = os.path.samefile(path, target)
            except OSError:
                same = False
        if not same and path.exists():
            same = path.resolve() == target.resolve()
        if same:
            what = "the input model" if path == source else "the input model's data file"
            raise CalibrunError(f"cannot write {target}: it is {what} {source}; choose another output path")


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path beside `target`; rename it onto `target` only if the block succeeds.

    The temp file lives in the target's folder so the final `os.replace` is atomic on one filesystem. Its name
    is chosen before it is created and it is created inside the try, so an interrupt (Ctrl-C) at any point
    removes it (`tempfile.mkstemp` creates the file before returning its name: an interrupt there left it).
    """
    interrupts.check()  # a Ctrl-C that Python dropped stops here, before new work is written
    target = check_writable(target)
    tmp_path = temp_name(target, suffix + ".tmp")
    owned: Path | None = tmp_path
    try:
        try:
            os.close(os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # mode as open() gives it
        except OSError as exc:
            owned = None  # not created, or (FileExistsError) someone else's: never remove it
            if is_full(exc):
                raise full_error(target.parent, f"cannot write {target.name}") from exc
            raise CalibrunError(f"cannot write {target}: {exc.strerror or exc}") from exc
        try:
            yield tmp_path
            os.replace(tmp_path, target)
        except OSError as exc:  # the block's writes name no path on a full device: say which folder is full
            if not is_full(exc):
                raise
            raise full_error(target.parent, f"cannot write {target.name}") from exc
    finally:
        if owned is not None:
            with contextlib.suppress(FileNotFoundError):
                owned.unlink()


def finite(value):
    """A number as strict JSON holds it: `value` when it is a finite int or float, else None."""
    return value if isinstance(value, int | float) and math.isfinite(value) else None


def strict_json(value):
    """`value` as strict JSON holds it: non-finite floats (inf, NaN) become null, in dicts and lists too."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(target: str | os.PathLike, obj, indent: int | None = 2) -> None:
    with atomic_path(target) as tmp:  # a full device: one line naming the folder (atomic_path)
        tmp.write_text(json.dumps(obj, indent=indent) + "\n")
