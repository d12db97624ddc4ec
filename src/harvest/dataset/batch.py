"""OpenAI batch input files: one request per line, read as items that carry their own request body.

A line of such a file (the OpenAI Batch API's input, which ``vllm run-batch`` also reads):

    {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "m", "messages": [...], "max_tokens": 64, "temperature": 0.7, "n": 2,
              "logprobs": true, "top_logprobs": 3, "seed": 1, "stop": ["\\n"]}}

``url`` is ``/v1/chat/completions`` (``body.messages``) or ``/v1/completions`` (``body.prompt``, one
string). The ``custom_id`` is the item's id. The body's fields that change what the model writes are
checked here by pydantic against what harvest sends (:data:`SENT_FIELDS`) and kept on the item as its
:class:`BatchRequest`; the runner sends them on top of the job's ``[sampling]`` (the row wins, field
by field). ``body.model`` is checked, never sent: it must name the model the job serves (``models``),
and the request goes to the job's server under the name that server knows.

A row that cannot run becomes a ``Skipped`` naming the reason and keeping, where it has one, its
``custom_id`` as given (``raw_id``, :func:`readable_id`: its output line echoes it): another
``method`` or ``url`` (``/v1/embeddings`` included: harvest generates text), a body field harvest
does not send (``tools``, ``stream: true``, ``echo``, ``best_of``...), a value of the wrong type, a
model the job does not serve, a conversation that does not end with a user message, a repeated
``custom_id`` (:class:`CustomIds`, in file order: the first row keeps it; the repeat keeps the
``custom_id`` too, its ledger id ``skip:<file>:<line>`` tells it apart).

This module never reads files and never raises for a bad row.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harvest.dataset.records import CHAT_URL, COMPLETIONS_URL, USER, BatchRequest, Item, Message, Row, Skipped
from harvest.dataset.shapes import SKIP_PREFIX, BadRow, read_conversation

#: The urls harvest runs; any other is a skipped row.
URLS = (CHAT_URL, COMPLETIONS_URL)
#: The keys that tell a batch line: a record with both is read as one (``shape = "auto"``).
MARKERS = ("custom_id", "body")
#: Error class of a batch row that cannot run (the row itself must change).
BATCH_KIND = "input"

_Stop = Union[str, list[str], None]


class _Body(BaseModel):
    """The body fields harvest sends, each as the OpenAI API types it; any other field is refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    n: Optional[int] = Field(None, ge=1, le=128)
    seed: Optional[int] = None
    stop: _Stop = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None
    response_format: Optional[dict[str, Any]] = None
    user: Optional[str] = None
    stream: Optional[Literal[False]] = None
    # vLLM and SGLang sampling extensions, sent as given
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    min_tokens: Optional[int] = Field(None, ge=0)
    ignore_eos: Optional[bool] = None
    skip_special_tokens: Optional[bool] = None


class _ChatBody(_Body):
    messages: list[Any]
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    chat_template_kwargs: Optional[dict[str, Any]] = None


class _TextBody(_Body):
    prompt: str
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    echo: Optional[Literal[False]] = None


#: Body fields that are checked but never sent as given: the model (the job's server decides the
#: name), the conversation or prompt (sent from the item), ``stream`` (never), ``echo`` (never).
_NOT_SENT = frozenset({"model", "messages", "prompt", "stream", "echo"})
#: What a row's body may set and harvest sends, per url.
SENT_FIELDS: Mapping[str, frozenset[str]] = {
    CHAT_URL: frozenset(_ChatBody.model_fields) - _NOT_SENT,
    COMPLETIONS_URL: frozenset(_TextBody.model_fields) - _NOT_SENT,
}


def is_batch_record(data: Any) -> bool:
    """Whether a raw record is an OpenAI batch line (it has ``custom_id`` and ``body``)."""
    return isinstance(data, Mapping) and all(k in data for k in MARKERS)


def _where(cid: str | None) -> str:
    return f" (custom_id {cid!r})" if cid is not None else ""


def readable_id(data: Any) -> str | None:
    """A line's ``custom_id`` exactly as it gave it, where it is text (its output line echoes it,
    even when the line cannot run); None for a line with none (not an object, missing, not a
    string, not encodable as UTF-8)."""
    cid = data.get("custom_id") if isinstance(data, Mapping) else None
    if not isinstance(cid, str):
        return None
    try:
        cid.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return cid


def _custom_id(data: Mapping[str, Any]) -> str:
    cid, raw = readable_id(data), data.get("custom_id")
    if isinstance(raw, str) and cid is None:
        raise BadRow("custom_id is not valid UTF-8")
    if cid is None or not cid.strip():
        shown = "missing" if raw is None else f"{type(raw).__name__} {raw!r}"[:80]
        raise BadRow(f"custom_id is {shown}, expected non-empty text")
    if cid.startswith(SKIP_PREFIX):
        raise BadRow(f"custom_id {cid!r} uses the prefix {SKIP_PREFIX!r}, reserved for lines without a custom_id")
    return cid


def _body(data: Mapping[str, Any], url: str) -> _Body:
    raw = data.get("body")
    if not isinstance(raw, Mapping):
        raise BadRow(f"body is {'null' if raw is None else type(raw).__name__}, expected an object")
    model = _ChatBody if url == CHAT_URL else _TextBody
    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(sorted(SENT_FIELDS[url]))
            raise BadRow(f"body.{field} is not supported for {url} (harvest sends: {allowed})") from None
        if err["type"] == "literal_error" and field in ("stream", "echo"):
            raise BadRow(f"body.{field} = true is not supported (harvest stores whole answers)") from None
        shown = repr(err.get("input"))[:60]
        raise BadRow(f"body.{field}: {err['msg']} (got {shown})") from None


def _request(url: str, body: _Body) -> BatchRequest:
    set_fields = body.model_dump(exclude_unset=True, exclude=set(_NOT_SENT))
    if "max_completion_tokens" in set_fields:  # the newer name of the same limit: one is sent
        limit = set_fields.pop("max_completion_tokens")
        set_fields.setdefault("max_tokens", limit)
    fields = tuple(sorted((k, v) for k, v in set_fields.items() if v is not None))
    prompt = body.prompt if isinstance(body, _TextBody) else None
    return BatchRequest(url, fields, prompt)


def _messages(body: _Body, system_prompt: str | None) -> tuple[Message, ...]:
    if isinstance(body, _TextBody):
        if not body.prompt.strip():
            raise BadRow("body.prompt is empty")
        return (Message(USER, body.prompt),)
    assert isinstance(body, _ChatBody)
    messages = read_conversation(body.messages, "body.messages", system_prompt)
    if messages[-1].role != USER:
        raise BadRow("body.messages ends with an assistant message; a batch row asks for the answer to its "
                   "last user message")
    return messages


def batch_item(row: Row, *, models: Collection[str] | None = None, system_prompt: str | None = None) -> Item | Skipped:
    """One batch line as an :class:`Item` whose ``request`` holds its own body, or a ``Skipped``
    naming why it cannot run. ``models``: the names ``body.model`` may hold (None: any)."""
    data = row.data
    cid = readable_id(data)
    try:
        if not is_batch_record(data):
            raise BadRow(f"not an OpenAI batch line: it needs {' and '.join(MARKERS)} (and method, url)")
        _custom_id(data)
        method = data.get("method", "POST")
        if method != "POST":
            raise BadRow(f"method {method!r} is not supported (POST)")
        url = data.get("url")
        if url not in URLS:
            shown = repr(url)[:80]
            raise BadRow(f"url {shown} is not supported: harvest runs {' and '.join(URLS)}")
        body = _body(data, url)
        if models is not None and body.model is not None and body.model not in models:
            raise BadRow(f"body.model is not a model this job serves: set it to {' or '.join(map(repr, sorted(models)))} "
                       f"or leave it out (body.model {body.model!r})")
        messages = _messages(body, system_prompt)
        request = _request(url, body)
    except BadRow as bad:
        return Skipped(row.source, row.line, bad.reason + _where(cid), BATCH_KIND, raw_id=cid)
    assert cid is not None
    return Item(id=cid, source=row.source, source_line=row.line, messages=messages, raw_id=cid, request=request)


class CustomIds:
    """The custom_ids seen so far in a file: a repeat becomes a ``Skipped`` naming the first line.

    Holds one entry per id (an OpenAI batch file has at most 50,000 lines), so that a file's
    repeated ids are reported, never merged."""

    def __init__(self) -> None:
        self._first: dict[str, int] = {}

    def check(self, record: Item | Skipped) -> Item | Skipped:
        if isinstance(record, Skipped) or record.request is None:
            return record
        first = self._first.setdefault(record.id, record.source_line)
        if first != record.source_line:
            return Skipped(record.source, record.source_line, f"custom_id repeats an earlier line; custom_ids "
                           f"are unique in a batch file (custom_id {record.id!r}, first at line {first})", BATCH_KIND,
                           raw_id=record.id)
        return record


__all__ = ["BATCH_KIND", "BatchRequest", "CHAT_URL", "COMPLETIONS_URL", "CustomIds", "MARKERS", "SENT_FIELDS",
           "URLS", "batch_item", "is_batch_record", "readable_id"]
