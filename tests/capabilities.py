"""What this machine's CPU can run, read once from ``/proc/cpuinfo``: the one place tests look.

Tests that depend on CPU features ask here and choose what the machine can run, and print which
they chose. vLLM's CPU build needs AVX-512 (F, BW, VL and DQ, as torch's ``_is_avx512_supported``)
or AMX tiles for an FP8 KV cache (``vllm/v1/attention/backends/cpu_attn.py``, vLLM 0.32.0); on an
AVX2-only machine it refuses the setting at start with "FP8 KV cache on CPU requires x86 with
AVX-512 or AMX".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The AVX-512 subsets torch (and so vLLM) require before it counts a CPU as AVX-512.
AVX512_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
AMX_FLAG = "amx_tile"


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU flags of this machine (those of the first processor listed)."""

    flags: frozenset[str]

    @classmethod
    def parse(cls, cpuinfo: str) -> CpuFeatures:
        for line in cpuinfo.splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() in ("flags", "Features"):
                return cls(frozenset(value.split()))
        return cls(frozenset())

    @classmethod
    def read(cls, path: str | Path = "/proc/cpuinfo") -> CpuFeatures:
        """This machine's features; an unreadable file means none (the conservative choice)."""
        try:
            return cls.parse(Path(path).read_text(errors="replace"))
        except OSError:
            return cls(frozenset())

    @property
    def avx512(self) -> bool:
        return AVX512_FLAGS <= self.flags

    @property
    def amx(self) -> bool:
        return AMX_FLAG in self.flags

    @property
    def vllm_cpu_fp8_kv(self) -> bool:
        """Whether vLLM's CPU build can run an FP8 KV cache here."""
        return self.avx512 or self.amx

    def describe(self) -> str:
        return f"AVX-512 {'yes' if self.avx512 else 'no'}, AMX {'yes' if self.amx else 'no'}"


@dataclass(frozen=True)
class Candidate:
    """One server setting a comparison test launches, and what the test expects of it."""

    name: str
    #: TOML lines added to the job's [server] table.
    server: str
    #: The settings ``compare`` reports as differing from the reference.
    settings: dict[str, str]
    #: "measured" (launches and differs measurably) or "unsupported" (the engine refuses it here).
    expect: str = "measured"


FP8_KV = Candidate("fp8", 'kv_cache_dtype = "fp8"', {"kv_cache_dtype": "fp8"})
FLOAT32 = Candidate("f32", 'dtype = "float32"', {"dtype": "float32"})


def compare_candidates(cpu: CpuFeatures) -> list[Candidate]:
    """The candidates a vLLM CPU comparison launches on a machine with ``cpu``.

    Two candidates, four launches with the reference and its floor, on either path. With AVX-512 or
    AMX: an FP8 KV cache and float32 weights, both measured. Without: the FP8 cache is launched first
    to show that the engine's refusal is recorded as "unsupported" and the comparison goes on to
    float32 weights, the measured one.
    """
    if cpu.vllm_cpu_fp8_kv:
        return [FP8_KV, FLOAT32]
    return [Candidate(FP8_KV.name, FP8_KV.server, FP8_KV.settings, expect="unsupported"), FLOAT32]


def nvidia_driver() -> str | None:
    """None when an NVIDIA driver answers NVML, else the reason it does not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return None if count > 0 else "NVML sees no GPU"
    except Exception as exc:  # any NVML failure means: no usable driver here
        return f"no NVIDIA driver ({type(exc).__name__})"


__all__ = ["AMX_FLAG", "nvidia_driver", "AVX512_FLAGS", "Candidate", "CpuFeatures", "compare_candidates"]
