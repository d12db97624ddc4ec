"""Samples per item ([sampling] n) and logprob records in the ledger: keys, totals, commit order,
the version 2 -> 3 migration."""

from __future__ import annotations

import os
import sqlite3

import numpy as np
import pytest

from harvest.errors import LedgerError
from harvest.ledger import SCHEMA_VERSION, Completion, Failure, Ledger, Status
from harvest.ledger.logprobs import LOGPROB_DIR, TurnLogprobs, decode, encode, from_openai, shard_name
from tests.ledger.ledger_testdata import synthetic


def _turn(n: int, k: int, seed: int) -> TurnLogprobs:
    rng = np.random.default_rng(seed)
    return TurnLogprobs(rng.integers(0, 32000, n).astype(np.int32), (-rng.random(n)).astype(np.float16),
                        rng.integers(0, 32000, (n, k)).astype(np.int32),
                        (-rng.random((n, k))).astype(np.float16))


def test_record_round_trip_and_checksum():
    turns = [_turn(7, 5, 1), _turn(0, 5, 2), _turn(3, 5, 3)]
    buf = encode(turns, 5)
    back = decode(buf)
    assert len(back) == 3
    for a, b in zip(turns, back):
        assert np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.top_ids, b.top_ids)
        assert np.array_equal(a.logprobs, b.logprobs) and np.array_equal(a.top_logprobs, b.top_logprobs)
    bad = bytearray(buf)
    bad[-1] ^= 0xFF
    with pytest.raises(LedgerError, match="checksum"):
        decode(bytes(bad))


def test_from_openai_reads_vllm_and_llama_ids():
    vllm = {"content": [{"token": "token_id:17", "logprob": -0.5,
                         "top_logprobs": [{"token": "token_id:17", "logprob": -0.5},
                                          {"token": "token_id:3", "logprob": -1.25}]}]}
    t = from_openai(vllm, 3)  # fewer candidates than k: the general path pads
    assert t.token_ids.tolist() == [17] and t.top_ids.tolist() == [[17, 3, -1]]
    assert t.top_logprobs[0, 2] == -np.inf
    full = from_openai(vllm, 2)  # exactly k: the bulk path, the same values
    assert full.top_ids.tolist() == [[17, 3]] and full.top_logprobs.tolist() == [[-0.5, -1.25]]
    assert full.logprobs.dtype == np.float16 and full.logprobs.tolist() == [-0.5]
    llama = {"content": [{"id": 5, "token": "a", "logprob": -0.1, "top_logprobs": [{"id": 5, "token": "a",
                                                                                   "logprob": -0.1}]}]}
    assert from_openai(llama, 1).token_ids.tolist() == [5]
    with pytest.raises(ValueError, match="no token id"):
        from_openai({"content": [{"token": "a", "logprob": -0.1, "top_logprobs": []}]}, 1)


def test_samples_are_rows_counted_in_totals(run_dir):
    with Ledger.open(run_dir, settings_hash="h", samples=3) as ledger:
        report = ledger.ingest(synthetic(10, dup_every=5, skip_every=7))
        assert report.unique == 8  # 10 rows, two duplicates
        rows = ledger.claim(100)
        # skipped input: 3 skipped rows, never claimed; 7 usable inputs x 3 samples
        assert len(rows) == 21
        assert sorted({r.sample for r in rows}) == [0, 1, 2]
        assert len({r.key for r in rows}) == 21
        # every sample of an input reads the same input
        by_id: dict[str, set[str]] = {}
        for r in rows:
            by_id.setdefault(r.id, set()).add(r.item.messages[0].content)
        assert all(len(v) == 1 for v in by_id.values())
        first = rows[0]
        ops = [Completion(r.id, {"s": r.sample}, sample=r.sample) for r in rows[1:]]
        assert ledger.complete(ops) == 20
        assert ledger.complete([Completion(rows[1].id, {"again": 1}, sample=rows[1].sample)]) == 0
        assert ledger.fail(first.id, "boom", "http_400", sample=first.sample)
        totals = ledger.check_totals()
        assert totals.ok, totals.describe()
        assert totals.counts[Status.SKIPPED] == 3 and totals.counts[Status.DONE] == 20
        assert "x 3 samples = 24" in totals.describe()
        got = ledger.get(rows[2].id, rows[2].sample)
        assert got is not None and got.output == {"s": rows[2].sample} and got.sample == rows[2].sample


def test_samples_cannot_change_on_resume(run_dir):
    Ledger.open(run_dir, settings_hash="h", samples=2).close()
    with pytest.raises(LedgerError, match="n = 2 .* n = 4"):
        Ledger.open(run_dir, settings_hash="h", samples=4)


def test_logprobs_commit_with_result_and_orphans_are_cut(run_dir):
    with Ledger.open(run_dir, settings_hash="h", samples=2) as ledger:
        ledger.ingest(synthetic(3))
        rows = ledger.claim(6)
        recs = {r.key: encode([_turn(4 + r.sample, 5, hash(r.key) % 1000)], 5) for r in rows}
        ledger.complete([Completion(r.id, "x", sample=r.sample, logprobs=recs[r.key]) for r in rows[:4]])
        shards, size = ledger.logprob_usage()
        assert shards == 1 and size == sum(len(recs[r.key]) for r in rows[:4])
        for r in rows[:4]:
            row = ledger.get(r.id, r.sample)
            assert row.logprobs_at is not None
            assert decode(recs[r.key])[0].token_ids.tolist() == ledger.logprobs(row)[0].token_ids.tolist()
        # A crash after the shard write, before the ledger commit: bytes no row references.
        shard = run_dir / LOGPROB_DIR / shard_name(0)
        with open(shard, "ab") as f:
            f.write(recs[rows[4].key])
        stray = run_dir / LOGPROB_DIR / shard_name(7)
        stray.write_bytes(b"never committed")
    with Ledger.open(run_dir, settings_hash="h", samples=2) as ledger:
        assert shard.stat().st_size == size  # cut back to what committed rows cover
        assert not stray.exists()
        assert ledger.recovered == 2
        rows = ledger.claim(6)
        ledger.complete([Completion(r.id, "y", sample=r.sample, logprobs=encode([_turn(2, 5, 9)], 5))
                         for r in rows])
        assert ledger.check_totals().ok
        assert ledger.logprob_usage()[0] == 2  # this handle wrote a shard of its own
        assert oct(os.stat(run_dir / LOGPROB_DIR).st_mode & 0o777) == "0o700"
        assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in (run_dir / LOGPROB_DIR).iterdir())
        exported = [ledger.logprobs(r) for r in ledger.iter_results()]
        assert len(exported) == 6 and all(e is not None for e in exported)


def test_version2_ledger_is_migrated(run_dir):
    """A version-2 ledger (no sample column, no logprob columns) opens, keeps its rows as sample 0."""
    with Ledger.open(run_dir, settings_hash="h") as ledger:
        ledger.ingest(synthetic(5))
        rows = ledger.claim(2)
        ledger.complete([Completion(rows[0].id, "kept")])
    # Turn it back into version 2's shape.
    conn = sqlite3.connect(run_dir / "ledger.sqlite", isolation_level=None)
    conn.executescript("""
        BEGIN;
        CREATE TABLE old_items (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, status TEXT NOT NULL,
          attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, error_class TEXT, source TEXT,
          source_line INTEGER, input_hash INTEGER, dup_count INTEGER NOT NULL DEFAULT 0,
          dup_conflicts INTEGER NOT NULL DEFAULT 0, updated_at REAL);
        INSERT INTO old_items SELECT seq, id, status, attempts, last_error, error_class, source, source_line,
          input_hash, dup_count, dup_conflicts, updated_at FROM items;
        DROP TABLE items; ALTER TABLE old_items RENAME TO items;
        CREATE INDEX items_status ON items(status);
        ALTER TABLE results DROP COLUMN lp_shard; ALTER TABLE results DROP COLUMN lp_offset;
        ALTER TABLE results DROP COLUMN lp_bytes; DROP TABLE lp_shards;
        UPDATE meta SET value = '2' WHERE key = 'schema_version';
        DELETE FROM meta WHERE key = 'samples';
        COMMIT;""")
    conn.close()
    with Ledger.open_readonly(run_dir) as ro:
        assert ro.get(rows[0].id).output == "kept" and ro.logprob_usage() == (0, 0)
    with Ledger.open(run_dir, settings_hash="h") as ledger:
        assert ledger.meta()["schema_version"] == SCHEMA_VERSION
        assert ledger.recovered == 1
        assert ledger.get(rows[0].id).output == "kept"
        assert ledger.recount() == (ledger.counts(), 1)
        rest = ledger.claim(10)
        assert len(rest) == 4
        ledger.complete([Completion(r.id, "new") for r in rest])
        assert ledger.check_totals().ok
