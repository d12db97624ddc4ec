"""Records the client hands to the runner: one completion, and snapshots of the client's state.

Everything here is a frozen value: built once from a server response or from the client's
counters at one moment, never updated afterwards, and never holding the API key.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any  # log-probabilities kept as the server sent them (JSON)


class EndpointState(str, enum.Enum):
    """Where an endpoint stands in the client's rotation."""

    #: In rotation: requests are dispatched to it.
    HEALTHY = "healthy"
    #: Out of rotation: it refused a connection, answered a run of 5xx or failed a health check. The
    #: client polls its health and puts it back when it answers; requests wait meanwhile, uncharged.
    SICK = "sick"
    #: Out of rotation: requests in flight and nothing back past the bound of its own recent answers,
    #: no generated token counted, while ``/health`` answers (a stuck scheduler or collective). No new
    #: request goes to it; the requests on the wire stay there, and an answer puts it back in
    #: rotation. ``health_deadline`` seconds after it was found hung it is DOWN (a server harvest
    #: launched is relaunched first, after ``hang_deadline``). See :mod:`harvest.client.hang`.
    HUNG = "hung"
    #: Given up: it stayed sick (or hung) past ``health_deadline``. Only :meth:`Client.check_health` brings it
    #: back. When every endpoint is down, requests raise :class:`~harvest.errors.ServerSick`.
    DOWN = "down"


class FailureKind(str, enum.Enum):
    """Why one HTTP exchange failed; the keys of :attr:`ClientStats.errors`."""

    #: No connection could be made (refused, connect timeout, name resolution). The server is sick.
    UNREACHABLE = "unreachable"
    #: The connection broke after the request was sent (reset, closed, truncated body).
    INTERRUPTED = "interrupted"
    #: ``request_timeout`` passed before the response was complete.
    TIMEOUT = "timeout"
    #: 408 / 409 / 425 / 429: the server is alive and asks to come back later.
    BUSY = "busy"
    #: Any 5xx.
    SERVER_ERROR = "server_error"
    #: A 2xx whose body is not a completion (not JSON, no choices, a field of another type).
    BAD_RESPONSE = "bad_response"
    #: The answer passed its cap (``[client] reply_bytes_per_token``): nothing of it is kept.
    OVERSIZED = "oversized"
    #: What came back is not a valid HTTP message (bad status line, too many or too long headers,
    #: bad chunking, duplicate Content-Length), or not HTTP at all.
    PROTOCOL = "protocol"
    #: A 3xx: the endpoint answers elsewhere. Never followed; the job's configuration is wrong.
    REDIRECT = "redirect"
    #: Any other 4xx: the item's fault; raised at once as :class:`~harvest.errors.RequestError`.
    REJECTED = "rejected"
    #: On the wire to an endpoint that was given up (hung, then down): held for another, uncharged.
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class Completion:
    """One generated answer and where and how it was obtained."""

    #: The generated text (``message.content`` for chat, ``text`` for text completions); "" if null.
    text: str
    #: ``message.reasoning_content`` (SGLang, vLLM < 0.10) or ``message.reasoning`` (newer vLLM);
    #: None when the server sent neither (no reasoning parser, or a text completion).
    reasoning_content: str | None
    #: "stop", "length", ... as the server said; when it said nothing or a reason harvest does not
    #: know, "length" if the answer's tokens reached max_tokens (see ``finish_reason_sent``).
    finish_reason: str | None
    #: Token counts from ``usage`` (the completion's own count where usage has none); None when
    #: unknown: not sent, or not an integer in range (never stored as sent).
    prompt_tokens: int | None
    completion_tokens: int | None
    #: Base URL of the endpoint that answered.
    endpoint: str
    #: Seconds from sending the successful request to having its whole body.
    latency_s: float
    #: Attempts charged to this item, the successful one included (held requests are not charged).
    attempts: int = 1
    #: The model name the server reported.
    model: str | None = None
    #: ``choices[0].logprobs`` exactly as sent, when ``logprobs`` was asked for.
    logprobs: Any = None
    #: vLLM ``prompt_logprobs`` (response or choice level) exactly as sent, when asked for.
    prompt_logprobs: Any = None
    #: The request's other choices (``n`` > 1), in index order; this record is choice 0.
    others: tuple[Completion, ...] = ()
    #: Streamed (``[client] stream = true``): seconds from sending the successful request to its first
    #: token (TTFT), the mean seconds per output token after it (TPOT: (last - first) / (tokens - 1)),
    #: and the gaps between the token events (ITL). None / () when not streamed.
    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: tuple[float, ...] = ()
    #: What the endpoint sent as finish_reason when harvest decided otherwise (it sent none, "", or
    #: one it does not know, and the token count was at max_tokens; or an odd type): as text. None
    #: when ``finish_reason`` is the endpoint's own.
    finish_reason_sent: str | None = None
    #: Characters of the reply replaced by U+FFFD to make its text valid Unicode (lone surrogates,
    #: bytes that are not UTF-8).
    replaced: int = 0

    @property
    def choices(self) -> tuple[Completion, ...]:
        """Every choice of the request: this one, then :attr:`others`."""
        return (self, *self.others)

    @property
    def truncated(self) -> bool:
        """True when generation stopped at ``max_tokens`` (``finish_reason == "length"``)."""
        return self.finish_reason == "length"


@dataclass(frozen=True)
class EndpointStats:
    """One endpoint at one moment."""

    url: str
    state: EndpointState
    #: Requests sent to it and not yet answered.
    outstanding: int
    #: Successful completions it has returned.
    completed: int
    #: Failures since its last successful answer (the "run" that makes it sick).
    consecutive_failures: int
    #: The last failure it produced, as text without secrets; None if none yet.
    last_error: str | None = None
    #: Its own bound of requests in flight (``concurrency = "auto"``'s current target); None when
    #: the client's one fixed concurrency bounds all endpoints together.
    target: int | None = None
    #: ``time.monotonic()`` when its current failure run began (None while it answers): a sick
    #: endpoint is DOWN ``health_deadline`` seconds after it.
    failing_since: float | None = None
    #: Seconds it has had requests in flight without sending anything back (None when idle), and
    #: the spell after which that counts as not answering (max(30 s, 3 x its p90 latency)).
    quiet_s: float | None = None
    hung_after_s: float | None = None
    #: Found hung (state HUNG, or DOWN after it): the seconds it had sent nothing back when found;
    #: None when it was not hung.
    hung_s: float | None = None

    @property
    def hung(self) -> bool:
        """Requests in flight and nothing back for longer than ``hung_after_s``."""
        return self.quiet_s is not None and self.hung_after_s is not None and self.quiet_s > self.hung_after_s


@dataclass(frozen=True)
class ClientStats:
    """The client at one moment: what is in flight, what waits, what failed and why."""

    #: Requests on the wire now, all endpoints together.
    in_flight: int
    #: Requests held because no endpoint is healthy (not charged to their items).
    held: int
    #: Completions returned.
    completed: int
    #: Charged retries (attempts beyond the first) made so far.
    retries: int
    #: Failed exchanges by :class:`FailureKind` value, including those later retried successfully.
    errors: dict[str, int] = field(default_factory=dict)
    endpoints: tuple[EndpointStats, ...] = ()


__all__ = ["ClientStats", "Completion", "EndpointState", "EndpointStats", "FailureKind"]
