"""Words shared by every message harvest prints: a count with its noun in the right number."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 row``, ``2 rows``, ``1,234 rows``; ``plural`` where adding an s is wrong."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


__all__ = ["counted"]
