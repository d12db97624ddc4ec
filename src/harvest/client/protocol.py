"""The OpenAI-compatible wire format, outward: request bodies and paths.

Covers ``/v1/chat/completions`` and ``/v1/completions`` as vLLM and SGLang speak them, including
their extensions (``top_k``, vLLM ``prompt_logprobs``, ``extra_body`` merged at the top level). What
comes back is read in ``client/replies.py``, the one door for answers. This module only builds
JSON; it never sends anything and never sees the API key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any  # JSON bodies: the OpenAI-compatible wire format, whose shape the server owns

from harvest.config import SamplingConfig

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
MODELS_PATH = "/v1/models"

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def base_body(sampling: SamplingConfig, model: str | None) -> dict[str, Any]:
    """The fields every request carries, from the sampling configuration (``extra_body`` merged in)."""
    body: dict[str, Any] = {}
    if model:
        body["model"] = model
    body["max_tokens"] = sampling.max_tokens
    body["temperature"] = sampling.temperature
    body["top_p"] = sampling.top_p
    if sampling.top_k is not None:
        body["top_k"] = sampling.top_k
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    body.update(sampling.extra_body)
    return body


def apply_overrides(body: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Per-request fields on top of ``body`` (a copy the caller owns).

    A value of None removes the field; ``extra_body`` (a mapping) is merged at the top level, the
    way the ``openai`` package sends it, so vLLM/SGLang extensions such as ``prompt_logprobs``,
    ``top_k`` or ``chat_template_kwargs`` pass through unchanged.
    """
    for key, value in overrides.items():
        if key == "extra_body":
            if value:
                body.update(value)
        elif value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def encode(body: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON. Raises ValueError/TypeError for what JSON cannot carry (NaN, lone surrogates)."""
    try:
        return _encoder.encode(body).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text is not valid Unicode ({exc.reason} at {exc.start})") from None


__all__ = [
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "MODELS_PATH",
    "apply_overrides",
    "base_body",
    "encode",
]
