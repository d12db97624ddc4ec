"""The state of one campaign session: what changes while it runs, in one typed object.

The session (``campaign/run/session.py``) makes one :class:`RunState` and hands it to its steps
(``intake.py``, ``supervise.py``, ``connect.py``, ``dispatch.py``); each reads what it uses from it.
Every change that more than one step makes goes through one method here: :meth:`RunState.end` is the
only writer of the outcome and its note, :meth:`RunState.stopped` of the stop reports,
:meth:`RunState.request_stop` of the stop request, :meth:`RunState.folder_moved` of a replaced run
folder's reason. The rest has one writer each, named beside its field. Nothing here sends a
request, touches a server or writes a file.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from harvest import safefiles
from harvest.campaign.outputs.timeline import Timeline
from harvest.campaign.run.breaker import Trip
from harvest.config import HarvestConfig
from harvest.events import Event, Listener
from harvest.placement import Fleet
from harvest.redact import redact_text
from harvest.stops import StopReport

log = logging.getLogger("harvest.campaign")

#: The run folder's subfolder that holds the server's records and logs.
SERVER_DIR = "server"

#: How a session ends: "finished", "interrupted" (Ctrl-C / SIGTERM), "server_down" or "stopped"
#: (the breaker, a first batch of rows all skipped, a replaced run folder).
Outcome = Literal["finished", "interrupted", "server_down", "stopped"]


@dataclass(eq=False)
class RunState:
    """What one session of a run knows and changes while it runs (not reusable)."""

    config: HarvestConfig
    run_dir: Path
    #: The hash of the settings that change outputs (``intake.output_settings``): it guards a resume.
    settings_hash: str
    #: Set by :meth:`request_stop` (Ctrl-C, SIGTERM, a replaced run folder): dispatch winds down.
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)
    #: The servers harvest launched for the run, while they run (written by ``supervise.py`` only).
    fleet: Fleet | None = None
    #: How the session ended; "finished" until :meth:`end` says otherwise.
    outcome: Outcome = "finished"
    note: str | None = None
    #: Relaunches spent (written by ``supervise.py`` only).
    relaunches: int = 0
    #: One verified report per server stopped, leftovers of an earlier session included.
    stop_reports: list[StopReport] = field(default_factory=list)
    #: Items ``--retry`` (or a changed [data] shape) put back to pending (written by ``intake.py`` only).
    requeued: int = 0
    #: The model name sent with every request (checked against /v1/models), once known
    #: (written by ``connect.py`` only).
    model: str | None = None
    #: What the session found in the run folder when it began (None: a new run; the session's).
    resumed: str | None = None
    #: Why the circuit breaker stopped the run (set with the outcome by :meth:`tripped`).
    trip: Trip | None = None
    #: The report's record of this session (timeline.json): intervals, histograms, launches.
    timeline: Timeline | None = None
    #: The display's phase listener, once it exists.
    on_event: Listener | None = None
    #: Who is told at once of what a person may want to know (``[notify]``, ``/metrics``): an event
    #: (``relaunched``, ``breaker``) and its reason (set by ``session.py``'s outside, ``outside.py``).
    on_notice: Callable[[str, str], None] | None = None
    #: The run folder, held from the ledger's open to the caller's report: every file of the run
    #: (the server's records and logs too) goes through it and :meth:`server_dir`.
    folder: safefiles.Folder | None = None
    #: Why the run folder's name stopped naming the folder held (set by :meth:`folder_moved`).
    moved: str | None = None
    #: The endpoints found hung (holding requests, ``/health`` answering) when every endpoint was
    #: given up: restarting them is what to do (written by ``dispatch.py`` only).
    hung: tuple[str, ...] = ()
    _server_dir: safefiles.Folder | None = None

    def end(self, outcome: Outcome, note: str | None = None) -> None:
        """The session ends with ``outcome``; ``note`` says why. "finished" stands until an end, and an
        interrupt gives way to a later end that says why; after any other end the outcome holds, and
        a later note replaces the earlier one (a run folder replaced at the end says where the run's
        files are)."""
        if self.outcome in ("finished", "interrupted"):
            self.outcome = outcome
        if note is not None:  # it may quote an endpoint's URL: its key never reaches a screen or a file
            self.note = redact_text(note)

    def tripped(self, trip: Trip) -> None:
        """The circuit breaker stopped the run: the outcome "stopped", with the trip as its note."""
        self.trip = trip
        self.end("stopped", trip.describe())
        self.notice("breaker", trip.describe())

    def notice(self, event: str, reason: str) -> None:
        """Tell ``event`` to whoever listens (``[notify]``, ``/metrics``); never raises."""
        if self.on_notice is not None:
            try:
                self.on_notice(event, redact_text(reason))
            except Exception as exc:  # noqa: BLE001 - telling never ends the run
                log.warning("%s not told: %s", event, exc)

    def stopped(self, reports: Iterable[StopReport], *, why: str | None = None, leftover: bool = False) -> None:
        """Servers' verified stops: kept for the report and the timeline. ``why``: the reason of a
        stop before a relaunch; ``leftover``: servers an earlier session of the run left running."""
        for report in reports:
            self.stop_reports.append(report)
            if self.timeline is not None:
                self.timeline.stop(report, leftover=leftover, why=why)

    def phase(self, event: Event) -> None:
        """Tell the display a phase began, moved or ended (nothing before it exists)."""
        if self.on_event is not None:
            self.on_event(event)

    def request_stop(self) -> None:
        """Ask for a clean stop: dispatch ends, what is in flight goes back to pending; a fleet still
        starting gives up its launch (its cleanup stops what started)."""
        if not self.stop_requested.is_set():
            log.warning("stop requested: finishing committed work, releasing in-flight items")
        self.stop_requested.set()
        if self.fleet is not None and self.fleet.ready is None:
            self.fleet.cancel()

    def server_dir(self) -> safefiles.Folder:
        """The run folder's ``server/`` folder, held (made 0700 when absent): the fleet's records,
        logs and stop reports go through it, never through the run folder's name."""
        if self._server_dir is None:
            assert self.folder is not None  # held from the ledger's open
            self._server_dir = self.folder.subfolder(SERVER_DIR)
        return self._server_dir

    def folder_moved(self) -> str | None:
        """Why the run folder's name names another folder than the one held (remembered once
        seen), or None while it still names it."""
        if self.moved is None and self.folder is not None:
            self.moved = self.folder.moved()
        return self.moved


__all__ = ["SERVER_DIR", "Outcome", "RunState"]
