"""The morning after, from timeline.json: every session of the run and how it ended (why, and a
session killed without recording its end said so), every launch with its pid and how it ended,
a leftover's stop attached to the launch that left it, with its pid (the report's two tables)."""

from __future__ import annotations

import html
import re
from pathlib import Path
from types import SimpleNamespace

from harvest.campaign.outputs.timeline import Timeline, read_timeline
from harvest.report.run import launches_section, sessions_section
from harvest.stops import StopReport


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def _fleet(pid: int, launch: int) -> SimpleNamespace:  # what Timeline.launch reads of a fleet
    record = SimpleNamespace(engine="llamacpp", engine_version="b1", pid=pid, url="http://127.0.0.1:8000", gpus=(),
                             baseline_mib={}, started_at=1_800_000_000.0, argv=("llama-server",), launch=launch)
    return SimpleNamespace(launch_record=lambda: record, ready=SimpleNamespace(seconds=1.0), kv_capacity_tokens=4096)


def _stop(pid: int) -> StopReport:
    return StopReport("run/server", "clean", (), False, total_s=0.5, deadline_s=60, engine="llamacpp", pid=pid)


def test_sessions_and_launches_say_how_each_ended(tmp_path: Path):
    clock = Clock()
    first = Timeline.open(tmp_path, clock=clock)
    first.launch(_fleet(101, 1))  # type: ignore[arg-type]
    first.stop(_stop(101), why="the server exited (code -9); relaunched")
    first.launch(_fleet(102, 2))  # type: ignore[arg-type]
    first.write()  # ... then the runner is SIGKILLed: no end recorded, launch 2 left running
    clock.t += 60
    second = Timeline.open(tmp_path, clock=clock)
    second.stop(_stop(102), leftover=True)  # the next session stops what the killed one left
    second.launch(_fleet(103, 3))  # type: ignore[arg-type]
    second.stop(_stop(103))
    second.close("interrupted", "stopped by harvest stop")
    doc, problem = read_timeline(tmp_path)
    assert doc is not None, problem
    sessions = doc["sessions"]
    assert [s["outcome"] for s in sessions] == [None, "interrupted"] and sessions[1]["note"] == "stopped by harvest stop"
    assert all(isinstance(s["pid"], int) for s in sessions)
    launches = doc["launches"]
    assert [x["pid"] for x in launches] == [101, 102, 103] and [x["launch"] for x in launches] == [1, 2, 3]
    assert launches[1]["stop"]["leftover"] and launches[1]["stop"]["why"] == \
        "left running by an earlier session; stopped as a later one began" and launches[1]["session"] == 0

    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", sessions_section(doc))).split())
    assert "no end recorded: killed or crashed" in text and "interrupted: stopped by harvest stop" in text
    page = launches_section(launches, run_dir=tmp_path)
    rows = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    assert "stopped (the server exited (code -9); relaunched): clean" in rows
    assert "stopped (left running by an earlier session; stopped as a later one began): clean" in rows
    assert "stopped (the run's end): clean" in rows
    assert rows.count("not kept") == 3  # no log files in this folder: said, not linked


def test_a_leftover_without_its_launch_in_the_timeline_still_gets_its_pid(tmp_path: Path):
    timeline = Timeline.open(tmp_path, clock=Clock())
    timeline.stop(_stop(4242), leftover=True)
    (entry,) = timeline.launches
    assert entry["pid"] == 4242 and entry["engine"] == "llamacpp" and entry["leftover"]
