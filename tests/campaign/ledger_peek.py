"""Read a run's ledger straight from its SQLite file, read-only, while a `harvest run` may be writing.

Tests use these to observe what was really committed, independently of harvest's own ledger code.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


def _query(run_dir: Path, sql: str) -> list[tuple]:
    path = run_dir / "ledger.sqlite"
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:  # tables not created yet
        return []
    finally:
        conn.close()


def results_count(run_dir: Path) -> int:
    rows = _query(run_dir, "SELECT COUNT(*) FROM results")
    return rows[0][0] if rows else 0


def result_ids(run_dir: Path) -> list[str]:
    """The item id of every committed result (an id twice: a result twice)."""
    return [r[0] for r in _query(run_dir, "SELECT i.id FROM results r JOIN items i ON i.seq = r.item")]


def statuses(run_dir: Path) -> dict[str, int]:
    return dict(_query(run_dir, "SELECT status, COUNT(*) FROM items GROUP BY status"))


def attempts(run_dir: Path) -> list[int]:
    return [r[0] for r in _query(run_dir, "SELECT attempts FROM items")]


def orphan_results(run_dir: Path) -> int:
    """Results whose item is not done or truncated: a result that should not exist."""
    rows = _query(run_dir, "SELECT COUNT(*) FROM results r JOIN items i ON i.seq = r.item "
                           "WHERE i.status NOT IN ('done', 'truncated')")
    return rows[0][0] if rows else 0


def unique_items(run_dir: Path) -> int:
    rows = _query(run_dir, "SELECT COUNT(DISTINCT id) FROM items")
    return rows[0][0] if rows else 0
