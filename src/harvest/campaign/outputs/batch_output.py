"""The body of an OpenAI batch row's answer in a batch output file (``harvest export --format
openai-batch``), from the result ``campaign/run/batchrow.py`` stored: a ``chat.completion`` or a
``text_completion`` with every choice, each with its log-probabilities as the engine sent them.
Reads a stored result only; raises :class:`MalformedResult` for one outside docs/result-schema.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any


class MalformedResult(ValueError):
    """A stored result that does not follow docs/result-schema.md (the row is reported, not written)."""


def hex_id(kind: str, item_id: str) -> str:
    """A stable id of ``kind`` for an item: the same on every export."""
    return hashlib.blake2b(f"{kind}\0{item_id}".encode(), digest_size=12).hexdigest()


def batch_body(item_id: str, out: Mapping[str, Any], *, created: float | None, settings_hash: str | None) -> dict[str, Any]:
    """A batch row's answer: a ``chat.completion`` or a ``text_completion`` with every choice."""
    batch = out["batch"]
    chat = batch.get("url") == "/v1/chat/completions"
    choices = []
    for c in batch.get("choices") or ():
        if not (isinstance(c, Mapping) and isinstance(c.get("text"), str) and isinstance(c.get("index"), int)):
            raise MalformedResult("batch.choices holds an entry without index and text")
        choice: dict[str, Any] = {"index": c["index"]}
        if chat:
            message = {"role": "assistant", "content": c["text"]}
            if isinstance(c.get("reasoning_content"), str):
                message["reasoning_content"] = c["reasoning_content"]
            choice["message"] = message
        else:
            choice["text"] = c["text"]
        choice["logprobs"] = c.get("logprobs")
        choice["finish_reason"] = c.get("finish_reason")
        choices.append(choice)
    if not choices:
        raise MalformedResult("batch.choices is empty")
    usage = batch.get("usage") if isinstance(batch.get("usage"), Mapping) else {}
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    kind = "chatcmpl" if chat else "cmpl"
    return {
        "id": f"{kind}-{hex_id(kind, item_id)}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(created or 0),
        "model": out.get("model") if isinstance(out.get("model"), str) else "",
        "system_fingerprint": settings_hash or out.get("settings_hash"),
        "choices": choices,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


__all__ = ["MalformedResult", "batch_body", "hex_id"]
