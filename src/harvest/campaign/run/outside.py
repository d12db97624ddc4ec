"""What a session tells the world beyond its own terminal, for a run that lasts days.

    outside = Outside(state, launcher)     # one per session (campaign/run/session.py)
    await outside.begin()                  # runner.json written; /metrics served; notifier started
    outside.attach(progress)               # the watch beside the run begins
    state.notice("relaunched", why)        # from the steps: told to [notify], counted in /metrics
    await outside.end(report)              # runner.json's end; "finished" or "ended" told; all stopped

- ``runner.json`` (:mod:`campaign.run.runner`): who runs the folder, detached or not, and at the end
  how the session ended and its exit code (``harvest status --watch`` ends with it, ``harvest stop
  RUN_DIR`` stops the runner it names).
- ``[client] metrics_port``: harvest's own ``/metrics`` (``campaign/outputs/prometheus.py``).
- ``[notify]``: the notices (``campaign/run/notify.py``).
- The watch, every :data:`WATCH_S`: progress.json kept fresh while dispatch is not there to write it
  (a launch, a relaunch: ``harvest status --watch`` in another terminal still sees time pass), the
  gauges of ``/metrics``, and the stall: every endpoint holding requests with nothing back (or sick)
  is told once per spell (``stalled``) and each endpoint's spell counted as a hang.

None of it may end or slow the run: a metrics port that cannot be bound is refused at the start
(before any launch), everything else is logged and the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harvest.campaign.outputs.progress import Progress
from harvest.campaign.outputs.prometheus import RunMetrics
from harvest.campaign.run import runner
from harvest.campaign.run.notify import Notifier
from harvest.campaign.run.state import RunState
from harvest.errors import ConfigError
from harvest.errors import LedgerError
from harvest.ledger import Ledger, Status

log = logging.getLogger("harvest.campaign")

#: Seconds between two looks of the watch.
WATCH_S = 1.0
#: Seconds a runner's stop may take beyond its servers' stop deadlines.
STOP_MARGIN_S = 30.0


@dataclass(frozen=True)
class Launcher:
    """How the session was started: detached (``harvest run --detach``: its output in ``log``, a
    file of the run folder), and the command line that runs it again."""

    detached: bool = False
    log: str | None = None
    command: tuple[str, ...] = ()


class Outside:
    """The runner record, ``/metrics``, the notices and the watch of one session."""

    def __init__(self, state: RunState, launcher: Launcher | None = None):
        self.state = state
        self.config = state.config
        self.launcher = launcher or Launcher()
        self.record: runner.RunnerRecord | None = None
        self.metrics: RunMetrics | None = None
        self.notifier = Notifier(self.config.notify, self._facts)
        self._progress: Progress | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stalled = False
        self._quiet: set[str] = set()

    # --- the session's steps --------------------------------------------------------------------

    async def begin(self) -> None:
        """runner.json (written on a worker thread: the loop does no file work), /metrics and the
        notifier, once the run folder is held (the ledger open)."""
        folder = self.state.folder
        assert folder is not None  # held from the ledger's open
        server = self.config.server
        stop_s = (server.stop_deadline if server is not None and server.launched else 0.0) + STOP_MARGIN_S
        self._serve_metrics()
        self.record = runner.RunnerRecord.mine(detached=self.launcher.detached, log=self.launcher.log, stop_s=stop_s,
                                               argv=self.launcher.command,
                                               metrics=self.metrics.url if self.metrics is not None else None)
        await asyncio.to_thread(runner.write, folder, self.record)
        self.state.on_notice = self.notice
        self.notifier.start()

    def _serve_metrics(self) -> None:
        client = self.config.client
        if client.metrics_port is None:
            return
        folder = self.state.folder
        assert folder is not None
        metrics = RunMetrics(folder.via, run_dir=str(self.state.run_dir))
        try:
            url = metrics.serve(client.metrics_host, client.metrics_port)
        except OSError as exc:
            name = f"{self.config.source} [client] metrics_port"
            raise ConfigError(name, [(name, f"{client.metrics_host}:{client.metrics_port} cannot be served: "
                                            f"{exc.strerror or exc}; choose a free port (0: any)")]) from None
        self.metrics = metrics
        log.info("metrics for Prometheus: %s", url)

    def attach(self, progress: Progress) -> None:
        """Feed ``/metrics`` from the progress, and start the watch beside the run."""
        self._progress = progress
        progress.metrics = self.metrics
        self._watch = asyncio.get_running_loop().create_task(self._watch_loop(progress))

    def notice(self, event: str, reason: str) -> None:
        """Something a person may want to know at once (``relaunched``, ``breaker``)."""
        if event == "relaunched" and self.metrics is not None:
            self.metrics.relaunched()
        self.notifier.tell(event, reason)

    async def end(self, outcome: str, exit_code: int, note: str | None, *, ok: bool) -> None:
        """The session ends: runner.json says how, the end is told, the watch and /metrics stop."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        if self.record is not None and self.state.folder is not None:
            self.record = self.record.ended(outcome, exit_code, note)
            try:
                await asyncio.to_thread(runner.write, self.state.folder, self.record)
            except OSError as exc:
                log.warning("runner.json not written: %s", exc)
        self.notifier.tell("finished" if ok else "ended", note or outcome, outcome=outcome, exit_code=exit_code)
        try:
            await self.notifier.aclose()
        finally:
            if self.metrics is not None:
                self.metrics.close()

    # --- the watch -----------------------------------------------------------------------------

    async def _watch_loop(self, progress: Progress) -> None:
        every = self.config.run.progress_interval
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                if time.monotonic() - progress.last_update > 2 * every:
                    progress.update()  # dispatch is not writing it now (a launch, a relaunch)
                self._look(progress)
            except Exception as exc:  # noqa: BLE001 - the watch never ends the run
                log.debug("watch: %s", exc)

    def _look(self, progress: Progress) -> None:
        """The stall (told once per spell) and each endpoint's hang (counted once per spell)."""
        stats = progress.client_stats() if progress.client_stats is not None else None
        if stats is None or progress.state != "running":
            return
        # The hang check's verdicts, not a quiet spell alone (long answers are not a stall): found
        # hung (/health answering), or taken out as not answering (sick, down).
        out = {e.url for e in stats.endpoints if e.state.value in ("hung", "sick", "down")}
        for e in stats.endpoints:
            if e.url in out and e.url not in self._quiet and (e.state.value == "hung" or e.hung):
                if self.metrics is not None:
                    self.metrics.hung(e.url)
        self._quiet = out
        stalled = bool(stats.endpoints) and all(e.url in out for e in stats.endpoints) and \
            stats.in_flight + stats.held > 0
        if stalled and not self._stalled:
            first = next(e for e in stats.endpoints if e.url in out)
            self.notifier.tell("stalled", f"{first.url} {first.last_error or first.state.value}")
        self._stalled = stalled

    # --- the notices' facts ----------------------------------------------------------------------

    def _facts(self) -> Mapping[str, Any]:
        """What every notice carries (run on a worker thread): the run folder, the ledger's counts."""
        folder, state = self.state.folder, self.state
        facts: dict[str, Any] = {"run_dir": str(state.run_dir), "relaunches": state.relaunches,
                                 "watch": f"harvest status {state.run_dir} --watch"}
        if folder is None:
            return facts
        with contextlib.suppress(LedgerError, OSError):
            ledger = Ledger.open_readonly(folder.via())
            try:
                counts = ledger.counts()
            finally:
                ledger.close()
            facts["counts"] = {s.value: counts[s] for s in Status}
            facts["total"] = sum(counts.values())
        return facts


__all__ = ["Launcher", "Outside", "STOP_MARGIN_S", "WATCH_S"]
