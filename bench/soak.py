"""Soak: a managed llama-server campaign left alone while faults are injected at random.

    python bench/soak.py                              # 30,000 items: about 10 minutes with the faults
    python bench/soak.py --items 3000 --stop-seconds 10 --hang-deadline 15 --hang-floor 5   # the suite's

``harvest run`` launches llama-server (the tiny test model) behind ``tests/hang_engine.py``, a
loopback proxy that can hold every completion while ``/health`` answers, with the default
``[client]`` settings (``--hang-deadline`` and ``--hang-floor`` shorten the hang's). The faults are injected one at a
time, in a random order, each once a random share of the items is committed (between 5 % and
85 %; the next one only once the run recovered from the last):

- ``engine_sigkill``: SIGKILL of the engine's process group (from harvest's launch record);
- ``engine_sigstop``: SIGSTOP of that group for ``--stop-seconds`` (60), then SIGCONT;
- ``engine_hang``: the proxy holds every completion from now on (SIGUSR1), ``/health`` answering;
- ``client_sigkill``: SIGKILL of ``harvest run``, then the same command again (a resume that must
  stop the engine the killed session left running, by its record);
- ``engine_frozen`` (only when named in ``--faults``): SIGSTOP of that group, left so: harvest must
  stop it, verified, and relaunch it within the hang bound (``replaced in`` is the time from the
  SIGSTOP to the new engine's record);
- ``engine_ignores_sigterm``: the engine is made to ignore SIGTERM, then the client is SIGKILLed:
  the resumed session's verified stop of the leftover must escalate to SIGKILL.

Then the run must end by itself (exit 0), with every input id exactly once (the ledger read
straight from SQLite, and an export counted by id), no engine process left (every group harvest
launched, measured), every verified stop clean, and no process of the run holding host memory. Prints a table (faults by
kind, survived, items lost, duplicated, the longest stall between two committed results) and one
``BENCH soak`` JSON line; exit 0 when nothing was wrong. Every process it started is stopped by
its pid, and every engine group by the pgid of harvest's own record; every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the engine helpers are shared with the tests

from tests import engines  # noqa: E402
from tests.chaos.killer import final_check, harvest_argv, write_data  # noqa: E402

HANG_ENGINE = ROOT / "tests" / "hang_engine.py"
KINDS = ("engine_sigkill", "engine_sigstop", "engine_hang", "client_sigkill", "engine_ignores_sigterm")
#: Kinds injected only when named in --faults: ``engine_frozen`` (SIGSTOP of the group, left so) takes
#: the hang bound itself, about 3 minutes at the default [client] settings.
NAMED_KINDS = ("engine_frozen",)


class Soak:
    def __init__(self, work: Path, args: argparse.Namespace):
        self.work, self.args = work, args
        self.run_dir = work / "run"
        self.flag = work / "ignore-sigterm"
        self.env = {**os.environ, "HARVEST_STATE_DIR": str(work / "state")}
        self.job = work / "job.toml"
        self.proc: subprocess.Popen[bytes] | None = None
        self.sessions = 0
        self.exits: list[int] = []
        self.groups: set[int] = set()  # every engine group harvest launched (from its records)
        self.faults: list[dict[str, object]] = []

    # --- the harvest sessions --------------------------------------------------------------------

    def start_session(self) -> None:
        self.sessions += 1
        log = open(self.work / f"session-{self.sessions}.log", "wb")
        self.proc = subprocess.Popen(harvest_argv("run", str(self.job), "--no-live"), env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def record(self, timeout: float = 120.0) -> dict[str, object] | None:
        """The engine of the running session: harvest's launch record, once its pid is alive."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running():
            try:
                rec = json.loads((self.run_dir / "server" / "launch.json").read_text())["record"]
                proc = psutil.Process(rec["pid"])
                if abs(proc.create_time() - rec["create_time"]) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE:
                    self.groups.add(int(rec["pgid"]))
                    return dict(rec)
            except (OSError, ValueError, KeyError, psutil.Error):
                pass
            time.sleep(0.2)
        return None

    # --- the faults ------------------------------------------------------------------------------

    def inject(self, kind: str) -> dict[str, object]:
        rec = self.record()
        t0 = time.monotonic()
        fault: dict[str, object] = {"kind": kind, "at": time.time(), "committed": committed(self.run_dir)}
        if rec is None:
            fault["skipped"] = "no engine running"
            return fault
        pid, pgid = int(rec["pid"]), int(rec["pgid"])
        fault["engine_pid"] = pid
        if kind == "engine_sigkill":
            os.killpg(pgid, signal.SIGKILL)
        elif kind == "engine_sigstop":
            os.killpg(pgid, signal.SIGSTOP)
            time.sleep(self.args.stop_seconds)
            try:
                os.killpg(pgid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        elif kind == "engine_frozen":  # frozen whole and left so: harvest's verified stop and relaunch end it
            os.killpg(pgid, signal.SIGSTOP)
        elif kind == "engine_hang":
            os.kill(pid, signal.SIGUSR1)
        elif kind in ("client_sigkill", "engine_ignores_sigterm"):
            if kind == "engine_ignores_sigterm":
                self.flag.write_text("armed")
            assert self.proc is not None
            self.proc.kill()
            self.exits.append(self.proc.wait(timeout=60))
            self.start_session()
        if kind != "engine_sigstop":  # every other fault ends this engine: the run goes on with a new one
            new = self.wait_new_engine(pid)
            fault["replaced"] = new is not None
            fault["replaced_s"] = round(time.monotonic() - t0, 1) if new is not None else None
            fault["old_engine_gone"] = new is not None and not group_alive(pgid)
            self.flag.unlink(missing_ok=True)
        # Recovered: a result committed by the engine that now serves (after SIGCONT, or the new one).
        progressed = self.wait_progress(committed(self.run_dir))
        fault["recovered_s"] = None if progressed is None else round(time.monotonic() - t0, 1)
        return fault

    def wait_new_engine(self, old_pid: int, timeout: float = 600.0) -> dict[str, object] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rec = self.record(timeout=5)
            if rec is not None and rec["pid"] != old_pid:
                return rec
            time.sleep(0.5)
        return None

    def wait_progress(self, before: int, timeout: float = 600.0) -> float | None:
        """Seconds until a result is committed beyond ``before`` (the run went on), None if never."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if committed(self.run_dir) > before:
                return round(time.monotonic() - t0, 1)
            if not self.running():
                return round(time.monotonic() - t0, 1) if self.proc and self.proc.returncode == 0 else None
            time.sleep(0.5)
        return None

    def cleanup(self) -> None:
        """Whatever is still going: the session asked to stop (SIGINT), then killed; engine groups
        of harvest's records still alive: SIGKILL (reported as a problem by the checks first)."""
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        for pgid in self.groups:
            if group_alive(pgid):
                os.killpg(pgid, signal.SIGKILL)


def committed(run_dir: Path) -> int:
    rows = query(run_dir, "SELECT COUNT(*) FROM results")
    return int(rows[0][0]) if rows else 0


def query(run_dir: Path, sql: str) -> list[tuple]:
    path = run_dir / "ledger.sqlite"
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def group_alive(pgid: int) -> bool:
    """Measured: a live (non-zombie) process in group ``pgid``."""
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def job_text(data: Path, run_dir: Path, llama: str, gguf: Path, flag: Path, port: int,
             hang_deadline: float | None, max_tokens: int, hang_floor: float | None = None) -> str:
    command = [sys.executable, str(HANG_ENGINE), "--ignore-term-if", str(flag), "--", llama]
    client = (f"hang_deadline = {hang_deadline}\n" if hang_deadline else "") + (
        f"hang_floor = {hang_floor}\n" if hang_floor else "")
    return (f'[data]\npath = "{data}"\nid_field = "id"\n[sampling]\nmax_tokens = {max_tokens}\n'
            f'[output]\ndir = "{run_dir}"\n[run]\nprogress_interval = 1\nmax_relaunches = 50\n'
            f'[server]\nengine = "llamacpp"\nmodel = "{gguf}"\ncommand = {json.dumps(command)}\nport = {port}\n'
            f'max_running_requests = 8\nextra_args = ["-c", "8192"]\nready_timeout = 60\n'
            f'stop_grace = 3\nstop_deadline = 30\n'
            f'[preflight]\nmin_disk_free_gib = 0.1\nram_reserve_gib = 0\n'
            f'[client]\n{client}')


def schedule(rng: random.Random, kinds: list[str], items: int) -> list[tuple[int, str]]:
    """(results committed, kind): the faults in a random order, each once a random share of the
    items is committed (one slot each between 5 % and 85 %), so that they land inside the run
    whatever the machine's speed."""
    order = list(kinds)
    rng.shuffle(order)
    slot = 0.8 / len(order)
    return [(int(items * (0.05 + slot * i + rng.uniform(0, slot * 0.8))), kind) for i, kind in enumerate(order)]


def longest_stall(run_dir: Path) -> float:
    times = sorted(t for (t,) in query(run_dir, "SELECT created_at FROM results"))
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


def own_children() -> set[tuple[int, float]]:
    """This process's descendants now, as (pid, create time)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            out.add((p.pid, p.create_time()))
        except psutil.Error:
            continue
    return out


def check(soak: Soak, unique: int, mem_before: int, port: int,
          before: set[tuple[int, float]] | None = None) -> tuple[list[str], dict[str, object]]:
    """``before``: the descendants that were there before the run (a test session's own servers):
    not the run's, never judged."""
    problems = final_check(soak.run_dir, unique)
    per_id = query(soak.run_dir, "SELECT i.id, COUNT(*) FROM results r JOIN items i ON i.seq = r.item "
                                 "GROUP BY i.id")
    duplicated = sum(c - 1 for _, c in per_id)
    lost = unique - len(per_id)
    out = soak.work / "export.jsonl"
    exported = subprocess.run(harvest_argv("export", str(soak.run_dir), "--format", "openai-batch",
                                           "--status", "done,truncated", "-o", str(out)),
                              env=soak.env, capture_output=True, text=True, timeout=300)
    if exported.returncode != 0:
        problems.append(f"export failed: {exported.stderr[-500:]}")
    else:
        ids = [json.loads(line).get("custom_id") for line in out.read_text().splitlines() if line.strip()]
        if len(ids) != unique or len(set(ids)) != unique:
            problems.append(f"export: {len(ids)} lines, {len(set(ids))} distinct ids, {unique} expected")
    left = sorted(g for g in soak.groups if group_alive(g))
    if left:
        problems.append(f"engine groups left running: {left}")
    try:
        with __import__("socket").create_connection(("127.0.0.1", port), timeout=1):
            problems.append(f"port {port} still answers after the run")
    except OSError:
        pass
    timeline = json.loads((soak.run_dir / "timeline.json").read_text())
    stops = [x["stop"] for x in timeline.get("launches", []) if x.get("stop")]
    dirty = [s for s in stops if s.get("verdict") != "clean"]
    if dirty:
        problems.append(f"{len(dirty)} verified stops not clean: {[s.get('problems') for s in dirty]}")
    # Host memory: nothing of the run may still hold any (every process it started, measured, gone).
    # The host's available memory is shown beside it, not judged: others share this machine.
    mem_after = psutil.virtual_memory().available
    held: dict[int, int] = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and (p.pid, p.create_time()) not in (before or set()):
                held[p.pid] = p.memory_info().rss
        except psutil.Error:
            continue  # gone meanwhile
    if held:
        problems.append(f"processes of the run still hold host memory: {sorted(held)} "
                        f"({sum(held.values()) / 2**20:.0f} MiB)")
    if soak.exits[-1:] != [0]:
        problems.append(f"the last session exited {soak.exits[-1:]} (sessions: {soak.exits})")
    figures = {"items": unique, "lost": lost, "duplicated": duplicated, "sessions": soak.sessions,
               "launches": len(timeline.get("launches", [])), "stops": len(stops),
               "stops_escalated": sum(1 for s in stops if s.get("escalated")),
               "longest_stall_s": round(longest_stall(soak.run_dir), 1),
               "host_mem_available_mib": [mem_before // 2**20, mem_after // 2**20]}
    return problems, figures


def table(faults: list[dict[str, object]], figures: dict[str, object]) -> str:
    lines = ["| fault | injected | survived | longest recovery (s) |", "|---|---|---|---|"]
    for kind in KINDS + NAMED_KINDS:
        mine = [f for f in faults if f["kind"] == kind]
        if not mine and kind in NAMED_KINDS:
            continue
        survived = [f for f in mine if f.get("recovered_s") is not None and f.get("old_engine_gone", True)]
        rec = max((float(f["recovered_s"]) for f in survived), default=0.0)  # type: ignore[arg-type]
        lines.append(f"| {kind} | {len(mine)} | {len(survived)} | {rec:.0f} |")
    lines.append(f"\nitems {figures['items']:,}, lost {figures['lost']}, duplicated {figures['duplicated']}, "
                 f"longest stall {figures['longest_stall_s']} s, sessions {figures['sessions']}, launches "
                 f"{figures['launches']}, stops {figures['stops']} ({figures['stops_escalated']} escalated to SIGKILL)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=30000, help="unique input items (the tiny model answers up to "
                    "70 a second on 2 cores: about 10 minutes with the faults)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--faults", default=",".join(KINDS + ("engine_sigkill", "client_sigkill")),
                    help="kinds to inject, comma-separated (a kind named twice is injected twice)")
    ap.add_argument("--stop-seconds", type=float, default=60.0, help="how long SIGSTOP lasts")
    ap.add_argument("--hang-deadline", type=float, default=None, help="[client] hang_deadline (default: harvest's)")
    ap.add_argument("--hang-floor", type=float, default=None, help="[client] hang_floor (default: harvest's)")
    ap.add_argument("--gguf", type=Path, default=None, help="the model (default: the tiny test model, built once)")
    ap.add_argument("--seed", type=int, default=51)
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--end-timeout", type=float, default=1200.0, help="seconds the run may take after the faults")
    args = ap.parse_args(argv)
    kinds = [k for k in args.faults.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS + NAMED_KINDS))
    if unknown:
        ap.error(f"unknown fault kinds: {unknown}; known: {', '.join(KINDS + NAMED_KINDS)}")
    work = args.dir or Path(tempfile.mkdtemp(prefix="harvest-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "run", ignore_errors=True)
    llama = os.environ.get("HARVEST_LLAMA_SERVER") or engines.install_engine("llamacpp")
    gguf = args.gguf or engines.cached_tiny_model(os.environ.get("HARVEST_VLLM_PYTHON")
                                                  or engines.install_engine("vllm")) / "model.gguf"
    data = write_data(work / "in.jsonl", args.items, duplicates=0)
    port = engines.free_port()
    soak = Soak(work, args)
    soak.job.write_text(job_text(data, soak.run_dir, llama, gguf, soak.flag, port, args.hang_deadline,
                                 args.max_tokens, args.hang_floor))
    mem_before = psutil.virtual_memory().available
    before = own_children()
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    problems: list[str] = []
    try:
        soak.start_session()
        for at, kind in schedule(rng, kinds, args.items):
            while committed(soak.run_dir) < at and soak.running():
                time.sleep(0.2)
            if not soak.running():
                problems.append(f"the run ended before the {kind} fault (exit {soak.proc and soak.proc.returncode})")
                break
            fault = soak.inject(kind)
            fault["t"] = round(time.monotonic() - t0, 1)
            soak.faults.append(fault)
            replaced = f", replaced in {fault['replaced_s']} s" if fault.get("replaced_s") is not None else ""
            print(f"[soak] {fault['t']:7.1f} s  {kind:<24} recovered in {fault.get('recovered_s')} s{replaced} "
                  f"({committed(soak.run_dir):,} committed)", flush=True)
        assert soak.proc is not None
        try:
            soak.exits.append(soak.proc.wait(timeout=args.end_timeout))
        except subprocess.TimeoutExpired:
            problems.append(f"the run did not end within {args.end_timeout:.0f} s of the last fault")
    finally:
        soak.cleanup()
    took = time.monotonic() - t0
    more, figures = check(soak, args.items, mem_before, port, before)
    problems += more
    problems += [f"{f['kind']} at {f['t']} s not survived: {f}" for f in soak.faults
                 if f.get("recovered_s") is None or f.get("old_engine_gone") is False or f.get("skipped")]
    print(table(soak.faults, figures))
    for p in problems:
        print(f"PROBLEM: {p}")
    summary = {"took_s": round(took, 1), "faults": soak.faults, **figures, "problems": problems,
               "command": "python bench/soak.py " + " ".join(sys.argv[1:] if argv is None else argv),
               "load_avg": os.getloadavg()}
    (work / "soak.json").write_text(json.dumps(summary, indent=1))
    print("BENCH soak " + json.dumps({k: v for k, v in summary.items() if k != "faults"}))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
