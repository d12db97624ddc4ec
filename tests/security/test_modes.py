"""Every file harvest writes is 0600 in a 0700 folder: run, serve, tune and compare folders and the
state dir, whatever the umask.

The commands run as a user runs them, each its own process, under umask 0 (where a file opened
with the default mode would come out 0666 and a folder 0777): a campaign on llama-server with its
export and report, a detached llama-server and its stop, a tune sweep and a compare on the
OpenAI-style stand-in engine (tests/quality/chat_engine.py). Then the test walks every path under
those folders.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests import engines, harvest_process

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"

pytestmark = [pytest.mark.engine]


def harvest(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *args], capture_output=True, text=True,
                               timeout=timeout, env=env, stdin=subprocess.DEVNULL, umask=0)


def walk_modes(top: Path) -> tuple[list[str], int]:
    """Paths under ``top`` (itself included) whose mode is not 0700 (folders) / 0600 (files)."""
    wrong, seen = [], 0
    for p in [top, *top.rglob("*")]:
        st = p.lstat()
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        seen += 1
        if stat.S_ISLNK(st.st_mode) or stat.S_IMODE(st.st_mode) != want:
            wrong.append(f"{p.relative_to(top.parent)} {stat.S_IMODE(st.st_mode):o}")
    return wrong, seen


def chat_server(port: int, *extra: str) -> str:
    argv = [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}", *extra]
    return (f'[server]\nengine = "command"\nport = {port}\nready_timeout = 30\nstop_grace = 2\nstop_deadline = 6\n'
            f'health_url = "http://{{host}}:{{port}}/health"\ncommand = {json.dumps(argv)}\n'
            f'[preflight]\nmin_disk_free_gib = 0.05\n')


def test_every_file_harvest_writes_is_0600_in_a_0700_folder(tmp_path, llama_server_bin, tiny_gguf):
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Say {i}."}) + "\n" for i in range(8)))
    def llama() -> str:
        return (f'[server]\nengine = "llamacpp"\nmodel = "{tiny_gguf}"\ncommand = ["{llama_server_bin}"]\n'
                f'port = {engines.free_port()}\nmax_running_requests = 2\nextra_args = ["-c", "2048"]\n'
                f'ready_timeout = 60\nstop_grace = 3\nstop_deadline = 20\n'
                f'[preflight]\nmin_disk_free_gib = 0.1\nram_reserve_gib = 0\n')

    common = f'[data]\npath = "{data}"\nid_field = "id"\n[sampling]\nmax_tokens = 4\n[client]\nconcurrency = 2\n'
    folders: list[Path] = []

    # A campaign on llama-server, then its export and report at their default paths.
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(llama() + common + f'[output]\ndir = "{run_dir}"\n[run]\nprogress_interval = 0.5\n')
    for args in (("run", str(job), "--no-live"), ("export", str(run_dir), "--format", "sharegpt", "--status",
                                                  "done,truncated"), ("report", str(run_dir))):
        done = harvest(env, *args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    folders.append(run_dir)

    # A detached llama-server, stopped from another process.
    serve_cfg = tmp_path / "serve.toml"
    serve_cfg.write_text(llama())
    serve_dir = tmp_path / "served"
    served = harvest(env, "serve", str(serve_cfg), "--run-dir", str(serve_dir), "--detach")
    stopped = harvest(env, "stop", str(serve_dir))
    assert served.returncode == 0 and stopped.returncode == 0, served.stderr + stopped.stdout + stopped.stderr
    folders.append(serve_dir)

    # A tune sweep (reference, floor, one candidate) and a compare, on the stand-in engine.
    tune_job = tmp_path / "tune-job.toml"
    tune_job.write_text(chat_server(engines.free_port()) + common + f'[output]\ndir = "{tmp_path / "tuned"}"\n')
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nextra_args = [["--delay", "0.01"]]\n[probe]\nprompts = 6\nmax_tokens = 8\n'
                    '[throughput]\nprompts = 8\nconcurrency = 2\n')
    tuned = harvest(env, "tune", str(tune_job), "--grid", str(grid), "--out", str(tmp_path / "tune"))
    # the stand-in answers alike under --delay: the candidate passes the gate, and the sweep exits 0
    assert tuned.returncode == 0 and "Traceback" not in tuned.stderr, tuned.stdout + tuned.stderr
    assert (tmp_path / "tune" / "tune.json").is_file() and (tmp_path / "tune" / "tune.csv").is_file()
    folders.append(tmp_path / "tune")
    ref, cand = tmp_path / "ref.toml", tmp_path / "cand.toml"
    ref.write_text(chat_server(engines.free_port()) + common)
    cand.write_text(chat_server(engines.free_port(), "--perturb", "0.5") + common)
    compared = harvest(env, "compare", "--reference", str(ref), "--candidate", str(cand), "--probe", "6",
                       "--out", str(tmp_path / "compare"))
    # half the candidate's answers differ from the second word on: it fails, and compare exits 1
    assert compared.returncode == 1 and "Traceback" not in compared.stderr, compared.stdout + compared.stderr
    rows = json.loads((tmp_path / "compare" / "compare.json").read_text())["rows"]
    assert [r["verdict"] for r in rows if r["label"] not in ("reference", "floor")] == ["fail"], rows
    folders.append(tmp_path / "compare")
    folders.append(tmp_path / "state")

    names: set[str] = set()
    total = 0
    for top in folders:
        wrong, seen = walk_modes(top)
        assert wrong == [], wrong
        total += seen
        names |= {p.name for p in top.rglob("*")}
    for expected in ("ledger.sqlite", "ledger.lock", "progress.json", "timeline.json", "launch.json",
                     "server.log", "stop.json", "watch.log", "export.sharegpt.jsonl", "report.html",
                     "tune.json", "tune.csv", "compare.json"):
        assert expected in names, (expected, sorted(names))
    assert total > 30, total
