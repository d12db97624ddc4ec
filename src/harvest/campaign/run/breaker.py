"""The circuit breaker of a run: stop when every result says the *job* is wrong, not the item.

    breaker = Breaker(window=20)
    breaker.failed(item_id, failure)   # a failure the breaker may hold back (see HELD_CLASSES)
    breaker.succeeded()                # any result that is not such a failure
    if breaker.tripped: ...            # window identical failures in a row

A job whose sampling the server rejects (HTTP 400 to every request), a wrong model name (404), a
missing key (401/403), an invalid request body (422), any other 4xx the endpoint gives every request
(402, 405, 410 ...), a context too small for every prompt, or an endpoint whose every answer is
unusable (``bad_reply``, ``oversized``, ``protocol``) fails *every* item with the same message.
Committing those failures would burn the whole dataset; so the runner hands such failures to the
breaker instead of the ledger. They are held (the items stay
``running`` in the ledger, uncharged) while they form one streak of the same class and message:

- a result of any other kind ends the streak: the held failures are given back to be committed as
  ordinary failures (:meth:`Breaker.succeeded` returns them);
- a failure with another class or message does the same and starts a new streak with itself;
- ``window`` failures in a row trip the breaker: the runner stops dispatch and puts the held items
  (and whatever is in flight) back to pending without charging an attempt;
- a redirect (class ``redirect``: the endpoint answers elsewhere; harvest never follows one) trips it
  at once: it is the job's configuration, whatever the item.

Messages are compared with their numbers masked, so "maximum context length is 2048 tokens. However,
you requested 2100 tokens" on one item matches "... 2311 tokens" on the next. This module decides
only; it never touches the ledger, the client or the server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harvest.ledger import Failure

#: Error classes that can mean "the job is misconfigured" when every item gets the same one (and
#: every other ``http_4xx``: see :func:`held_class`).
HELD_CLASSES = frozenset({"http_400", "http_401", "http_403", "http_404", "http_422", "context_overflow",
                          "bad_reply", "oversized", "protocol", "redirect"})
#: Classes that trip the breaker on their first failure.
AT_ONCE = frozenset({"redirect"})

_HTTP_4XX = re.compile(r"http_4\d\d")

#: Default number of identical failures in a row that stops a run (``[run] breaker_window``).
DEFAULT_WINDOW = 20

_NUMBER = re.compile(r"\d+")

#: What to change, per class, printed with the server's own message when the breaker trips.
ADVICE = {
    "http_400": "the server rejects the request itself: fix the setting its message names "
                "([sampling] stop / max_tokens / extra_body, or the server's own limits), then run again",
    "http_401": "the server wants an API key: set [server] api_key_env to the variable that holds it "
                "(and export it), then run again",
    "http_403": "the server refuses this key: check the key in [server] api_key_env, then run again",
    "http_404": "the model or the path is unknown to the server: check [server] model / served_model_name "
                "and the endpoint URL (base URL without /v1/chat/completions), then run again",
    "http_422": "the server cannot parse the request body: check [sampling] extra_body, then run again",
    "context_overflow": "the prompts do not fit the model's context: raise the server's context length "
                        "or lower [sampling] max_tokens, then run again",
    "redirect": "point [server] base_url (or [client] endpoints) at the address the endpoint names, then run again",
    "bad_reply": "the endpoint's answers are not OpenAI-compatible completions: check that [server] base_url is "
                 "the server's OpenAI API, then run again",
    "oversized": "the endpoint's answers are bigger than [client] reply_bytes_per_token allows for max_tokens: "
                 "raise it if they are real answers, else check the endpoint, then run again",
    "protocol": "the endpoint does not answer valid HTTP: check that [server] base_url (its port) is the "
                "server's, then run again",
}


def held_class(error_class: str) -> bool:
    """Whether failures of ``error_class`` can mean "the job is misconfigured": the classes of
    :data:`HELD_CLASSES` and any ``http_4xx``."""
    return error_class in HELD_CLASSES or _HTTP_4XX.fullmatch(error_class) is not None


def failure_key(error_class: str, message: str) -> tuple[str, str]:
    """What makes two failures "the same": the class and the message with its numbers masked."""
    return error_class, _NUMBER.sub("#", message)


@dataclass(frozen=True)
class Trip:
    """Why the breaker stopped the run."""

    error_class: str
    #: The server's message, as the last failure of the streak carried it.
    message: str
    window: int
    #: The items whose failures were held back: they go back to pending, uncharged.
    held: tuple[str, ...]

    @property
    def advice(self) -> str:
        return ADVICE.get(self.error_class, "fix the setting the message names, then run again")

    def describe(self) -> str:
        if self.window == 1:
            return f"a request failed in a way that stops the run ({self.error_class}): {self.message}"
        return (f"{self.window} requests in a row failed the same way ({self.error_class}): "
                f"{self.message}")


class Breaker:
    """Counts identical failures in a row; ``window`` of them trip it. ``window=0`` turns it off."""

    def __init__(self, window: int = DEFAULT_WINDOW, classes: frozenset[str] | None = None):
        if window < 0:
            raise ValueError(f"window must be >= 0, not {window}")
        self.window = window
        #: The classes held (None: :func:`held_class`).
        self.classes = classes
        self._key: tuple[str, str] | None = None
        self._held: list[tuple[str, Failure]] = []
        #: Set once the breaker tripped; it stays tripped.
        self.trip: Trip | None = None

    @property
    def tripped(self) -> bool:
        return self.trip is not None

    @property
    def held(self) -> list[tuple[str, Failure]]:
        """The failures held back so far: ``(item id, failure)`` in the order they came."""
        return list(self._held)

    def holds(self, error_class: str) -> bool:
        """Whether a failure of ``error_class`` goes to the breaker (else straight to the ledger)."""
        if self.window <= 0:
            return False
        return held_class(error_class) if self.classes is None else error_class in self.classes

    def failed(self, failure: Failure) -> list[Failure]:
        """Hold ``failure`` (a class :meth:`holds`); returns the failures released to be committed
        (an earlier streak this one ended). After a trip, every failure is held."""
        if self.trip is not None:
            self._held.append((failure.item_id, failure))
            return []
        key = failure_key(failure.error_class, failure.error)
        released: list[Failure] = []
        if key != self._key:
            released = self._release()
            self._key = key
        self._held.append((failure.item_id, failure))
        if len(self._held) >= self.window or failure.error_class in AT_ONCE:
            self.trip = Trip(failure.error_class, failure.error, len(self._held),
                             tuple(item_id for item_id, _ in self._held))
        return released

    def succeeded(self) -> list[Failure]:
        """A result that is not a held failure ends the streak; returns the failures to commit."""
        if self.trip is not None:
            return []
        return self._release()

    def finish(self) -> list[Failure]:
        """Dispatch ended without a trip: the held failures are real failures, to commit."""
        return [] if self.trip is not None else self._release()

    def _release(self) -> list[Failure]:
        released = [f for _, f in self._held]
        self._held.clear()
        self._key = None
        return released


__all__ = ["ADVICE", "AT_ONCE", "Breaker", "DEFAULT_WINDOW", "HELD_CLASSES", "Trip", "failure_key", "held_class"]
