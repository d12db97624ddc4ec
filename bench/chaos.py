"""Chaos: `harvest run` SIGKILLed again and again (100 rounds by default), resumed each time.

    python bench/chaos.py                          # 100 kills, half inside ledger commits
    python bench/chaos.py --rounds 100 --managed   # the run launches (and relaunches) its own server

Each round starts ``harvest run JOB`` and SIGKILLs it by its pid: on odd rounds inside a ledger
write transaction (frozen with SIGSTOP while it holds SQLite's WAL write lock, seen in /proc/locks),
on even rounds after a random delay (start-up, ingest, dispatch or a commit). After every kill the
ledger file is checked: integrity_check, results <=> done/truncated items, no committed result lost
or written twice, ids unique. A last resume must then finish, and every unique input id must be done
exactly once. The engine is llama.cpp's llama-server on the tiny test model: started once here and
used as an endpoint, or (``--managed``) launched by each run, so each resume must also stop the
server the killed session left behind.

Prints one line per 10 rounds and a JSON summary; exit code 0 when no problem was found. Every
process started here is stopped by its pid or through harvest's own verified stop; every wait is
bounded. Needs the engines (scripts/install-engines vllm llamacpp), like the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the engine helpers and the killer are shared with the tests

from tests import engines  # noqa: E402
from tests.chaos.killer import ChaosResult, chaos_rounds, final_check, harvest_argv, read_ledger, write_data  # noqa: E402


def job_text(data: Path, run_dir: Path, *, url: str | None, llama: str, gguf: Path, port: int) -> str:
    common = (f'[data]\npath = "{data}"\nid_field = "id"\n[sampling]\nmax_tokens = 16\n'
              f'[output]\ndir = "{run_dir}"\n[run]\nprogress_interval = 0.5\nmax_relaunches = 5\n')
    if url is not None:
        return common + f'[client]\nendpoints = ["{url}"]\nconcurrency = 16\nhealth_deadline = 60\n'
    return common + (
        f'[server]\nengine = "llamacpp"\nmodel = "{gguf}"\ncommand = ["{llama}"]\nport = {port}\n'
        f'max_running_requests = 8\nextra_args = ["-c", "16384"]\nready_timeout = 60\n'
        f'stop_grace = 3\nstop_deadline = 20\n'
        f'[preflight]\nmin_disk_free_gib = 0.1\nram_reserve_gib = 0\n'
        f'[client]\nconcurrency = 16\nhealth_deadline = 60\n')


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100, help="kills to make")
    ap.add_argument("--items", type=int, default=6000, help="unique input items")
    ap.add_argument("--mode", choices=["mixed", "commit", "random"], default="mixed")
    ap.add_argument("--managed", action="store_true", help="the run launches its own llama-server")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temporary one)")
    args = ap.parse_args()

    work = args.dir or Path(tempfile.mkdtemp(prefix="harvest-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    run_dir = work / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    env = {**os.environ, "HARVEST_STATE_DIR": str(work / "state")}
    llama = os.environ.get("HARVEST_LLAMA_SERVER") or engines.install_engine("llamacpp")
    model = engines.build_tiny_model(os.environ.get("HARVEST_VLLM_PYTHON") or engines.install_engine("vllm"),
                                     work / "tiny-model")
    gguf = model / "model.gguf"
    data = write_data(work / "in.jsonl", args.items)
    server = None
    port = engines.free_port()
    if not args.managed:
        server = engines.start_engine(engines.llama_argv(llama, str(gguf), port), port=port, model=str(gguf),
                                      log_path=work / "llama-server.log", health="/health", timeout=60)
    job = work / "job.toml"
    url = server.url if server else None
    job.write_text(job_text(data, run_dir, url=url, llama=llama, gguf=gguf, port=port))
    argv = harvest_argv("run", str(job), "--no-live")
    rng = random.Random(args.seed)
    total = ChaosResult()
    t0 = time.monotonic()
    try:
        while total.total_kills < args.rounds:
            step = min(10, args.rounds - total.total_kills)
            part = chaos_rounds(argv, run_dir, kills=step, mode=args.mode, rng=rng, env=env,
                                max_rounds=3 * step)
            total.rounds += part.rounds
            total.kills.update(part.kills)
            total.commit_phases.update(part.commit_phases)
            total.finished_early += part.finished_early
            total.commit_timeouts += part.commit_timeouts
            total.problems += part.problems
            for problem in part.problems:
                print(f"  problem: {problem}", flush=True)
            total.results_per_round += part.results_per_round
            view = read_ledger(run_dir)
            done = len(view.results) if view else 0
            print(f"{total.total_kills:4d} kills in {total.rounds} rounds, {time.monotonic() - t0:6.1f} s: "
                  f"{done}/{args.items} results, problems {len(total.problems)}", flush=True)
            if part.total_kills == 0:
                break  # the input is exhausted: nothing left to kill
        t_final = time.monotonic()
        final = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env)
        final_s = time.monotonic() - t_final
        problems = list(total.problems)
        if final.returncode != 0:
            problems.append(f"final resume exited {final.returncode}: {final.stderr[-2000:]}")
        problems += final_check(run_dir, args.items)
    finally:
        if args.managed and (run_dir / "server" / "launch.json").exists():
            subprocess.run(harvest_argv("stop", str(run_dir / "server"), "--deadline", "20"), env=env,
                           capture_output=True, timeout=60)
        if server is not None:
            server.stop()
    view = read_ledger(run_dir)
    summary = {
        "kills": total.total_kills, "rounds": total.rounds, "by_kind": dict(total.kills),
        "commit_kills_by_phase": dict(total.commit_phases),
        "runs_that_finished_before_the_kill": total.finished_early,
        "commit_rounds_without_a_commit_in_30_s": total.commit_timeouts,
        "items": args.items, "managed_server": args.managed, "seed": args.seed,
        "results": len(view.results) if view else 0, "counts": view.counts if view else {},
        "results_before_final_resume": total.results_per_round[-1] if total.results_per_round else 0,
        "final_resume_s": round(final_s, 1), "total_s": round(time.monotonic() - t0, 1),
        "problems": problems, "ok": not problems and total.total_kills >= args.rounds,
    }
    print(json.dumps(summary, indent=1))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
