"""Streamed answers (``[client] stream = true``): a request sent with ``stream: true`` (usage
included), its server-sent events assembled into the body the same request would have had
unstreamed (``protocol.assemble_stream``), and when its tokens came: the time to the first token
(TTFT), the time per output token after it (TPOT) and the gaps between token events (ITL), all from
the request's send. Everything else about the request (retries, who pays for a failure) is the
client's, unchanged: this module never retries and never decides a failure's kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any  # JSON request bodies: the server owns their shape

from harvest.client import protocol
from harvest.client.records import Completion
from harvest.transport import RawResponse, Transport


@dataclass(frozen=True)
class TimedResponse(RawResponse):
    """A streamed answer as the unstreamed body, and when its tokens came (choice 0)."""

    timing: protocol.StreamTiming | None = None


def request_body(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """``body`` asking for a streamed answer with its usage (vLLM, SGLang: ``stream_options``)."""
    return {**body, "stream": True, "stream_options": {"include_usage": True}} if stream else body


async def post(transport: Transport, url: str, data: bytes, headers: Mapping[str, str], timeout: float,
               stream: bool) -> RawResponse:
    """One POST; streamed, its events assembled (an error status keeps its body, the error text)."""
    if not stream:
        return await transport.request("POST", url, body=data, headers=headers, timeout=timeout)
    answer = await transport.stream(url, body=data, headers=headers, timeout=timeout)
    if answer.status != 200:
        return RawResponse(answer.status, answer.body, answer.retry_after)
    try:
        body, timing = protocol.assemble_stream(answer.events)
    except ValueError as exc:  # the caller's parse of this text names it a bad response
        return RawResponse(answer.status, str(exc).encode())
    return TimedResponse(answer.status, body, timing=timing)


def timed(completion: Completion, response: RawResponse) -> Completion:
    """``completion`` with its stream's TTFT, TPOT ((last - first) / (tokens - 1)) and gaps, when
    ``response`` was streamed; else as it is."""
    timing = response.timing if isinstance(response, TimedResponse) else None
    if timing is None:
        return completion
    tokens = completion.completion_tokens
    tpot = None
    if timing.first_s is not None and timing.last_s is not None and tokens is not None and tokens > 1:
        tpot = (timing.last_s - timing.first_s) / (tokens - 1)
    return dataclasses.replace(completion, ttft_s=timing.first_s, tpot_s=tpot, itl_s=timing.gaps)


__all__ = ["TimedResponse", "post", "request_body", "timed"]
