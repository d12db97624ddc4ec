"""``[notify]`` on the stand-in that hangs (a real llama-server behind tests/hang_engine.py: every
completion held after 40 answers, ``/health`` answering), managed by harvest: the command and the
loopback URL are each told once of ``stalled``, ``relaunched`` and ``finished``, with the documented
document; the command hangs on ``stalled`` (killed at its timeout) and the run does not wait for it:
the relaunch comes first, and the run finishes, every item once.

The hang bound at the tiny model's scale (``hang_floor`` 2 s, ``hang_deadline`` 3 s).
"""

from __future__ import annotations

import json
import sys

import psutil
import pytest

from tests import engines
from tests.campaign.ledger_peek import statuses
from tests.campaign.loopback import Receiver
from tests.campaign.test_give_up import PREFLIGHT, data, harvest_run
from tests.campaign.test_hang import HANG_ENGINE, ids_once
from tests.campaign.test_notify import check_document
from tests.hosts.conftest import write_toml

pytestmark = [pytest.mark.engine, pytest.mark.slow]

N = 200
TIMEOUT = 12
#: Records each notice (event, document, when, its pid); on "stalled" it then hangs, a notifier stuck.
RECORDER = ("import json, os, sys, time; doc = json.load(sys.stdin); event = os.environ['HARVEST_NOTIFY_EVENT']; "
            "open(sys.argv[1], 'a').write(json.dumps([event, doc, time.time(), os.getpid()]) + '\\n'); "
            "event == 'stalled' and time.sleep(600)")


def assert_spells(events: list[str], what: object, out: str) -> None:
    """``stalled``, ``relaunched``, at most one later spell (``stalled``), then ``finished``."""
    assert events[:2] == ["stalled", "relaunched"] and events[-1] == "finished", (what, out[-3000:])
    assert set(events[2:-1]) <= {"stalled"}, (what, out[-3000:])  # no second relaunch: the engine hangs once
    assert all(a != b for a, b in zip(events, events[1:])), (what, out[-3000:])  # one notice per spell


def test_hang_relaunch_and_end_are_told_once_each_and_a_stuck_notifier_holds_nothing_up(
        tmp_path, llama_server_bin, tiny_gguf):
    run_dir, marker, lines = tmp_path / "run", tmp_path / "hung-once", tmp_path / "told.jsonl"
    with Receiver() as rx:
        job = write_toml(tmp_path / "job.toml", {
            "server": {"engine": "llamacpp", "model": str(tiny_gguf), "port": engines.free_port(),
                       "command": [sys.executable, str(HANG_ENGINE), "--hang-after", "40", "--once", str(marker),
                                   "--", llama_server_bin],
                       "max_running_requests": 4, "extra_args": ["-c", "8192"]},
            "preflight": PREFLIGHT, "data": {"path": str(data(tmp_path, N)), "id_field": "id"},
            "sampling": {"max_tokens": 16}, "client": {"hang_floor": 2, "hang_deadline": 3},
            "notify": {"command": [sys.executable, "-c", RECORDER, str(lines)], "url": rx.url, "timeout": TIMEOUT},
            "output": {"dir": str(run_dir)}})
        proc = harvest_run(job, tmp_path)
        try:
            out, _ = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
        posted = list(rx.docs)
    assert proc.returncode == 0, out
    told = [json.loads(line) for line in lines.read_text().splitlines()]
    # The hang's spell is told once, then the relaunch, then the end. A later spell is a new notice:
    # on a loaded machine the relaunched engine's answers can pass this tiny hang bound (3 s) for a
    # while, a stall of its own, told once too (never twice in a row, never after the end).
    assert_spells([t[0] for t in told], told, out)
    assert_spells([d["event"] for d in posted], posted, out)
    for event, doc, _, _ in told:
        check_document(doc, event, run_dir)
    for doc in posted:
        check_document(doc, doc["event"], run_dir)
    stalled, relaunched, finished = told[0][1], told[1][1], told[-1][1]
    assert stalled["reason"].endswith("while /health answered") and "hung: no answer for" in stalled["reason"]
    assert "while /health answered; relaunched (relaunch 1 of 5)" in relaunched["reason"]
    assert relaunched["relaunches"] == 1 and finished["counts"]["done"] + finished["counts"]["truncated"] == N
    assert finished["exit_code"] == 0
    # the stuck notifier: killed at its timeout, and the relaunch did not wait for it
    stuck_at, stuck_pid = told[0][2], told[0][3]
    relaunch = json.loads((run_dir / "server" / "launch.json").read_text())["record"]
    assert relaunch["launch"] == 2 and relaunch["started_at"] < stuck_at + TIMEOUT, (relaunch["started_at"], stuck_at)
    assert f"notify: stalled: failed: {sys.executable} timed out after {TIMEOUT} s" in out, out
    assert not psutil.pid_exists(stuck_pid) or psutil.Process(stuck_pid).status() == psutil.STATUS_ZOMBIE
    assert statuses(run_dir) == {"done": N} or set(statuses(run_dir)) <= {"done", "truncated"}
    assert ids_once(run_dir) == (N, 0)
