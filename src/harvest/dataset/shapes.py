"""Turn one raw row into an ``Item`` (normalized, validated conversation with a stable id) or a
``Skipped`` naming the reason.

Input shapes, chosen per row when ``shape = "auto"``:

    prompt     {"prompt": "text"}                                   -> one user turn
    messages   {"messages": [{"role": "user", "content": ...}, ...]}  (OpenAI chat)
    sharegpt   {"conversations": [{"from": "human", "value": ...}, ...]}
    specforge  {"conversations": [{"role": "user", "content": ...}, ...]}

Each message is read by its own keys (``role``/``content`` or ``from``/``value``), so a ShareGPT
file that uses role/content still reads. Field names come from ``[data]`` (``prompt_field``,
``messages_field``, ``conversations_field``, ``id_field``). A conversation is valid when, after any
leading system messages, it starts with a user turn and user/assistant roles alternate; it may end
with either (a trailing assistant answer is the original, to be regenerated).

The id is the row's ``id_field`` (stringified) when one is configured (a row without it is
skipped). When ``id_field`` is not set, a row's own field named ``id`` is its id when it holds
usable text or an integer (what users join regenerated data back to the source by); otherwise,
and always with ``id_field = ""``, the id is a BLAKE2b-128 hash of the canonical JSON of the
normalized messages, system prompt included: the same input gives the same id on every run, on
every machine.

This module never raises for a bad row (it returns ``Skipped``) and never reads files.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from harvest.config import DataConfig
from harvest.dataset.records import ASSISTANT, SYSTEM, USER, Item, Message, Role, Row, Skipped

#: Role names found in the wild, lower-cased, mapped to the three roles harvest generates with.
ROLE_ALIASES: Mapping[str, Role] = {
    "system": SYSTEM,
    "developer": SYSTEM,
    "user": USER,
    "human": USER,
    "assistant": ASSISTANT,
    "gpt": ASSISTANT,
    "model": ASSISTANT,
    "chatgpt": ASSISTANT,
    "bing": ASSISTANT,
    "bard": ASSISTANT,
}

#: The field read as a row's own id when ``[data] id_field`` is not set.
DEFAULT_ID_FIELD = "id"

#: Error class of a row that was read but does not fit the [data] field mapping.
SHAPE_KIND = "shape"
#: Ids with this prefix are reserved for skipped rows (see ``Skipped.id``).
SKIP_PREFIX = "skip:"


class BadRow(Exception):
    """The row is unusable for ``reason``: raised by the readers of a row's parts (here and in
    dataset/batch.py), turned into a ``Skipped`` by the function that reads the whole row."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def content_hash(messages: tuple[Message, ...]) -> str:
    """Stable id of a conversation: BLAKE2b-128 (32 hex digits) of its canonical JSON."""
    canonical = json.dumps(
        [[m.role, m.content] for m in messages], ensure_ascii=False, separators=(",", ":")
    ).encode("utf-8")
    return hashlib.blake2b(canonical, digest_size=16).hexdigest()


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _text(value: Any, where: str) -> str:
    """Message content as text: a string, or OpenAI content parts of type text (joined by newlines)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for j, part in enumerate(value):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text" and isinstance(
                part.get("text"), str
            ):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, Mapping) else _type_name(part)
                raise BadRow(f"{where}[{j}]: content part of type {kind!r} is not text")
        return "\n".join(parts)
    raise BadRow(f"{where}: content is {_type_name(value)}, expected text")


def _message(raw: Any, where: str) -> Message:
    if not isinstance(raw, Mapping):
        raise BadRow(f"{where}: is {_type_name(raw)}, expected an object with role/content or from/value")
    if "role" in raw:
        role_raw, content_raw, content_key = raw["role"], raw.get("content"), "content"
    elif "from" in raw:
        role_raw, content_raw, content_key = raw["from"], raw.get("value"), "value"
    else:
        raise BadRow(f"{where}: has neither 'role' nor 'from'")
    if not isinstance(role_raw, str):
        raise BadRow(f"{where}: role is {_type_name(role_raw)}, expected text")
    role = ROLE_ALIASES.get(role_raw.strip().lower())
    if role is None:
        raise BadRow(f"{where}: role {role_raw!r} is not supported (system, user or assistant)")
    if content_raw is None:
        raise BadRow(f"{where}: no {content_key!r}")
    return Message(role, _text(content_raw, f"{where}.{content_key}"))


def _conversation(value: Any, field: str) -> list[Message]:
    if isinstance(value, str):
        # CSV cells and some Parquet exports hold the conversation as JSON text.
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise BadRow(f"field {field!r} is text that is not a JSON list of messages") from None
    if not isinstance(value, list):
        raise BadRow(f"field {field!r} is {_type_name(value)}, expected a list of messages")
    return [_message(raw, f"{field}[{i}]") for i, raw in enumerate(value)]


def read_conversation(value: Any, field: str, system_prompt: str | None) -> tuple[Message, ...]:
    """The conversation held by ``field`` (a list of messages, or JSON text of one), validated:
    leading system messages (``system_prompt`` added when there is none), then user and assistant
    alternating from user. Raises :class:`BadRow` naming the field and message."""
    return _validate(_conversation(value, field), field, system_prompt)


def _validate(messages: list[Message], field: str, system_prompt: str | None) -> tuple[Message, ...]:
    if not messages:
        raise BadRow(f"empty conversation in {field!r}")
    n_system = 0
    while n_system < len(messages) and messages[n_system].role == SYSTEM:
        n_system += 1
    if n_system == 0 and system_prompt is not None:
        messages = [Message(SYSTEM, system_prompt), *messages]
        n_system, offset = 1, -1
    else:
        offset = 0
    body = messages[n_system:]
    if not body:
        raise BadRow(f"{field!r} holds only system messages, no user turn")
    expected: Role = USER
    for k, m in enumerate(body):
        where = f"{field}[{k + n_system + offset}]"
        if m.role == SYSTEM:
            raise BadRow(f"{where}: system message after the conversation started")
        if m.role != expected:
            if k == 0:
                raise BadRow(f"{where}: conversation starts with {m.role}, expected user")
            raise BadRow(f"{where}: {m.role} follows {body[k - 1].role} (user and assistant must alternate)")
        if m.role == USER and not m.content.strip():
            raise BadRow(f"{where}: user message is empty")
        expected = ASSISTANT if expected == USER else USER
    for k, m in enumerate(messages):
        try:
            m.content.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRow(
                f"{field}[{k + offset}]: text is not valid UTF-8 (undecodable bytes or an unpaired surrogate)"
            ) from None
    return tuple(messages)


def _raw_id(data: Mapping[str, Any], field: str, required: bool) -> str | None:
    if field not in data or data[field] is None:
        if required:
            raise BadRow(f"missing id field {field!r}")
        return None
    value = data[field]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        if required:
            raise BadRow(f"id field {field!r} is {_type_name(value)}, expected text or an integer")
        return None
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        if required:
            raise BadRow(f"id field {field!r} is not valid UTF-8") from None
        return None
    if required:
        if not text.strip():
            raise BadRow(f"id field {field!r} is empty")
        if text.startswith(SKIP_PREFIX):
            raise BadRow(f"id {text!r} uses the prefix {SKIP_PREFIX!r}, reserved for skipped rows")
    return text


def _usable_id(raw_id: str | None) -> bool:
    """Whether a row's own ``id`` (found without ``id_field``) can be its item id."""
    return raw_id is not None and bool(raw_id.strip()) and not raw_id.startswith(SKIP_PREFIX)


def _skipped_id(data: Any, config: DataConfig) -> str | None:
    """A skipped row's own id where it has a usable one (what its item's id would have been)."""
    if config.id_field == "" or not isinstance(data, Mapping):
        return None
    raw_id = _raw_id(data, config.id_field or DEFAULT_ID_FIELD, required=False)
    return raw_id if _usable_id(raw_id) else None


def _pick_shape(data: Mapping[str, Any], config: DataConfig) -> str:
    if config.shape != "auto":
        return config.shape
    if data.get(config.messages_field) is not None:
        return "messages"
    if data.get(config.conversations_field) is not None:
        return "conversations"
    if config.prompt_field in data:
        return "prompt"
    fields = ", ".join(repr(str(k)) for k in list(data)[:8]) + (", ..." if len(data) > 8 else "")
    raise BadRow(
        f"no {config.prompt_field!r}, {config.messages_field!r} or {config.conversations_field!r} field"
        f"; the row has {fields or 'no fields'}"
    )


def _messages(data: Mapping[str, Any], config: DataConfig) -> tuple[Message, ...]:
    shape = _pick_shape(data, config)
    if shape == "prompt":
        field = config.prompt_field
        if field not in data:
            raise BadRow(f"missing field {field!r}")
        prompt = data[field]
        if not isinstance(prompt, str):
            raise BadRow(f"field {field!r} is {_type_name(prompt)}, expected text")
        if not prompt.strip():
            raise BadRow(f"field {field!r} is empty")
        return _validate([Message(USER, prompt)], field, config.system_prompt)
    field = config.messages_field if shape == "messages" else config.conversations_field
    if data.get(field) is None:
        raise BadRow(f"missing field {field!r}")
    return read_conversation(data[field], field, config.system_prompt)


def normalize(row: Row, config: DataConfig) -> Item | Skipped:
    """Normalize one raw row. Never raises for bad data: a bad row comes back as ``Skipped``.

    ``config.system_prompt`` is added as the first message when the row has no system message of
    its own (a row's own system prompt wins).
    """
    try:
        if not isinstance(row.data, Mapping):
            raise BadRow(f"row is {_type_name(row.data)}, expected an object")
        messages = _messages(row.data, config)
        if config.id_field:
            raw_id = _raw_id(row.data, config.id_field, required=True)
            assert raw_id is not None
            item_id = raw_id
        else:
            raw_id = _raw_id(row.data, DEFAULT_ID_FIELD, required=False)
            item_id = raw_id if config.id_field is None and raw_id is not None and _usable_id(raw_id) \
                else content_hash(messages)
    except BadRow as bad:
        return Skipped(row.source, row.line, bad.reason, SHAPE_KIND, raw_id=_skipped_id(row.data, config))
    return Item(id=item_id, source=row.source, source_line=row.line, messages=messages, raw_id=raw_id)


__all__ = ["BadRow", "DEFAULT_ID_FIELD", "ROLE_ALIASES", "SHAPE_KIND", "SKIP_PREFIX", "content_hash", "normalize",
           "read_conversation"]
