"""``harvest stop RUN_DIR`` of a run folder whose run is going on: the run stopped as Ctrl-C does.

    harvest stop runs/first-job          # its runner (runner.json: pid + create time) asked to stop

The runner (a ``harvest run``, detached or in another terminal) gets SIGTERM, which it takes as
Ctrl-C: the items in flight go back to pending, uncharged, and its servers get their verified stop;
this command waits for it to exit (``--deadline``, else the runner's recorded stop budget: its
servers' stop deadlines and a margin), then reads what it left: its outcome, the ledger's counts
(nothing left running), the servers' stop reports. A runner that outlives the deadline is ended
with SIGKILL (``campaign/run/runner.py``), and its servers are then stopped here by their records.
``harvest run`` with the same arguments resumes the run. Exit 0 when the runner is gone, nothing is
left running and every server's stop was clean; 1 otherwise.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from harvest.campaign.outputs.timeline import read_timeline
from harvest.campaign.run import runner
from harvest.cli.render import print_stop_reports, shown, stop_payload
from harvest.errors import LedgerError
from harvest.ledger import Ledger, Status
from harvest.placement import NothingToStop, from_record
from harvest.placement.far_records import stop_report_from_dict
from harvest.stops import StopReport


def live_runner(run_dir: Path) -> runner.RunnerRecord | None:
    """The runner record of ``run_dir`` when its runner runs now (measured), else None."""
    record = runner.read(run_dir)
    if record is None or record.ended_at is not None or not runner.alive(record):
        return None
    return record


def stop_run(run_dir: Path, record: runner.RunnerRecord, deadline: float | None, as_json: bool) -> int:
    """Stop the run in ``run_dir`` run by ``record`` (see the module docstring); the exit code."""
    wait = deadline if deadline is not None else record.stop_s
    _say(as_json, f"stopping the run in {run_dir}: its runner, pid {record.pid}, asked to stop as Ctrl-C does "
                  f"(SIGTERM); waiting up to {wait:g} s for it to release its items and stop its servers")
    asked_at = time.time()
    done = runner.stop(record, deadline_s=wait)
    after = runner.read(run_dir)
    reports = _stops_since(run_dir, asked_at)
    if done.killed:
        _say(as_json, f"the runner did not exit within {wait:g} s: ended with SIGKILL"
                      f"{'' if done.gone else ' and still there'}; its servers stopped by their records")
        reports += _stop_by_records(run_dir)
    counts = _counts(run_dir)
    running = counts.get("running", 0) if counts else None
    clean = done.gone and all(r.clean for r in reports) and (running == 0 or done.killed)
    if as_json:
        doc: dict[str, Any] = stop_payload(reports)
        doc["verdict"] = "clean" if clean else "dirty"
        doc["run"] = {"run_dir": str(run_dir), "pid": record.pid, "exited_after_s": done.exited_after_s,
                      "killed": done.killed, "gone": done.gone, "counts": counts,
                      "outcome": after.outcome if after is not None else None}
        click.echo(json.dumps(doc, indent=2))
        return 0 if clean else 1
    how = (f"exited after {done.exited_after_s:.1f} s" if done.exited_after_s is not None else
           "ended by SIGKILL" if done.gone else "STILL RUNNING")
    outcome = after.outcome if after is not None and after.ended_at is not None else "not recorded"
    click.echo(shown(f"runner pid {record.pid}: {how} (outcome: {outcome})"))
    if counts is not None:
        left = counts.get("pending", 0)
        click.echo(shown(f"items: {left:,} pending, {running:,} running, {counts.get('done', 0):,} done"
                         + (" (those left running go back to pending when the run resumes)" if running else "")))
    if reports:  # a run against endpoints harvest does not manage has none
        print_stop_reports(reports, "this machine")
    again = " ".join(record.argv) if record.argv else "harvest run JOB"
    click.echo(shown(f"resume it with: {again}"))
    return 0 if clean else 1


def _say(as_json: bool, text: str) -> None:
    click.echo(shown(text), err=as_json)


def _stops_since(run_dir: Path, since: float) -> list[StopReport]:
    """The stop reports the runner's session recorded (timeline.json) since ``since`` (epoch): what
    its own verified stop of each server measured."""
    doc, _ = read_timeline(run_dir)
    if doc is None:
        return []
    out = []
    for launch in doc.get("launches") or []:
        stop = launch.get("stop")
        if isinstance(stop, dict) and (stop.get("stopped_at") or 0) >= since - 1:
            try:
                out.append(stop_report_from_dict(stop, host="this machine"))
            except (KeyError, TypeError, ValueError):
                continue
    return out


def _stop_by_records(run_dir: Path) -> list[StopReport]:
    try:
        return from_record(run_dir).stop(run_dir)
    except NothingToStop:
        return []


def _counts(run_dir: Path) -> dict[str, int] | None:
    try:
        ledger = Ledger.open_readonly(run_dir)
    except LedgerError:
        return None
    try:
        counts = ledger.counts()
    finally:
        ledger.close()
    return {s.value: counts[s] for s in Status}


__all__ = ["live_runner", "stop_run"]
