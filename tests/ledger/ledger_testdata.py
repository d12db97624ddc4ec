"""Synthetic input for the ledger tests, shaped as the dataset layer yields it."""

from __future__ import annotations

from collections.abc import Iterator

from harvest.dataset import Item, Message, Skipped, content_hash


def make_item(text: str, line: int, source: str = "data.jsonl", item_id: str | None = None) -> Item:
    messages = (Message("user", text),)
    return Item(item_id or content_hash(messages), source, line, messages)


def synthetic(n: int, dup_every: int = 0, skip_every: int = 0) -> Iterator[Item | Skipped]:
    """``n`` rows; every ``dup_every``-th repeats row 0's prompt, every ``skip_every``-th is bad."""
    for line in range(1, n + 1):
        if skip_every and line % skip_every == 0:
            yield Skipped("data.jsonl", line, "bad JSON: test")
        elif dup_every and line % dup_every == 0:
            yield make_item("prompt 1", line)
        else:
            yield make_item(f"prompt {line}", line)
