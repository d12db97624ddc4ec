"""Records that flow out of the dataset layer: a normalized conversation (``Item``) or a bad row
(``Skipped``), plus the raw ``Row`` a reader yields before normalization.

An ``Item`` is what the runner generates from: its conversation is already normalized to
system/user/assistant messages with text content, validated (starts with a user turn after any
system messages, roles alternate), and carries a stable id. This module never reads files and never
decides how a row maps to messages (that is ``shapes``); it only defines the records and the pure
helpers on them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Literal

Role = Literal["system", "user", "assistant"]

SYSTEM: Role = "system"
USER: Role = "user"
ASSISTANT: Role = "assistant"
ROLES: tuple[Role, ...] = (SYSTEM, USER, ASSISTANT)

#: The two urls of an OpenAI batch line that harvest runs (dataset/batch.py).
CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"


@dataclass(frozen=True)
class BatchRequest:
    """A batch row's own request: where it goes and the body fields sent on top of ``[sampling]``.

    ``fields`` holds only what the row set (``max_completion_tokens`` read as ``max_tokens``), as
    sorted ``(name, value)`` pairs, values as JSON; ``prompt`` is the text of a completions row.
    """

    url: str
    fields: tuple[tuple[str, Any], ...] = ()
    prompt: str | None = None

    @property
    def chat(self) -> bool:
        return self.url == CHAT_URL

    def overrides(self) -> dict[str, Any]:
        """The fields to send on top of the job's sampling settings (a new dict)."""
        return dict(self.fields)

    def get(self, name: str, default: Any = None) -> Any:
        return next((v for k, v in self.fields if k == name), default)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url, "fields": dict(self.fields)}
        if self.prompt is not None:
            out["prompt"] = self.prompt
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchRequest:
        return cls(url=data["url"], fields=tuple(sorted(data["fields"].items())), prompt=data.get("prompt"))


@dataclass(frozen=True)
class Message:
    """One normalized chat message."""

    role: Role
    content: str


@dataclass(frozen=True)
class Row:
    """A raw row as a reader found it, before normalization.

    ``line`` is 1-based: the physical line where the row starts for JSONL, JSON and CSV files, the
    row number inside the file for Parquet and Arrow files.
    """

    source: str
    line: int
    data: Mapping[str, Any]


@dataclass(frozen=True)
class Skipped:
    """A row that cannot be used, with where it is and why. The stream goes on after it."""

    source: str
    line: int
    reason: str
    #: ``"shape"``: the row was read but does not fit the ``[data]`` field mapping (so a changed
    #: mapping may read it); ``"input"``: the row itself cannot be read (bad JSON, bad encoding...).
    #: It is the skipped item's error class in the ledger.
    kind: str = "input"
    #: The row's own id as it gave it, where one could be read (an OpenAI batch line's
    #: ``custom_id``, a row's id field): what an export that echoes ids (``openai-batch``) names
    #: the row by. None when the row has none (not JSON, no id, an id that is not text).
    raw_id: str | None = None

    @property
    def id(self) -> str:
        """Stable ledger id of this bad row: ``skip:<file name>:<line>``.

        Only the file name is used (not the full path), so the id does not change when the dataset
        folder is moved between a run and its resume.
        """
        return f"skip:{PurePath(self.source).name}:{self.line}"


@dataclass(frozen=True)
class Item:
    """One usable input: a validated conversation with a stable id.

    ``messages`` holds every turn of the input: optional leading system message(s), then user and
    assistant messages alternating, starting with user. A trailing assistant message is the original
    answer to the last user turn (the runner regenerates it); a trailing user message asks for a new
    answer. ``raw_id`` is the user's id field as found (stringified), None when the row has none;
    ``id == raw_id`` when the item is known by the user's id, not by a content hash.
    """

    id: str
    source: str
    source_line: int
    messages: tuple[Message, ...]
    raw_id: str | None = None
    #: An OpenAI batch line's own request (dataset/batch.py): one request, sent as the row asks, on
    #: top of the job's ``[sampling]``; None for every other shape.
    request: BatchRequest | None = None

    @property
    def system(self) -> str | None:
        """The system prompt (several leading system messages are joined by a blank line)."""
        parts = [m.content for m in self.messages if m.role == SYSTEM]
        return "\n\n".join(parts) if parts else None

    def user_turns(self) -> tuple[str, ...]:
        """The content of every user message, in order: one generation per user turn."""
        return tuple(m.content for m in self.messages if m.role == USER)

    def assistant_turns(self) -> tuple[str, ...]:
        """The original assistant answers found in the input, in order (may be fewer than turns)."""
        return tuple(m.content for m in self.messages if m.role == ASSISTANT)

    @property
    def turns(self) -> int:
        """How many assistant answers the runner generates for this item (one per user turn)."""
        return sum(1 for m in self.messages if m.role == USER)

    def history(self, turn: int, replies: Sequence[str] | None = None) -> tuple[Message, ...]:
        """The messages to send to generate assistant turn ``turn`` (0-based).

        That is: the system message(s), then user turns ``0..turn`` with, between them, the assistant
        answers to turns ``0..turn-1``. Those answers come from ``replies`` (the regenerated ones) when
        given, else from the original input (the "keep the original turns as context" mode).
        """
        if not 0 <= turn < self.turns:
            raise IndexError(f"item {self.id} has {self.turns} user turns; turn {turn} does not exist")
        if replies is not None and len(replies) < turn:
            raise ValueError(f"turn {turn} needs {turn} earlier replies, got {len(replies)}")
        users = [m for m in self.messages if m.role == USER]
        originals = self.assistant_turns()
        out = [m for m in self.messages if m.role == SYSTEM]
        for i in range(turn + 1):
            out.append(users[i])
            if i < turn:
                # Roles alternate (checked at normalization), so every user turn but the last has an
                # original answer.
                out.append(Message(ASSISTANT, replies[i] if replies is not None else originals[i]))
        return tuple(out)

    def to_json(self) -> str:
        """Compact JSON of the conversation and raw id (what the ledger stores; see :meth:`from_json`).

        The id, source and line are not included: the ledger keeps them in their own columns.
        """
        data: dict[str, Any] = {"raw_id": self.raw_id, "messages": [[m.role, m.content] for m in self.messages]}
        if self.request is not None:
            data["request"] = self.request.to_dict()
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"), sort_keys=self.request is not None)

    @classmethod
    def from_json(cls, item_id: str, source: str, source_line: int, text: str) -> Item:
        """Rebuild an item stored with :meth:`to_json`."""
        data = json.loads(text)
        return cls(
            id=item_id,
            source=source,
            source_line=source_line,
            messages=tuple([Message(role, content) for role, content in data["messages"]]),
            raw_id=data["raw_id"],
            request=BatchRequest.from_dict(data["request"]) if "request" in data else None,
        )


__all__ = ["ASSISTANT", "BatchRequest", "CHAT_URL", "COMPLETIONS_URL", "Item", "Message", "ROLES", "Role", "Row", "SYSTEM", "Skipped", "USER"]
