"""Fixtures of the chaos tests: a private index of server run folders per test (``harvest ps`` and
``harvest stop`` without a folder read it), shared with the `harvest` processes the tests start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def harvest_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("HARVEST_STATE_DIR", str(d))
    return d


@pytest.fixture
def env(harvest_state_dir: Path) -> dict[str, str]:
    """The environment of `harvest` subprocesses (the private index included)."""
    return dict(os.environ)
