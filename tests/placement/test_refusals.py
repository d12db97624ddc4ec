"""Commands on a placement where they cannot work: one line on stderr, exit 2, and nothing done on
this machine instead (no server folder in the state dir, nothing listening on the job's port)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harvest.net import port_listening
from tests import engines, harvest_process
from tests.realparts import require

HARVEST = str(Path(sys.executable).with_name("harvest"))


def harvest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    return harvest_process.run([HARVEST, *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def cluster_job(tmp_path: Path, port: int) -> Path:
    """A [cluster] job whose address no cluster answers (a closed loopback port)."""
    path = tmp_path / "cluster-job.toml"
    path.write_text(f'[server]\nengine = "vllm"\nmodel = "{tmp_path}/m"\nport = {port}\napi_key_env = "K"\n'
                    f'[cluster]\nbackend = "ray"\naddress = "127.0.0.1:{engines.free_port()}"\nconnect_timeout = 5\n'
                    f'[output]\ndir = "{tmp_path}/run"\n')
    return path


def nothing_here(tmp_path: Path, port: int) -> None:
    assert not port_listening("127.0.0.1", port, timeout=0.5)
    servers = tmp_path / "state" / "servers"
    assert not servers.exists() or not any(servers.iterdir())  # no local launch record


@pytest.mark.parametrize("detach", [[], ["--detach"]])
def test_serve_of_a_cluster_job_never_launches_here(tmp_path, detach):
    require("ray", "the [cluster] placement needs Ray (pip install -e '.[ray]')")
    port = engines.free_port()
    res = harvest(tmp_path, "serve", str(cluster_job(tmp_path, port)), *detach)
    assert res.returncode == 2, res.stdout + res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "[cluster] address" in errors[0] and "cannot connect to Ray" in errors[0], res.stderr
    assert "Traceback" not in res.stderr
    nothing_here(tmp_path, port)


def test_ps_and_stop_of_a_cluster_job_ask_the_cluster(tmp_path):
    require("ray", "the [cluster] placement needs Ray (pip install -e '.[ray]')")
    job = cluster_job(tmp_path, engines.free_port())
    res = harvest(tmp_path, "ps", "--config", str(job))
    assert res.returncode == 2 and "cannot connect to Ray" in res.stderr, res.stdout + res.stderr
    res = harvest(tmp_path, "stop", "--config", str(job))
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "name the run folder" in line


@pytest.mark.parametrize(("args", "words"), [
    (["gpus", "--host", "root@127.0.0.1", "--watch", "1"], "--watch refreshes this machine's view"),
    (["gpus", "--host", "root@127.0.0.1", "--cluster", "auto"], "give --cluster or --host, not both"),
])
def test_a_combination_that_cannot_work_is_one_line(tmp_path, args, words):
    res = harvest(tmp_path, *args)
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: ") and words in line, line


def test_stop_of_a_folder_without_a_record_is_one_line(tmp_path):
    (tmp_path / "runs" / "box").mkdir(parents=True)
    res = harvest(tmp_path, "stop", str(tmp_path / "runs" / "box"))
    assert res.returncode == 0 and not res.stderr  # nothing to stop: said, not an error
    (line,) = res.stdout.strip().splitlines()
    assert line.startswith("nothing to stop: ") and "no launch record in" in line and "host-*" in line


@pytest.mark.parametrize("where", [["--host", "root@127.0.0.1"], ["--cluster", "127.0.0.1:9"]])
def test_preflight_wait_off_this_machine_is_one_line(tmp_path, where):
    """--wait polls this machine's rules; a far host or a Ray cluster is checked once: refused before
    anything is contacted (no SSH, no Ray connection: the addresses above answer nothing)."""
    if where[0] == "--cluster":
        require("ray", "the [cluster] placement needs Ray (pip install -e '.[ray]')")
    port = engines.free_port()
    job = tmp_path / "job.toml"
    job.write_text(f'[server]\nengine = "command"\ncommand = ["true"]\nport = {port}\n')
    res = harvest(tmp_path, "preflight", str(job), *where, "--wait", "5")
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: ") and "--wait" in line, line
    assert res.stdout == ""
    nothing_here(tmp_path, port)
