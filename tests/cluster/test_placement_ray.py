"""The placement matrix on a real local Ray cluster (tests/cluster/conftest.py): gpus, preflight,
serve --detach + ps + stop, run, tune (two candidates) and compare of a [cluster] job (llama-server
actors on the worker nodes), every document in its documented shape, every server found on its
node by the run's record and stopped clean there; and `[run] max_relaunches` spent: the
replacements stop at the budget and the run says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from harvest.placement import record
from tests import engines, harvest_process
from tests.campaign.ledger_peek import attempts
from tests.chaos.killer import final_check, harvest_argv, read_ledger, wait_committed
from tests.cluster.conftest import ENGINE_SLOTS
from tests.cluster.test_ray_run import Driver, engine_process, ray_record, run, wait_record, write_job
from tests.placement.matrix import Place, every_command

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_every_command_on_the_cluster(tmp_path, ray_cluster, llama_server_bin, tiny_gguf):
    server = {"engine": "llamacpp", "model": str(tiny_gguf), "command": [llama_server_bin],
              "port": engines.free_port(), "extra_args": ["-c", "2048"], "ready_timeout": 90, "stop_grace": 3,
              "stop_deadline": 20}
    cluster = {"backend": "ray", "address": ray_cluster.address, "servers": 2, "gpus_per_server": 0,
               "resources": {"engine": 1}, "connect_timeout": 60}
    tables = {"server": server, "preflight": {"min_disk_free_gib": 0.1, "ram_reserve_gib": 0}, "cluster": cluster}

    def harvest(*args: str) -> subprocess.CompletedProcess:
        return harvest_process.run(harvest_argv(*args), capture_output=True, text=True, timeout=400,
                                   env=ray_cluster.env)

    workers = {ray_cluster.node_id("node_a")[:8], ray_cluster.node_id("node_b")[:8]}

    def on_a_worker(where: str) -> bool:
        return where.startswith("node 127.0.0.1 (") and where[-9:-1] in workers

    every_command(Place("ray", harvest, tables, where=on_a_worker, servers=2), tmp_path)
    rec = json.loads((tmp_path / "served" / "placement.json").read_text())
    assert rec["kind"] == "ray" and [m["state"] for m in rec["members"]] == ["stopped", "stopped"]
    assert {m["info"]["node_id"][:8] for m in rec["members"]} == workers  # one per worker node
    run = record.find(tmp_path / "run")
    assert [doc["kind"] for _, doc in run] == ["ray"]
    assert {m["info"]["node_id"][:8] for m in run[0][1]["members"]} == workers  # the run's servers: one on each


def test_max_relaunches_spent(tmp_path, ray_cluster, llama_server_bin, tiny_gguf):
    """One server, one replacement allowed: the first engine killed is replaced, the second is not;
    the run ends (items left pending, nothing charged) and says the budget is used up."""
    n = 3000  # far more than one server does while the test kills two
    job, run_dir = write_job(tmp_path, ray_cluster, llama_server_bin, tiny_gguf, n, servers="1", max_relaunches=1)
    with Driver(job, run_dir, ray_cluster.env) as driver:
        # The first engine is killed once the run generates (a result committed): a managed server
        # that dies before that, during the endpoints' start check, is waited for by the check
        # (start_deadline) instead of being relaunched; this test is about the relaunch budget.
        wait_committed(run_dir, 1, driver.proc, timeout=180)
        for round_ in range(2):
            rec = wait_record(run_dir, 1)
            ready = [m for m in rec["members"] if m["state"] == "ready"]
            engine = engine_process(ready[-1]["info"])
            assert engine is not None
            os.killpg(engine.pid, signal.SIGKILL)  # the engine's group, recorded at its launch
            end = time.monotonic() + 120
            while time.monotonic() < end:  # the watch sees it gone (lost), a replacement may follow
                states = {m["name"]: m["state"] for m in ray_record(run_dir)["members"]}
                if states.get(ready[-1]["name"]) != "ready":
                    break
                time.sleep(0.3)
        output = driver.wait(timeout=400)
    assert driver.proc.returncode == 1, output[-3000:]
    assert "run.max_relaunches (1) used up" in output, output[-4000:]
    assert "(server_down; the managed server exited and relaunches are used up)" in output, output[-4000:]
    members = ray_record(run_dir)["members"]
    assert len(members) == 2, members  # the first server and its one replacement, no third
    view = read_ledger(run_dir)
    # not all done (the budget ended the servers, not the items), nothing failed, and no attempt was
    # charged for the two engines killed under the items in flight: a done item took one, the rest none
    assert view.counts.get("pending", 0) > 0 and view.counts.get("failed", 0) == 0, view.counts
    assert max(attempts(run_dir)) <= 1 and sum(attempts(run_dir)) == view.counts.get("done", 0) + \
        view.counts.get("truncated", 0), (view.counts, sorted(set(attempts(run_dir))))
    for m in members:
        assert m["info"] is None or engine_process(m["info"]) is None
    res = harvest_process.run(harvest_argv("stop", str(run_dir), "--json"), capture_output=True, text=True,
                              timeout=120, env=ray_cluster.env)
    assert res.returncode == 0, res.stdout + res.stderr  # nothing of the run is left running: clean
    doc = json.loads(res.stdout)
    assert doc == {"schema": "harvest.stop/1", "verdict": "clean", "servers": []}
    assert not any(p.info["name"] == "llama-server" and p.info["pid"] in
                   {(m["info"] or {}).get("pid") for m in members} for p in psutil.process_iter(["pid", "name"]))


#: Holds every engine slot of one node in a placement group of its own (another user's work on a
#: shared cluster) until its stdin closes, then removes the group and exits.
OCCUPIER = """
import sys, ray
from ray.util.placement_group import placement_group, remove_placement_group
ray.init(address=sys.argv[1], log_to_driver=False)
pg = placement_group([{sys.argv[2]: 1.0, "engine": float(sys.argv[3])}], strategy="STRICT_PACK")
ray.get(pg.ready(), timeout=60)
print("held", flush=True)
sys.stdin.readline()
remove_placement_group(pg)
"""


def test_a_busy_node_is_not_chosen_while_another_has_room(tmp_path, ray_cluster, llama_server_bin, tiny_gguf):
    """Another job holds every engine slot of the node harvest would pick first by its totals. With
    ``servers = 1`` the server goes to the node with room now, at once; with ``per_node`` the busy
    node's server waits ``connect_timeout`` and is left out with a line naming that node and what is
    free there, and the run finishes on the other."""
    (tmp_path / "one").mkdir()
    (tmp_path / "each").mkdir()
    busy = min(("node_a", "node_b"), key=ray_cluster.node_id)  # the first node by harvest's order
    free = "node_b" if busy == "node_a" else "node_a"
    holder = subprocess.Popen([sys.executable, "-c", OCCUPIER, ray_cluster.address, busy, str(ENGINE_SLOTS)],
                              env=ray_cluster.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        n = 12
        job, run_dir = write_job(tmp_path / "one", ray_cluster, llama_server_bin, tiny_gguf, n, servers="1")
        out = run(harvest_argv("run", str(job), "--no-live"), ray_cluster.env)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        (member,) = ray_record(run_dir)["members"]  # one placement, no server left out on the busy node
        assert member["info"]["node_id"] == ray_cluster.node_id(free) and member["state"] == "stopped", member

        job, run_dir = write_job(tmp_path / "each", ray_cluster, llama_server_bin, tiny_gguf, n,
                                 servers='"per_node"', connect_timeout=5)
        out = run(harvest_argv("run", str(job), "--no-live"), ray_cluster.env)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        members = ray_record(run_dir)["members"]
        served = [m for m in members if m["state"] == "stopped"]
        assert [m["info"]["node_id"] for m in served] == [ray_cluster.node_id(free)], members
        where = f"on node 127.0.0.1 ({ray_cluster.node_id(busy)[:8]}) within 5 s; free there now:"
        assert where in out.stdout + out.stderr, out.stdout[-3000:] + out.stderr[-3000:]
        assert final_check(run_dir, n) == []
    finally:
        if holder.stdin is not None:
            holder.stdin.close()  # the holder removes its group and exits
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            holder.kill()  # the holder this test started, by its pid
            holder.wait(timeout=30)
