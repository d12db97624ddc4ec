"""Ray give-up paths on the real local cluster (tests/cluster/conftest.py).

- An engine that dies while its actor and its node live on. The actor's poll reports the exit;
  harvest writes the server off as lost (its stop runs on the node through the live actor, verified
  there), places a replacement and finishes: every item once, no attempt charged for the loss.
- Missed polls: a server's actor and engine frozen (SIGSTOP, a node that hangs without dying: Ray
  still counts the node alive, so only harvest's own polls can notice). After ``POLL_MISSES`` polls
  without an answer harvest writes the server off as lost, says so naming the server and its node,
  cannot verify its stop there (the report is dirty and names the way out, ``harvest stop`` of the
  node's run folder, which the test then runs), places a replacement and finishes.

So that the run cannot end before the loss path runs, the surviving engine is paused (SIGSTOP to
the group harvest recorded) from just before the fault until the replacement is ready.
(Relaunches used up on Ray: tests/cluster/test_placement_ray.py::test_max_relaunches_spent.)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import psutil
import pytest

from harvest.placement.ray.servers import POLL_MISSES, POLL_S, POLL_TIMEOUT_S, STOP_SLACK_S
from tests.campaign.ledger_peek import attempts
from tests.chaos.killer import final_check, harvest_argv, wait_committed
from tests.cluster.test_ray_run import (
    Driver,
    engine_process,
    ray_record,
    run,
    wait_record,
    wait_replacement,
    write_job,
)
from tests.timing import SLACK_S

pytestmark = [pytest.mark.engine, pytest.mark.slow]

#: [server] stop_deadline of the missed-polls job: the stop of its frozen server waits this plus
#: STOP_SLACK_S for the actor; 8 s keeps that short and is still far more than a llama-server's stop
#: takes (stop_grace 3 s).
STOP_DEADLINE = 8.0


def written_off_and_replaced(run_dir, n: int, rec: dict, victim: dict, *, verdict: str) -> dict:
    """Every item once with no attempt charged for the loss, the victim written off as lost with the
    stop ``verdict`` its node allowed, its replacement stopped clean; returns the final record."""
    assert final_check(run_dir, n) == []  # nothing lost, nothing duplicated
    assert max(attempts(run_dir)) == 1, "an attempt was charged for the lost server"
    after = ray_record(run_dir)
    lost = [m for m in after["members"] if m["name"] == victim["name"]]
    assert lost and lost[0]["state"] == "lost" and lost[0]["verdict"] == verdict, lost
    replacements = [m for m in after["members"] if m["name"] not in {x["name"] for x in rec["members"]}]
    assert replacements and all(m["state"] == "stopped" and m["verdict"] == "clean" for m in replacements), \
        replacements
    return after


def serving(run_dir, driver: Driver) -> tuple[dict, dict, psutil.Process, psutil.Process]:
    """Once both servers are ready and 10 results are in: the record, the victim (its first member),
    the victim's engine and the survivor's (the leaders recorded at launch)."""
    rec = wait_record(run_dir, 2)
    wait_committed(run_dir, 10, driver.proc, timeout=120)
    victim, survivor = rec["members"][0], rec["members"][1]
    engine, other = engine_process(victim["info"]), engine_process(survivor["info"])
    assert engine is not None and other is not None
    return rec, victim, engine, other


def test_an_engine_that_dies_while_its_actor_lives_is_replaced(tmp_path, ray_cluster, llama_server_bin,
                                                                tiny_gguf):
    n = 200
    job, run_dir = write_job(tmp_path, ray_cluster, llama_server_bin, tiny_gguf, n)
    paused: psutil.Process | None = None
    with Driver(job, run_dir, ray_cluster.env) as driver:
        try:
            rec, victim, engine, other = serving(run_dir, driver)
            os.killpg(other.pid, signal.SIGSTOP)
            paused = other
            os.killpg(engine.pid, signal.SIGKILL)  # the engine's group (recorded at launch); actor and node live
            wait_replacement(run_dir, rec)
            time.sleep(2.0)  # the client's health probe finds the replacement
            os.killpg(other.pid, signal.SIGCONT)
            paused = None
            output = driver.wait(timeout=400)
        finally:
            if paused is not None and paused.is_running():
                os.killpg(paused.pid, signal.SIGCONT)
    assert driver.proc.returncode == 0, output[-4000:]
    assert f"server {victim['name']} on" in output and "lost: its engine exited" in output, output[-4000:]
    # The actor still answered: the stop of the written-off server ran on its node, verified there.
    after = written_off_and_replaced(run_dir, n, rec, victim, verdict="clean")
    assert engine_process(victim["info"]) is None
    for m in after["members"]:
        if m["info"] is not None:
            assert engine_process(m["info"]) is None, f"{m['name']} still runs"


def gone(pid: int, timeout: float) -> bool:
    """True once ``pid`` is no longer a live process (a zombie counts as gone), within ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def test_missed_polls_write_a_frozen_server_off(tmp_path, ray_cluster, llama_server_bin, tiny_gguf):
    n = 200
    job, run_dir = write_job(tmp_path, ray_cluster, llama_server_bin, tiny_gguf, n,
                             stop_deadline=STOP_DEADLINE)
    frozen: list[tuple[str, int]] = []  # ("group"|"pid", id) this test stopped, resumed in any case
    with Driver(job, run_dir, ray_cluster.env) as driver:
        try:
            rec, victim, engine, other = serving(run_dir, driver)
            actor_pid = int(victim["info"]["actor_pid"])  # the actor's own report of its pid, at its launch
            os.killpg(other.pid, signal.SIGSTOP)
            frozen.append(("group", other.pid))
            # The victim's node hangs: its actor (the supervisor) and its engine, both alive, both silent.
            os.kill(actor_pid, signal.SIGSTOP)
            frozen.append(("pid", actor_pid))
            os.killpg(engine.pid, signal.SIGSTOP)
            frozen.append(("group", engine.pid))
            frozen_at = time.monotonic()
            wait_replacement(run_dir, rec)
            took = time.monotonic() - frozen_at
            time.sleep(2.0)  # the client's health probe finds the replacement
            for kind, ident in reversed(frozen):  # the hang ends: what still exists goes on
                with contextlib.suppress(ProcessLookupError):
                    (os.killpg if kind == "group" else os.kill)(ident, signal.SIGCONT)
            frozen = []
            output = driver.wait(timeout=400)
            # What the dirty report tells the user to do on that machine: harvest stop of the node's folder.
            hinted = run(harvest_argv("stop", victim["info"]["run_dir"], "--json"), ray_cluster.env, timeout=120)
        finally:
            for kind, ident in reversed(frozen):
                with contextlib.suppress(ProcessLookupError):
                    (os.killpg if kind == "group" else os.kill)(ident, signal.SIGCONT)
    assert driver.proc.returncode == 0, output[-4000:]
    # The line the user reads names the server, its node and why.
    label = f"node 127.0.0.1 ({victim['info']['node_id'][:8]})"
    why = f"lost: no answer to {POLL_MISSES} polls of {POLL_TIMEOUT_S:g} s"
    assert f"server {victim['name']} on {label} {why}" in output, output[-4000:]
    # Bounded: the misses, the stop that cannot run on the frozen node, the replacement's launch.
    bound = POLL_MISSES * (POLL_S + POLL_TIMEOUT_S) + STOP_DEADLINE + STOP_SLACK_S + 90 + SLACK_S
    assert took <= bound, f"the replacement was ready {took:.0f} s after the freeze (bound {bound:.0f} s)"
    # Its stop could not run there: the report says so, unverified, and names the way out.
    assert "could not run there" in output and f"harvest stop {victim['info']['run_dir']}" in output, \
        output[-4000:]
    after = written_off_and_replaced(run_dir, n, rec, victim, verdict="dirty")
    # The way out works: on that machine, the node's own record stops and verifies the engine.
    assert hinted.returncode == 0 and json.loads(hinted.stdout)["verdict"] == "clean", \
        hinted.stdout + hinted.stderr
    # Nothing left running: the written-off actor was removed from the cluster, every engine is gone.
    assert gone(actor_pid, 60), f"the frozen server's actor (pid {actor_pid}) still runs"
    for m in after["members"]:
        if m["info"] is not None:
            assert engine_process(m["info"]) is None, f"{m['name']} still runs"
