"""docs/ray.md's "A job on a Ray cluster" section run as written, as a new user would, on the tests'
local Ray cluster (tests/cluster/conftest.py): its TOML written as given with only the lines that
name the machine adapted (the cluster's address, the engine and model this CPU machine has, no
GPUs, the engine slots of the test nodes), plus a few prompts and a short answer; then every
`harvest` command of its shell block must succeed, in order, and the run they make must be whole."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests import engines, harvest_process
from tests.chaos.killer import final_check, harvest_argv, write_data

pytestmark = [pytest.mark.engine, pytest.mark.slow]

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "ray.md"
TITLE = "A job on a Ray cluster"


def section() -> tuple[str, str, list[str]]:
    """(file name, TOML text, the `harvest` commands) of the section."""
    text = GUIDE.read_text()
    start = text.index(f"## {TITLE}\n")
    body = text[start:text.find("\n## ", start + 1)]
    (toml,) = re.findall(r"```toml\n(.*?)```", body, re.S)
    commands = [ln.split("#")[0].strip() for block in re.findall(r"```sh\n(.*?)```", body, re.S)
                for ln in block.splitlines() if ln.strip().startswith("harvest ")]
    return toml.splitlines()[0].lstrip("# ").strip(), toml, commands


def adapt(toml: str, address: str, llama_server_bin: str, tiny_gguf: Path) -> str:
    """Only the lines that name the machine change; the test's own tables are added at the end."""
    out = []
    for line in toml.splitlines():
        key = line.split("=")[0].strip()
        if key == "engine":
            line = 'engine = "llamacpp"'
        elif key == "model":
            line = (f'model = "{tiny_gguf}"\ncommand = ["{llama_server_bin}"]\nextra_args = ["-c", "4096"]\n'
                    "max_running_requests = 4")
        elif key == "port":
            line = f"port = {engines.free_port()}"
        elif key == "address":
            line = f'address = "{address}"'
        elif key == "gpus_per_server":
            line = "gpus_per_server = 0"
        elif key == "resources":
            line = "resources = { engine = 1 }"  # the test cluster's worker nodes (the head has none)
        out.append(line)
    # This machine's disk and a short answer: the test's own, not the guide's.
    out += ["[preflight]", "min_disk_free_gib = 0.1", "ram_reserve_gib = 0",
            "[sampling]", "max_tokens = 8", "[run]", "progress_interval = 0.5"]
    return "\n".join(out) + "\n"


def test_many_nodes_section_runs_as_written(tmp_path, ray_cluster, llama_server_bin, tiny_gguf):
    name, toml, commands = section()
    assert [shlex.split(c)[1] for c in commands] == ["gpus", "preflight", "run", "status", "stop"], commands
    (tmp_path / name).write_text(adapt(toml, ray_cluster.address, llama_server_bin, tiny_gguf))
    n = 24
    write_data(tmp_path / "prompts.jsonl", n)
    env = {**ray_cluster.env, "HARVEST_API_KEY": "readme-test-key"}
    outs = {}
    for command in commands:
        argv = shlex.split(command)
        res = harvest_process.run(harvest_argv(*argv[1:]), cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=400)
        assert res.returncode == 0, f"{command}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        outs[argv[1]] = res.stdout + res.stderr
    # gpus and preflight answered for every node of the cluster (head and both workers)
    for word in ("gpus", "preflight"):
        for label in ("node_a", "node_b"):
            assert ray_cluster.node_id(label)[:8] in outs[word], (word, outs[word])
    run_dir = tmp_path / "runs" / "cluster"
    assert final_check(run_dir, n) == []  # every prompt done once, nothing lost or duplicated
    members = json.loads((run_dir / "server" / "placement.json").read_text())["members"]
    assert len(members) == 2 and all(m["state"] == "stopped" and m["verdict"] == "clean" for m in members), members
    assert outs["run"].count("server stop: clean") == 2
