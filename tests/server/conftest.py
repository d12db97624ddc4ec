"""Fixtures of the server tests: a private index of run folders per test, and a launcher whose
servers are all stopped (verified) in teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.helpers import Launcher


@pytest.fixture(autouse=True)
def harvest_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own index of run folders (``harvest ps`` reads it)."""
    d = tmp_path / "state"
    monkeypatch.setenv("HARVEST_STATE_DIR", str(d))
    return d


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.cleanup()
