"""Pure decisions of the client: what a status means, how long to back off, what the server said,
and the knobs of backoff and sickness (:class:`RetryPolicy`).

Nothing here does I/O or keeps state between calls; the client calls these and acts. Statuses are
classified by number and error messages are read from the JSON shapes OpenAI-compatible servers
use, never by matching words in a message.
"""

from __future__ import annotations

import email.utils
import json
import random
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from http import HTTPStatus

from harvest.client.records import FailureKind
from harvest.transport import Interrupted, Oversized, TimedOut, TransportError, Unreachable

#: Statuses that mean "alive but come back later": retried with backoff, honouring Retry-After.
BUSY_STATUSES = frozenset({408, 409, 425, 429})

#: The longest Retry-After honoured, in seconds; a larger value is clipped to this.
MAX_RETRY_AFTER_S = 300.0

#: How much of a server's error message is kept.
MAX_MESSAGE_CHARS = 2000


#: Failures that belong to the answer, not to the server's health: charged to the item at once
#: (retried while its attempts last), never a reason to find the endpoint sick.
REPLY_KINDS = frozenset({FailureKind.BUSY, FailureKind.BAD_RESPONSE, FailureKind.OVERSIZED, FailureKind.PROTOCOL})

#: The item's failure class (the ledger's ``error_class``) of the kinds that name what the answer
#: was; the others are classed by their status (``http_500``), or ``request``.
ITEM_CLASSES = {FailureKind.BAD_RESPONSE: "bad_reply", FailureKind.OVERSIZED: "oversized",
                FailureKind.PROTOCOL: "protocol", FailureKind.REDIRECT: "redirect"}


def classify_status(status: int) -> FailureKind | None:
    """None for a success (2xx); otherwise the kind of failure the status means."""
    if 200 <= status < 300:
        return None
    if status in BUSY_STATUSES:
        return FailureKind.BUSY
    if status >= 500:
        return FailureKind.SERVER_ERROR
    if 300 <= status < 400:
        return FailureKind.REDIRECT
    if status < 200:  # an informational status as the final answer: not HTTP as a client may take it
        return FailureKind.PROTOCOL
    return FailureKind.REJECTED


def transport_failure(exc: TransportError) -> FailureKind:
    """The kind of failure a transport exception is (by type)."""
    if isinstance(exc, Unreachable):
        return FailureKind.UNREACHABLE
    if isinstance(exc, TimedOut):
        return FailureKind.TIMEOUT
    if isinstance(exc, Interrupted):
        return FailureKind.INTERRUPTED
    if isinstance(exc, Oversized):
        return FailureKind.OVERSIZED
    return FailureKind.PROTOCOL  # Malformed: not a valid HTTP answer


def redirect_message(status: int, location: str | None) -> str:
    """What a 3xx says about the job's configuration (harvest never follows one)."""
    if not location:
        return f"the endpoint answered with a redirect ({status}) and no Location: check [server] base_url"
    shown = location if len(location) <= 300 else location[:300] + "..."
    return (f"the endpoint redirects to {shown} (harvest never follows a redirect: the key is not sent to "
            f"another target); if that is the endpoint, use that URL as base_url (without the /v1/... path)")


def backoff_delay(attempt: int, *, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait before retry number ``attempt`` (1 = first retry): exponential, equal jitter.

    The ceiling doubles from ``base`` up to ``cap``; the delay is drawn from [ceiling / 2, ceiling],
    so retries never bunch up at zero and never exceed the cap.
    """
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None if absent or bad."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - (now or datetime.now(timezone.utc))).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


def error_message(status: int, body: bytes) -> str:
    """The server's own explanation of a failed request, from the body's usual JSON shapes.

    Understood: ``{"error": {"message": ...}}`` (OpenAI, vLLM), ``{"error": "..."}``,
    ``{"message": ...}`` (SGLang, vLLM's ErrorResponse), ``{"detail": "..."}`` and FastAPI's
    ``{"detail": [{"loc": [...], "msg": ...}]}``. Anything else: the body as text, or the status's
    reason phrase when the body is empty.
    """
    text = body.decode("utf-8", errors="replace").strip()
    message = None
    if text[:1] in ("{", "["):
        try:
            message = _message_from_json(json.loads(text))
        except (ValueError, RecursionError):  # RecursionError: a body of nested brackets
            message = None
    if not message:
        message = text
    if not message:
        try:
            message = HTTPStatus(status).phrase
        except ValueError:
            message = "no message"
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    return message


def _message_from_json(data: object) -> str | None:
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if isinstance(error, dict):
        inner = error.get("message")
        if inner:
            return str(inner)
    elif isinstance(error, str) and error:
        return error
    if data.get("message"):
        return str(data["message"])
    detail = data.get("detail")
    if isinstance(detail, str) and detail:
        return detail
    if isinstance(detail, list) and detail:
        parts = []
        for entry in detail:
            if isinstance(entry, dict) and "msg" in entry:
                loc = entry.get("loc")
                where = ".".join(str(p) for p in loc) if isinstance(loc, (list, tuple)) else ""
                parts.append(f"{where}: {entry['msg']}" if where else str(entry["msg"]))
            else:
                parts.append(str(entry))
        return "; ".join(parts)
    return None


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` and every URL password replaced by ``***``
    (servers echo bad keys), terminal control characters escaped (it reaches the console) and lone
    surrogates replaced (a server's ``"\\ud800"`` would fail the ledger write of the item's error)."""
    from harvest.redact import escape_controls, redact_text

    return _SURROGATE.sub("\ufffd", escape_controls(redact_text(text, [secret] if secret else [])))


_SURROGATE = re.compile("[\ud800-\udfff]")



@dataclass(frozen=True)
class RetryPolicy:
    """Knobs of backoff and sickness detection that ClientConfig does not expose."""

    #: Consecutive server-side failures on one endpoint that make it sick even if /health says OK.
    sick_after: int = 3
    #: First backoff ceiling in seconds; it doubles per charged retry up to ``backoff_cap``.
    backoff_base: float = 0.5
    backoff_cap: float = 30.0
    #: First pause between health polls of a sick endpoint; doubles up to ``health_interval_cap``.
    health_interval: float = 0.5
    health_interval_cap: float = 5.0
    #: Timeout of one health probe (and of model discovery).
    probe_timeout: float = 10.0
    #: Times one request may be on the wire when its server goes down (a failed health check right
    #: after). Such requests are held, not charged, but a request present at this many outages is
    #: suspected of crashing the server and fails as a RequestError, so one poison prompt cannot
    #: crash a restarted server forever.
    max_outages: int = 3
    #: The shortest quiet spell (requests in flight, nothing back) judged as a hang, and the pause
    #: between two looks for one (:mod:`harvest.client.hang`).
    hang_floor: float = 30.0
    hang_interval: float = 2.0

    def __post_init__(self) -> None:
        if self.sick_after < 1 or self.max_outages < 1:
            raise ValueError("sick_after and max_outages must be >= 1")
        for name in ("backoff_base", "backoff_cap", "health_interval", "health_interval_cap", "probe_timeout",
                     "hang_floor", "hang_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")


__all__ = [
    "BUSY_STATUSES",
    "ITEM_CLASSES",
    "MAX_RETRY_AFTER_S",
    "REPLY_KINDS",
    "RetryPolicy",
    "backoff_delay",
    "classify_status",
    "error_message",
    "parse_retry_after",
    "redact",
    "redirect_message",
    "transport_failure",
]
