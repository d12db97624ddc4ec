"""``[notify]``: a command (argv, the document on stdin) and a URL (the document POSTed) told once per
chosen event with the documented ``harvest.notify/1`` document; a notifier that hangs or fails never
slows or ends the run (campaign/run/notify.py).

Runs against the suite's own loopback endpoint (tests/campaign/loopback.py): what is under test is
harvest's side. The hang and the relaunch on the stand-in that hangs are in test_notify_hang.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil

from harvest.config import NotifyConfig, parse_config
from harvest.campaign.run.notify import Notifier
from harvest.campaign.run.outside import Outside
from harvest.client.records import EndpointState
from harvest.ledger import Ledger
from tests.campaign.loopback import Endpoint, Receiver
from tests.gpu.schema_doc import documented_schema, problems
from tests.placed import run_campaign

N = 60
#: A command that appends its stdin and $HARVEST_NOTIFY_EVENT to a file, one JSON line each.
RECORDER = ("import json, os, sys; doc = json.load(sys.stdin); "
            "open(sys.argv[1], 'a').write(json.dumps([os.environ['HARVEST_NOTIFY_EVENT'], doc]) + '\\n')")


def job(tmp_path: Path, url: str, notify: dict, **over: dict) -> dict:
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"n{i}", "prompt": f"Tell {i}."}) + "\n" for i in range(N)))
    table = {"data": {"path": str(data), "id_field": "id"}, "sampling": {"max_tokens": 8},
             "client": {"endpoints": [url], "concurrency": 4, "max_retries": 0},
             "run": {"progress_interval": 0.2}, "output": {"dir": str(tmp_path / "run")}, "notify": notify}
    for key, value in over.items():
        table[key] = {**table.get(key, {}), **value}
    return table


def told(path: Path) -> list[tuple[str, dict]]:
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()] if path.exists() else []


def check_document(doc: dict, event: str, run_dir: Path) -> None:
    assert problems(doc, documented_schema("harvest.notify/1")) == [], doc
    assert doc["event"] == event and doc["run_dir"] == str(run_dir)
    assert doc["watch"] == f"harvest status {run_dir} --watch"


async def test_a_finished_run_is_told_once_to_the_command_and_the_url(tmp_path):
    lines = tmp_path / "told.jsonl"
    with Endpoint() as ep, Receiver() as rx:
        config = parse_config(job(tmp_path, ep.url, {"command": [sys.executable, "-c", RECORDER, str(lines)],
                                                     "url": rx.url}))
        report = await run_campaign(config)
    assert report.ok
    run_dir = tmp_path / "run"
    by_command = told(lines)
    assert [e for e, _ in by_command] == ["finished"] and [d["event"] for d in rx.docs] == ["finished"]
    for event, doc in [*by_command, ("finished", rx.docs[0])]:
        check_document(doc, event, run_dir)
        assert doc["counts"]["done"] == N and doc["total"] == N and doc["outcome"] == "finished"
        assert doc["exit_code"] == 0
    assert by_command[0][1] == {**rx.docs[0], "time": by_command[0][1]["time"]}  # one document for both
    ledger = Ledger.open_readonly(run_dir)
    try:  # the webhook's path is its key: recorded hidden
        assert "SECRETKEY123" not in json.dumps(ledger.meta())
    finally:
        ledger.close()


async def test_a_breaker_trip_is_told_then_the_end_and_nothing_else(tmp_path):
    lines = tmp_path / "told.jsonl"
    with Endpoint(mode="bad_request") as ep:
        config = parse_config(job(tmp_path, ep.url, {"command": [sys.executable, "-c", RECORDER, str(lines)]},
                                  run={"breaker_window": 5}))
        report = await run_campaign(config)
    assert report.outcome == "stopped" and report.trip is not None
    events = told(lines)
    assert [e for e, _ in events] == ["breaker", "ended"], events
    for event, doc in events:
        check_document(doc, event, tmp_path / "run")
    assert "http_400" in events[0][1]["reason"] and events[1][1]["outcome"] == "stopped"
    assert events[1][1]["exit_code"] == 1 and events[1][1]["counts"]["pending"] > 0


async def test_only_the_chosen_events_are_told(tmp_path):
    lines = tmp_path / "told.jsonl"
    with Endpoint(mode="bad_request") as ep:
        config = parse_config(job(tmp_path, ep.url, {"command": [sys.executable, "-c", RECORDER, str(lines)],
                                                     "on": ["finished"]}, run={"breaker_window": 5}))
        await run_campaign(config)
    assert told(lines) == []


async def test_a_notifier_that_hangs_or_fails_does_not_hold_the_loop_and_is_ended_at_its_timeout(tmp_path):
    """A command that never ends and a URL that answers 500 after a while, timeout 2 s: the loop
    ticks on meanwhile (a dispatch loop's 10 ms turns, 100 of them, all before the timeout), the
    command is killed with its group at the timeout, and both failures are said."""
    pid_file = tmp_path / "pid"
    hang = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                                  f"time.sleep(600)"]
    with Receiver(status=500, delay=0.5) as rx:
        notifier = Notifier(NotifyConfig(command=hang, url=rx.url, timeout=2), lambda: {"run_dir": "r"})
        notifier.start()
        t0 = time.monotonic()
        notifier.tell("stalled", "no answer for 40 s")
        told_in = time.monotonic() - t0
        turns = 0
        while turns < 100:  # the run's own work goes on beside the hung notifier
            await asyncio.sleep(0.01)
            turns += 1
        loop_done = time.monotonic() - t0
        assert not notifier.sent, "the loop's turns finished after the notifier gave up"
        await notifier.aclose()
        took = time.monotonic() - t0
    assert told_in < 0.05 and loop_done < 2.0 <= took
    said = notifier.sent
    assert len(notifier.sent) == 2 and all(e == "stalled" for e, _ in notifier.sent)
    outcomes = sorted(w for _, w in notifier.sent)
    assert any("timed out after 2 s" in w for w in outcomes) and any("HTTP 500" in w for w in outcomes), said
    assert all("SECRETKEY123" not in w for w in outcomes)
    pid = int(pid_file.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert len(rx.docs) == 1


async def test_a_failing_command_is_logged_and_the_run_still_finishes(tmp_path, caplog):
    with Endpoint() as ep:
        config = parse_config(job(tmp_path, ep.url, {"command": [sys.executable, "-c", "import sys; sys.exit(3)"]}))
        report = await run_campaign(config)
    assert report.ok and report.totals.counts  # finished, every item accounted for
    assert any("notify: finished: failed:" in r.getMessage() and "exited with 3" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def _stats(*endpoints: tuple[str, str, str | None], in_flight: int = 4) -> SimpleNamespace:
    """What the watch reads of the client: (url, state, last_error) per endpoint."""
    return SimpleNamespace(in_flight=in_flight, held=0, endpoints=[
        SimpleNamespace(url=url, state=EndpointState(state), last_error=error, hung=False)
        for url, state, error in endpoints])


async def test_a_stall_is_the_hang_checks_verdict_told_once_per_spell_not_a_quiet_spell(tmp_path):
    """``stalled``: every endpoint taken out by the hang check (hung, or not answering) while items
    wait; told once per spell, again after an answer ended the spell; long answers (quiet, still
    healthy) and one endpoint of two out are no stall."""
    config = parse_config(job(tmp_path, "http://127.0.0.1:9", {"command": ["true"]}))
    outside = Outside(SimpleNamespace(config=config))  # type: ignore[arg-type]
    told_now: list[tuple[str, str | None]] = []
    outside.notifier.tell = lambda event, reason=None, **_: told_now.append((event, reason))  # type: ignore[method-assign]
    a, b = "http://127.0.0.1:8001", "http://127.0.0.1:8002"
    hung = "hung: no answer for 35 s while /health answered"
    frozen = "not answering: no answer for 33 s and /health did not answer"
    looks = [_stats((a, "healthy", None), (b, "healthy", None)),  # long answers: quiet, not judged
             _stats((a, "hung", hung), (b, "healthy", None)),  # one of two out: the other serves
             _stats((a, "hung", hung), (b, "sick", frozen)),  # both out: a stall, told
             _stats((a, "hung", hung), (b, "down", frozen)),  # the same spell: not told again
             _stats((a, "healthy", None), (b, "down", frozen)),  # a answered: the spell ends
             _stats((a, "sick", frozen), (b, "down", frozen)),  # a new spell: told again
             _stats((a, "sick", frozen), (b, "down", frozen), in_flight=0)]  # nothing waits: no stall
    for stats in looks:
        outside._look(SimpleNamespace(state="running", client_stats=lambda s=stats: s))  # type: ignore[arg-type]
    assert told_now == [("stalled", f"{a} {hung}"), ("stalled", f"{a} {frozen}")], told_now
