"""Which server settings may be launched at all: hard policy rules and the memory partial order.

``violations(config, policy)``: the ``forbid`` patterns (fnmatch on ``key=value``) a setting breaks;
a setting that breaks one is rejected before launch, whatever its throughput would be.

``needs_at_least(a, b)``: True when setting ``a`` can only need as much memory as ``b`` or more:
every field equal except the memory knobs, each of which is >= in ``a``. The memory knobs are
``mem_fraction_static``, ``gpu_memory_utilization``, ``max_running_requests``, ``hicache_size``,
and in ``extra_args`` the value after one of :data:`MEMORY_FLAGS`. A sweep skips such an ``a``
once ``b`` failed for lack of memory.

Pure functions over configs; nothing here launches or measures.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from harvest.config import ServerConfig
from harvest.quality.settings import PolicySettings
from harvest.redact import REDACTED, is_secret_variable, redact_argv

#: ServerConfig fields where a larger value claims more memory.
MEMORY_FIELDS = ("mem_fraction_static", "gpu_memory_utilization", "max_running_requests", "hicache_size")
#: Engine flags (in extra_args) whose larger value claims more memory.
MEMORY_FLAGS = frozenset({
    "--mem-fraction-static", "--gpu-memory-utilization", "--max-running-requests", "--hicache-size",
    "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "--context-length",
    "--cb-memory-fraction", "--cb-max-memory-percent", "--cb-num-blocks", "--cb-max-batch-tokens",
    "--max-total-tokens", "--chunked-prefill-size", "--cuda-graph-max-bs",
})
#: Fields that say where or how the server is supervised, not what it computes or claims.
NEUTRAL_FIELDS = frozenset({"host", "port", "ready_timeout", "stop_grace", "stop_deadline", "api_key_env",
                            "health_url", "base_url"})


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return " ".join(_text(v) for v in value)
    return str(value)


def setting_items(config: ServerConfig) -> list[str]:
    """Every server field as ``key=value`` (lists joined by spaces, ``env.NAME=value`` per variable)."""
    data = config.model_dump(mode="json", exclude={"env"})
    items = [f"{key}={_text(value)}" for key, value in data.items()]
    items += [f"env.{k}={v}" for k, v in sorted(config.env.items())]
    return items


def _shown(item: str) -> str:
    """A ``key=value`` setting item fit to show: secret variables, arguments and URL parts hidden."""
    key, _, value = item.partition("=")
    if key.startswith("env.") and is_secret_variable(key[4:], value):
        return f"{key}={REDACTED}"
    return f"{key}={' '.join(redact_argv(value.split(' ')))}"


def violations(config: ServerConfig, policy: PolicySettings) -> list[str]:
    """The policy rules ``config`` breaks, each as ``"kv_cache_dtype=fp8 (forbid kv_cache_dtype=fp8*)"``."""
    out = []
    items = setting_items(config)
    for pattern in policy.forbid:
        for item in items:
            if fnmatch.fnmatchcase(item, pattern):
                out.append(f"{_shown(item)} (forbid {pattern})")
    return out


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _split_args(args: list[str]) -> list[str]:
    out: list[str] = []
    for a in args:
        if a.startswith("--") and "=" in a:
            flag, _, value = a.partition("=")
            out += [flag, value]
        else:
            out.append(a)
    return out


def _args_at_least(a: list[str], b: list[str]) -> bool:
    a, b = _split_args(a), _split_args(b)
    if len(a) != len(b):
        return False
    for i, (x, y) in enumerate(zip(a, b)):
        if x == y:
            continue
        if i == 0 or a[i - 1] != b[i - 1] or a[i - 1] not in MEMORY_FLAGS:
            return False
        nx, ny = _number(x), _number(y)
        if nx is None or ny is None or nx < ny:
            return False
    return True


def needs_at_least(a: ServerConfig, b: ServerConfig) -> bool:
    """True when ``a`` differs from ``b`` only by memory knobs that are each >= in ``a``."""
    skip = set(NEUTRAL_FIELDS) | set(MEMORY_FIELDS) | {"extra_args"}
    if a.model_dump(exclude=skip) != b.model_dump(exclude=skip):
        return False
    for name in MEMORY_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if x == y:
            continue
        if x is None or y is None or x < y:
            return False
    return _args_at_least(list(a.extra_args), list(b.extra_args))


__all__ = ["MEMORY_FIELDS", "MEMORY_FLAGS", "NEUTRAL_FIELDS", "needs_at_least", "setting_items", "violations"]
