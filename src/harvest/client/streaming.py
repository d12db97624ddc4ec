"""Streamed answers (``[client] stream = true``): a request sent with ``stream: true`` (usage
included), its server-sent events handed as they arrive to a :class:`~harvest.client.replies.StreamAssembler`
that joins them into the answer the same request would have had unstreamed and times its tokens: the
time to the first token (TTFT), the time per output token after it (TPOT) and the gaps between token
events (ITL), all from the request's send. Nothing of the raw stream is kept, and the stream is cut
at the request's max_tokens (``client/replies.py``). Everything else about the request (retries, who
pays for a failure) is the client's, unchanged: this module never retries and never decides a
failure's kind.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any  # JSON request bodies: the server owns their shape

from harvest.client.replies import ReplyLimits, StreamAssembler, StreamedReply
from harvest.transport import RawResponse, Transport

#: A streamed line may be a whole answer (a server that sends it as one event) and its framing.
LINE_FRAMING = 4096


def request_body(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """``body`` asking for a streamed answer with its usage (vLLM, SGLang: ``stream_options``)."""
    return {**body, "stream": True, "stream_options": {"include_usage": True}} if stream else body


def post(transport: Transport, url: str, data: bytes, headers: Mapping[str, str], timeout: float,
         stream: bool, limits: ReplyLimits) -> Awaitable[RawResponse]:
    """One POST within ``limits``, to be awaited; streamed, its events assembled as they come (a
    :class:`StreamedReply`; an error status keeps its body, the error text). Unstreamed, the
    transport's own request (no coroutine around it: each one costs every request CPU)."""
    if not stream:
        return transport.request("POST", url, body=data, headers=headers, timeout=timeout, max_bytes=limits.body_bytes)
    return _streamed(transport, url, data, headers, timeout, limits)


async def _streamed(transport: Transport, url: str, data: bytes, headers: Mapping[str, str], timeout: float,
                    limits: ReplyLimits) -> RawResponse:
    assembler = StreamAssembler(limits)
    answer = await transport.stream(url, body=data, sink=assembler, headers=headers, timeout=timeout,
                                    max_bytes=limits.stream_bytes, max_line=limits.body_bytes + LINE_FRAMING)
    if answer.status != 200:
        return RawResponse(answer.status, answer.body, answer.retry_after, answer.location)
    return StreamedReply(answer.status, b"", assembled=assembler)


__all__ = ["post", "request_body"]
