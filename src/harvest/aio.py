"""The event loop harvest's commands run on: uvloop when it is installed (the ``fast`` extra:
``pip install -e '.[fast]'`` in the clone), asyncio's own otherwise, or when ``HARVEST_UVLOOP=0`` asks for it.

uvloop runs the client's event loop in C (its share of a request's CPU was 24 % in P2's profile);
what it changes is measured in BENCHMARKS.md (P2, ``harvest-uvloop`` against ``harvest``). Nothing
here is imported at start-up by the library: only the CLI entry points call :func:`run`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def uvloop_wanted() -> bool:
    """True when uvloop is importable and ``HARVEST_UVLOOP`` does not say 0."""
    if os.environ.get("HARVEST_UVLOOP", "1").strip().lower() in ("0", "no", "false", "off"):
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on uvloop's loop when :func:`uvloop_wanted`, else on asyncio's."""
    if uvloop_wanted():
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


__all__ = ["run", "uvloop_wanted"]
