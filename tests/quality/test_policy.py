"""Policy rules reject settings by pattern; the memory partial order says which settings to skip."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harvest.config import ServerConfig
from harvest.quality.policy import needs_at_least, setting_items, violations
from harvest.quality.settings import PolicySettings


def cfg(**kw) -> ServerConfig:
    return ServerConfig(engine="sglang", model="m", **kw)


def test_forbid_patterns_match_key_value_items():
    policy = PolicySettings(forbid=["kv_cache_dtype=fp8*", "extra_args=*--enable-torch-compile*"])
    assert violations(cfg(kv_cache_dtype="fp8_e5m2"), policy) == [
        "kv_cache_dtype=fp8_e5m2 (forbid kv_cache_dtype=fp8*)"]
    assert violations(cfg(kv_cache_dtype="fp8_e4m3"), policy)
    assert violations(cfg(kv_cache_dtype="auto"), policy) == []
    assert violations(cfg(), policy) == []  # unset: "kv_cache_dtype=" matches nothing
    assert violations(cfg(extra_args=["--enable-torch-compile", "--x"]), policy)
    assert "enable_hierarchical_cache=false" in setting_items(cfg())
    assert "env.A=1" in setting_items(cfg(env={"A": "1"}))


def test_a_pattern_without_key_is_refused():
    with pytest.raises(ValidationError):
        PolicySettings(forbid=["fp8*"])


@pytest.mark.parametrize(("a", "b", "expected"), [
    (dict(mem_fraction_static=0.9), dict(mem_fraction_static=0.8), True),
    (dict(mem_fraction_static=0.8), dict(mem_fraction_static=0.9), False),
    (dict(mem_fraction_static=0.8), dict(mem_fraction_static=0.8), True),   # the same setting again
    (dict(mem_fraction_static=0.9, max_running_requests=64), dict(mem_fraction_static=0.8,
                                                                  max_running_requests=32),
     True),
    (dict(mem_fraction_static=0.9, max_running_requests=16), dict(mem_fraction_static=0.8,
                                                                  max_running_requests=32),
     False),  # more of one, less of another: incomparable
    # another KV dtype: not comparable
    (dict(mem_fraction_static=0.9, kv_cache_dtype="fp8_e4m3"), dict(mem_fraction_static=0.8), False),
    (dict(mem_fraction_static=0.9), dict(), False),  # unset is not comparable with a number
    (dict(enable_hierarchical_cache=True, hicache_size=64), dict(enable_hierarchical_cache=True,
                                                                 hicache_size=32),
     True),
    (dict(extra_args=["--cb-num-blocks", "4096"]), dict(extra_args=["--cb-num-blocks", "2048"]), True),
    (dict(extra_args=["--cb-num-blocks=4096"]), dict(extra_args=["--cb-num-blocks", "2048"]), True),
    (dict(extra_args=["--cb-num-blocks", "1024"]), dict(extra_args=["--cb-num-blocks", "2048"]), False),
    (dict(extra_args=["--attention-backend", "fa3"]), dict(extra_args=["--attention-backend", "triton"]),
     False),
    # the port is neutral
    (dict(port=9000, mem_fraction_static=0.9), dict(port=8000, mem_fraction_static=0.85), True),
])
def test_needs_at_least(a, b, expected):
    assert needs_at_least(cfg(**a), cfg(**b)) is expected
