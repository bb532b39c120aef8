"""The CPU's int8 dot-product instructions: they decide whether onnxruntime's x86 int8 kernels can saturate.

onnxruntime's own guidance (quantize_static's docstring, "Choosing parameters for CPU inference"): an x86 CPU without
VNNI computes u8 x s8 products in 16-bit intermediate sums that can saturate, and `reduce_range=True` (7-bit weights)
reduces that risk; with VNNI (or AMX) the 8-bit products accumulate without saturation. So the same int8 model can
measure differently on two machines (the zoo's classifiers did: docs/zoo.md). result.json `used.cpu` records what
this machine offers, and calibrun.analysis.recommend measures `quant.reduce_range=true` where the kernels can
saturate.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

X86 = {"x86_64", "amd64", "i386", "i686", "x86"}
# the non-saturating int8 dot products, best first: /proc/cpuinfo's flag names
DOT_PRODUCTS = ("amx_int8", "avx512_vnni", "avx_vnni")
# numpy's names of the same (where /proc/cpuinfo is not there to read)
NUMPY_NAMES = {"AVX512VNNI": "avx512_vnni", "AVXVNNI": "avx_vnni"}


def describe(machine: str, flags: set[str] | None) -> dict:
    """result.json `used.cpu` for a CPU of architecture `machine` with instruction `flags` (None: unknown):
    `machine`, `int8_dot` (the best non-saturating int8 dot product found, or None), `saturates` (x86 without one:
    onnxruntime's u8s8 kernels can saturate)."""
    machine = machine.lower()
    found = next((flag for flag in DOT_PRODUCTS if flag in (flags or ())), None)
    return {"machine": machine, "int8_dot": found, "saturates": machine in X86 and found is None}


def linux_flags(cpuinfo: str) -> set[str]:
    """The instruction flags of /proc/cpuinfo's text (x86 `flags`, ARM `Features`), of its first processor."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def _flags() -> set[str] | None:
    try:
        return linux_flags(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        pass
    try:  # numpy's own dispatch table (not Linux)
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:
        return None
    return {name for key, name in NUMPY_NAMES.items() if features.get(key)}


@functools.cache
def int8_dot() -> dict:
    """This machine's `used.cpu` (read once per process)."""
    return describe(platform.machine(), _flags())
