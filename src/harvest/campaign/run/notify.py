"""``[notify]``: tell a command and/or a URL when a run ends, stalls, relaunches its server or trips
its breaker, without ever slowing or ending the run.

    notifier = Notifier(config.notify, run_dir=..., facts=...)   # facts(): counts etc., off the loop
    notifier.start()
    notifier.tell("relaunched", "the server exited (code -9); relaunched")   # never waits
    await notifier.aclose()             # the last notices sent, within the notify timeout

A notice is one JSON document (``harvest.notify/1``, docs/notify.md), secrets by shape redacted
(:func:`harvest.redact.redact_doc`), handed to the command on its stdin (argv as given, no shell;
the event in ``$HARVEST_NOTIFY_EVENT``) and POSTed to the URL, side by side. Budget and promises:

- ``tell`` only puts the notice on a bounded queue (:data:`QUEUE_MAX`; a full queue drops it, with a
  warning): the dispatch loop never waits on a notifier.
- one worker sends them in order; each command and each POST gets ``[notify] timeout`` seconds. A
  command still running then is killed with its process group (started in a session of its own:
  its pid is this process's unreaped child, so the group is provably the one started here), and
  reaped; a POST is cancelled. A failure (exit code, HTTP status, time out) is logged, redacted, and
  the run goes on.
- ``aclose`` gives the notices still queued (the run's end among them) one more timeout each, at
  most :data:`CLOSE_MAX` of them, then cancels the worker.

It signals nothing but the commands it started, and reads the run's state only through ``facts``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from harvest import schemas
from harvest.config import NotifyConfig
from harvest.redact import hide_url_path, redact_doc, redact_text
from harvest.aiohttp_transport import AiohttpTransport
from harvest.transport import TransportError

log = logging.getLogger("harvest.campaign")

#: Notices waiting to be sent at most; more are dropped (said once per drop).
QUEUE_MAX = 64
#: Notices still queued when the run ends that are sent before it exits, at most.
CLOSE_MAX = 8
#: What a command may print that is kept for its failure line.
OUTPUT_KEPT = 2000


def notice_doc(event: str, reason: str | None, facts: Mapping[str, Any]) -> dict[str, Any]:
    """The ``harvest.notify/1`` document of one event (see docs/notify.md), redacted."""
    doc: dict[str, Any] = {
        "schema": schemas.NOTIFY, "event": event,
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(), "pid": os.getpid(), "reason": reason,
        "run_dir": facts.get("run_dir"), "outcome": facts.get("outcome"), "exit_code": facts.get("exit_code"),
        "counts": facts.get("counts"), "total": facts.get("total"), "relaunches": facts.get("relaunches", 0),
        "watch": facts.get("watch"),
    }
    return redact_doc(doc)


class Notifier:
    """The notices of one session (see the module docstring). ``facts()`` says what the document
    carries beside the event (run folder, counts, outcome...); it runs on a worker thread."""

    def __init__(self, config: NotifyConfig, facts: Callable[[], Mapping[str, Any]]):
        self.config = config
        self._facts = facts
        self._queue: asyncio.Queue[tuple[str, str | None, dict[str, Any]]] = asyncio.Queue(QUEUE_MAX)
        self._worker: asyncio.Task[None] | None = None
        self._transport: AiohttpTransport | None = None
        #: (event, what happened) of every notice sent or tried: "sent", "failed: ...", "timed out".
        self.sent: list[tuple[str, str]] = []

    def start(self) -> None:
        if self.config.active and self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._work())

    def tell(self, event: str, reason: str | None = None, **facts: Any) -> None:
        """Queue the notice of ``event`` if ``[notify] on`` names it; never waits."""
        if self._worker is None or event not in self.config.on:
            return
        try:
            self._queue.put_nowait((event, reason, facts))
        except asyncio.QueueFull:
            log.warning("notify: %s not told: %d notices are waiting already", event, QUEUE_MAX)

    async def _work(self) -> None:
        while True:
            event, reason, extra = await self._queue.get()
            try:
                await self._send(event, reason, extra)
            except Exception as exc:  # noqa: BLE001 - a notifier never ends the run
                log.warning("notify: %s not told: %s", event, redact_text(str(exc)))
            finally:
                self._queue.task_done()

    async def _send(self, event: str, reason: str | None, extra: Mapping[str, Any]) -> None:
        facts = {**await asyncio.to_thread(self._facts), **extra}
        doc = notice_doc(event, reason, facts)
        body = json.dumps(doc, indent=1).encode()
        sends = []
        if self.config.command:
            sends.append(self._run_command(event, body))
        if self.config.url:
            sends.append(self._post(event, body))
        for what in await asyncio.gather(*sends, return_exceptions=True):
            said = what if isinstance(what, str) else f"failed: {type(what).__name__}: {what}"
            self.sent.append((event, redact_text(said)))
            if said != "sent":
                log.warning("notify: %s: %s", event, redact_text(said))

    async def _run_command(self, event: str, body: bytes) -> str:
        argv = self.config.command
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "HARVEST_NOTIFY_EVENT": event})
        except OSError as exc:
            return f"failed: {argv[0]} could not be started: {exc.strerror or exc}"
        try:
            out, _ = await asyncio.wait_for(proc.communicate(body), self.config.timeout)
        except asyncio.TimeoutError:
            await _end_group(proc)
            return f"failed: {argv[0]} timed out after {self.config.timeout:g} s (killed with its process group)"
        except BaseException:
            await _end_group(proc)
            raise
        if proc.returncode != 0:
            tail = out[-OUTPUT_KEPT:].decode("utf-8", "replace").strip()
            return f"failed: {argv[0]} exited with {proc.returncode}" + (f": {tail}" if tail else "")
        return "sent"

    async def _post(self, event: str, body: bytes) -> str:
        url = self.config.url
        assert url is not None
        if self._transport is None:
            self._transport = AiohttpTransport(max_connections=2)
        shown = hide_url_path(url)
        try:
            response = await asyncio.wait_for(
                self._transport.request("POST", url, body=body, timeout=self.config.timeout, max_bytes=64 << 10,
                                        headers={"Content-Type": "application/json"}),
                self.config.timeout + 1.0)
        except (TransportError, asyncio.TimeoutError) as exc:
            return f"failed: POST {shown}: {type(exc).__name__}: {exc}"
        if not 200 <= response.status < 300:
            return f"failed: POST {shown} answered HTTP {response.status}"
        return "sent"

    async def aclose(self) -> None:
        """Send what is queued (at most :data:`CLOSE_MAX` notices, each within the timeout), then stop."""
        worker, self._worker = self._worker, None
        if worker is None:
            return
        # the one on its way and those queued, each bounded by its own timeout; past the budget, dropped
        budget = min(self._queue.qsize() + 1, CLOSE_MAX) * (self.config.timeout + 2.0)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._queue.join(), budget)
        if not self._queue.empty():
            log.warning("notify: %d notices not told: the run ended", self._queue.qsize())
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        if self._transport is not None:
            await self._transport.aclose()


async def _end_group(proc: asyncio.subprocess.Process) -> None:
    """Kill a notify command that outlived its time with its process group, then reap it (bounded)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group of our unreaped child
    with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
        await asyncio.wait_for(proc.wait(), 5.0)


__all__ = ["CLOSE_MAX", "Notifier", "QUEUE_MAX", "notice_doc"]
