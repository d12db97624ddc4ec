"""The ledger's side of the token log-probability shards (``logprobs.py`` holds the files and their
format): the ``lp_shards`` table, one row per shard with the bytes that committed results cover.

The order is logprobs.py's: a batch's records are appended and ``fdatasync``-ed first
(:func:`append_records`, before the transaction); the transaction that inserts the result rows
referencing them also moves each shard's committed length (:func:`mark_committed`); a writable open
cuts every shard back to what the table says (:func:`committed_lengths`, ``ShardStore.trim``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping

from harvest.ledger.logprobs import ShardStore
from harvest.ledger.records import Completion

#: Where one result's record lies: (shard, offset, bytes).
LpRef = tuple[int, int, int]


def append_records(conn: sqlite3.Connection, shards: ShardStore,
                   completions: Iterable[Completion]) -> dict[int, LpRef]:
    """Append the records of ``completions`` (those that carry logprobs) to the current shard,
    synced before this returns; ``id(completion)`` -> where its record lies."""
    with_lp = [(c, c.logprobs) for c in completions if c.logprobs is not None]
    first_free = conn.execute("SELECT COALESCE(MAX(shard), -1) + 1 FROM lp_shards").fetchone()[0]
    refs = shards.append([record for _, record in with_lp], first_free)
    return {id(c): (shard, offset, len(record)) for (c, record), (shard, offset) in zip(with_lp, refs)}


def mark_committed(conn: sqlite3.Connection, refs: Mapping[int, LpRef], end: int) -> None:
    """Inside the write transaction: each shard that ``refs`` wrote to is committed up to ``end``."""
    for shard in {ref[0] for ref in refs.values()}:
        conn.execute("INSERT INTO lp_shards(shard, committed) VALUES (?, ?) ON CONFLICT(shard)"
                     " DO UPDATE SET committed = excluded.committed", (shard, end))


def committed_lengths(conn: sqlite3.Connection) -> dict[int, int]:
    """Shard -> the bytes of it that committed results cover."""
    return dict(conn.execute("SELECT shard, committed FROM lp_shards"))


def committed_usage(conn: sqlite3.Connection) -> tuple[int, int]:
    """``(shards, bytes)`` of logprob storage that committed results cover."""
    shards, size = conn.execute("SELECT COUNT(*), COALESCE(SUM(committed), 0) FROM lp_shards").fetchone()
    return int(shards), int(size)


__all__ = ["LpRef", "append_records", "committed_lengths", "committed_usage", "mark_committed"]
