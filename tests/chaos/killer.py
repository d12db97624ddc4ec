"""SIGKILL of `harvest run` at chosen moments, and the checks that follow every kill.

Shared by the CI tests in this folder and by ``bench/chaos.py``. Two ways to choose the moment,
both measured from outside the process (harvest has no fault hook):

``random``  after a random delay: start-up, ingest, dispatch or a commit, wherever it lands.
``commit``  inside a ledger write transaction. SQLite holds the WAL write lock, an exclusive POSIX
            lock on byte 120 of ``ledger.sqlite-shm``, from ``BEGIN IMMEDIATE`` until its
            ``COMMIT`` is done, and ``/proc/locks`` lists it with the holder's pid. The killer polls
            ``/proc/locks``; when the run holds the lock it freezes the run (SIGSTOP), looks again
            while it is frozen, and SIGKILLs it if the lock is still held: the kill then provably
            lands between ``BEGIN`` and the end of ``COMMIT``. Otherwise the run is resumed
            (SIGCONT) and the wait goes on.

Only the `harvest run` processes started here are signalled, by the pid of a child that has not
been reaped (so the pid cannot belong to anyone else). Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from tests import harvest_process

#: Byte of the -shm file that SQLite's WAL write lock covers (WALINDEX_LOCK_OFFSET + WAL_WRITE_LOCK).
WAL_WRITE_LOCK_BYTE = 120


def write_data(path: Path, n: int, duplicates: int = 5, shared: int = 0) -> Path:
    """``n`` prompts with ids ``k0..k{n-1}``, plus ``duplicates`` repeats of ``k7`` (the ledger dedupes).
    ``shared``: every even row has one of that many system prompts, so the run's send order groups
    them and claims deeper ahead (campaign/run/order.py) while it is killed."""
    rows = [json.dumps(shared_row(i, shared) if shared and i % 2 == 0 else
                       {"id": f"k{i}", "prompt": f"Write a line about the number {i}."}) for i in range(n)]
    rows += [json.dumps({"id": "k7", "prompt": "Write a line about the number 7."})] * duplicates
    path.write_text("\n".join(rows) + "\n")
    return path


def shared_row(i: int, shared: int) -> dict[str, object]:
    """Row ``k{i}`` with system prompt ``i % shared`` of ``shared``."""
    system = f"You are helper {i % shared}. Answer in one short line, plainly, without lists."
    return {"id": f"k{i}", "messages": [{"role": "system", "content": system},
                                        {"role": "user", "content": f"Write a line about the number {i}."}]}


def harvest_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "harvest", *args]


# --- what the ledger file holds ----------------------------------------------------------------


@dataclass(frozen=True)
class LedgerView:
    """The ledger as read straight from the SQLite file (no harvest code involved)."""

    integrity: str
    ingest_complete: bool
    items: int
    counts: dict[str, int]
    #: item seq -> created_at of its result (a result rewritten would change its created_at).
    results: dict[int, float]
    #: Results whose item is not done/truncated, and done/truncated items without a result.
    orphans: int
    missing: int
    #: Ids that occur more than once in the items table (must be 0: the id is unique).
    repeated_ids: int


def read_ledger(run_dir: Path) -> LedgerView | None:
    """None while the run has not created its tables yet."""
    path = run_dir / "ledger.sqlite"
    if not path.exists():
        return None
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"items", "results", "meta"} <= tables:
            return None
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        ingest = json.loads(meta["ingest"]) if "ingest" in meta else {"complete": False}
        counts = dict(conn.execute("SELECT status, COUNT(*) FROM items GROUP BY status"))
        results = dict(conn.execute("SELECT item, created_at FROM results"))
        orphans = conn.execute(
            "SELECT COUNT(*) FROM results r LEFT JOIN items i ON i.seq = r.item "
            "WHERE i.status IS NULL OR i.status NOT IN ('done', 'truncated')").fetchone()[0]
        missing = conn.execute(
            "SELECT COUNT(*) FROM items i LEFT JOIN results r ON r.item = i.seq "
            "WHERE i.status IN ('done', 'truncated') AND r.item IS NULL").fetchone()[0]
        repeated = conn.execute(
            "SELECT COUNT(*) FROM (SELECT id FROM items GROUP BY id HAVING COUNT(*) > 1)").fetchone()[0]
        items = conn.execute("SELECT COUNT(*) FROM items").fetchone()[0]
        return LedgerView(integrity, bool(ingest.get("complete")), items, counts, results, orphans, missing,
                          repeated)
    finally:
        conn.close()


def check_after_kill(before: LedgerView | None, after: LedgerView | None) -> list[str]:
    """What is wrong with the ledger after a kill, compared with the view before it (empty: all fine)."""
    if after is None:
        return [] if before is None else ["the ledger tables disappeared"]
    problems = []
    if after.integrity != "ok":
        problems.append(f"integrity_check: {after.integrity}")
    if after.orphans:
        problems.append(f"{after.orphans} results belong to items that are not done/truncated")
    if after.missing:
        problems.append(f"{after.missing} done/truncated items have no result")
    if after.repeated_ids:
        problems.append(f"{after.repeated_ids} ids occur more than once")
    if before is not None:
        lost = [seq for seq in before.results if seq not in after.results]
        changed = [seq for seq, t in before.results.items()
                   if seq in after.results and after.results[seq] != t]
        if lost:
            problems.append(f"{len(lost)} committed results were lost (e.g. item seq {lost[0]})")
        if changed:
            problems.append(f"{len(changed)} committed results were written again "
                            f"(e.g. item seq {changed[0]})")
        if after.items < before.items:
            problems.append(f"items went from {before.items} to {after.items}")
    return problems


# --- the kills ---------------------------------------------------------------------------------


def holds_wal_write_lock(pid: int, shm: Path) -> bool:
    """Whether ``pid`` holds SQLite's WAL write lock on ``shm`` now (read from /proc/locks)."""
    try:
        st = os.stat(shm)
        with open("/proc/locks") as fh:
            text = fh.read()
    except OSError:
        return False
    inode = f":{st.st_ino} "
    byte = f" {WAL_WRITE_LOCK_BYTE} {WAL_WRITE_LOCK_BYTE}"
    for line in text.splitlines():
        parts = line.split()
        # "1: POSIX  ADVISORY  WRITE 30690 fe:00:2146691 120 120"
        if len(parts) >= 8 and parts[1] == "POSIX" and parts[3] == "WRITE" and parts[4] == str(pid) \
                and (parts[5] + " ").endswith(inode) and line.endswith(byte):
            return True
    return False


def kill_inside_commit(proc: subprocess.Popen, run_dir: Path, timeout: float, poll: float = 0.0005) -> bool:
    """SIGKILL ``proc`` while it is frozen inside a ledger write transaction (see the module doc).

    Returns True once it did; False when the process exited or ``timeout`` passed first (the
    process is then left running, for the caller to kill or wait for).
    """
    shm = run_dir / "ledger.sqlite-shm"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if holds_wal_write_lock(proc.pid, shm):
            os.kill(proc.pid, signal.SIGSTOP)  # our unreaped child: the pid is still its own
            try:
                _wait_stopped(proc.pid, 1.0)
                if holds_wal_write_lock(proc.pid, shm):
                    os.kill(proc.pid, signal.SIGKILL)
                    return True
            finally:
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)
        time.sleep(poll)
    return False


def _wait_stopped(pid: int, timeout: float) -> None:
    """Wait until the kernel reports every thread of ``pid`` stopped (SIGSTOP is delivered
    asynchronously, thread by thread; the ledger commits on a thread of its own)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            states = []
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                    states.append(fh.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            return
        if all(s in ("T", "t") for s in states):
            return
        time.sleep(0.0002)


# --- rounds ------------------------------------------------------------------------------------


@dataclass
class ChaosResult:
    """What a series of kill/resume rounds did and found."""

    rounds: int = 0
    kills: Counter = field(default_factory=Counter)  # "commit" / "random" -> count
    #: Kills inside a commit, by the phase the ledger shows afterwards ("ingest" or "dispatch").
    commit_phases: Counter = field(default_factory=Counter)
    finished_early: int = 0
    #: Commit rounds that saw no commit within their timeout; killed then, counted as random kills.
    commit_timeouts: int = 0
    problems: list[str] = field(default_factory=list)
    results_per_round: list[int] = field(default_factory=list)

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())


def chaos_rounds(argv: list[str], run_dir: Path, *, kills: int, mode: str, rng: random.Random,
                 env: dict[str, str] | None = None, max_rounds: int | None = None,
                 random_delay: tuple[float, float] = (0.3, 2.5),
                 commit_delay: tuple[float, float] = (0.0, 1.0),
                 commit_timeout: float = 30.0) -> ChaosResult:
    """Start ``argv`` (a `harvest run`) and SIGKILL it, ``kills`` times; check the ledger after each.

    ``mode``: "commit", "random" or "mixed" (alternating). A round whose run finished before the
    kill is counted in ``finished_early`` and not as a kill.
    """
    result = ChaosResult()
    max_rounds = max_rounds or 3 * kills
    before = read_ledger(run_dir)
    while result.total_kills < kills and result.rounds < max_rounds:
        result.rounds += 1
        kind = mode if mode != "mixed" else ("commit" if result.rounds % 2 else "random")
        proc = harvest_process.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, env=env)
        killed = False
        try:
            if kind == "commit":
                time.sleep(rng.uniform(*commit_delay))
                killed = kill_inside_commit(proc, run_dir, commit_timeout)
            else:
                time.sleep(rng.uniform(*random_delay))
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGKILL)
                    killed = True
        finally:
            if proc.poll() is None and not killed:
                # No commit within the timeout (a starved machine): the kill lands wherever the run is.
                os.kill(proc.pid, signal.SIGKILL)
                kind, killed = "random", True
                result.commit_timeouts += 1
            proc.wait(timeout=60)
        if killed:
            result.kills[kind] += 1
        else:
            result.finished_early += 1
        after = read_ledger(run_dir)
        if killed and kind == "commit":
            result.commit_phases["dispatch" if after is not None and after.ingest_complete else "ingest"] += 1
        for p in check_after_kill(before, after):
            result.problems.append(f"round {result.rounds} ({kind}): {p}")
        result.results_per_round.append(len(after.results) if after else 0)
        before = after if after is not None else before
    return result


def final_check(run_dir: Path, unique: int) -> list[str]:
    """After the last resume: every unique input id once, each done with exactly one result."""
    view = read_ledger(run_dir)
    if view is None:
        return ["no ledger"]
    problems = check_after_kill(None, view)
    if not view.ingest_complete:
        problems.append("ingest incomplete")
    if view.items != unique:
        problems.append(f"{view.items} items in the ledger, {unique} unique input ids")
    final = sum(view.counts.get(s, 0) for s in ("done", "truncated", "failed", "skipped"))
    if final != unique:
        problems.append(f"statuses add up to {final} final items of {unique}: {view.counts}")
    if len(view.results) != view.counts.get("done", 0) + view.counts.get("truncated", 0):
        problems.append(f"{len(view.results)} results for {view.counts}")
    return problems


def committed(run_dir: Path) -> int:
    """Results committed so far (0 before the ledger has its tables)."""
    path = run_dir / "ledger.sqlite"
    if not path.exists():
        return 0
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def wait_committed(run_dir: Path, at_least: int, proc: subprocess.Popen | None = None,
                   timeout: float = 120) -> int:
    """Wait until ``at_least`` results are committed; fails if ``proc`` ends first or time runs out."""
    end = time.monotonic() + timeout
    while True:
        n = committed(run_dir)
        if n >= at_least:
            return n
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) with {n} results, "
                                 f"before {at_least}")
        if time.monotonic() > end:
            raise AssertionError(f"only {n} results after {timeout} s, waiting for {at_least}")
        time.sleep(0.05)
