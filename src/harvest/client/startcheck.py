"""The start check of a run's endpoints: what model each one serves, and whether it answers at all.

Before any item is sent, each endpoint is asked ``GET /v1/models``. What comes back decides:

    a model list (2xx, JSON with ``data``)    the configured name is checked against it (the caller
                                              refuses one that is not listed)
    anything else that is an answer           the endpoint is up but cannot list its models: a 5xx
      (4xx, 5xx, a body that is no list,      (``transformers serve`` answers 500 while it scans the
      no answer within the probe timeout)     Hugging Face cache), a 404 (no such route), a proxy's
                                              page. Its ``GET /health`` is asked; where that does not
                                              answer 2xx, one request of one token is. Either
                                              answering shows the endpoint up, and the model is
                                              checked by that first answer (:func:`first_answer`):
                                              the engine's own 401/403/404 text is what the caller
                                              shows, nothing is charged to any item
    refused connections, or neither /health   down: only this, and only once ``[client]
      nor the request ever answers            start_deadline`` passed, names what it last gave
    what is not valid HTTP (an SSH server's   down at once (``Listing.malformed``: what it sent): a
      banner on a wrong port, a bad head)     base URL that points at something else, not a wait

So an endpoint is never "down" because it cannot list its models, and a wrong model name on such
an endpoint is found by one request, not by a dataset of failures.

This module sends no item, never changes an endpoint's health state, and never waits past the
deadline it is given.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from harvest.client import protocol, replies
from harvest.client.endpoints import endpoint_url
from harvest.client.policy import error_message
from harvest.transport import Malformed, RawResponse, TimedOut, Transport, TransportError, Unreachable

#: The content of the one-token request that checks an endpoint whose model list cannot be read.
FIRST_PROMPT = "Say OK."

#: Statuses of a first answer that say the job is wrong for this endpoint (the key, the model
#: name or the path): the run stops before any item is sent, with the engine's own text.
REFUSING = (401, 403, 404)
#: The least time a probe is given, even past the deadline: a refused connection shows at once, and a
#: loaded machine may not run the connect's callback within a tenth of a second.
PROBE_FLOOR_S = 0.5


@dataclass(frozen=True)
class FirstAnswer:
    """The answer to the one-token request: its HTTP status (None: no answer in time) and the
    engine's own message when it is an error."""

    status: int | None
    message: str = ""

    @property
    def answered(self) -> bool:
        """Whether an HTTP answer that is not a server error came back (the endpoint is up)."""
        return self.status is not None and self.status < 500

    @property
    def refused(self) -> bool:
        """Whether the engine refused the job itself: the key, the model or the path."""
        return self.status in REFUSING


@dataclass(frozen=True)
class Listing:
    """What the start check learnt of one endpoint."""

    url: str
    #: The model ids it lists; None when no list could be read.
    ids: tuple[str, ...] | None
    #: Whether it answered at all (a list, ``/health`` 2xx, or an answer to the one-token request).
    up: bool
    #: What ``GET /v1/models`` gave when it gave no list ("answered 500", "answered 200 without a
    #: model list", "gave no answer within 10 s", "refused the connection"); None with a list.
    models_answer: str | None = None
    #: How the endpoint showed it is up without a list ("/health answered 200", "a first request
    #: answered 200"); None with a list or when down.
    shown_by: str | None = None
    #: The first answer, when the one-token request was sent.
    first: FirstAnswer | None = None
    #: What it answered that is not valid HTTP (an SSH banner on a wrong port), quoted; None else.
    malformed: str | None = None

    def warning(self, model: str | None) -> str | None:
        """The one line a person sees when the list could not be read, or None."""
        if self.ids is not None or not self.up:
            return None
        asked = f"asking for {model!r} as configured" if model else "requests name no model"
        return f"{self.url}: GET /v1/models {self.models_answer}; {asked} ({self.shown_by})"


def _describe(response: RawResponse | None, why: str | None) -> str:
    if response is None:
        return why or "gave no answer"
    if 200 <= response.status < 300:
        return f"answered {response.status} without a model list"
    return f"answered {response.status}"


def _listed(response: RawResponse) -> tuple[str, ...] | None:
    """The ids of a 2xx model list, or None when the body is not one."""
    if not 200 <= response.status < 300:
        return None
    return replies.model_ids(response.body)


class _NotHttp(Exception):
    """An endpoint answered with what is not valid HTTP (inside this module only)."""


class StartCheck:
    """Asks each endpoint what it serves, within one deadline for all (the caller's ``[client]
    start_deadline``). ``model``: the name requests will carry (None: the first listed, or none)."""

    def __init__(self, transport: Transport, headers: Mapping[str, str], *, probe_timeout: float,
                 clock: Callable[[], float], sleep: Callable[[float], Awaitable[object]]):
        self._transport = transport
        self._headers = dict(headers)
        self._probe_timeout = probe_timeout
        self._clock, self._sleep = clock, sleep

    async def _get(self, url: str, timeout: float) -> tuple[RawResponse | None, str | None]:
        try:
            return await self._transport.request("GET", url, headers=self._headers, timeout=timeout,
                                                 max_bytes=replies.PROBE_BYTES), None
        except Unreachable:
            return None, "refused the connection"
        except TimedOut:
            return None, f"gave no answer within {timeout:g} s"
        except Malformed as exc:
            raise _NotHttp(str(exc)) from None
        except TransportError as exc:
            return None, f"broke off ({type(exc).__name__}: {exc})"

    async def first_answer(self, url: str, model: str | None, timeout: float) -> FirstAnswer:
        """One chat request of one token to ``url`` (an endpoint base URL): is it answered, and if
        refused, with what message. Not an item: never retried, never counted."""
        body: dict[str, object] = {"messages": [{"role": "user", "content": FIRST_PROMPT}], "max_tokens": 1}
        if model:
            body["model"] = model
        try:
            response = await self._transport.request("POST", endpoint_url(url, protocol.CHAT_PATH),
                                                     body=protocol.encode(body), headers=self._headers,
                                                     timeout=timeout, max_bytes=replies.PROBE_BYTES)
        except TransportError:
            return FirstAnswer(None)
        if 200 <= response.status < 300:
            return FirstAnswer(response.status)
        return FirstAnswer(response.status, error_message(response.status, response.body))

    async def endpoint(self, url: str, model: str | None, deadline_s: float,
                       on_wait: Callable[[str, float, str], None] | None = None) -> Listing:
        """Ask one endpoint until it lists its models, shows it is up without a list, or
        ``deadline_s`` seconds (from now) pass. ``on_wait(url, waited_s, what_came_back)`` is
        called between tries."""
        start = self._clock()
        last = "gave no answer"
        while True:
            left = deadline_s - (self._clock() - start)
            try:
                response, why = await self._get(endpoint_url(url, protocol.MODELS_PATH),
                                                max(PROBE_FLOOR_S, min(self._probe_timeout, left)))
            except _NotHttp as exc:  # not a server to wait for: something else listens there
                return Listing(url, None, False, f"answered with {exc}", malformed=str(exc))
            ids = _listed(response) if response is not None else None
            if ids is not None:
                return Listing(url, ids, True)
            last = _describe(response, why)
            shown = await self._shown_up(url, model, start, deadline_s, last)
            if shown is not None:
                return shown
            waited = self._clock() - start
            if waited >= deadline_s:
                return Listing(url, None, False, last)
            if on_wait is not None:
                on_wait(url, waited, last)
            await self._sleep(min(1.0, max(deadline_s - waited, 0.0)))

    async def _shown_up(self, url: str, model: str | None, start: float, deadline_s: float,
                        models_answer: str) -> Listing | None:
        """An endpoint whose list could not be read: up if ``/health`` answers 2xx or, failing
        that, a one-token request is answered; the model is checked by that answer."""
        left = max(PROBE_FLOOR_S, deadline_s - (self._clock() - start))
        try:
            health, _ = await self._get(endpoint_url(url, "/health"),
                                        max(PROBE_FLOOR_S, min(self._probe_timeout, left)))
        except _NotHttp:
            health = None
        status = health.status if health is not None else None
        healthy = status is not None and 200 <= status < 300
        # A first answer checks the model either way; where /health does not answer it is what
        # shows the endpoint up. It may take longer than a probe (a busy shared server).
        first = await self.first_answer(url, model, max(self._probe_timeout, left))
        if healthy:
            return Listing(url, None, True, models_answer, f"/health answered {status}", first)
        if first.answered:
            return Listing(url, None, True, models_answer, f"a first request answered {first.status}", first)
        return None


__all__ = ["FIRST_PROMPT", "FirstAnswer", "Listing", "REFUSING", "StartCheck"]
