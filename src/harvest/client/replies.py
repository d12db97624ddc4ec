"""The one door for what an endpoint answers: bytes in, typed values out, every limit applied.

An answer to ``/v1/chat/completions`` or ``/v1/completions``, whole or streamed, becomes a
:class:`~harvest.client.records.Completion` here, or a :class:`BadReply` that says what is wrong
with it (the item's failure of class ``bad_reply``). Beyond this module the client and the campaign
handle types, never JSON. The limits come from the request (:func:`limits_for`):

    body      256 KiB + max_tokens x n x ``[client] reply_bytes_per_token`` (64), each token four
              times more per log-probability asked (top_logprobs + 1), plus the prompt's share with
              vLLM's ``prompt_logprobs``. The transport counts it while reading, after
              decompression: a bigger answer fails as ``oversized`` (nothing of it is kept).
    stream    the same for the text kept, the whole stream within the body plus 1 KiB an event,
              one line within the body: past either, ``oversized``.
    tokens    a choice that streamed more than max_tokens + slack text events is cut there and is
              ``truncated`` (finish_reason "length"), whatever the server would have sent after.

Shapes taken as real engines send them (vLLM, SGLang, llama.cpp, ``transformers serve``, OpenAI):
content as a string, null or a list of text parts (``{"type": "text", "text": ...}``, their text
joined); reasoning as ``reasoning_content`` or ``reasoning``; usage absent or null; finish_reason a
string or SGLang's ``{"type": ...}``. Anything else is a :class:`BadReply` naming the field.

What an answer may not do is break what harvest stores or shows:
- a token count that is not an integer in range (``NaN``, ``1e308``, ``10**30``, ``-3``, ``"abc"``)
  is unknown (None), never stored as sent;
- text is valid Unicode: a lone surrogate (``\\ud800``) or bytes that are not UTF-8 become U+FFFD,
  counted in ``Completion.replaced``;
- a missing or unknown finish_reason is decided by the numbers: completion tokens (usage, else the
  answer's own: its log-probabilities or streamed events) at max_tokens mean "length" (truncated,
  never done); what the endpoint sent is kept in ``Completion.finish_reason_sent``.

Every reply is parsed once, by pydantic from the bytes (``model_validate_json``); the slow path
(Python's parser, for the text pydantic refuses) runs only for an answer that needs repair.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, TypeVar, Union  # Any: JSON kept as sent (logprobs) or checked by hand

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harvest.client.records import Completion
from harvest.transport import Oversized, RawResponse

#: What every reply may carry beyond its tokens (ids, usage, framing, a system fingerprint ...).
BASE_BYTES = 256 << 10
#: ``[client] reply_bytes_per_token``'s default: a token's text as JSON, escapes included, with room.
BYTES_PER_TOKEN = 64
#: The tokens an answer may hold when the request names no max_tokens (an engine's default is the
#: model's context).
UNKNOWN_MAX_TOKENS = 131072
#: What a probe's answer may carry (``/health``, ``/v1/models``, a one-token request): a model list
#: of thousands of ids fits.
PROBE_BYTES = 4 << 20
#: The largest token count taken as sent; beyond it a count is unknown.
MAX_COUNT = 2**31 - 1
#: finish_reason values taken as the engine's own word; any other is decided by the numbers.
KNOWN_REASONS = frozenset({"stop", "length", "tool_calls", "function_call", "content_filter"})
#: How much of a reason, a model name or a sent value is kept.
_SHOWN_CHARS = 64
_MODEL_CHARS = 256


class BadReply(ValueError):
    """A 2xx answer that is not a completion (not JSON, no choices, a field of the wrong type, an
    error event in a stream): the reason, naming the field."""


@dataclass(frozen=True, slots=True)
class ReplyLimits:
    """What one request's answer may cost (:func:`limits_for`)."""

    #: The request's ``max_tokens`` (None: it names none).
    max_tokens: int | None
    #: Choices asked (``n``).
    choices: int
    #: The most bytes of a whole answer (after decompression), and of the text a stream keeps.
    body_bytes: int
    #: The most bytes of a whole stream, framing included.
    stream_bytes: int
    #: Text events a choice may stream before the stream is cut (max_tokens + slack).
    events: int
    #: ``[client] reply_bytes_per_token`` the caps were derived from (named when one is passed).
    per_token: int

    @property
    def completion_bound(self) -> int:
        """The largest completion token count of a whole answer taken as sent."""
        return MAX_COUNT if self.max_tokens is None else (self.max_tokens + 64) * self.choices


def limits_for(body: Mapping[str, Any], per_token: int, request_bytes: int) -> ReplyLimits:
    """The limits of the answer to ``body`` (a request as sent, ``request_bytes`` long)."""
    get = body.get
    prompt = get("prompt_logprobs")
    shape = (get("max_tokens", get("max_completion_tokens")), get("n"), get("logprobs"), get("top_logprobs"))
    if prompt is None:  # the common case: one value per request shape, computed once
        try:
            return _limits(*shape, per_token)
        except TypeError:  # a value that cannot be a key (a list in extra_body): not a number either
            return _limits(None, None, None, None, per_token)
    limits = _limits.__wrapped__(*shape, per_token)
    if type(prompt) is not int or prompt < 0:
        return limits
    # vLLM's prompt_logprobs: each prompt token (at most a byte each) with its top ones
    extra = request_bytes * 4 * per_token * (min(prompt, 1024) + 1)
    return dataclasses.replace(limits, body_bytes=limits.body_bytes + extra, stream_bytes=limits.stream_bytes + extra)


@functools.lru_cache(maxsize=256)
def _limits(max_tokens: Any, n: Any, logprobs: Any, top_logprobs: Any, per_token: int) -> ReplyLimits:
    if type(max_tokens) is not int or max_tokens < 1:
        max_tokens = None
    n = n if type(n) is int and 1 <= n <= 4096 else 1
    per = per_token
    if logprobs:
        # chat: logprobs true + top_logprobs k; text completions: logprobs k
        k = top_logprobs if logprobs is True else logprobs
        per += 4 * per_token * ((k if type(k) is int and 0 <= k <= 1024 else 20) + 1)
    tokens = max_tokens or UNKNOWN_MAX_TOKENS
    size = BASE_BYTES + tokens * n * per
    events = tokens + 16 + tokens // 8
    return ReplyLimits(max_tokens, n, size, size + (events * n + 256) * 1024, events, per_token)


def failure_text(exc: Exception, limits: ReplyLimits) -> str:
    """A transport failure as the item's error says it: an answer past its cap with what to change."""
    if not isinstance(exc, Oversized):
        return str(exc)
    return (f"{exc} (max_tokens {limits.max_tokens or 'unset'} x n {limits.choices}, {limits.per_token} bytes a "
            f"token: raise [client] reply_bytes_per_token if the endpoint's answers are that big)")


# ---------------------------------------------------------------------------------- the wire shapes

class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Part(_Wire):
    type: Any = None
    text: Any = None


#: ``content``: a string, null, or a list of parts (OpenAI's content-parts shape).
_Content = Union[str, list[_Part], None]


class _Message(_Wire):
    content: _Content = None
    reasoning_content: Optional[str] = None
    reasoning: Optional[str] = None


class _WireChoice(_Wire):
    """What a chat and a text choice both carry."""

    index: Any = None
    finish_reason: Any = None
    logprobs: Any = None
    prompt_logprobs: Any = None


class _ChatChoice(_WireChoice):
    message: _Message


class _TextChoice(_WireChoice):
    text: Optional[str]


class _WireReply(_Wire):
    """What a chat and a text reply both carry besides their choices."""

    usage: Any = None
    model: Any = None
    prompt_logprobs: Any = None


class _ChatReply(_WireReply):
    choices: list[_ChatChoice] = Field(min_length=1)


class _TextReply(_WireReply):
    choices: list[_TextChoice] = Field(min_length=1)


class _Delta(_Wire):
    content: _Content = None
    reasoning_content: Optional[str] = None
    reasoning: Optional[str] = None


class _ChunkChoice(_Wire):
    index: Any = None
    delta: Optional[_Delta] = None
    text: Optional[str] = None
    finish_reason: Any = None
    logprobs: Any = None


class _Chunk(_Wire):
    choices: Optional[list[_ChunkChoice]] = None
    usage: Any = None
    model: Any = None
    error: Any = None


class _Model(_Wire):
    id: Any = None


class _ModelList(_Wire):
    data: list[_Model]


W = TypeVar("W", bound=_Wire)


def _validate(shape: type[W], raw: bytes, what: str, kind: str) -> tuple[W, int]:
    """``raw`` as ``shape``, and the characters replaced to make its text valid Unicode; BadReply
    ("``what`` is not JSON" / "``what`` is not a ``kind``: the field and why") otherwise."""
    try:
        return shape.model_validate_json(raw), 0
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if first["type"] != "json_invalid":
            raise BadReply(f"{what} is not a {kind}: {_where(first)}") from None
    # pydantic's parser refuses lone surrogates and bytes that are not UTF-8; Python's takes them
    text = raw.decode("utf-8", "replace")
    try:
        data, replaced = _repair(json.loads(text))
    except (ValueError, RecursionError):
        raise BadReply(f"{what} is not JSON: {_quote(raw[:80])}") from None
    replaced += text.count("\ufffd") - raw.count("\ufffd".encode())
    try:
        return shape.model_validate(data), replaced
    except ValidationError as exc:
        raise BadReply(f"{what} is not a {kind}: {_where(exc.errors(include_url=False)[0])}") from None


def _where(error: Mapping[str, Any]) -> str:
    loc = ".".join(str(p) for p in error.get("loc", ()))
    return f"{loc}: {error.get('msg', 'invalid')}" if loc else str(error.get("msg", "invalid"))


_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _repair(value: Any) -> tuple[Any, int]:
    """``value`` with every lone surrogate in its strings (keys too) replaced by U+FFFD, and how many."""
    if isinstance(value, str):
        return _SURROGATE.subn("\ufffd", value)
    if isinstance(value, list):
        out, total = [], 0
        for item in value:
            fixed, n = _repair(item)
            out.append(fixed)
            total += n
        return out, total
    if isinstance(value, dict):
        fixed_dict, total = {}, 0
        for key, item in value.items():
            k, n = _repair(key)
            v, m = _repair(item)
            fixed_dict[k] = v
            total += n + m
        return fixed_dict, total
    return value, 0


def _quote(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return repr(_CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text))


def _shown(value: Any) -> str:
    """A value an endpoint sent, as a short line (a reason, a model name)."""
    text = value if isinstance(value, str) else json.dumps(value)
    text = _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _count(value: Any, bound: int) -> int | None:
    """A token count as sent, or None unless it is an integer in [0, bound]."""
    if type(value) is int:
        return value if 0 <= value <= bound else None
    if type(value) is float and value.is_integer() and 0 <= value <= bound:
        return int(value)
    return None


def _usage(usage: Any, limits: ReplyLimits) -> tuple[int | None, int | None]:
    """(prompt tokens, completion tokens) of a usage block, each None when absent or out of range."""
    if not isinstance(usage, dict):
        return None, None
    return (_count(usage.get("prompt_tokens"), MAX_COUNT),
            _count(usage.get("completion_tokens"), limits.completion_bound))


def _model(value: Any) -> str | None:
    return value[:_MODEL_CHARS] if isinstance(value, str) else None


def _text(content: _Content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text for p in content if isinstance(p.text, str) and p.type in (None, "text", "output_text"))


def _finish(sent: Any, tokens: int | None, max_tokens: int | None) -> tuple[str | None, str | None]:
    """(finish_reason as decided, what was sent when harvest decided otherwise: "" for nothing)."""
    reason = sent.get("type") if isinstance(sent, dict) else sent  # SGLang: {"type": "length", "length": 512}
    if isinstance(reason, str) and reason in KNOWN_REASONS:
        return reason, None if reason is sent else _shown(sent)
    if tokens is not None and max_tokens is not None and tokens >= max_tokens:
        return "length", "" if sent is None else _shown(sent)
    if isinstance(sent, str):
        return _shown(sent), None
    return None, None if sent is None else _shown(sent)


def _own_tokens(logprobs: Any) -> int | None:
    """An answer's tokens by its own log-probabilities (``logprobs.content``), when it has them."""
    if isinstance(logprobs, dict):
        content = logprobs.get("content")
        if isinstance(content, list):
            return len(content)
        tokens = logprobs.get("tokens")  # text completions
        if isinstance(tokens, list):
            return len(tokens)
    return None


def _choice_tokens(logprobs: Any, total: int | None, index: int, count: int) -> int | None:
    """Tokens of one choice: the usage count for a single choice; for ``n`` > 1 (usage counts all
    choices together) the length of its log-probabilities when it has them, else an even share;
    without usage, its own log-probabilities."""
    if count == 1 and total is not None:
        return total
    own = _own_tokens(logprobs)
    if own is not None or total is None:
        return own
    return total // count + (1 if index < total % count else 0)


def _ordered(choices: list[Any]) -> list[Any]:
    """Choices by their ``index`` where each has a distinct integer one, else as sent."""
    if len(choices) == 1:
        return choices
    indexes = [c.index for c in choices]
    if all(type(i) is int for i in indexes) and len(set(indexes)) == len(indexes):
        return sorted(choices, key=lambda c: c.index)
    return choices


# ---------------------------------------------------------------------------------- whole answers

def read_chat(response: RawResponse, limits: ReplyLimits, *, endpoint: str, latency_s: float,
              attempts: int) -> Completion:
    """A chat completion (whole, or a stream's :class:`StreamedReply`) -> :class:`Completion`."""
    if isinstance(response, StreamedReply):
        return response.assembled.completion(endpoint=endpoint, latency_s=latency_s, attempts=attempts)
    reply, replaced = _validate(_ChatReply, response.body, "the answer", "chat completion")
    prompt, total = _usage(reply.usage, limits)
    choices = _ordered(reply.choices)
    out = []
    for i, choice in enumerate(choices):
        message = choice.message
        reasoning = message.reasoning_content if message.reasoning_content is not None else message.reasoning
        tokens = _choice_tokens(choice.logprobs, total, i, len(choices))
        reason, sent = _finish(choice.finish_reason, tokens, limits.max_tokens)
        out.append(Completion(
            text=_text(message.content), reasoning_content=reasoning, finish_reason=reason,
            prompt_tokens=prompt, completion_tokens=tokens, endpoint=endpoint, latency_s=latency_s,
            attempts=attempts, model=_model(reply.model), logprobs=choice.logprobs,
            prompt_logprobs=reply.prompt_logprobs if reply.prompt_logprobs is not None else choice.prompt_logprobs,
            finish_reason_sent=sent, replaced=replaced))
    return dataclasses.replace(out[0], others=tuple(out[1:])) if len(out) > 1 else out[0]


def read_text(response: RawResponse, limits: ReplyLimits, *, endpoint: str, latency_s: float,
              attempts: int) -> Completion:
    """A text completion (whole, or a stream's :class:`StreamedReply`) -> :class:`Completion` (choice 0,
    the others in ``others``)."""
    if isinstance(response, StreamedReply):
        return response.assembled.completion(endpoint=endpoint, latency_s=latency_s, attempts=attempts)
    reply, replaced = _validate(_TextReply, response.body, "the answer", "text completion")
    prompt, total = _usage(reply.usage, limits)
    choices = _ordered(reply.choices)
    out = []
    for i, choice in enumerate(choices):
        tokens = _choice_tokens(choice.logprobs, total, i, len(choices))
        reason, sent = _finish(choice.finish_reason, tokens, limits.max_tokens)
        out.append(Completion(
            text=choice.text or "", reasoning_content=None, finish_reason=reason, prompt_tokens=prompt,
            completion_tokens=tokens, endpoint=endpoint, latency_s=latency_s, attempts=attempts,
            model=_model(reply.model), logprobs=choice.logprobs,
            prompt_logprobs=choice.prompt_logprobs if choice.prompt_logprobs is not None else reply.prompt_logprobs,
            finish_reason_sent=sent, replaced=replaced))
    return dataclasses.replace(out[0], others=tuple(out[1:])) if len(out) > 1 else out[0]


def loads(raw: bytes) -> Any:
    """``raw`` as JSON of any shape (a side request's answer), or None when it is not JSON (nested
    too deep, or text that is not valid Unicode, included)."""
    try:
        return pydantic_core.from_json(raw)
    except ValueError:
        return None


def model_ids(raw: bytes) -> tuple[str, ...] | None:
    """Every model id of a ``/v1/models`` answer, in its order; None when it is no model list."""
    try:
        listing, _ = _validate(_ModelList, raw, "the answer", "model list")
    except BadReply:
        return None
    return tuple(_shown(m.id) if not isinstance(m.id, str) else m.id[:_MODEL_CHARS] for m in listing.data if m.id)


def first_model_id(raw: bytes) -> str | None:
    """The first model id of a ``/v1/models`` answer, or None when there is none."""
    ids = model_ids(raw)
    return ids[0] if ids else None


# ---------------------------------------------------------------------------------- streams

@dataclass(frozen=True)
class StreamedReply(RawResponse):
    """A streamed answer, assembled as it came (its body stays empty: nothing raw is kept)."""

    assembled: StreamAssembler = dataclasses.field(default=None)  # type: ignore[assignment]


class _Choice:
    """One choice of a stream, as it comes."""

    __slots__ = ("index", "text", "content", "reasoning", "logprobs", "finish", "events", "chat")

    def __init__(self, index: int):
        self.index = index
        self.text: list[str] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.logprobs: list[Any] = []
        self.finish: Any = None
        self.events = 0
        self.chat = False


class StreamAssembler:
    """The transport's sink for one streamed answer: each ``data:`` payload parsed as a chunk as it
    arrives and joined per choice (content, reasoning, text, ``logprobs.content``; finish_reason,
    usage and model where sent). It ends the stream once a choice streamed more text events than
    its max_tokens allow (the answer is then truncated), and raises :class:`Oversized` once the
    text kept or the events pass their caps. Choice 0's text events are timed (TTFT, TPOT, ITL)."""

    def __init__(self, limits: ReplyLimits):
        self.limits = limits
        self._choices: dict[int, _Choice] = {}
        self._usage: Any = None
        self._model: Any = None
        self._events = 0
        self._kept = 0
        self._replaced = 0
        #: Set when an event was not a chunk, or carried the server's error: reading stopped there.
        self.error: str | None = None
        #: Set when the stream was cut at a choice's max_tokens.
        self.cut = False
        #: Arrivals of choice 0's text events, seconds after the request was sent.
        self.arrivals: list[float] = []

    def __call__(self, at: float, payload: bytes) -> bool:
        self._events += 1
        if self._events > (self.limits.events + 16) * 2 * self.limits.choices + 256:
            raise Oversized(f"the stream sent more than {self._events - 1:,} events")
        try:
            chunk, replaced = _validate(_Chunk, payload, "a streamed event", "completion chunk")
        except BadReply as exc:
            self.error = str(exc)
            return False
        self._replaced += replaced
        if chunk.error is not None and not chunk.choices:
            self.error = f"the stream ended with an error: {_shown(chunk.error)}"
            return False
        if chunk.model is not None:
            self._model = chunk.model
        if chunk.usage is not None:
            self._usage = chunk.usage
        for c in chunk.choices or ():
            if not self._choice(at, c):
                self.cut = self.error is None
                return False
        return True

    def _choice(self, at: float, c: _ChunkChoice) -> bool:
        index = c.index if type(c.index) is int else 0
        into = self._choices.get(index)
        if into is None:
            if len(self._choices) >= self.limits.choices:
                self.error = f"the stream sent a choice {_shown(c.index)} beyond the {self.limits.choices} asked"
                return False
            into = self._choices[index] = _Choice(index)
        pieces = 0
        delta = c.delta
        if delta is not None:
            into.chat = True
            for piece, where in ((_text(delta.content), into.content), (delta.reasoning_content, into.reasoning),
                                 (delta.reasoning, into.reasoning)):
                if piece:
                    where.append(piece)
                    pieces += len(piece)
        if c.text:
            into.text.append(c.text)
            pieces += len(c.text)
        lp = c.logprobs
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            into.logprobs.extend(lp["content"])
        if c.finish_reason is not None:
            into.finish = c.finish_reason
        if not pieces:
            return True
        self._kept += pieces
        if self._kept > self.limits.body_bytes:
            raise Oversized(f"the streamed text passed its cap of {self.limits.body_bytes:,} bytes")
        into.events += 1
        if index == 0:
            self.arrivals.append(at)
        return into.events <= self.limits.events

    def completion(self, *, endpoint: str, latency_s: float, attempts: int) -> Completion:
        """The answer as one :class:`Completion` (choice 0, the others in ``others``), timed."""
        if self.error is not None:
            raise BadReply(self.error)
        if not self._choices:
            raise BadReply("the stream carried no choice")
        prompt, total = _usage(self._usage, self.limits)
        choices = sorted(self._choices.values(), key=lambda c: c.index)
        out = []
        for i, c in enumerate(choices):
            usage_share = _choice_tokens({"content": c.logprobs} if c.logprobs else None, total, i, len(choices))
            tokens = usage_share if usage_share is not None else c.events
            finish = c.finish
            if self.cut and finish is None:
                finish = "length"  # the stream was cut at max_tokens: what followed was not read
            reason, sent = _finish(finish, tokens, self.limits.max_tokens)
            text = "".join(c.content) if c.chat else "".join(c.text)
            out.append(Completion(
                text=text, reasoning_content="".join(c.reasoning) if c.reasoning else None, finish_reason=reason,
                prompt_tokens=prompt, completion_tokens=tokens, endpoint=endpoint, latency_s=latency_s,
                attempts=attempts, model=_model(self._model),
                logprobs={"content": c.logprobs} if c.logprobs else None, finish_reason_sent=sent,
                replaced=self._replaced))
        first = out[0]
        arrivals = self.arrivals
        tpot = None
        tokens0 = first.completion_tokens
        if arrivals and tokens0 is not None and tokens0 > 1:
            tpot = (arrivals[-1] - arrivals[0]) / (tokens0 - 1)
        first = dataclasses.replace(first, ttft_s=arrivals[0] if arrivals else None, tpot_s=tpot,
                                    itl_s=tuple(b - a for a, b in zip(arrivals, arrivals[1:])),
                                    others=tuple(out[1:]))
        return first


__all__ = [
    "BASE_BYTES",
    "BYTES_PER_TOKEN",
    "KNOWN_REASONS",
    "PROBE_BYTES",
    "BadReply",
    "ReplyLimits",
    "StreamAssembler",
    "StreamedReply",
    "first_model_id",
    "limits_for",
    "loads",
    "model_ids",
    "failure_text",
    "read_chat",
    "read_text",
]
