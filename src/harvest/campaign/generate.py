"""Generate one item: every assistant turn in order, reasoning kept apart, truncation policy applied.

The result is the JSON stored in the ledger (docs/result-schema.md):

    {"messages": [{"role", "content", "reasoning_content"?}...],
     "turns": [{"finish_reason", "prompt_tokens", "completion_tokens", "endpoint", "latency_s", "attempts"}],
     "model": str, "settings_hash": str}

An empty or whitespace-only answer (once reasoning is set apart) is asked again ``[run]
empty_retries`` times with the same settings; if it stays empty the item fails with class ``empty``
(no text stored): an empty answer is never training data.

This module talks to the client only; it never touches the ledger or the server process. Errors
propagate by type: RequestError (the item is bad), ServerSick (the server is gone).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from harvest.config import RunConfig, SamplingConfig
from harvest.dataset.records import ASSISTANT, Item
from harvest.ledger.records import Status

_THINK = re.compile(r"<think>(.*?)(?:</think>|$)\s*", re.DOTALL)


class ChatClient(Protocol):
    """The part of :class:`harvest.client.Client` generation needs (a seam for tests)."""

    async def chat(self, messages: Sequence[dict[str, Any]], **overrides: Any) -> Any: ...


def _empty(text: str, run: RunConfig) -> bool:
    """An answer with nothing but white space once reasoning is set apart is no answer."""
    if run.reasoning != "none":
        text, _ = split_reasoning(text, None)
    return not text.strip()


def split_reasoning(text: str, reasoning: str | None) -> tuple[str, str | None]:
    """Separate reasoning from the answer: the server's field wins, else ``<think>`` blocks in text."""
    if reasoning is not None:
        return _THINK.sub("", text).strip() if "<think>" in text else text, reasoning
    found = _THINK.findall(text)
    if not found:
        # A server whose template opened <think> in the prompt sends only the closing tag.
        head, sep, tail = text.partition("</think>")
        if sep:
            return tail.lstrip(), head.strip()
        return text, None
    return _THINK.sub("", text).lstrip(), "\n\n".join(part.strip() for part in found)


@dataclass(frozen=True)
class Generated:
    """What generating one item produced, ready for the ledger."""

    output: dict[str, Any]
    status: Status
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    attempts: int
    #: Set when the item is failed instead of stored: the reason (truncation policy "drop", or an
    #: answer that stayed empty); ``drop_class`` is the failure's error class.
    dropped: str | None = None
    drop_class: str = "truncated"
    #: Seconds the item's requests spent on the wire (each from being sent to its answer), summed:
    #: the item's latency without its wait in harvest's own queue.
    latency_s: float = 0.0


async def generate_item(client: ChatClient, item: Item, *, run: RunConfig, sampling: SamplingConfig,
                        settings_hash: str) -> Generated:
    """Regenerate each assistant turn of ``item`` in order, on top of the chosen history."""
    replies: list[str] = []
    messages_out: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in item.messages
                                          if m.role == "system"]
    turns: list[dict[str, Any]] = []
    users = [m.content for m in item.messages if m.role == "user"]
    model: str | None = None
    truncated_at: int | None = None
    prompt_tokens = completion_tokens = requests = 0
    latency = 0.0
    for k in range(item.turns):
        history = item.history(k, replies if run.history == "regenerated" else None)
        request = [{"role": m.role, "content": m.content} for m in history]
        completion = await client.chat(request)
        requests, latency = requests + completion.attempts, latency + completion.latency_s
        if completion.truncated and run.truncated == "retry":
            larger = run.retry_max_tokens or 2 * sampling.max_tokens
            completion = await client.chat(request, max_tokens=larger)
            requests, latency = requests + completion.attempts, latency + completion.latency_s
        for _ in range(run.empty_retries):
            if not _empty(completion.text, run):
                break
            completion = await client.chat(request)  # the same settings, asked again
            requests, latency = requests + completion.attempts, latency + completion.latency_s
        # One attempt of the item asks each turn once; every further request is another attempt.
        attempts = requests - k
        if _empty(completion.text, run):
            asked = 1 + run.empty_retries
            why = (f"empty answer at turn {k} (finish_reason={completion.finish_reason}, "
                   f"{completion.completion_tokens} tokens; asked {asked} time{'s' if asked > 1 else ''})")
            return Generated({}, Status.FAILED, completion.finish_reason,
                             prompt_tokens + (completion.prompt_tokens or 0),
                             completion_tokens + (completion.completion_tokens or 0), attempts, why, "empty",
                             latency)
        model = completion.model or model
        text, reasoning = completion.text, completion.reasoning_content
        if run.reasoning != "none":
            text, reasoning = split_reasoning(text, reasoning)
        reply: dict[str, Any] = {"role": ASSISTANT, "content": text}
        if run.reasoning == "save" and reasoning is not None:
            reply["reasoning_content"] = reasoning
        elif run.reasoning == "none" and reasoning is not None:
            reply["reasoning_content"] = reasoning
        messages_out.append({"role": "user", "content": users[k]})
        messages_out.append(reply)
        replies.append(text)
        turns.append({"finish_reason": completion.finish_reason, "prompt_tokens": completion.prompt_tokens,
                      "completion_tokens": completion.completion_tokens, "endpoint": completion.endpoint,
                      "latency_s": round(completion.latency_s, 4), "attempts": completion.attempts})
        prompt_tokens += completion.prompt_tokens or 0
        completion_tokens += completion.completion_tokens or 0
        if completion.truncated and truncated_at is None:
            truncated_at = k
    output = {"messages": messages_out, "turns": turns, "model": model, "settings_hash": settings_hash}
    last_reason = turns[-1]["finish_reason"] if turns else None
    status = Status.TRUNCATED if truncated_at is not None else Status.DONE
    dropped = None
    if truncated_at is not None and run.truncated == "drop":
        dropped = f"finish_reason=length at turn {truncated_at} (max_tokens {sampling.max_tokens})"
    attempts = requests - max(item.turns - 1, 0)
    return Generated(output, status, last_reason, prompt_tokens, completion_tokens, attempts, dropped,
                     latency_s=latency)


__all__ = ["ChatClient", "Generated", "generate_item", "split_reasoning"]
