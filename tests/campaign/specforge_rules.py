"""SpecForge's check of regenerated data, encoded for the tests: the rules a row must meet before
SpecForge trains on it.

Upstream: github.com/sgl-project/SpecForge, ``scripts/validate_regenerated_data.py`` (``validate_row``
and ``validate_dataset``) with ``scripts/conversation_validation.py`` (``validate_conversation``), as
of the SpecForge 0.2.0 release line (2026). The PyPI package ``specforge`` 0.2.0 does not ship
``scripts/`` and pins torch, sglang and transformers, so the check cannot be installed here and
run for real; these are its rules, restated:

- every non-blank line is a JSON object;
- ``id`` is a non-empty string (duplicate ids are allowed, and counted);
- ``status == "success"``;
- ``conversations`` is a non-empty list of objects; system messages may only lead; then ``user``
  and ``assistant`` alternate starting with ``user``; user and system ``content`` are non-empty
  strings, assistant ``content`` a string; at least one user message;
- ``reasoning_content``, where present on an assistant turn, is a string or null;
- at least one assistant message, and the conversation ends with one;
- with ``strict_think_markers``: no ``<think>``/``</think>`` (any case) in assistant content or
  reasoning.

``strict_empty_answers`` adds the rule the issue met in a SpecForge checkout ("message 1 content
must be a non-empty string" on an empty regenerated answer): assistant content non-empty too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class SpecForgeRejects(ValueError):
    """A row SpecForge's validator would refuse; the message says which line and why."""


def _think(text: str) -> bool:
    low = text.lower()
    return "<think>" in low or "</think>" in low


def conversation_error(messages: Any, *, strict_empty_answers: bool) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "conversations must be a non-empty list"
    expected, saw_user = "user", False
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"message {i} must be an object"
        role, content = m.get("role"), m.get("content")
        if role == "assistant" and not strict_empty_answers:
            if not isinstance(content, str):
                return f"message {i} content must be a string"
        elif not isinstance(content, str) or not content.strip():
            return f"message {i} content must be a non-empty string"
        if role == "system" and not saw_user:
            continue
        if role not in ("user", "assistant"):
            return f"message {i} has unsupported role {role!r}"
        if role != expected:
            return f"message {i} expected role {expected!r}, got {role!r}"
        saw_user = True
        expected = "assistant" if role == "user" else "user"
    return None if saw_user else "conversation has no user message"


def check_row(row: Any, *, strict_think_markers: bool = False, strict_empty_answers: bool = True) -> int:
    """The row's assistant message count; raises :class:`SpecForgeRejects` naming the rule broken."""
    if not isinstance(row, dict):
        raise SpecForgeRejects("expected a JSON object")
    if not isinstance(row.get("id"), str) or not row["id"].strip():
        raise SpecForgeRejects("id must be a non-empty string")
    if row.get("status") != "success":
        raise SpecForgeRejects("status must be 'success'")
    messages = row.get("conversations")
    error = conversation_error(messages, strict_empty_answers=strict_empty_answers)
    if error is not None:
        raise SpecForgeRejects(error)
    answers = 0
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        answers += 1
        reasoning = m.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            raise SpecForgeRejects(f"assistant message {i} reasoning_content must be a string or null")
        if strict_think_markers and (_think(m["content"]) or (isinstance(reasoning, str) and _think(reasoning))):
            raise SpecForgeRejects(f"assistant message {i} contains a thinking marker")
    if answers == 0:
        raise SpecForgeRejects("conversation has no assistant message")
    if messages[-1].get("role") != "assistant":
        raise SpecForgeRejects("conversation must end with an assistant message")
    return answers


def check_file(path: Path, **rules: bool) -> tuple[int, int]:
    """``(rows, assistant messages)`` of a file SpecForge accepts; raises :class:`SpecForgeRejects`
    for the first row it refuses, or for a file with no rows."""
    rows = answers = 0
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecForgeRejects(f"line {n}: invalid JSON: {exc}") from None
        try:
            answers += check_row(row, **rules)
        except SpecForgeRejects as exc:
            raise SpecForgeRejects(f"line {n}: {exc}") from None
        rows += 1
    if rows == 0:
        raise SpecForgeRejects(f"{path} contains no data rows")
    return rows, answers
