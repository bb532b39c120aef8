"""calibrun.core.cpu: which int8 dot product the CPU offers, and whether onnxruntime's x86 int8 kernels can saturate
(no VNNI or AMX: onnxruntime's advice is 7-bit weights, quant.reduce_range=true)."""

import platform

from calibrun.core import cpu

X86_FLAGS = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu sse2
"""
ARM_FEATURES = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddot\n"


def test_cpuinfo_flags_of_the_first_processor():
    assert cpu.linux_flags(X86_FLAGS) == {"fpu", "sse2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni",
                                          "avx512_bf16"}
    assert "asimddot" in cpu.linux_flags(ARM_FEATURES)
    assert cpu.linux_flags("model name\t: something\n") == set()


def test_x86_without_vnni_saturates_with_it_not_and_arm_never():
    vnni = cpu.describe("x86_64", cpu.linux_flags(X86_FLAGS))
    assert vnni == {"machine": "x86_64", "int8_dot": "avx512_vnni", "saturates": False}
    assert cpu.describe("AMD64", {"avx2", "avx_vnni"}) == {"machine": "amd64", "int8_dot": "avx_vnni",
                                                           "saturates": False}
    assert cpu.describe("x86_64", {"avx2", "amx_int8", "avx512_vnni"})["int8_dot"] == "amx_int8"  # the best first
    assert cpu.describe("x86_64", {"avx2", "fma"}) == {"machine": "x86_64", "int8_dot": None, "saturates": True}
    assert cpu.describe("x86_64", None)["saturates"]  # unknown: the kernels may saturate
    assert cpu.describe("aarch64", cpu.linux_flags(ARM_FEATURES)) == {"machine": "aarch64", "int8_dot": None,
                                                                    "saturates": False}


def test_this_machine_is_described_once():
    found = cpu.int8_dot()
    assert found["machine"] == platform.machine().lower()
    assert found is cpu.int8_dot()
    assert "model" in found
    assert found["saturates"] == (found["machine"] in cpu.X86 and found["int8_dot"] is None)


def test_the_cpu_model_is_its_vendor_family_and_model():
    """onnxruntime picks kernels by the CPU: two with the same dot product can round fp32 differently."""
    assert cpu.linux_model(X86_FLAGS) == "AuthenticAMD family 26 model 2 (AMD EPYC)"
    assert cpu.linux_model(ARM_FEATURES) is None
    assert cpu.linux_model("model name\t: something\n") == "something"
