"""A Ray give-up path on the real local cluster (tests/cluster/conftest.py): an engine that dies while
its actor and its node live on. The actor's poll reports the exit; harvest writes the server off
as lost (its stop runs on the node through the live actor, verified there), places a replacement
and finishes: every item once, no attempt charged for the loss.

So that the run cannot end before the loss path runs, the surviving engine is paused (SIGSTOP to
the group harvest recorded) from just before the kill until the replacement is ready.
(Relaunches used up on Ray: tests/placement, issue 22. Missed polls, an actor that stops answering:
not covered here, each costs three 10 s poll timeouts on this machine.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest

from tests.campaign.ledger_peek import attempts
from tests.chaos.killer import final_check, harvest_argv, wait_committed
from tests.cluster.test_ray_run import engine_process, ray_record, wait_record, wait_replacement, write_job

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_an_engine_that_dies_while_its_actor_lives_is_replaced(tmp_path, ray_cluster, llama_server_bin,
                                                                tiny_gguf):
    n = 200
    job, run_dir = write_job(tmp_path, ray_cluster, llama_server_bin, tiny_gguf, n)
    proc = subprocess.Popen(harvest_argv("run", str(job), "--no-live"), env=ray_cluster.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    paused: psutil.Process | None = None
    output = ""
    try:
        rec = wait_record(run_dir, 2)
        wait_committed(run_dir, 10, proc, timeout=120)
        victim, survivor = rec["members"][0], rec["members"][1]
        engine, other = engine_process(victim["info"]), engine_process(survivor["info"])
        assert engine is not None and other is not None
        os.killpg(other.pid, signal.SIGSTOP)
        paused = other
        os.killpg(engine.pid, signal.SIGKILL)  # the engine's group (recorded at launch); actor and node live
        wait_replacement(run_dir, rec)
        time.sleep(2.0)  # the client's health probe finds the replacement
        os.killpg(other.pid, signal.SIGCONT)
        paused = None
        output, _ = proc.communicate(timeout=400)
    finally:
        if paused is not None and paused.is_running():
            os.killpg(paused.pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 0, output[-4000:]
    assert f"server {victim['name']} on" in output and "lost: its engine exited" in output, output[-4000:]
    assert final_check(run_dir, n) == []  # nothing lost, nothing duplicated
    assert max(attempts(run_dir)) == 1, "an attempt was charged for the engine's death"
    after = ray_record(run_dir)
    lost = [m for m in after["members"] if m["name"] == victim["name"]]
    # The actor still answered: the stop of the written-off server ran on its node, verified there.
    assert lost and lost[0]["state"] == "lost" and lost[0]["verdict"] == "clean", lost
    replacements = [m for m in after["members"] if m["name"] not in {x["name"] for x in rec["members"]}]
    assert replacements and all(m["state"] == "stopped" and m["verdict"] == "clean" for m in replacements), \
        replacements
    assert engine_process(victim["info"]) is None
    for m in after["members"]:
        if m["info"] is not None:
            assert engine_process(m["info"]) is None, f"{m['name']} still runs"
