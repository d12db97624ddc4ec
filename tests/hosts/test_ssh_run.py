"""A far box over real OpenSSH: ``harvest run`` launches llama-server there through the far harvest,
drives the campaign through the tunnel, stops it there; then ``serve --detach``, ``ps``, ``stop``
and ``gpus`` against the same host. The far harvest is this checkout (see conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from harvest.placement.ssh.servers import read_remote_record
from tests import engines
from tests import harvest_process
from tests.campaign.ledger_peek import attempts
from tests.hosts.conftest import FAR_HARVEST, write_toml

pytestmark = [pytest.mark.engine]

HARVEST = FAR_HARVEST  # the near harvest is the same checkout


def harvest(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([HARVEST, *args], capture_output=True, text=True, timeout=timeout)


def data_file(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"Remote line {i}."}) + "\n" for i in range(n)))
    return path


def llama_server_table(llama_server_bin: str, tiny_gguf: Path, port: int) -> dict[str, object]:
    """A real engine, fast to start (what is under test is the far side and the tunnel, not the engine)."""
    return {"engine": "llamacpp", "model": str(tiny_gguf), "command": [llama_server_bin], "port": port,
            "extra_args": ["-c", "4096"], "ready_timeout": 120, "stop_grace": 5, "stop_deadline": 60}


def test_run_through_ssh_end_to_end_then_serve_ps_stop_gpus(tmp_path, sshd, llama_server_bin, tiny_gguf):
    far_port = engines.free_port()
    job = write_toml(tmp_path / "job.toml", {
        "server": llama_server_table(llama_server_bin, tiny_gguf, far_port),
        "data": {"path": str(data_file(tmp_path / "in.jsonl", 40)), "id_field": "id"},
        "sampling": {"max_tokens": 8},
        "client": {"concurrency": 8, "max_retries": 0, "health_deadline": 60},
        "output": {"dir": str(tmp_path / "run")},
        "run": {"progress_interval": 0.5},
        "host": sshd.host_table(),
    })
    res = harvest("run", str(job), "--no-live")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "server stop: clean" in res.stdout, res.stdout
    assert set(attempts(tmp_path / "run")) == {1}
    record = read_remote_record(tmp_path / "run" / "server")
    assert record is not None and record["status"] == "stopped"
    # The far run folder is the far harvest's, under its own state dir, and its stop report is there.
    far_dir = Path(record["far_run_dir"])
    assert far_dir.is_relative_to(sshd.state_dir)
    assert json.loads((far_dir / "stop.json").read_text())["verdict"] == "clean"
    # The tunnel's ssh client is gone, and so is the far engine (measured: its recorded leader).
    assert not psutil.pid_exists(record["tunnel"]["ssh_pid"]) or \
        psutil.Process(record["tunnel"]["ssh_pid"]).status() == psutil.STATUS_ZOMBIE
    launch = json.loads((far_dir / "launch.json").read_text())
    assert not _alive(launch["record"]["pid"], launch["record"]["create_time"])

    # serve --detach on the far host, then ps, stop by the near record, ps again, gpus.
    box = write_toml(tmp_path / "box.toml", {"server": llama_server_table(llama_server_bin, tiny_gguf, far_port),
                                              "host": sshd.host_table()})
    near = tmp_path / "near-record"
    res = harvest("serve", str(box), "--detach", "--run-dir", str(near))
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        listed = json.loads(harvest("ps", "--json", "--config", str(box)).stdout)
        assert [s["measured"]["leader_alive"] for s in listed["servers"]] == [True]
        assert listed["servers"][0]["port"] == far_port
    finally:
        res = harvest("stop", str(near), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["schema"] == "harvest.stop/1" and report["verdict"] == "clean"
    (one,) = report["servers"]
    assert [s["name"] for s in one["steps"]][:2] == ["record", "sigterm"]
    listed = json.loads(harvest("ps", "--json", "--config", str(box)).stdout)
    assert listed["servers"] == []
    res = harvest("gpus", "--config", str(box))
    assert res.returncode == 0 and "host" in res.stdout and "root@127.0.0.1" in res.stdout, res.stdout


def _alive(pid: int, create_time: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-x", "-q"]))
