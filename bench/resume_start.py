"""P3 resume start: time from `harvest run` start to its first dispatch, resuming a 10^6-item job.

    python bench/resume_start.py [--items 1000000] [--rounds 3]

Measures the whole command as a user runs it: ``harvest run job.toml`` in a fresh process (Python
start-up, imports, config, ledger open and crash recovery, dataset fingerprint, ingest-resume skip,
counts, client start, model discovery, first claim) until the first chat request reaches the server.

Set-up: a JSON Lines dataset of N synthetic prompts; a fast null OpenAI server (``null_server.py``'s
protocol, run in this process so it can note the arrival time of the first chat request on the
same monotonic clock). A first ``harvest run`` session of the fresh job (timed from its start to
its first dispatch: generation starts after the first ingest batch) is killed (SIGKILL) once half
the dataset is ingested; a second session resumes the ingest (timed to its first dispatch: the "mid-ingest"
figure, which pays for reading past the rows already in), serves ``--done-first`` requests and is
killed with requests in flight (rows left ``running``, as a crash leaves them).

Then, alternating, per round (the common case: a resume after the ingest finished):

    baseline  a fresh Python process that imports aiohttp and sends one chat request: the floor of
              any Python client's start-to-first-request
    harvest   ``harvest run job.toml`` resuming the job; once its first request arrived it gets
              SIGTERM (it releases what is in flight and exits), so the next round resumes again

Prints each time with the load average, the medians and the ratio to the baseline; target: harvest
<= 5 s. ``--profile DIR`` also writes a pyinstrument profile of one resume (``pip install
pyinstrument``). Every process started here is stopped by its pid with a bounded wait.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import null_server  # bench/null_server.py: the script's folder is on sys.path
from benchutil import exit_on_sigterm, load  # bench/benchutil.py

FIRST_CHAT = b"POST /v1/chat/completions "

BASELINE = (
    "import asyncio, json, aiohttp, sys\n"
    "async def main():\n"
    "    async with aiohttp.ClientSession() as s:\n"
    "        body = json.dumps({'model': 'null-model', 'messages': [{'role': 'user', 'content': 'hi'}],"
    " 'max_tokens': 16})\n"
    "        async with s.post(sys.argv[1] + '/v1/chat/completions', data=body,"
    " headers={'Content-Type': 'application/json'}) as r:\n"
    "            await r.read()\n"
    "asyncio.run(main())\n"
)



class Recorder:
    """The null server, run on a thread of this process, noting when chat requests arrive."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.count = 0
        self.armed = threading.Event()
        self.seen = threading.Event()
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="null-server", daemon=True)

    def arm(self) -> None:
        """Forget the last arrival: the next chat request is the one timed."""
        self.first = None
        self.seen.clear()

    def start(self, timeout: float = 15.0) -> None:
        ready = threading.Event()
        self._ready = ready
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError("the null server did not start")

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        recorder = self

        class Protocol(null_server._HttpProtocol):
            def data_received(self, data: bytes) -> None:
                if FIRST_CHAT in data:
                    recorder.count += data.count(FIRST_CHAT)
                    if recorder.first is None:
                        recorder.first = time.monotonic()
                        recorder.seen.set()
                super().data_received(data)

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await self._loop.create_server(Protocol, "127.0.0.1", 0, backlog=1024)
        host, port = server.sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self._ready.set()
        async with server:
            await self._stop.wait()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10.0)


def write_dataset(path: Path, n: int) -> None:
    with open(path, "w") as fh:
        fh.writelines(json.dumps({"id": f"item-{i}", "prompt": f"Write a short answer to question number {i}: "
                                 f"why does the sky look blue at noon and red at sunset?"}) + "\n" for i in range(n))


def write_job(path: Path, data: Path, url: str, run_dir: Path) -> None:
    q = json.dumps
    path.write_text(
        f"[data]\npath = {q(str(data))}\nid_field = \"id\"\n\n"
        "[sampling]\nmax_tokens = 16\n\n"
        f"[client]\nendpoints = [{q(url)}]\nconcurrency = 64\nhealth_deadline = 30\n\n"
        f"[output]\ndir = {q(str(run_dir))}\n"
    )


def stop_process(proc: subprocess.Popen, sig: int, timeout: float) -> int | None:
    """Send ``sig`` to the process we started and wait for it; SIGKILL if it outlives ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


def ledger_counts(run_dir: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        return dict(conn.execute("SELECT status, COUNT(*) FROM items GROUP BY status").fetchall())
    finally:
        conn.close()


def harvest_argv(job: Path, profile: Path | None = None) -> list[str]:
    if profile is not None:
        return [sys.executable, "-m", "pyinstrument", "--renderer", "text", "-o", str(profile), "-m", "harvest",
                "run", str(job), "--no-live"]
    return [sys.executable, "-m", "harvest", "run", str(job), "--no-live"]


def ingest_complete(run_dir: Path) -> bool:
    """True once the ledger holds the whole dataset."""
    try:
        conn = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'ingest'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return bool(row and json.loads(row[0])["complete"])


def ingested_rows(run_dir: Path) -> int:
    """Rows the ledger has committed from the dataset so far (0 before the ledger exists)."""
    if not (run_dir / "ledger.sqlite").exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'ingest'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return 0
    return json.loads(row[0])["rows"] if row else 0


def fill_by_sql(run_dir: Path, items: int) -> tuple[int, float]:
    """Write the rest of the dataset's rows straight into the ledger the killed first session left,
    as its ingest would have (same ids, source lines and stored input; the tally triggers count
    them), and mark the ingest complete. Returns (rows written, seconds)."""
    t0 = time.monotonic()
    conn = sqlite3.connect(run_dir / "ledger.sqlite", timeout=30, isolation_level=None)
    try:
        conn.execute("PRAGMA cache_size=-1048576")
        conn.execute("BEGIN IMMEDIATE")
        state = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'ingest'").fetchone()[0])
        start = state["rows"]
        source, template = conn.execute(
            "SELECT i.source, n.input FROM items AS i JOIN inputs AS n ON n.item = i.seq"
            " WHERE i.id = 'item-0'"
        ).fetchone()
        before = conn.execute("SELECT max(seq) FROM items").fetchone()[0]
        conn.execute(
            "WITH RECURSIVE k(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM k WHERE i + 1 < ?)"
            " INSERT INTO items(id, status, source, source_line, updated_at)"
            " SELECT 'item-' || i, 'pending', ?, i + 1, ? FROM k", (start, items, source, time.time()))
        conn.execute(
            "INSERT INTO inputs(item, input) SELECT seq,"
            " replace(replace(?, '\"item-0\"', '\"' || id || '\"'), 'number 0:',"
            " 'number ' || (source_line - 1) || ':') FROM items WHERE seq > ?", (template, before))
        state.update(rows=items, complete=True)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'ingest'", (json.dumps(state),))
        conn.execute("COMMIT")
    finally:
        conn.close()
    return items - start, time.monotonic() - t0


def killed_during_ingest(rec: Recorder, job: Path, run_dir: Path, log: Path,
                         args: argparse.Namespace) -> tuple[int, float | None]:
    """Start the job and SIGKILL it once about half the dataset is ingested. Returns the rows in
    and the seconds from start to the first dispatch of this fresh job (None if none came)."""
    rec.arm()
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(harvest_argv(job), stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + args.timeout
        while ingested_rows(run_dir) < (args.fill_by_sql or args.items // 2):
            if proc.poll() is not None:
                raise RuntimeError(f"the first session ended during ingest (exit {proc.returncode}); see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"half the ingest took over {args.timeout:g} s; see {log}")
            time.sleep(0.1)
    finally:
        stop_process(proc, signal.SIGKILL, 10)
    return ingested_rows(run_dir), (rec.first - t0 if rec.first is not None else None)


def crash_mid_flight(rec: Recorder, job: Path, run_dir: Path, log: Path,
                     args: argparse.Namespace) -> tuple[float, float]:
    """Start (or resume) the job, time its first dispatch, let it serve ``--done-first`` requests,
    then SIGKILL it with requests in flight. Returns (seconds to first dispatch, seconds in all)."""
    rec.arm()
    load_before = load()
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(harvest_argv(job), stdout=fh, stderr=subprocess.STDOUT)
    try:
        if not rec.seen.wait(args.timeout):
            raise RuntimeError(f"the session sent nothing within {args.timeout:g} s; see {log}")
        to_first = rec.first - t0  # type: ignore[operator]
        start = rec.count
        deadline = time.monotonic() + args.timeout
        while rec.count - start < args.done_first and time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the session ended early (exit {proc.returncode}); see {log}")
            time.sleep(0.2)
        # --finish-ingest: keep it running until the whole dataset is in the ledger, so the rounds
        # below resume a finished ingest (at 10^7 rows it outlasts --done-first requests).
        while args.finish_ingest and not ingest_complete(run_dir):
            if proc.poll() is not None:
                raise RuntimeError(f"the session ended early (exit {proc.returncode}); see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the ingest did not finish within {args.timeout:g} s; see {log}")
            time.sleep(1.0)
    finally:
        stop_process(proc, signal.SIGKILL, 10)
    print(f"  (mid-ingest resume {to_first:.3f} s to first dispatch; {load_before} -> {load()})", flush=True)
    return to_first, time.monotonic() - t0


def resume(rec: Recorder, job: Path, log: Path, args: argparse.Namespace, profile: Path | None = None) -> float:
    rec.arm()
    load_before = load()
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(harvest_argv(job, profile), stdout=fh, stderr=subprocess.STDOUT)
    try:
        if not rec.seen.wait(args.timeout):
            raise RuntimeError(f"harvest sent nothing within {args.timeout:g} s; see {log}")
        took = rec.first - t0  # type: ignore[operator]
    finally:
        code = stop_process(proc, signal.SIGTERM, 60)
    if code not in (0, 130, 1, -signal.SIGTERM):
        raise RuntimeError(f"harvest run exited with {code} after SIGTERM; see {log}")
    print(f"  harvest   {took:6.3f} s to first dispatch  ({load_before} -> {load()})", flush=True)
    return took


def baseline(rec: Recorder, args: argparse.Namespace) -> float:
    rec.arm()
    load_before = load()
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", BASELINE, rec.url], check=False, capture_output=True, text=True,
                          timeout=args.timeout)
    if done.returncode != 0 or rec.first is None:
        raise RuntimeError(f"the baseline client failed: {done.stderr[-2000:]}")
    took = rec.first - t0
    print(f"  baseline  {took:6.3f} s to first request   ({load_before} -> {load()})", flush=True)
    return took



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--done-first", type=int, default=20_000,
                    help="requests the second session serves before it is killed")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds any one step may take")
    ap.add_argument("--fill-by-sql", type=int, default=0, metavar="ROWS",
                    help="kill the first session once ROWS rows are in, then write the rest of the"
                         " dataset into the ledger by SQL (for 10^7 rows on a slow machine)")
    ap.add_argument("--finish-ingest", action="store_true",
                    help="the second session runs until the whole dataset is ingested before its SIGKILL")
    ap.add_argument("--dir", type=Path, help="work folder, kept (default: a temporary one, removed)")
    ap.add_argument("--profile", type=Path, help="write a pyinstrument text profile of one extra resume here")
    args = ap.parse_args(argv)

    exit_on_sigterm()
    work = args.dir or Path(tempfile.mkdtemp(prefix="harvest-p3-"))
    work.mkdir(parents=True, exist_ok=True)
    rec = Recorder()
    rec.start()
    try:
        data = work / "prompts.jsonl"
        t = time.monotonic()
        if not data.exists() or sum(1 for _ in data.open("rb")) != args.items:
            write_dataset(data, args.items)
        run_dir = work / "run"
        shutil.rmtree(run_dir, ignore_errors=True)
        job = work / "job.toml"
        write_job(job, data, rec.url, run_dir)
        print(f"P3 resume start: {args.items:,} items ({data.stat().st_size / 2**20:.0f} MiB JSONL, written in "
              f"{time.monotonic() - t:.1f} s), {args.rounds} rounds", flush=True)
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
              f"{time.strftime('%Y-%m-%d %H:%M')}; {load()}", flush=True)

        half, fresh = killed_during_ingest(rec, job, run_dir, work / "first.log", args)
        fresh_text = f"{fresh:.3f} s" if fresh is not None else "none before the kill"
        print(f"first session (a fresh job): start -> first dispatch {fresh_text}; SIGKILL during ingest, "
              f"{half:,} of {args.items:,} rows in the ledger", flush=True)
        if args.fill_by_sql:
            filled, secs = fill_by_sql(run_dir, args.items)
            print(f"filled the other {filled:,} rows into the ledger by SQL in {secs:.0f} s (--fill-by-sql);"
                  " the second session resumes a complete ingest", flush=True)
        mid, took = crash_mid_flight(rec, job, run_dir, work / "second.log", args)
        counts = ledger_counts(run_dir)
        print(f"second session: resumed the ingest (read past the {half:,} rows in, ingested the other "
              f"{args.items - half:,}), first dispatch after {mid:.3f} s; SIGKILL after {took:.1f} s with "
              f"requests in flight: {counts}",
              flush=True)

        base: list[float] = []
        ours: list[float] = []
        for k in range(args.rounds):
            base.append(baseline(rec, args))
            ours.append(resume(rec, job, work / f"resume-{k}.log", args))
        if args.profile:
            resume(rec, job, work / "resume-profiled.log", args, profile=args.profile)
            print(f"profile of one resume: {args.profile}")
        counts = ledger_counts(run_dir)
    finally:
        rec.stop()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    b, h = statistics.median(base), statistics.median(ours)
    print(f"\nmedians: baseline (python + aiohttp, one request) {b:.3f} s; harvest run resume {h:.3f} s "
          f"(rounds: {', '.join(f'{x:.3f}' for x in ours)}); ledger after: {counts}")
    print(f"ratio harvest / baseline x{h / b:.1f}; target <= 5 s: {'met' if h <= 5.0 else 'MISSED'}; {load()}")
    print(f"resume of a job killed during its ingest: {mid:.3f} s to first dispatch (target <= 5 s: "
          f"{'met' if mid <= 5.0 else 'MISSED'})")
    print(f"BENCH p3_resume items={args.items} harvest_first_dispatch_s={h:.3f} baseline_s={b:.3f} "
          f"mid_ingest_resume_s={mid:.3f} fresh_first_dispatch_s={fresh if fresh is not None else float('nan'):.3f} "
          f"load1={os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
