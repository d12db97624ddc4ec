"""The placement is chosen once: from a config plus flags, or from a run folder's record.

No engine, no network: what is observed is the kind chosen, the record files on disk (their modes),
and the one-line refusals.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from harvest.config import HostConfig, parse_config
from harvest.placement import Flags, Refused, from_config, from_record, record
from harvest.placement.base import Fleet
from harvest.server.state import STATE_FILE


def job(tmp_path, **tables):
    base = {"server": {"engine": "vllm", "model": "m", "port": 8123}, "output": {"dir": str(tmp_path / "out")}}
    base.update(tables)
    return parse_config(base, source="job.toml", base=tmp_path)


def test_chosen_from_the_config_and_the_flags(tmp_path):
    assert from_config(job(tmp_path)).kind == "local"
    assert from_config(None).kind == "local"
    assert from_config(job(tmp_path, host={"ssh": "root@box"})).kind == "ssh"
    assert from_config(job(tmp_path, hosts=[{"ssh": "a@x"}, {"ssh": "b@y"}])).kind == "ssh"
    cluster_job = job(tmp_path, cluster={"backend": "ray", "address": "127.0.0.1:1"},
                      server={"engine": "vllm", "model": "m", "port": 8123, "api_key_env": "K"})
    ray = from_config(cluster_job)
    assert ray.kind == "ray" and ray.where() == "the Ray cluster at 127.0.0.1:1"
    # flags replace the file's own tables
    assert from_config(cluster_job, Flags(host=HostConfig(ssh="root@box"))).kind == "ssh"
    probe = from_config(job(tmp_path), Flags(cluster="10.0.0.1:6379"))
    assert probe.kind == "ray" and probe.cluster.address == "10.0.0.1:6379"


def test_both_flags_are_refused_in_one_line(tmp_path):
    with pytest.raises(Refused) as info:
        from_config(None, Flags(host=HostConfig(ssh="root@box"), cluster="auto"))
    assert "\n" not in str(info.value) and "--cluster or --host" in str(info.value)


def test_a_cluster_flag_alone_cannot_launch(tmp_path):
    """--cluster without a job's [cluster] only probes: a launch there is refused, never done here."""
    with pytest.raises(Refused) as info:
        from_config(None, Flags(cluster="auto")).fleet()
    assert "needs a job with a [cluster] table" in str(info.value)


def test_records_are_owner_only_and_tagged(tmp_path):
    folder = tmp_path / "runs" / "box" / "server"
    record.write(folder, "ssh", {"host": {"ssh": "root@box"}, "status": "ready"})
    path = folder / record.RECORD
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    doc = json.loads(path.read_text())
    assert doc["kind"] == "ssh" and doc["schema"] == "harvest.placement/1"
    assert [f.name for f in path.parent.iterdir()] == [record.RECORD]  # no temporary file left


@pytest.mark.parametrize("where", ["", "server", "server/host-0"])
def test_an_ssh_run_folder_is_found_from_its_top(tmp_path, where):
    """`harvest stop runs/box` works whether the record sits in the folder, server/ or host-N/."""
    top = tmp_path / "runs" / "box"
    record.write(top / where, "ssh", {"host": {"ssh": "root@box", "name": "box"}, "status": "ready"})
    placement = from_record(top)
    assert placement.kind == "ssh" and placement.where() == "box"
    assert [f for f, _ in placement.records] == [top / where]


def test_two_hosts_run_folder_names_both(tmp_path):
    top = tmp_path / "run"
    for i, name in enumerate(("box-a", "box-b")):
        record.write(top / "server" / f"host-{i}", "ssh", {"host": {"ssh": f"root@{name}", "name": name}})
    assert from_record(top).where() == "box-a, box-b"


def test_a_ray_run_folder_and_a_local_one(tmp_path):
    record.write(tmp_path / "ray-run" / "server", "ray", {"address": "127.0.0.1:1", "namespace": "ns",
                                                          "members": []})
    ray = from_record(tmp_path / "ray-run")
    assert ray.kind == "ray" and ray.cluster.namespace == "ns"
    (tmp_path / "local" / "server").mkdir(parents=True)
    (tmp_path / "local" / "server" / STATE_FILE).write_text("{}")
    assert from_record(tmp_path / "local").kind == "local"


def test_a_folder_without_a_record_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(Refused) as info:
        from_record(tmp_path / "empty")
    text = str(info.value)
    assert "\n" not in text and "no launch record in" in text and str(tmp_path / "empty") in text


def test_a_fleet_stops_to_a_list_and_reads_one_shape(tmp_path):
    """What campaign code reads is the same whatever the kind launched: a list of reports, the
    engine adapter, the config the client reaches; what only one kind can do has its default."""
    from harvest.config import ServerConfig
    from harvest.server.stop import StopReport

    cfg = ServerConfig(engine="vllm", model="m", port=8200)

    class Group(Fleet):  # a kind of two servers (as a Ray group): several urls, one report each
        urls = ["http://127.0.0.1:8200", "http://127.0.0.1:8201"]
        ready = kv_capacity_tokens = None

        def returncode(self):
            return None

        def cancel(self):
            pass

        async def _start(self):
            pass

        async def _stop(self, deadline):
            return [StopReport(run_dir="a", verdict="clean", steps=(), escalated=False),
                    StopReport(run_dir="b", verdict="dirty", steps=(), escalated=False, problems=("x",))]

    import asyncio

    fleet = Group(cfg, run_dir=tmp_path, where="test")
    assert fleet.adapter.kind == "vllm"
    assert fleet.client_config.port == 8200
    assert [e.batch for e in fleet.engine_limits()] == [128, 128]  # one per URL (vLLM without GPUs: 128)
    assert fleet.replacements == 0 and fleet.launch_record() is None and not fleet.stopped_elsewhere()
    with pytest.raises(Refused) as info:
        fleet.detach()
    assert "cannot be left running" in str(info.value) and "test" in str(info.value)
    reports = asyncio.run(fleet.stop())
    assert [r.run_dir for r in reports] == ["a", "b"]
    assert fleet.stop_report.run_dir == "b"  # the dirty one is what a one-line summary shows


def test_a_fleet_without_every_verb_cannot_be_made(tmp_path):
    """The ABC holds the seam: a kind that leaves out a verb fails when it is made, not when the
    verb is first asked for in the middle of a run."""
    from harvest.config import ServerConfig

    class Half(Fleet):
        urls = ["http://127.0.0.1:8200"]

    with pytest.raises(TypeError, match="abstract"):
        Half(ServerConfig(engine="vllm", model="m", port=8200), run_dir=tmp_path, where="test")


def test_a_ray_probe_waits_for_each_node_as_long_as_the_job_says(tmp_path, monkeypatch):
    """A node's first answer starts a Ray worker there: gpus/preflight wait the job's connect_timeout
    for it; --timeout replaces it; without a [cluster] table, 30 s."""
    import harvest.placement.ray.probe as probe

    waited = []
    monkeypatch.setattr(probe, "cluster_gpus",
                        lambda address, *, timeout, runtime_env: waited.append(timeout) or [])
    cluster_job = job(tmp_path, cluster={"backend": "ray", "address": "127.0.0.1:1", "connect_timeout": 75},
                      server={"engine": "vllm", "model": "m", "port": 8123, "api_key_env": "K"})
    from_config(cluster_job).gpus()
    from_config(cluster_job, Flags(timeout=4)).gpus()
    from_config(cluster_job, Flags(cluster="127.0.0.1:2")).gpus()
    from_config(None, Flags(cluster="127.0.0.1:2")).gpus()
    assert waited == [75, 4, 75, 30]
