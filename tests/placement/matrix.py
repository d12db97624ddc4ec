"""One check of serve --detach + ps + stop, the same on every placement (local, SSH host, container,
Ray): the server runs where the config says (its pid alive on that host or node, seen by psutil on
this test machine, where every test host and node lives), `ps --json` and `stop --json` print the one
documented shape (docs/json-schema.md), and the stop is verified clean (the pid gone afterwards)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil

from tests.gpu.schema_doc import documented_schema, problems
from tests.server.helpers import gone

Harvest = Callable[..., subprocess.CompletedProcess]


def valid(doc: dict, schema_id: str) -> dict:
    found = problems(doc, documented_schema(schema_id))
    assert found == [], found
    return doc


def serve_ps_stop(harvest: Harvest, job: Path, near: Path, *, ps_args: tuple[str, ...] = (),
                  expect_where: Callable[[str], bool] = lambda w: True,
                  pid_here: Callable[[int], int] = lambda pid: pid) -> dict:
    """``pid_here`` maps the pid the placement reports to the pid seen from this machine (a
    container's own pid namespace differs). Returns the stop document."""
    res = harvest("serve", str(job), "--detach", "--json", "--run-dir", str(near))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    served = json.loads(res.stdout.strip().splitlines()[-1])
    assert served["schema"] == "harvest.serve/2" and served["servers"], served
    pids = []
    try:
        for s in served["servers"]:
            assert expect_where(s["where"]), s
            pid = pid_here(int(s["pid"]))
            assert psutil.pid_exists(pid), s  # the engine runs, where the placement says
            pids.append((pid, psutil.Process(pid).create_time()))
        listed = valid(json.loads(harvest("ps", "--json", *ps_args).stdout), "harvest.ps/1")
        mine = [r for r in listed["servers"] if r["pid"] in {int(s["pid"]) for s in served["servers"]}]
        assert len(mine) == len(served["servers"]), (listed, served)
        assert all(r["measured"]["leader_alive"] and expect_where(r["where"]) for r in mine), mine
    finally:
        res = harvest("stop", str(near), "--json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    stopped = valid(json.loads(res.stdout), "harvest.stop/1")
    assert stopped["verdict"] == "clean" and len(stopped["servers"]) == len(served["servers"])
    assert all(r["verdict"] == "clean" for r in stopped["servers"])
    for pid, created in pids:  # gone: that very process (pid and create time; a zombie is gone)
        assert gone(pid, created), pid
    after = valid(json.loads(harvest("ps", "--json", *ps_args).stdout), "harvest.ps/1")
    assert not [r for r in after["servers"] if r["pid"] in {int(s["pid"]) for s in served["servers"]}
                and r["measured"]["leader_alive"]]
    return stopped
