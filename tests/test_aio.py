"""``harvest.aio.run``: uvloop's event loop when installed, asyncio's when HARVEST_UVLOOP=0."""

from __future__ import annotations

import asyncio

import pytest

from harvest import aio


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_harvest_uvloop_0_runs_on_asyncio(monkeypatch):
    monkeypatch.setenv("HARVEST_UVLOOP", "0")
    assert not aio.uvloop_wanted()
    assert aio.run(loop_module()).startswith("asyncio")


@pytest.mark.realpart("uvloop", "harvest run's event loop is uvloop where it is installed (the 'fast' extra)")
def test_uvloop_is_used_when_installed(monkeypatch):
    monkeypatch.delenv("HARVEST_UVLOOP", raising=False)
    assert aio.uvloop_wanted()
    assert aio.run(loop_module()).startswith("uvloop")
