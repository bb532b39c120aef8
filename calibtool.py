"""calibtool: the contract CLI. `quantize | scales | error`, one JSON object on stdout.

    python calibtool.py quantize IN OUT SEED FACTOR BATCHES [qdq|qoperator]
    python calibtool.py scales MODEL
    python calibtool.py error FP32 INT8 SEED ROWS

Exit 0 with one JSON object on stdout; 2 on a wrong argument count; 1 with one line on stderr otherwise.
No logic of its own: it parses, calls calibrun.engine and prints. The calibration cache is the folder
named by CALIBRUN_CACHE (default .calibrun-cache; `off` disables it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run from any working directory

from calibrun.errors import one_line  # noqa: E402  (light: no onnx or onnxruntime import)

USAGE = (
    "usage: calibtool.py quantize IN OUT SEED FACTOR BATCHES [qdq|qoperator]\n"
    "       calibtool.py scales MODEL\n"
    "       calibtool.py error FP32 INT8 SEED ROWS"
)
ARG_COUNTS = {"quantize": (5, 6), "scales": (1,), "error": (4,)}
QUANTIZE_KEYS = ("out", "bytes", "batches", "span", "format", "ops", "input_scale", "input_zero_point")


class UsageError(Exception):
    pass


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None


def _float(text: str, name: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None


def run(argv: list[str]) -> dict:
    from calibrun import engine
    from calibrun.quantize import QuantOptions

    command, args = argv[0], argv[1:]
    if command == "quantize":
        src, out, seed, factor, batches = args[:5]
        fmt = args[5] if len(args) > 5 else "qdq"
        options = QuantOptions(format=fmt.lower())
        seed_v, factor_v, batches_v = _int(seed, "SEED"), _float(factor, "FACTOR"), _int(batches, "BATCHES")
        model = engine.open_float_model(src)
        result = engine.quantize_lab(model, out, seed_v, factor_v, batches_v, options=options,
                                     cache=engine.cache_from_env())
        return {key: result[key] for key in QUANTIZE_KEYS}
    if command == "scales":
        return engine.scales(args[0])
    fp32, int8, seed, rows = args
    return engine.error(fp32, int8, _int(seed, "SEED"), _int(rows, "ROWS"))


class _HeldLogs(logging.Handler):
    """Holds library log records (onnxruntime's pre-processing advice...) until the command's outcome is
    known: shown on success, dropped on failure so that the error stays the one line on stderr."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def show(self) -> None:
        for record in self.records:
            print(f"{record.levelname}:{record.name}:{record.getMessage()}", file=sys.stderr)


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ARG_COUNTS or len(argv) - 1 not in ARG_COUNTS[argv[0]]:
        print(USAGE, file=sys.stderr)
        return 2
    held = _HeldLogs()
    logging.basicConfig(handlers=[held], level=logging.WARNING, force=True)
    try:
        with _stdout_to_stderr():
            result = run(argv)
    except Exception as exc:  # one line, no traceback: CalibrunError, ValueError from parsing, library errors
        if os.environ.get("CALIBRUN_DEBUG"):
            held.show()
            raise
        print(f"calibtool: error: {one_line(exc)}", file=sys.stderr)
        return 1
    held.show()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
