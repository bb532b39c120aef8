"""calibtool: the contract CLI. `quantize | scales | error`, one JSON object on stdout.

    python calibtool.py quantize IN OUT SEED FACTOR BATCHES [qdq|qoperator]
    python calibtool.py scales MODEL
    python calibtool.py error FP32 INT8 SEED ROWS

Exit 0 with one JSON object on stdout; 2 on a wrong argument count; 1 with one line on stderr otherwise.
No logic of its own: it parses, calls calibrun (quantize, model.graph, measure.errors) and prints. The
calibration cache is the folder named by CALIBRUN_CACHE (default .calibrun-cache; `off` disables it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run from any working directory

from calibrun.core import interrupts  # noqa: E402  (light: no onnx or onnxruntime import)
from calibrun.core.errors import one_line  # noqa: E402  (light too)
from calibrun.core.files import (  # noqa: E402  (light too)
    check_not_source,
    remove_orphans,
    remove_temp_orphans,
    strict_json,
)
from calibrun.quant.cache import DEFAULT_DIR  # noqa: E402  (light too)
from calibrun.quant.cache import folders as cache_folders  # noqa: E402  (light too)

USAGE = (
    "usage: {prog} quantize IN OUT SEED FACTOR BATCHES [qdq|qoperator]\n"
    "       {prog} scales MODEL\n"
    "       {prog} error FP32 INT8 SEED ROWS"
)
HELP_FLAGS = ("-h", "--help")


def usage(prog: str | None = None) -> str:
    """The usage lines, naming the command as it was called (`calibtool`, `calibtool.py`, a path to either)."""
    prog = os.path.basename(prog if prog is not None else (sys.argv[0] if sys.argv and sys.argv[0] else ""))
    return USAGE.format(prog=prog or "calibtool")
ARG_COUNTS = {"quantize": (5, 6), "scales": (1,), "error": (4,)}
QUANTIZE_KEYS = ("out", "bytes", "batches", "span", "format", "ops", "input_scale", "input_zero_point")


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text)} characters)"


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:  # also Python's limit on the digits of an int
        raise ValueError(f"{name} must be an integer, got {_shown(text)}") from None


def _float(text: str, name: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {_shown(text)}") from None


def run(argv: list[str]) -> dict:
    """The command's JSON result. The numbers are checked before onnx and onnxruntime are imported (calibrun.core.bounds
    is light), so that a mistyped argument is refused at once."""
    from calibrun.core.bounds import MAX_BATCHES, MAX_ROWS, check_factor, check_positive_int, check_seed

    command, args = argv[0], argv[1:]
    if command == "quantize":
        src, out, seed, factor, batches = args[:5]
        check_not_source(src, out)  # before anything else: the input must survive any outcome
        fmt = args[5] if len(args) > 5 else "qdq"
        seed_v = check_seed(_int(seed, "SEED"), "seed")
        factor_v = check_factor(_float(factor, "FACTOR"), "factor")
        batches_v = check_positive_int(_int(batches, "BATCHES"), "batches", MAX_BATCHES)
        from calibrun.model import open_float_model

        open_float_model(src)  # a missing or broken file is named before onnxruntime is imported
        from calibrun.quant.calibrate import cache_from_env
        from calibrun.quant.quantize import QuantOptions, quantize_lab_file

        options = QuantOptions(format=fmt.lower())
        try:
            result = quantize_lab_file(src, out, seed_v, factor_v, batches_v, options=options, cache=cache_from_env())
        except Exception as exc:
            from calibrun.model.one_row import lab_rule_error

            raise lab_rule_error(src, exc) from exc
        return {key: result[key] for key in QUANTIZE_KEYS}
    if command == "scales":
        from calibrun.model.graph import scales

        return scales(args[0])
    fp32, int8, seed, rows = args
    seed_v = check_seed(_int(seed, "SEED"), "seed")
    rows_v = check_positive_int(_int(rows, "ROWS"), "rows", MAX_ROWS)
    from calibrun.measure import errors as measure
    from calibrun.quant.calibrate import cache_from_env

    try:
        return measure.error(fp32, int8, seed_v, rows_v, cache=cache_from_env())
    except Exception as exc:
        from calibrun.model.one_row import lab_rule_error

        raise lab_rule_error(fp32, exc) from exc


class _HeldLogs(logging.Handler):
    """Holds library log records (onnxruntime's pre-processing advice...) until the command's outcome is
    known: shown on success, dropped on failure so that the error stays the one line on stderr."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def show(self, caught: list[warnings.WarningMessage] = ()) -> None:
        for record in self.records:
            print(f"{record.levelname}:{record.name}:{record.getMessage()}", file=sys.stderr)
        for w in caught:
            print(f"{w.category.__name__}: {one_line(w.message)}", file=sys.stderr)


def _clean_orphans(argv: list[str]) -> None:
    """Temp files that killed calibtool or calibrun processes left: beside OUT, in the cache, in /tmp."""
    folders = []
    if argv[0] == "quantize":
        folders.append(Path(argv[2]).parent)
    cache = os.environ.get("CALIBRUN_CACHE", DEFAULT_DIR)
    if cache.strip().lower() not in {"off", "0", "false", ""}:
        folders += cache_folders(cache)
    removed = [p for folder in folders for p in remove_orphans(folder)] + remove_temp_orphans()
    if removed:
        logging.getLogger("calibtool").info("removed %d temp file(s) of killed runs", len(removed))


def _print_json(result: dict) -> bool:
    """The one JSON line on stdout; False (and one line on stderr) when stdout cannot take it (a full
    device, a closed pipe)."""
    try:
        sys.stdout.write(json.dumps(strict_json(result), allow_nan=False) + "\n")  # NaN and inf: null
        sys.stdout.flush()
    except OSError as exc:  # ENOSPC, EPIPE (BrokenPipeError), EIO ...
        # Python flushes stdout again at exit: point it at /dev/null so that no second error is printed.
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
        print(f"calibtool: error: cannot write the result to stdout: {exc.strerror or one_line(exc)}",
              file=sys.stderr)
        return False
    return True


@contextlib.contextmanager
def _stdout_to_stderr():
    """Anything a library prints (Python or C++) goes to stderr; stdout carries only the JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _message(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):  # calibrun.core.interrupts.Interrupted, or Python's own
        return "terminated (SIGTERM)" if getattr(exc, "signum", None) == signal.SIGTERM else "interrupted"
    return one_line(exc)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in HELP_FLAGS:
        print(usage() + "\n\n" + __doc__.strip().split("\n\n", 2)[2], file=sys.stdout)
        return 0
    if not argv or argv[0] not in ARG_COUNTS or len(argv) - 1 not in ARG_COUNTS[argv[0]]:
        print(usage(), file=sys.stderr)
        return 2
    held = _HeldLogs()
    logging.basicConfig(handlers=[held], level=logging.WARNING, force=True)
    # SIGTERM, and SIGINT unless the shell ignores it (a background job), raise an exception where the process is, so
    # that every temp file is removed on the way out; one that Python drops is raised again (calibrun.core.interrupts)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, handler in previous.items():
        if handler in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(sig, interrupts.raise_interrupted)
    unraisable_hook = interrupts.quiet_dropped()
    try:
        # Python and numpy warnings are held like the logs: shown on success, dropped on failure, so that an
        # error (FACTOR=1e39, a broken model) stays the one line on stderr.
        with warnings.catch_warnings(record=True) as caught, _stdout_to_stderr():
            warnings.simplefilter("default")
            _clean_orphans(argv)
            result = run(argv)
    except (Exception, KeyboardInterrupt) as exc:  # one line, no traceback, whatever failed
        if os.environ.get("CALIBRUN_DEBUG"):
            held.show()
            raise
        print(f"calibtool: error: {_message(exc)}", file=sys.stderr)
        return 1
    finally:
        interrupts.acknowledge()
        sys.unraisablehook = unraisable_hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not _print_json(result):
        return 1  # the one line about stdout; the held logs would only bury it
    held.show(caught)
    return 0


if __name__ == "__main__":
    sys.exit(main())
