"""``[[hosts]]``: two boxes (two real sshd on two loopback ports), each launching its own engine
through its far harvest; one campaign drives both (least-outstanding balancing over the two
tunnels), both get traffic, both are stopped clean by their far harvest. ``harvest gpus`` over
both prints one table with a host column; a host that fails preflight is named and left out, or
the run refused with ``--all-hosts``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harvest.placement.ssh.servers import read_remote_record
from harvest.ledger import Ledger, Status
from tests import engines
from tests import harvest_process
from tests.gpu.schema_doc import place_answers
from tests.hosts.conftest import FAR_HARVEST, write_toml
from tests.hosts.test_container import PREFLIGHT, server_table

pytestmark = [pytest.mark.engine]


def harvest(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([FAR_HARVEST, *args], capture_output=True, text=True, timeout=timeout)


def two_host_job(tmp_path: Path, sshd, sshd2, bin_: str, gguf: Path, *, second_over: dict | None = None,
                 client: dict | None = None, server: dict | None = None, items: int = 60,
                 run: dict | None = None) -> Path:
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"h{i}", "prompt": f"Two hosts {i}."}) + "\n"
                            for i in range(items)))
    return write_toml(tmp_path / "job.toml", {
        "server": {**server_table(bin_, gguf, engines.free_port()), **(server or {})}, "preflight": PREFLIGHT,
        "data": {"path": str(data), "id_field": "id"}, "sampling": {"max_tokens": 8},
        "client": {"concurrency": 8, "max_retries": 0, "health_deadline": 60, **(client or {})},
        **({"run": run} if run else {}),
        "output": {"dir": str(tmp_path / "run")},
        "hosts": [sshd.host_table(name="box-a"),
                  sshd2.host_table(name="box-b", server={"port": engines.free_port(), **(second_over or {})})],
    })


def test_one_campaign_over_two_hosts(tmp_path, sshd, sshd2, llama_server_bin, tiny_gguf):
    """Under ``concurrency = "auto"`` each host's endpoint starts and stops at its own engine's batch:
    box-b overrides [server]'s 2 slots with 8 (a bigger box). Steered by [server]'s 2, an exact cap,
    box-b's endpoint would stay at 4 at most (its cap and a queue of at most one more batch)."""
    job = two_host_job(tmp_path, sshd, sshd2, llama_server_bin, tiny_gguf, items=240,
                       client={"concurrency": "auto"}, server={"max_running_requests": 2},
                       second_over={"max_running_requests": 8}, run={"progress_interval": 0.2})
    res = harvest("run", str(job), "--no-live")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("server stop: clean") == 2, res.stdout
    ledger = Ledger.open_readonly(tmp_path / "run")
    try:
        rows = list(ledger.iter_results(statuses=tuple(Status)))
    finally:
        ledger.close()
    served = {r.output["turns"][0]["endpoint"] for r in rows}
    urls = {}
    for sub in ("host-0", "host-1"):
        record = read_remote_record(tmp_path / "run" / "server" / sub)
        assert record is not None and record["status"] == "stopped"
        urls[sub] = f"http://127.0.0.1:{record['tunnel']['local_port']}"
        assert json.loads((Path(record["far_run_dir"]) / "stop.json").read_text())["verdict"] == "clean"
    assert served == set(urls.values())  # both hosts got traffic, through their tunnels
    assert len({r.item_id for r in rows}) == 240  # every item answered (8 tokens: "truncated" at max_tokens)
    assert all(r.status in (Status.DONE, Status.TRUNCATED) for r in rows)
    # each endpoint's auto target, as the run's timeline recorded it: box-a held to its 2 slots and a
    # short queue (4 at most), box-b from its own 8 and a short queue (10) on
    points = json.loads((tmp_path / "run" / "timeline.json").read_text())["intervals"]
    targets = {sub: [t for p in points if (t := p["endpoints"].get(url, {}).get("target")) is not None]
               for sub, url in urls.items()}
    assert targets["host-0"] and targets["host-1"], points
    assert max(targets["host-0"]) <= 4.0, targets
    assert min(targets["host-1"]) >= 10.0, targets

    res = harvest("gpus", "--config", str(job))
    assert res.returncode == 0, res.stderr
    assert "box-a" in res.stdout and "box-b" in res.stdout and "host" in res.stdout
    doc = json.loads(harvest("gpus", "--json", "--config", str(job)).stdout)
    assert [p["where"] for p in doc["places"]] == ["box-a", "box-b"] and all(place_answers(doc, "harvest.gpus/2"))


def test_a_host_that_fails_is_named_and_left_out_or_refused(tmp_path, sshd, sshd2, llama_server_bin, tiny_gguf):
    # box-b's far harvest is missing: its preflight cannot run there.
    job = two_host_job(tmp_path, sshd, sshd2, llama_server_bin, tiny_gguf,
                       second_over={})
    text = job.read_text()
    second = text.index("[[hosts]]", text.index("[[hosts]]") + 1)
    job.write_text(text[:second] + text[second:].replace(f'harvest = "{FAR_HARVEST}"',
                                                         f'harvest = "{tmp_path / "missing-harvest"}"'))
    refused = harvest("run", str(job), "--no-live", "--all-hosts")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "refused (--all-hosts)" in refused.stderr and "box-b" in refused.stderr
    assert read_remote_record(tmp_path / "run" / "server" / "host-0") is None  # nothing was launched

    res = harvest("run", str(job), "--no-live")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "host box-b left out" in res.stderr
    assert res.stdout.count("server stop: clean") == 1
