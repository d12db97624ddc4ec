"""The OpenAI-compatible wire format: request bodies out, :class:`Completion` records in.

Covers ``/v1/chat/completions`` and ``/v1/completions`` as vLLM and SGLang speak them, including
their extensions (``top_k``, ``reasoning_content`` / ``reasoning``, vLLM ``prompt_logprobs``). This
module only builds and reads JSON; it never sends anything and never sees the API key.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any  # JSON bodies: the OpenAI-compatible wire format, whose shape the server owns

from harvest.client.records import Completion
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


def parse_chat(raw: bytes, *, endpoint: str, latency_s: float, attempts: int) -> Completion:
    """A chat completion response -> :class:`Completion`. Raises ValueError/KeyError/... if it is not one."""
    data = json.loads(raw)
    choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
    usage = data.get("usage") or {}
    total = usage.get("completion_tokens")
    out = []
    for i, choice in enumerate(choices):
        message = choice["message"]
        reasoning = message.get("reasoning_content")
        if reasoning is None:
            reasoning = message.get("reasoning")
        prompt_logprobs = data.get("prompt_logprobs")
        if prompt_logprobs is None:
            prompt_logprobs = choice.get("prompt_logprobs")
        out.append(Completion(
            text=message.get("content") or "",
            reasoning_content=reasoning,
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=_choice_tokens(choice, total, i, len(choices)),
            endpoint=endpoint,
            latency_s=latency_s,
            attempts=attempts,
            model=data.get("model"),
            logprobs=choice.get("logprobs"),
            prompt_logprobs=prompt_logprobs,
        ))
    first = out[0]  # IndexError: no choices, not a completion
    return dataclasses.replace(first, others=tuple(out[1:])) if len(out) > 1 else first


@dataclass(frozen=True)
class StreamTiming:
    """When a streamed answer's tokens came, seconds after the request was sent (choice 0)."""

    #: The first event carrying generated text (or reasoning): the time to the first token.
    first_s: float | None
    #: The last such event.
    last_s: float | None
    #: Gaps between consecutive text events: the inter-token latencies (one event, one token or more).
    gaps: tuple[float, ...]


def assemble_stream(events: Sequence[tuple[float, bytes]]) -> tuple[bytes, StreamTiming]:
    """A streamed chat or text completion (its ``data:`` payloads, each with its arrival) as the
    JSON body the same request would have had without streaming, and choice 0's token timing.
    Deltas are joined per choice (``content``, ``reasoning_content`` / ``reasoning``, ``text``,
    ``logprobs.content``); ``finish_reason``, ``usage`` and ``model`` are taken where sent. Raises
    ValueError when an event is not a JSON object (the caller's "bad response")."""
    choices: dict[int, dict[str, Any]] = {}
    usage: Any = None
    model = None
    arrivals: list[float] = []
    for at, payload in events:
        chunk = json.loads(payload)
        if not isinstance(chunk, dict):
            raise ValueError(f"a streamed event is not a JSON object: {payload[:80]!r}")
        if "error" in chunk and not chunk.get("choices"):
            raise ValueError(f"the stream ended with an error: {str(chunk['error'])[:200]}")
        model = chunk.get("model") or model
        usage = chunk.get("usage") or usage
        for c in chunk.get("choices") or ():
            index = c.get("index", 0)
            into = choices.setdefault(index, {"index": index, "text": [], "content": [], "reasoning": [],
                                              "logprobs": [], "finish_reason": None, "chat": False})
            delta = c.get("delta")
            piece = False
            if isinstance(delta, Mapping):
                into["chat"] = True
                for key, field in (("content", "content"), ("reasoning_content", "reasoning"),
                                   ("reasoning", "reasoning")):
                    if isinstance(delta.get(key), str) and delta[key]:
                        into[field].append(delta[key])
                        piece = True
            if isinstance(c.get("text"), str) and c["text"]:
                into["text"].append(c["text"])
                piece = True
            lp = c.get("logprobs")
            if isinstance(lp, Mapping) and isinstance(lp.get("content"), list):
                into["logprobs"].extend(lp["content"])
            if c.get("finish_reason") is not None:
                into["finish_reason"] = c["finish_reason"]
            if piece and index == 0:
                arrivals.append(at)
    out: list[dict[str, Any]] = []
    for index in sorted(choices):
        c = choices[index]
        logprobs = {"content": c["logprobs"]} if c["logprobs"] else None
        if c["chat"]:
            message = {"role": "assistant", "content": "".join(c["content"]),
                       "reasoning_content": "".join(c["reasoning"]) if c["reasoning"] else None}
            out.append({"index": index, "message": message, "finish_reason": c["finish_reason"], "logprobs": logprobs})
        else:
            out.append({"index": index, "text": "".join(c["text"]), "finish_reason": c["finish_reason"],
                        "logprobs": logprobs})
    body = json.dumps({"model": model, "choices": out, "usage": usage}).encode()
    gaps = tuple(b - a for a, b in zip(arrivals, arrivals[1:]))
    return body, StreamTiming(arrivals[0] if arrivals else None, arrivals[-1] if arrivals else None, gaps)


def _choice_tokens(choice: Mapping[str, Any], total: int | None, index: int, count: int) -> int | None:
    """Tokens of one choice: ``usage.completion_tokens`` for a single choice; for ``n`` > 1 (usage
    counts all choices together) the length of its logprobs when it has them, else an even share."""
    if count == 1 or total is None:
        return total
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, Mapping) and isinstance(logprobs.get("content"), list):
        return len(logprobs["content"])
    return total // count + (1 if index < total % count else 0)


def parse_text(raw: bytes, *, endpoint: str, latency_s: float, attempts: int) -> Completion:
    """A text completion response -> :class:`Completion`. Raises ValueError/KeyError/... if it is not one."""
    data = json.loads(raw)
    choice = data["choices"][0]
    text = choice["text"]
    usage = data.get("usage") or {}
    prompt_logprobs = choice.get("prompt_logprobs")
    if prompt_logprobs is None:
        prompt_logprobs = data.get("prompt_logprobs")
    return Completion(
        text=text or "",
        reasoning_content=None,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        endpoint=endpoint,
        latency_s=latency_s,
        attempts=attempts,
        model=data.get("model"),
        logprobs=choice.get("logprobs"),
        prompt_logprobs=prompt_logprobs,
    )


def model_ids(raw: bytes) -> list[str]:
    """Every model id of a ``/v1/models`` answer, in its order ([] when it lists none)."""
    try:
        data = json.loads(raw)
    except ValueError:
        return []
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list):
        return []
    return [str(m["id"]) for m in models if isinstance(m, dict) and m.get("id")]


def first_model_id(raw: bytes) -> str | None:
    """The first model id of a ``/v1/models`` answer, or None when there is none."""
    try:
        data = json.loads(raw)
        models = data.get("data") if isinstance(data, dict) else None
        if isinstance(models, list) and models and isinstance(models[0], dict):
            model_id = models[0].get("id")
            return str(model_id) if model_id else None
    except ValueError:
        pass
    return None


__all__ = [
    "CHAT_PATH",
    "StreamTiming",
    "assemble_stream",
    "COMPLETIONS_PATH",
    "MODELS_PATH",
    "apply_overrides",
    "base_body",
    "encode",
    "first_model_id",
    "model_ids",
    "parse_chat",
    "parse_text",
]
