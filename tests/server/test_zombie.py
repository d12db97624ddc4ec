"""A recorded process that exited and is not reaped yet is said to be that: "exited, not yet
reaped", never "another process".

The engine is the real fake_engine.py, launched by harvest's supervisor inside this test process,
so the test is its parent: it ends by itself (``--life``) and, until the supervisor's stop reaps
it, it stays a zombie of this process (``Zs <defunct>``) with its recorded pid and create time.
`harvest stop` from another process then finds the zombie in the record's place.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import psutil

from harvest.server import group_findings
from tests import harvest_process
from tests.server.helpers import fake_config, wait_for


def test_a_zombie_of_the_recorded_leader_is_exited_not_yet_reaped(launcher, tmp_path):
    server = launcher.launch(lambda port: fake_config(tmp_path / "pids", "--life", "2", port=port))
    state = server.state()
    leader = state.record.leader
    wait_for(lambda: psutil.Process(leader.pid).status() == psutil.STATUS_ZOMBIE, 30,
             "the engine to exit and stay unreaped")
    assert psutil.Process(leader.pid).ppid() == psutil.Process().pid  # ours, and not reaped

    out = harvest_process.run([sys.executable, "-m", "harvest", "stop", str(server.run_dir)], capture_output=True,
                              text=True, timeout=120)

    shown = out.stdout + out.stderr
    assert out.returncode == 0, shown
    assert f"recorded leader pid {leader.pid} (python" in shown, shown
    assert f"has exited, not yet reaped by its parent (pid {psutil.Process().pid}" in shown, shown
    assert "another process" not in shown, shown
    assert psutil.Process(leader.pid).status() == psutil.STATUS_ZOMBIE  # `harvest stop` reaped nothing

    # The same pid under another create time is another process (a reused number), said so.
    other = replace(state, record=replace(state.record, create_time=leader.create_time - 100))
    assert f"pid {leader.pid} is now another process (python" in group_findings(other)
    assert "created after the recorded one" in group_findings(other)

    server.shutdown()  # reaps its child
    wait_for(lambda: not psutil.pid_exists(leader.pid), 10, "the zombie to be reaped")
