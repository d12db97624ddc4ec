"""``harvest compare`` and ``harvest tune`` with ``[host]``: every launch runs on the far host (the far
harvest launches it and stops it with verification), the quality probe and the throughput
measurement run from here through the tunnel. Real OpenSSH (conftest.py).

compare: llama.cpp's llama-server on the tiny GGUF, the reference and one candidate (a server
file without a host table: it runs where the reference runs), no second reference launch.
tune: the deterministic chat stand-in (tests/quality/chat_engine.py) as a ``command`` engine, two
trials, with ``[[hosts]]`` naming the test's sshd first and a box that does not answer second: the
trials run on the first host only, and the second is never contacted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from harvest.placement.ssh.servers import read_remote_record
from tests import engines
from tests import harvest_process
from tests.hosts.conftest import FAR_HARVEST, write_toml

pytestmark = [pytest.mark.engine]

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"


def harvest(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([FAR_HARVEST, *args], capture_output=True, text=True, timeout=timeout)


def prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Tell me about item {i}."}) + "\n"
                            for i in range(n)))
    return path


def alive(pid: int, create_time: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_far_stop_verified(near_server_dir: Path, sshd) -> dict:
    """The near record says stopped; the far run folder is the far harvest's; its stop report is
    clean and its recorded engine is gone (measured); the tunnel's ssh client is gone."""
    record = read_remote_record(near_server_dir)
    assert record is not None and record["status"] == "stopped", record
    far_dir = Path(record["far_run_dir"])
    assert far_dir.is_relative_to(sshd.state_dir)
    assert json.loads((far_dir / "stop.json").read_text())["verdict"] == "clean"
    launch = json.loads((far_dir / "launch.json").read_text())["record"]
    assert not alive(launch["pid"], launch["create_time"])
    tunnel = record["tunnel"]
    assert tunnel["local_port"] != record["far_port"]  # the probes' address was the tunnel's own
    assert not psutil.pid_exists(tunnel["ssh_pid"]) or \
        psutil.Process(tunnel["ssh_pid"]).status() == psutil.STATUS_ZOMBIE
    return record


def far_ps(box: Path) -> list[dict]:
    res = harvest("ps", "--json", "--config", str(box), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)["servers"]


def test_compare_through_ssh_llama(tmp_path, sshd, llama_server_bin, tiny_gguf):
    port = engines.free_port()
    server = {"engine": "llamacpp", "model": str(tiny_gguf), "command": [llama_server_bin], "port": port,
              "ready_timeout": 180, "stop_grace": 5, "stop_deadline": 30}
    data = prompts(tmp_path / "in.jsonl", 12)
    ref = write_toml(tmp_path / "ref.toml", {"server": server, "preflight": {"min_disk_free_gib": 0.05},
                                              "data": {"path": str(data), "id_field": "id"},
                                              "host": sshd.host_table()})
    cand = write_toml(tmp_path / "cand.toml", {"server": {**server, "max_running_requests": 2},
                                                "preflight": {"min_disk_free_gib": 0.05}})
    settings = write_toml(tmp_path / "settings.toml", {"probe": {"prompts": 4, "max_tokens": 8,
                                                                 "floor_launch": False, "resamples": 50}})
    out = tmp_path / "compare"
    res = harvest("compare", "--reference", str(ref), "--candidate", str(cand), "--settings", str(settings),
                  "--out", str(out), "--json")
    assert "Traceback" not in res.stderr
    doc = json.loads(res.stdout)
    assert [x["label"] for x in doc["launches"]] == ["reference", "candidate-1"]
    assert all(x["error"] is None and x["stop"]["verdict"] == "clean" for x in doc["launches"]), doc["launches"]
    (cand_row,) = [r for r in doc["rows"] if r["label"] == "candidate-1"]
    assert cand_row["quality"] is not None and cand_row["gate"]["checks"], cand_row
    for c in cand_row["gate"]["checks"]:  # each check's value against its limit, read here
        assert (c["value"] <= c["limit"] + 1e-6 if c["op"] == "<=" else c["value"] >= c["limit"] - 1e-6) == c["passed"]
    passed = all(c["passed"] for c in cand_row["gate"]["checks"])
    assert cand_row["verdict"] == ("pass" if passed else "fail"), cand_row
    assert res.returncode == (0 if passed else 1), res.stdout + res.stderr  # exit 1: a candidate failed
    assert cand_row["settings"] == {"max_running_requests": 2}
    for launch in doc["launches"]:
        record = assert_far_stop_verified(Path(launch["run_dir"]), sshd)
        # The far engine answered the probe: llama-server logs every task it served (4 probe prompts).
        log = (Path(record["far_run_dir"]) / "server.log").read_text(errors="replace")
        assert log.count("| processing task") >= 4, log[-2000:]
    # The candidate file has no host table: it ran on the reference's host.
    cand_record = read_remote_record(Path(doc["launches"][1]["run_dir"]))
    assert cand_record["host"]["port"] == sshd.port
    assert far_ps(ref) == []


def test_tune_through_ssh_first_of_hosts(tmp_path, sshd):
    port = engines.free_port()
    silent = {"ssh": "root@127.0.0.1", "port": engines.free_port(), "identity_file": str(sshd.key),
              "connect_timeout": 2, "command_timeout": 5, "name": "never-contacted"}
    job = write_toml(tmp_path / "job.toml", {
        "server": {"engine": "command", "port": port,
                   "command": [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}"],
                   "health_url": "http://{host}:{port}/health", "ready_timeout": 60, "stop_grace": 2,
                   "stop_deadline": 15},
        "preflight": {"min_disk_free_gib": 0.05},
        "data": {"path": str(prompts(tmp_path / "in.jsonl", 20)), "id_field": "id"},
        "sampling": {"max_tokens": 8},
        "output": {"dir": str(tmp_path / "run")},
        "hosts": [sshd.host_table(name="box-1"), silent],
    })
    grid = write_toml(tmp_path / "tune.toml", {
        "grid": {"extra_args": [[], ["--perturb", "0.9"]]},
        "probe": {"prompts": 6, "max_tokens": 8, "floor_launch": False, "resamples": 50},
        "throughput": {"prompts": 10, "concurrency": 4},
    })
    res = harvest("tune", str(job), "--grid", str(grid), "--json",
                  "--out", str(tmp_path / "tune"))
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert any("first of 2 [[hosts]]" in n and "box-1" in n for n in doc["notes"]), doc["notes"]
    verdicts = {t["index"]: t["verdict"] for t in doc["trials"]}
    assert verdicts == {1: "pass", 2: "fail"}, doc["trials"]
    assert doc["best"] == 1
    t1 = doc["trials"][0]
    # Throughput was measured from here through the tunnel: every request answered.
    assert t1["throughput"]["requests"] == 10 and t1["throughput"]["failed"] == 0
    assert t1["throughput"]["gen_tok_s"] > 0
    assert len(doc["launches"]) == 2
    for launch in doc["launches"]:
        assert launch["stop"]["verdict"] == "clean"
        record = assert_far_stop_verified(Path(launch["run_dir"]), sshd)
        assert record["host"]["name"] == "box-1"
    box = write_toml(tmp_path / "box.toml", {"host": sshd.host_table()})
    assert far_ps(box) == []
    assert os.path.isfile(tmp_path / "tune" / "tune.csv")


def test_probes_reach_a_far_server_through_its_tunnel(tmp_path):
    """A fleet's client_config: a far server is probed at the tunnel's local end, one launched here at
    its own address (no SSH needed: the tunnel is described, not opened)."""
    from harvest.config import HostConfig, ServerConfig
    from harvest.placement.local import LocalFleet
    from harvest.placement.ssh.fleet import SshFleet
    from harvest.placement.ssh.servers import RemoteServer
    from harvest.placement.ssh.tunnel import Tunnel
    from harvest.server import Server

    cfg = ServerConfig(engine="command", command=["true"], port=8123, api_key_env="K")
    host = HostConfig(ssh="root@box", server={"port": 9001})
    far = RemoteServer(host, cfg, run_dir=tmp_path / "far")
    fleet = SshFleet(far, where="box")
    assert fleet.client_config.url == "http://127.0.0.1:9001"  # not launched yet: the far address
    far.tunnel, far.local_port = Tunnel(host, 9001, local_port=45123), 45123
    reached = fleet.client_config
    assert reached.url == "http://127.0.0.1:45123" and reached.api_key_env == "K"
    assert fleet.adapter.kind == "command"
    assert [c.port for c in fleet.server_configs] == [9001]  # the host's own [server] port
    here = Server(cfg, run_dir=tmp_path / "here")
    assert LocalFleet(here).client_config is here.config