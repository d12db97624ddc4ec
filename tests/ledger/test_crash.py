"""Crash safety on a real file: a child process running ingest/claim/complete is SIGKILLed (by its
pid) at chosen moments, again and again; after each kill the ledger is consistent, and the resumed
runs end with every unique input item finished exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harvest.ledger import LEDGER_FILE, Ledger, Status

CHILD = r"""
import sys
from harvest.config import DataConfig
from harvest.dataset import iter_items
from harvest.ledger import Completion, Ledger, Status

run, data = sys.argv[1], sys.argv[2]

def say(word):
    # Announce the phase, then wait for the test's go: the child is never more than one phase
    # ahead of what the test has read, however slow the test is to read it.
    print(word, flush=True)
    sys.stdin.readline()

def announced(records):
    for n, rec in enumerate(records):
        if n % 500 == 0:
            say("ingest")
        yield rec

with Ledger.open(run, settings_hash="crash-test") as ledger:
    say(f"open {ledger.recovered}")
    ledger.ingest(announced(iter_items(DataConfig(path=data))), batch_size=1000)
    while True:
        say("claim")
        rows = ledger.claim(2500)
        if not rows:
            break
        ledger.charge_attempt([r.id for r in rows[:3]])
        say("complete")
        ledger.complete([
            Completion(r.id, {"reply": r.item.user_turns()[-1][::-1]},
                       Status.TRUNCATED if r.item.source_line % 11 == 0 else Status.DONE)
            for r in rows
        ])
print("finished", flush=True)
"""

ROWS = 12_000


def write_input(path: Path) -> tuple[int, int, int]:
    """The dataset: some rows repeat earlier prompts, some are bad JSON. Returns (unique, dups, bad)."""
    seen: set[str] = set()
    dups = bad = 0
    with path.open("w") as f:
        for line in range(1, ROWS + 1):
            if line % 501 == 0:
                f.write('{"prompt": broken\n')
                bad += 1
                continue
            prompt = f"prompt {line % 11_000}"
            dups += prompt in seen
            seen.add(prompt)
            f.write(json.dumps({"prompt": prompt}) + "\n")
    return len(seen) + bad, dups, bad


def read_line(proc: subprocess.Popen[str], deadline: float) -> str | None:
    """The child's next stdout line, or None at EOF. Fails the test past the deadline."""
    assert proc.stdout is not None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        pytest.fail("the child ledger process made no progress before the deadline")
    ready, _, _ = select.select([proc.stdout], [], [], remaining)
    if not ready:
        pytest.fail("the child ledger process made no progress before the deadline")
    line = proc.stdout.readline()
    return line.strip() if line else None


def go(proc: subprocess.Popen[str]) -> None:
    """Let the child go on past the phase it announced."""
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def check_consistent(run: Path) -> int:
    """Invariants that must hold in the file at any moment; returns the rows left running."""
    conn = sqlite3.connect(run / LEDGER_FILE)
    try:
        results = conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        finished = conn.execute(
            "SELECT COUNT(*) FROM items WHERE status IN ('done', 'truncated')").fetchone()[0]
        mismatched = conn.execute(
            "SELECT COUNT(*) FROM results AS r JOIN items AS i ON i.seq = r.item"
            " WHERE i.status <> r.status").fetchone()[0]
        running = conn.execute("SELECT COUNT(*) FROM items WHERE status = 'running'").fetchone()[0]
    finally:
        conn.close()
    assert results == finished, f"{results} results for {finished} done/truncated items"
    assert mismatched == 0
    return running


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(tmp_path):
    data = tmp_path / "prompts.jsonl"
    unique, dups, bad = write_input(data)
    run = tmp_path / "run"
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    rng = random.Random(4)
    # Phases to kill in: during ingest, right after claiming, in the middle of a complete batch.
    plan = ["ingest", "ingest", "claim", "complete", "complete", "claim", "complete", "complete"]
    kills = 0
    left_running = 0
    for phase in [*plan, None]:
        proc = subprocess.Popen([sys.executable, str(child), str(run), str(data)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=os.environ.copy())
        try:
            deadline = time.monotonic() + 120
            first = read_line(proc, deadline)
            assert first is not None and first.startswith("open ")
            assert int(first.split()[1]) == left_running  # running rows came back to pending at open
            go(proc)
            seen = 0
            while True:
                line = read_line(proc, deadline)
                if line is None or line == "finished":
                    break
                go(proc)  # the child works on the phase it announced
                if line == phase:
                    seen += 1
                    if seen == 2 or phase != "ingest":
                        time.sleep(rng.uniform(0, 0.02))
                        os.kill(proc.pid, signal.SIGKILL)
                        kills += 1
                        break
        finally:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # a hung child: end it (ours, by pid) and fail below
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
            assert proc.stdout is not None and proc.stdin is not None
            proc.stdout.close()
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        if phase is None:
            assert proc.returncode == 0
        left_running = check_consistent(run)
    assert kills == len(plan)

    with Ledger.open(run, settings_hash="crash-test") as ledger:
        totals = ledger.check_totals()
        rows = list(ledger.iter_results([Status.DONE, Status.TRUNCATED]))
        attempts = ledger.conn.execute("SELECT MAX(attempts) FROM items").fetchone()[0]
    assert totals.ok, totals.describe()
    assert totals.input_rows == ROWS and totals.unique == unique and totals.duplicates == dups
    assert totals.counts[Status.SKIPPED] == bad
    assert len(rows) == len({r.item_id for r in rows}) == unique - bad
    for r in rows:  # every result belongs to its own item
        assert r.output == {"reply": r.item.user_turns()[-1][::-1]}  # type: ignore[union-attr]
    assert attempts >= 1
