"""A sweep reports each launch as trial k of n with its phase (harvest.events), the supervisor's
preflight / launching / stopping in between, on the stand-in chat engine (no model)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from harvest.cli.phases import PhaseBoard
from harvest.campaign.sweep.tune_file import parse_tune_file
from tests.placed import tune
from harvest.config import parse_config
from harvest.events import Event
from tests import engines
from tests.campaign.test_tune import CHAT_ENGINE, _prompts


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HARVEST_STATE_DIR", str(tmp_path / "state"))


def test_each_launch_is_trial_k_of_n_with_its_phase(tmp_path):
    job = parse_config({
        "server": {"engine": "command", "port": engines.free_port(), "max_running_requests": 4,
                   "command": [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}"],
                   "health_url": "http://{host}:{port}/health", "ready_timeout": 30, "stop_grace": 2,
                   "stop_deadline": 6},
        "preflight": {"min_disk_free_gib": 0.05},
        "data": {"path": str(_prompts(tmp_path / "in.jsonl", 12)), "id_field": "id"},
        "sampling": {"max_tokens": 4},
        "output": {"dir": str(tmp_path / "run")},
    }, source=str(tmp_path / "job.toml"))
    tf = parse_tune_file({"grid": {"extra_args": [[], ["--perturb", "0.7"]]},
                          "probe": {"prompts": 4, "max_tokens": 6},
                          "throughput": {"prompts": 4, "concurrency": 2}})
    events: list[Event] = []
    board = PhaseBoard()

    def listen(event: Event) -> None:
        events.append(event)
        board.on_event(event)

    report = asyncio.run(tune(job, tf, on_event=listen))
    assert len(report.launches) == 3  # the reference (= trial 1), its floor, trial 2

    starts = [e.info for e in events if e.phase == "trial" and e.kind == "start"]
    assert [(s["index"], s["of"]) for s in starts] == [(1, 3), (2, 3), (3, 3)]
    assert [s["label"] for s in starts] == [launch.label for launch in report.launches]
    # Within each trial: preflight, launching, the probe, the stop, in that order.
    for k in range(3):
        begin = events.index(next(e for e in events if e.phase == "trial" and e.kind == "start"
                                  and e.info["index"] == k + 1))
        end = next((i for i, e in enumerate(events) if i > begin and e.phase == "trial" and e.kind == "start"),
                   len(events))
        seen = [(e.phase, e.kind, e.info.get("step")) for e in events[begin:end]]
        order = [("preflight", "end", None), ("launching", "end", None),
                 ("trial", "update", "probing quality and throughput"), ("stopping", "end", None)]
        positions = [seen.index(item) for item in order]
        assert positions == sorted(positions), seen
    # The board shows the last trial alone, with its own phases.
    rows = {r.name: r for r in board.rows()}
    assert rows["trial"].text.startswith("trial 3 of 3")
    assert rows["stopping"].text.startswith("verified stop: CLEAN")
