"""B1: one OpenAI batch input file run by `vllm run-batch` and by `harvest run` + `harvest export
--format openai-batch`, on vLLM's CPU build with the tiny model: wall time of each (the engine's
start included in both: run-batch starts its own engine, harvest launches and stops its managed
vLLM), and the greedy rows' answers compared; the script exits 1 when one differs.

    .venv/bin/python bench/batch_file.py [--rows 300] [--rounds 1]

The file is tests/batchfile.py's rows, chat only (vLLM 0.32's run-batch answers /v1/completions
rows with an error: docs/batch-files.md): max_tokens 1..6, half greedy, the rest sampled with
n 1..3, log-probabilities on every fourth row. No row sets a seed: vLLM 0.32's CPU build under
run-batch died on the first seeded sampled row (the worker's "CPU Generator does not use offset";
every later line answered 500), where the same rows through its API server answered. Both runs use the same engine flags
(`--max-model-len 2048 --enforce-eager`, VLLM_CPU_KVCACHE_SPACE=1). Rounds alternate (vLLM first,
then harvest, then again), and the load average is printed beside every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchutil import exit_on_sigterm, load  # noqa: E402

from tests.batchfile import answers, write_batch  # noqa: E402
from tests.engines import VLLM_ENV, cached_tiny_model, free_port, install_engine  # noqa: E402

FLAGS = ["--max-model-len", "2048", "--enforce-eager"]


def run_vllm_batch(python: str, model: Path, batch: Path, out: Path, log: Path) -> float:
    """`vllm run-batch` (as `python -m vllm.entrypoints.openai.run_batch`) in its own session,
    waited for with a bound; seconds from launch to exit."""
    argv = [python, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(batch), "-o", str(out),
            "--model", str(model), "--served-model-name", "tiny", *FLAGS]
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **VLLM_ENV},
                                start_new_session=True)
        try:
            code = proc.wait(timeout=1200)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)  # the group this script started, by its recorded id
                proc.wait(timeout=30)
    if code != 0:
        raise SystemExit(f"vllm run-batch exited {code}; its log: {log}")
    return time.monotonic() - t0


def run_harvest(python: str, model: Path, batch: Path, work: Path) -> tuple[float, Path]:
    """`harvest run` (a managed vLLM: launch, the file, verified stop) then `harvest export`."""
    job = work / "job.toml"
    env_table = "".join(f'{k} = "{v}"\n' for k, v in VLLM_ENV.items())
    job.write_text(f'[server]\nengine = "vllm"\nmodel = {json.dumps(str(model))}\npython = {json.dumps(python)}\n'
                   f'served_model_name = "tiny"\nhost = "127.0.0.1"\nport = {free_port()}\nready_timeout = 900\n'
                   f'extra_args = {json.dumps(FLAGS)}\n[server.env]\n{env_table}'
                   f'[data]\npath = {json.dumps(str(batch))}\n'
                   f'[client]\nconcurrency = 64\n[output]\ndir = {json.dumps(str(work / "run"))}\n')
    t0 = time.monotonic()
    harvest = [str(ROOT / ".venv" / "bin" / "harvest")]
    run = subprocess.run([*harvest, "run", str(job), "--no-live"], capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        raise SystemExit(f"harvest run exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    out = work / "harvest.jsonl"
    export = subprocess.run([*harvest, "export", str(work / "run"), "--format", "openai-batch", "-o", str(out)],
                            capture_output=True, text=True, timeout=600)
    if export.returncode != 0:
        raise SystemExit(f"harvest export exited {export.returncode}: {export.stderr[-3000:]}")
    return time.monotonic() - t0, out


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    python = install_engine("vllm")
    model = cached_tiny_model(python)
    differ = 0
    times: dict[str, list[float]] = {"vllm": [], "harvest": []}
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        work = Path(tmp)
        requests = write_batch(work / "requests.jsonl", args.rows, "tiny", chat_only=True, seeded=False)
        greedy = [r["custom_id"] for r in requests if r["body"]["temperature"] == 0.0]
        for k in range(args.rounds):
            vout = work / f"vllm-{k}.jsonl"
            times["vllm"].append(run_vllm_batch(python, model, work / "requests.jsonl", vout, work / f"vllm-{k}.log"))
            print(f"round {k}: vllm run-batch {times['vllm'][-1]:.1f} s ({load()})", flush=True)
            round_dir = work / f"h{k}"
            round_dir.mkdir()
            seconds, hout = run_harvest(python, model, work / "requests.jsonl", round_dir)
            times["harvest"].append(seconds)
            print(f"round {k}: harvest run + export {seconds:.1f} s ({load()})", flush=True)
            v = answers([json.loads(x) for x in vout.read_text().splitlines()])
            h = answers([json.loads(x) for x in hout.read_text().splitlines()])
            same = [cid for cid in greedy if cid in v and v[cid] == h.get(cid)]
            differ += len(greedy) - len(same)
            for cid in [c for c in greedy if c not in same][:5]:
                print(f"  differs: {cid}: vllm {v.get(cid)!r} harvest {h.get(cid)!r}")
            print(f"round {k}: greedy rows identical {len(same)}/{len(greedy)}; answered: vllm {len(v)}, "
                  f"harvest {len(h)} of {len(requests)}", flush=True)
            differ += 2 * len(requests) - len(v) - len(h)  # a row left unanswered by either fails the bench too
    best_v, best_h = min(times["vllm"]), min(times["harvest"])
    print(f"BENCH batch_file rows={args.rows} vllm_run_batch_s={best_v:.1f} harvest_s={best_h:.1f} "
          f"ratio={best_h / best_v:.2f} greedy_differ={differ} {load()}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
