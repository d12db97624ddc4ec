"""Every command, the same on every placement (local, SSH host, container, Ray), on a real engine.

``serve_ps_stop``: serve --detach + ps + stop; the server runs where the config says (its pid alive
on that host or node, seen by psutil on this test machine, where every test host and node lives),
`ps --json` and `stop --json` print the one documented shape (docs/json-schema.md), and the stop is
verified clean (the pid gone afterwards).

``every_command``: gpus, preflight, serve_ps_stop, run, tune (two candidates) and compare, each
checked against its documented JSON shape (the same document whatever the placement); every server
those commands launched is found through the run's own placement records (harvest.placement.record:
a local supervisor folder, a far host's folder, a Ray node's folder), its engine log shows it
answered requests there, its stop there was verified clean, and its recorded process is gone.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from harvest.placement import record
from tests.chaos.killer import read_ledger
from tests.gpu.schema_doc import documented_schema, place_answers, problems
from tests.hosts.conftest import write_toml
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


@dataclass
class Place:
    """One placement under test: how to call harvest, the tables that put a job there, and how this
    test machine sees what ran there."""

    kind: str  # "local", "ssh" or "ray"
    harvest: Harvest
    tables: dict[str, Any]  # [server] and [preflight], plus [host] / [cluster] (or nothing: this machine)
    where: Callable[[str], bool]  # a server's or a place's `where`, as the placement names it
    pid_here: Callable[[int], int] = lambda pid: pid
    #: The recorded engine (its pid as recorded there, its create time) is gone, measured.
    engine_gone: Callable[[int, float], bool] = gone
    servers: int = 1  # servers a run of this job starts


def engine_folders(folder: Path) -> list[Path]:
    """The engine folders (launch.json, stop.json, server.log) of the servers a launch started,
    read from its placement record: this machine's supervisor folder, a far host's run folder, or
    each Ray member's folder on its node."""
    found = record.find(folder)
    out: list[Path] = []
    for _, doc in found:
        if doc["kind"] == "ssh":
            out.append(Path(doc["far_run_dir"]))
        elif doc["kind"] == "ray":
            out += [Path(m["info"]["run_dir"]) for m in doc["members"] if m.get("info")]
    local = record.local_record_dir(folder)
    if not found and local is not None:
        out.append(local)
    assert out, f"no placement record under {folder}"
    return out


def ran_and_stopped(place: Place, folder: Path, *, min_requests: int) -> list[Path]:
    """Each server of this launch answered at least ``min_requests`` requests where it ran (its own
    log there: llama-server logs each finished task), was stopped clean there, and is gone now."""
    folders = engine_folders(folder)
    for f in folders:
        launch = json.loads((f / "launch.json").read_text())["record"]
        assert (f / "server.log").read_text(errors="replace").count("total time =") >= min_requests, f
        assert json.loads((f / "stop.json").read_text())["verdict"] == "clean", f
        assert place.engine_gone(int(launch["pid"]), float(launch["create_time"])), launch
    return folders


def launches_clean(place: Place, doc: dict[str, Any], labels: list[str]) -> None:
    """Every launch of a tune / compare document: the documented shape, stopped clean, and found
    (with its engine's requests) where the placement put it."""
    shape = documented_schema("harvest.launch/1")
    assert [x["label"] for x in doc["launches"]] == labels, doc["launches"]
    for launch in doc["launches"]:
        assert problems(launch, shape) == [], problems(launch, shape)
        assert launch["error"] is None and launch["stop"]["verdict"] == "clean", launch
        ran_and_stopped(place, Path(launch["run_dir"]), min_requests=1)


def prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Tell me about item {i}."}) + "\n"
                            for i in range(n)))
    return path


def every_command(place: Place, tmp: Path) -> None:
    """gpus, preflight, serve --detach + ps + stop, run, tune (two candidates), compare: each exit
    code, each documented shape, each server where the placement says, each stop clean."""
    t0 = time.monotonic()

    def h(*args: str) -> subprocess.CompletedProcess:
        res = place.harvest(*args)
        print(f"{time.monotonic() - t0:6.1f} s  harvest {args[0]}: exit {res.returncode}")  # shown on a failure
        return res

    n = 12
    data = prompts(tmp / "in.jsonl", n)
    server = {**place.tables["server"], "max_running_requests": 4}
    job = write_toml(tmp / "job.toml", {**place.tables, "server": server, "data": {"path": str(data), "id_field": "id"},
                                        "sampling": {"max_tokens": 8}, "client": {"concurrency": 4},
                                        "output": {"dir": str(tmp / "run")}})
    cfg_args = ("--config", str(job))

    res = h("gpus", "--json", *cfg_args)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    doc = json.loads(res.stdout)
    answers = place_answers(doc, "harvest.gpus/2")
    assert doc["placement"] == place.kind and answers and all(a is not None for a in answers), doc
    assert any(place.where(p["where"]) for p in doc["places"]), doc["places"]

    res = h("preflight", str(job), "--json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    doc = json.loads(res.stdout)
    answers = place_answers(doc, "harvest.preflight/2")
    assert doc["placement"] == place.kind and doc["passed"] is True and doc["engine"] == "llamacpp", doc
    assert all(a is not None and a["passed"] for a in answers)
    assert any(place.where(p["where"]) for p in doc["places"]), doc["places"]

    serve_ps_stop(h, job, tmp / "served", ps_args=cfg_args, expect_where=place.where, pid_here=place.pid_here)

    res = h("run", str(job), "--no-live")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    view = read_ledger(tmp / "run")
    assert view is not None and sum(view.counts.values()) == n, view
    assert view.counts.get("pending", 0) == 0 and view.counts.get("failed", 0) == 0, view.counts
    folders = ran_and_stopped(place, tmp / "run", min_requests=1)
    assert len(folders) == place.servers, folders
    total = sum((f / "server.log").read_text(errors="replace").count("total time =") for f in folders)
    assert total >= n, total  # every row was generated by the servers where the placement put them
    res = h("stop", str(tmp / "run"), "--json")  # nothing left running: clean, by the run folder's record
    assert res.returncode == 0, res.stdout + res.stderr
    stopped = valid(json.loads(res.stdout), "harvest.stop/1")
    assert stopped["verdict"] == "clean" and all(r["verdict"] == "clean" for r in stopped["servers"]), stopped

    grid = write_toml(tmp / "tune.toml", {
        "grid": {"max_running_requests": [2, 4]},  # 4: the job's own, so the reference launch measures it
        "probe": {"prompts": 4, "max_tokens": 8, "floor_launch": False, "resamples": 50},
        "throughput": {"prompts": 8, "concurrency": 4, "max_tokens": 8}})
    res = h("tune", str(job), "--grid", str(grid), "--json", "--out", str(tmp / "tune"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = valid(json.loads(res.stdout), "harvest.tune/1")
    assert [t["overrides"] for t in doc["trials"]] == [{"max_running_requests": 2}, {"max_running_requests": 4}]
    assert [t["is_reference"] for t in doc["trials"]] == [False, True]
    assert all(t["verdict"] in ("pass", "fail") and t["quality"] is not None for t in doc["trials"]), doc["trials"]
    assert all(t["throughput"]["requests"] == 8 and t["throughput"]["failed"] == 0 for t in doc["trials"])
    launches_clean(place, doc, ["reference", doc["trials"][0]["label"]])  # two settings, two launches

    cand = write_toml(tmp / "cand.toml", {"server": {**server, "max_running_requests": 2},
                                           "preflight": place.tables["preflight"]})  # no placement: the reference's
    settings = write_toml(tmp / "settings.toml", {"probe": {"prompts": 4, "max_tokens": 8, "floor_launch": False,
                                                            "resamples": 50}})
    res = h("compare", "--reference", str(job), "--candidate", str(cand), "--settings", str(settings),
            "--out", str(tmp / "compare"), "--json")
    assert res.returncode in (0, 1), res.stdout[-3000:] + res.stderr[-3000:]
    doc = valid(json.loads(res.stdout), "harvest.compare/1")
    (row,) = [r for r in doc["rows"] if r["label"] == "candidate-1"]
    assert row["verdict"] in ("pass", "fail") and row["quality"] is not None, row
    assert row["settings"] == {"max_running_requests": 2}
    launches_clean(place, doc, ["reference", "candidate-1"])
