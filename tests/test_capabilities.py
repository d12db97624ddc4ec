"""The CPU capability probe the tests choose by (tests/capabilities.py), forced through both paths
with cpuinfo texts of an AVX2-only AMD EPYC and an AVX-512 Xeon, and read on this machine."""

from __future__ import annotations

from pathlib import Path

from tests.capabilities import CpuFeatures, compare_candidates

EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c avx2 bmi2

processor\t: 1
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c avx2 bmi2
"""
XEON_AVX512 = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni
"""
SAPPHIRE_AMX = XEON_AVX512.replace("avx512_vnni", "avx512_vnni amx_bf16 amx_tile amx_int8")


def test_no_avx512_path_expects_fp8_refused_then_measures_float32():
    cpu = CpuFeatures.parse(EPYC_AVX2)
    assert not cpu.avx512 and not cpu.amx and not cpu.vllm_cpu_fp8_kv
    assert cpu.describe() == "AVX-512 no, AMX no"
    chosen = compare_candidates(cpu)
    assert [(c.name, c.expect) for c in chosen] == [("fp8", "unsupported"), ("f32", "measured")]
    assert chosen[0].settings == {"kv_cache_dtype": "fp8"} and chosen[1].settings == {"dtype": "float32"}


def test_avx512_path_launches_fp8():
    for text in (XEON_AVX512, SAPPHIRE_AMX):
        cpu = CpuFeatures.parse(text)
        assert cpu.vllm_cpu_fp8_kv
        chosen = [(c.name, c.expect) for c in compare_candidates(cpu)]
        assert chosen == [("fp8", "measured"), ("f32", "measured")]
    assert CpuFeatures.parse(SAPPHIRE_AMX).amx and not CpuFeatures.parse(XEON_AVX512).amx


def test_avx512f_alone_is_not_enough():
    """torch (so vLLM) wants F, BW, VL and DQ; a CPU with only some of them takes the AVX2 path."""
    cpu = CpuFeatures.parse("flags\t: avx2 avx512f avx512cd\n")
    assert not cpu.avx512 and compare_candidates(cpu)[0].expect == "unsupported"


def test_unreadable_or_flagless_cpuinfo_means_no_features(tmp_path: Path):
    assert CpuFeatures.read(tmp_path / "absent").flags == frozenset()
    assert CpuFeatures.parse("processor : 0\n").flags == frozenset()


def test_this_machine_is_read_from_proc_cpuinfo():
    cpu = CpuFeatures.read()
    text = Path("/proc/cpuinfo").read_text()
    assert cpu.avx512 == all(f" {flag}" in text for flag in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))
    print(f"this machine: {cpu.describe()}; compare candidates "
          + ", ".join(f"{c.name} ({c.expect})" for c in compare_candidates(cpu)))
