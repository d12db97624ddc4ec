"""Generate one item: every assistant turn in order, reasoning kept apart, truncation policy applied.

The result is the JSON stored in the ledger (docs/result-schema.md):

    {"messages": [{"role", "content", "reasoning_content"?}...],
     "turns": [{"finish_reason", "prompt_tokens", "completion_tokens", "endpoint", "latency_s", "attempts"}],
     "model": str, "settings_hash": str}

An empty or whitespace-only answer (once reasoning is set apart) is asked again ``[run]
empty_retries`` times with the same settings; if it stays empty the item fails with class ``empty``
(no text stored): an empty answer is never training data.

Samples (``[sampling] n`` > 1): each sample of an item is an independent full conversation rollout.
The first assistant turn of the samples claimed together is one request with ``n`` where the engine
honours it (the prompt is prefilled once), else one request per sample; every later turn is asked
on that sample's own regenerated history. Token log-probabilities (``[sampling] logprobs``) are
kept per assistant turn of each sample, as one record (ledger/logprobs.py).

This module talks to the client only; it never touches the ledger or the server process. Errors
propagate by type: RequestError (the item is bad), ServerSick (the server is gone).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from harvest.config import VLLM_MAX_LOGPROBS, HarvestConfig, RunConfig, SamplingConfig, engine_logprobs_limit
from harvest.dataset.records import ASSISTANT, Item
from harvest.errors import RequestError
from harvest.ledger.logprobs import TurnLogprobs, encode, from_openai
from harvest.ledger.records import Status

_THINK = re.compile(r"<think>(.*?)(?:</think>|$)\s*", re.DOTALL)


class ChatClient(Protocol):
    """The part of :class:`harvest.client.Client` generation needs (a seam for tests)."""

    async def chat(self, messages: Sequence[dict[str, Any]], **overrides: Any) -> Any: ...

    async def complete(self, prompt: str, **overrides: Any) -> Any: ...


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
    #: Which of the item's samples this is, and its encoded logprob record (ledger/logprobs.py).
    sample: int = 0
    logprobs: bytes | None = None
    #: Streamed (``[client] stream``): the first turn's time to first token and per output token, and
    #: the gaps between tokens over every turn; None / () when not streamed.
    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: tuple[float, ...] = ()


def logprobs_to_ask(config: HarvestConfig) -> int:
    """How many top log-probabilities to ask for ``[sampling] logprobs = k``: k + 1 where the engine
    allows it. vLLM lists the sampled token first and then the top ones, k in all, so at temperature
    > 0 its top k is the sampled token and the top k - 1 (vllm/entrypoints/openai/chat_completion/
    serving.py ``_get_top_logprobs``); one more, sorted (``ledger/logprobs.py`` ``from_openai``),
    is the true top k. At the engine's limit (vLLM's ``max_logprobs``, 20 by default, assumed for an
    endpoint harvest does not launch) it asks k, and the sorted k may hold the sampled token in place
    of the k-th (docs/config.md, ``logprobs``)."""
    k = config.sampling.logprobs
    if not k:
        return 0
    limit = engine_logprobs_limit(config.server)
    cap = limit[0] if limit is not None else (
        VLLM_MAX_LOGPROBS if config.server is None or config.server.engine == "openai" else None)
    return k + 1 if cap is None or k + 1 <= cap else k


def logprob_overrides(sampling: SamplingConfig, ask: int | None = None) -> dict[str, Any]:
    """Request fields that ask for top log-probabilities with token ids (vLLM's
    ``return_tokens_as_token_ids``; llama-server sends ids anyway; servers ignore what they do not
    know): ``ask`` of them (:func:`logprobs_to_ask`), ``[sampling] logprobs`` when not given."""
    if not sampling.logprobs:
        return {}
    return {"logprobs": True, "top_logprobs": ask or sampling.logprobs,
            "extra_body": {"return_tokens_as_token_ids": True}}


def _seed(sampling: SamplingConfig, sample: int) -> dict[str, Any]:
    """Sample ``s`` asked alone gets seed ``seed + s`` (distinct samples under a fixed seed)."""
    return {"seed": sampling.seed + sample} if sampling.seed is not None and sample else {}


async def generate_item(client: ChatClient, item: Item, *, run: RunConfig, sampling: SamplingConfig,
                        settings_hash: str, sample: int = 0, affinity: str | None = None) -> Generated:
    """Regenerate each assistant turn of ``item`` in order, on top of the chosen history."""
    return await _rollout(client, item, None, sample=sample, run=run, sampling=sampling,
                          settings_hash=settings_hash, affinity=affinity)


async def generate_samples(client: ChatClient, item: Item, samples: Sequence[int], *, run: RunConfig,
                           sampling: SamplingConfig, settings_hash: str, one_request: bool,
                           affinity: str | None = None, logprobs_ask: int | None = None
                           ) -> list[Generated | BaseException]:
    """Samples ``samples`` of ``item``, each an independent full rollout of every assistant turn.

    The first turn is shared work: with ``one_request`` (an engine that honours ``n``: vLLM,
    SGLang) it is one request with ``n = len(samples)`` (the prompt is prefilled once), else one
    request per sample with seed ``seed + sample`` when a seed is set. Each sample then continues on
    its own regenerated history (turns 1.. are one request per sample). Returns one entry per
    sample, in order: its :class:`Generated`, or the exception that ended that sample alone
    (RequestError, ServerSick, ...); an error of the shared first request is raised.
    ``logprobs_ask``: top log-probabilities asked per token (:func:`logprobs_to_ask`).
    """
    overrides = logprob_overrides(sampling, logprobs_ask)
    if len(samples) == 1 or not one_request:
        firsts: list[Any] = [None] * len(samples)
    else:
        request = [{"role": m.role, "content": m.content} for m in item.history(0, [])]
        # seed + the first sample's index: samples 2..3 asked again after a resume do not replay
        # the stream that made samples 0..1
        completion = await client.chat(request, n=len(samples), **overrides, **_seed(sampling, samples[0]),
                                       **_route(affinity))
        firsts = list(completion.choices)
        if len(firsts) != len(samples):
            raise RequestError(f"asked for n = {len(samples)} choices, the server sent {len(firsts)}"
                               " (an engine that ignores n: set [sampling] n_per_request = false)")
    results = await asyncio.gather(*(
        _rollout(client, item, first, sample=s, run=run, sampling=sampling, settings_hash=settings_hash,
                 affinity=affinity, logprobs_ask=logprobs_ask)
        for s, first in zip(samples, firsts)), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, Exception):
            raise r  # cancellation and the like are not a sample's own failure
    return list(results)


def _route(affinity: str | None) -> dict[str, Any]:
    """The ``affinity`` keyword of a request, or nothing."""
    return {} if affinity is None else {"affinity": affinity}


async def _rollout(client: ChatClient, item: Item, first: Any, *, sample: int, run: RunConfig,
                   sampling: SamplingConfig, settings_hash: str, affinity: str | None = None,
                   logprobs_ask: int | None = None) -> Generated:
    """Every assistant turn of one sample; ``first``: turn 0's completion when already asked for."""
    # ``affinity``: the item's prefix key, sent with every turn, so the next turn goes to the server
    # that holds the conversation so far (``Client.chat``).
    overrides = {**logprob_overrides(sampling, logprobs_ask), **_seed(sampling, sample), **_route(affinity)}
    replies: list[str] = []
    messages_out: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in item.messages
                                          if m.role == "system"]
    turns: list[dict[str, Any]] = []
    token_logprobs: list[TurnLogprobs] = []
    users = [m.content for m in item.messages if m.role == "user"]
    model: str | None = None
    truncated_at: int | None = None
    prompt_tokens = completion_tokens = requests = 0
    latency = 0.0
    timed: list[Any] = []  # each turn's answer (a client Completion), for its streamed timing
    for k in range(item.turns):
        history = item.history(k, replies if run.history == "regenerated" else None)
        request = [{"role": m.role, "content": m.content} for m in history]
        if k == 0 and first is not None:
            completion = dataclasses.replace(first, others=())
        else:
            completion = await client.chat(request, **overrides)
        requests, latency = requests + completion.attempts, latency + completion.latency_s
        if completion.truncated and run.truncated == "retry":
            larger = run.retry_max_tokens or 2 * sampling.max_tokens
            completion = await client.chat(request, max_tokens=larger, **overrides)
            requests, latency = requests + completion.attempts, latency + completion.latency_s
        for _ in range(run.empty_retries):
            if not _empty(completion.text, run):
                break
            completion = await client.chat(request, **overrides)  # the same settings, asked again
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
                             latency, sample=sample)
        if sampling.logprobs:
            try:
                token_logprobs.append(from_openai(completion.logprobs, sampling.logprobs))
            except (ValueError, KeyError, TypeError) as exc:
                raise RequestError(f"turn {k}: unusable logprobs from {completion.endpoint}: {exc}") from None
        model = completion.model or model
        timed.append(completion)
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
        turns.append(_turn(completion))
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
    record = encode(token_logprobs, sampling.logprobs) if sampling.logprobs and dropped is None else None
    return Generated(output, status, last_reason, prompt_tokens, completion_tokens, attempts, dropped,
                     latency_s=latency, sample=sample, logprobs=record, **_stream_times(timed))


def _turn(completion: Any) -> dict[str, Any]:
    """One turn's record (docs/result-schema.md): how its answer ended and what it cost."""
    turn = {"finish_reason": completion.finish_reason, "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens, "endpoint": completion.endpoint,
            "latency_s": round(completion.latency_s, 4), "attempts": completion.attempts}
    if completion.finish_reason_sent is not None:  # harvest decided the reason by the token count
        turn["finish_reason_sent"] = completion.finish_reason_sent
    if completion.replaced:
        turn["replaced_chars"] = completion.replaced
    return turn


def _stream_times(answers: Sequence[Any]) -> dict[str, Any]:
    """A streamed item's timing: its first turn's TTFT and TPOT, the token gaps of every turn."""
    if not answers:
        return {}
    return {"ttft_s": answers[0].ttft_s, "tpot_s": answers[0].tpot_s,
            "itl_s": tuple(g for c in answers for g in c.itl_s)}


__all__ = ["ChatClient", "Generated", "generate_item", "generate_samples", "logprob_overrides", "logprobs_to_ask",
           "split_reasoning"]
