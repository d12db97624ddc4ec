"""A package's names imported on first use (PEP 562): ``__getattr__ = lazy(__name__, {name: module})``.

A command imports only what it uses: ``harvest stop`` reaches ``harvest.client.EngineLimit`` without
aiohttp, ``import harvest`` loads no config model, ``harvest.campaign.run.runner`` comes without the
session. Each name is kept in the package's namespace once imported, so later lookups skip this."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` of ``package``: ``where`` maps each name it offers to the
    module that defines it."""

    def __getattr__(name: str) -> Any:  # Any: whichever object the name is
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


__all__ = ["lazy"]
