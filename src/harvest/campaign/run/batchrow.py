"""Generate one OpenAI batch row: its one request, sent as the row asks, kept whole for the export.

A batch row (``Item.request``, dataset/batch.py) is one request, as the batch API runs it: the
row's messages (or prompt) as given, its body's fields on top of the job's ``[sampling]`` (the row
wins, field by field), every choice of its ``n`` kept with its finish reason and its log-probabilities
as the engine sent them. Nothing of harvest's conversation handling applies: no regenerated history,
no ``[run] truncated`` retry, no empty-answer retry, no reasoning split (what the engine sent as
reasoning is kept beside the text). The stored result (docs/result-schema.md) adds ``batch``:

    {"url", "choices": [{"index", "text", "reasoning_content"?, "finish_reason", "logprobs"}],
     "usage": {"prompt_tokens", "completion_tokens"}}

from which ``harvest export --format openai-batch`` writes the response body. Errors propagate by
type, as for any item: RequestError (the row is bad), ServerSick (the server is gone).
"""

from __future__ import annotations

from typing import Any

from harvest.campaign.run.generate import ChatClient, Generated
from harvest.dataset.records import ASSISTANT, Item
from harvest.ledger.records import Status


async def generate_request(client: ChatClient, item: Item, *, settings_hash: str,
                           affinity: str | None = None) -> Generated:
    """Send ``item``'s own request once and keep every choice of the answer."""
    request = item.request
    assert request is not None, "generate_request is for batch rows"
    overrides: dict[str, Any] = request.overrides()
    if affinity is not None:
        overrides["affinity"] = affinity
    if request.chat:
        messages = [{"role": m.role, "content": m.content} for m in item.messages]
        completion = await client.chat(messages, **overrides)
    else:
        completion = await client.complete(request.prompt or "", **overrides)
    choices = completion.choices
    out_choices = []
    for index, choice in enumerate(choices):
        one: dict[str, Any] = {"index": index, "text": choice.text, "finish_reason": choice.finish_reason,
                               "logprobs": choice.logprobs}
        if choice.reasoning_content is not None:
            one["reasoning_content"] = choice.reasoning_content
        out_choices.append(one)
    prompt = completion.prompt_tokens or 0
    generated = sum(c.completion_tokens or 0 for c in choices)
    reply: dict[str, Any] = {"role": ASSISTANT, "content": completion.text}
    if completion.reasoning_content is not None:
        reply["reasoning_content"] = completion.reasoning_content
    turn = {"finish_reason": completion.finish_reason, "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": generated, "endpoint": completion.endpoint,
            "latency_s": round(completion.latency_s, 4), "attempts": completion.attempts}
    output = {"messages": [{"role": m.role, "content": m.content} for m in item.messages] + [reply],
              "turns": [turn], "model": completion.model, "settings_hash": settings_hash,
              "batch": {"url": request.url, "choices": out_choices,
                        "usage": {"prompt_tokens": prompt, "completion_tokens": generated}}}
    truncated = any(c.truncated for c in choices)
    return Generated(output, Status.TRUNCATED if truncated else Status.DONE,
                     "length" if truncated else completion.finish_reason, prompt, generated,
                     completion.attempts, latency_s=completion.latency_s, ttft_s=completion.ttft_s,
                     tpot_s=completion.tpot_s, itl_s=completion.itl_s)


async def generate_rows(client: ChatClient, item: Item, *, settings_hash: str,
                        affinity: str | None = None) -> list[Generated | BaseException]:
    """:func:`generate_request` as the dispatch loop's samples of one item (a batch row has one)."""
    return [await generate_request(client, item, settings_hash=settings_hash, affinity=affinity)]


__all__ = ["generate_request", "generate_rows"]
