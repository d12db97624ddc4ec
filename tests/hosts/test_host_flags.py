"""``--host USER@NAME`` (with ``--port``, ``--identity-file``, ``--ssh-option``, ``--exec-prefix``,
``--far-harvest``): gpus, preflight and ps on a box named on the command line, no config file, over
the test's real sshd (conftest.py). A flag without --host, or --host with --config, is one line,
exit 2."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess

import pytest

from tests import harvest_process
from tests.gpu.schema_doc import place_answers
from tests.hosts.conftest import FAR_HARVEST, write_toml


def harvest(*args: str) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([FAR_HARVEST, *args], capture_output=True, text=True, timeout=120)


def host_flags(sshd) -> list[str]:
    table = sshd.host_table()
    flags = ["--host", str(table["ssh"]), "--port", str(sshd.port), "--identity-file", str(sshd.key),
             "--exec-prefix", shlex.join(table["exec_prefix"]), "--far-harvest", FAR_HARVEST]
    for opt in table["ssh_options"]:
        flags += ["--ssh-option", opt]
    return flags


def test_gpus_ps_preflight_with_host_flags(tmp_path, sshd):
    label = f"root@127.0.0.1:{sshd.port}"
    res = harvest("gpus", *host_flags(sshd))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "GPUs by host" in res.stdout and label in res.stdout, res.stdout
    res = harvest("gpus", "--json", *host_flags(sshd))
    doc = json.loads(res.stdout)
    (answer,) = place_answers(doc, "harvest.gpus/2")  # the documented shapes, as on this machine
    assert doc["placement"] == "ssh" and [p["where"] for p in doc["places"]] == [label]
    assert answer["schema"] == "harvest.gpus/1" and answer["host"]["ram_total_mib"] > 0

    res = harvest("ps", "--json", *host_flags(sshd))
    assert res.returncode == 0 and json.loads(res.stdout) == {"schema": "harvest.ps/1", "servers": []}

    # preflight of a job without a host table, on the box the flags name: a port held there fails.
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    job = write_toml(tmp_path / "job.toml", {
        "server": {"engine": "command", "port": held.getsockname()[1], "command": ["true"]},
        "preflight": {"min_disk_free_gib": 0.05, "ram_reserve_gib": 0}})
    try:
        res = harvest("preflight", str(job), "--json", *host_flags(sshd))
    finally:
        held.close()
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    (entry,) = place_answers(doc, "harvest.preflight/2")
    assert doc["places"][0]["where"] == label and doc["passed"] is False
    assert [r["rule"] for r in entry["results"] if not r["passed"]] == ["port"]


@pytest.mark.parametrize("args, says", [
    (["gpus", "--port", "2222"], "--port: needs --host"),
    (["ps", "--identity-file", "k"], "--identity-file: needs --host"),
    (["ps", "--host", "a@b", "--config", "box.toml"], "or --config, not both"),
    (["stop", "--host", "a@b", "--ssh-option", "v"], "--ssh-option:"),
    (["gpus", "--exec-prefix", "pct exec 101 --", "--port", "22"], "need --host"),
])
def test_flag_errors_are_one_line(args, says):
    res = harvest(*args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], res.stderr
