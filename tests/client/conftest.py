"""Fixtures of the client tests: a fake clock, a scripted fake server, real servers on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.client.fakes import FakeServer, FakeTime, LiveServer


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def fake_server() -> FakeServer:
    return FakeServer()


@pytest.fixture
def live_servers() -> Iterator[Callable[..., LiveServer]]:
    """A factory of live servers; every one it started is killed at the end of the test."""
    started: list[LiveServer] = []

    def start(*args: str, port: int = 0) -> LiveServer:
        server = LiveServer(*args, port=port)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()
