"""Fixtures of the ledger tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def run_dir(tmp_path):
    """A run folder that does not exist yet (the ledger creates it)."""
    return tmp_path / "run"
