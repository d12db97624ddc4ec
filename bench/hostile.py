"""R1 hostile endpoints: what a ``harvest run`` process costs, and how it ends, against endpoints that
answer /health and /v1/models well and completions badly (``bench/hostile_server.py``).

For each case a job of ``--items`` prompts (``engine = "openai"``, ``max_tokens = 512``, the default
``[client]`` otherwise; ``stream = true`` for the streamed cases) runs as a real ``harvest run``
subprocess against a hostile server of its own (another subprocess, not measured). The harvest
process's peak RSS is the kernel's own high-water mark (``ru_maxrss`` of ``wait4`` on its pid), and
a process over ``--kill-above-mb`` is SIGKILLed (counted as "killed"), so a version without the
caps cannot take the machine down. Printed per case: what the server sends, the exit code, the
ledger's counts and failure classes, the line harvest ended with, the peak RSS, the seconds.

    python bench/hostile.py [--cases gzip_bomb,big_body,...] [--items 60] [--src DIR] [--keep DIR]

``--src DIR`` runs the harvest of another tree (``DIR/src`` first on ``PYTHONPATH``): the same
cases on another commit, for a before/after table. Every process it starts is stopped by its pid;
every wait is bounded (``--timeout`` per run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from benchutil import load, stop  # bench/benchutil.py

HERE = Path(__file__).resolve().parent
SERVER = HERE / "hostile_server.py"

#: case -> (what the server sends, streamed, its --size)
CASES: dict[str, tuple[str, bool, int | None]] = {
    "ok": ("valid answers (the floor)", False, None),
    "gzip_bomb": ("2 MB gzip body that inflates to 2 GB", False, 2 << 30),
    "big_body": ("1 GB body (Content-Length)", False, 1 << 30),
    "big_string": ("500 MB answer string (chunked)", False, 500 << 20),
    "endless_sse": ("an SSE stream that never ends", True, None),
    "sse_long_line": ("one SSE line of 100 MB", True, 100 << 20),
    "bad_status": ("a bad status line", False, None),
    "many_headers": ("10,000 headers", False, None),
    "big_header": ("a 20 KB header", False, None),
    "bad_chunk": ("a bad chunk size mid-body", False, None),
    "dup_length": ("two Content-Length headers", False, None),
    "banner": ("an SSH banner (wrong port)", False, None),
    "redirect": ("307 to another port", False, None),
    "status_405": ("405 for every request", False, None),
}


def start_server(case: str, size: int | None, timeout: float = 120.0) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, str(SERVER), "--case", case, "--port", "0"]
    if size is not None:
        argv += ["--size", str(size)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline() if proc.stdout else ""), daemon=True).start()
    try:
        line = lines.get(timeout=timeout)  # the 2 GB bomb is compressed first (seconds)
    except queue.Empty:
        stop(proc)
        raise RuntimeError(f"the {case} server did not report its port within {timeout:g} s") from None
    m = re.match(r"listening on ([\d.]+:\d+)", line)
    if m is None:
        stop(proc)
        raise RuntimeError(f"the {case} server did not start: {line!r}")
    return proc, f"http://{m.group(1)}"


def write_job(folder: Path, url: str, items: int, stream: bool) -> Path:
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt": f"Question {i}: what is {i} squared?"}) + "\n"
                            for i in range(items)))
    job = folder / "job.toml"
    job.write_text(f'[server]\nengine = "openai"\nbase_url = "{url}/v1"\nmodel = "hostile-model"\n'
                   f'[data]\npath = "{data}"\n[sampling]\nmax_tokens = 512\n'
                   f'[client]\nstream = {"true" if stream else "false"}\nstart_deadline = 30\n'
                   f'[output]\ndir = "{folder / "run"}"\n')
    return job


def run_harvest(job: Path, env: dict[str, str], timeout: float, kill_mb: float) -> dict[str, object]:
    """``harvest run`` to its end (or SIGKILL past ``kill_mb`` or ``timeout``); exit, peak RSS, time."""
    out, err = job.parent / "stdout.txt", job.parent / "stderr.txt"
    t0 = time.monotonic()
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "harvest", "run", str(job), "--no-live"], cwd=job.parent,
                                env=env, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
    watched = psutil.Process(proc.pid)
    killed = None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        try:
            rss = watched.memory_info().rss
        except psutil.NoSuchProcess:
            rss = 0
        elapsed = time.monotonic() - t0
        if killed is None and (rss > kill_mb * 2**20 or elapsed > timeout):
            killed = f"killed past {kill_mb:.0f} MB" if rss > kill_mb * 2**20 else f"killed after {timeout:.0f} s"
            os.kill(proc.pid, signal.SIGKILL)  # the harvest run this script started
        time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here (wait4), not by Popen
    lines = err.read_text(errors="replace").splitlines() + out.read_text(errors="replace").splitlines()
    tail = [ln for ln in lines if ln.startswith(("STOPPED", "FAILED", "error:", "Traceback"))]
    session = next((ln for ln in lines if ln.startswith("this session:")), "")
    return {"exit": proc.returncode, "peak_mb": usage.ru_maxrss / 1024, "seconds": time.monotonic() - t0,
            "killed": killed, "said": tail[0] if tail else "", "session": session}


def ledger_counts(run_dir: Path) -> tuple[dict[str, int], dict[str, int]]:
    path = run_dir / "ledger.sqlite"
    if not path.exists():
        return {}, {}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        counts = dict(conn.execute("SELECT status, COUNT(*) FROM items GROUP BY status").fetchall())
        classes = dict(conn.execute("SELECT error_class, COUNT(*) FROM items WHERE status = 'failed' GROUP BY 1"))
        return counts, classes
    finally:
        conn.close()


def outcome(result: dict[str, object], counts: dict[str, int], classes: dict[str, int]) -> str:
    if result["killed"]:
        return str(result["killed"])
    shown = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    failed = ", ".join(f"{c} {n}" for c, n in sorted(classes.items()))
    said, session = str(result["said"]), str(result["session"])
    why = re.search(r"\((\w+)\)", said) if said.startswith("STOPPED") else None
    text = f"exit {result['exit']}: {shown or 'no ledger'}"
    if failed:
        text += f" (failed: {failed})"
    if why:
        text += f"; stopped: {why.group(1)}"
    elif "not an OpenAI-compatible server" in session:
        text += "; stopped at the start: not HTTP"
    elif said.startswith(("Traceback", "error:")):
        text += f"; {said[:60]}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="R1: peak RSS and outcome of harvest run against hostile endpoints")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    parser.add_argument("--items", type=int, default=60)
    parser.add_argument("--src", default=None, help="run the harvest of this tree (DIR/src on PYTHONPATH)")
    parser.add_argument("--kill-above-mb", type=float, default=1500.0)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds one harvest run may take")
    parser.add_argument("--keep", default=None, help="keep the run folders here")
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown cases: {', '.join(unknown)}")
    env = {**os.environ}
    if args.src:
        env["PYTHONPATH"] = str(Path(args.src).resolve() / "src")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="harvest-hostile-"))
    env["HARVEST_STATE_DIR"] = str(work / "state")
    rows = []
    for case in cases:
        sends, stream, size = CASES[case]
        folder = work / case
        folder.mkdir(parents=True, exist_ok=True)
        server, url = start_server(case, size)
        try:
            before = load()
            result = run_harvest(write_job(folder, url, args.items, stream), env, args.timeout, args.kill_above_mb)
        finally:
            stop(server)
        counts, classes = ledger_counts(folder / "run")
        rows.append((case, sends, outcome(result, counts, classes), result["peak_mb"], result["seconds"]))
        print(f"  {case:<14} {result['peak_mb']:7.0f} MB  {result['seconds']:6.1f} s  {rows[-1][2]}  ({before})",
              file=sys.stderr, flush=True)

    print(f"\nR1 hostile endpoints: harvest run of {args.items} items (max_tokens 512, default [client]) per case"
          f"{' on ' + args.src if args.src else ''}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; {load()}\n")
    print("| case | the endpoint sends | outcome | peak RSS | time |\n|---|---|---|---|---|")
    for case, sends, text, peak, seconds in rows:
        print(f"| `{case}` | {sends} | {text} | {peak:.0f} MB | {seconds:.1f} s |")
    worst = max(rows, key=lambda r: r[3])
    print(f"\nBENCH r1_hostile cases={len(rows)} peak_rss_mb_max={worst[3]:.0f} worst={worst[0]} "
          f"peak_rss_mb_ok={next((r[3] for r in rows if r[0] == 'ok'), 0):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
