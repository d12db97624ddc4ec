"""The async single writer: many generation tasks hand results to one thread that owns the ledger.

    async with LedgerWriter(ledger, batch_size=2048, max_delay=0.05) as writer:
        rows = await writer.claim(256)
        ...
        writer.complete(Completion(row.id, output))   # cheap: appends to a list, never blocks
        writer.fail(Failure(row.id, msg, "http_400"))
        await writer.release(ids)                       # sick server: back to pending, no charge
    # leaving the block commits everything submitted

Submitted operations are committed in submission order, in one transaction per batch: when
``batch_size`` operations are waiting or ``max_delay`` seconds after the first one, whichever comes
first. Every ledger call runs on one dedicated thread, so the SQLite connection is never used by two
threads and the event loop never waits on the disk. Calls that read (``claim``, ``counts``) first
hand over what is waiting, so they see it.

While the writer runs, use the ledger only through it, the ingest included: a runner that
generates while it ingests builds batches with ``prepare_ingest`` on another thread and commits
each through :meth:`LedgerWriter.ingest`. This module never decides policy and never opens or closes the ledger (its owner
does). After a failed commit it refuses further work (``LedgerError``) rather than dropping results
silently; a batch that fails rolls back as a whole, so its items stay claimable after a restart.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from harvest.errors import LedgerError
from harvest.ledger.records import ApplyReport, Completion, Failure, IngestReport, ItemRow, Key, Status, Totals
from harvest.ledger.store import IngestBatch, Ledger

T = TypeVar("T")


class LedgerWriter:
    """Batches ledger writes from many asyncio tasks onto one thread. Use as an async context manager."""

    def __init__(self, ledger: Ledger, *, batch_size: int = 2048, max_delay: float = 0.05,
                 call_timeout: float = 120.0, idle_tick: float = 1.0):
        if ledger.readonly:
            raise LedgerError(f"{ledger.path}: a writer needs a ledger opened for writing")
        self._ledger = ledger
        self.batch_size = batch_size
        self.max_delay = max_delay
        #: Longest a single ledger call (a commit) may take before the writer gives up with an error.
        self.call_timeout = call_timeout
        self._idle_tick = idle_tick
        self._ops: list[tuple[str, Any]] = []
        self._first_at = 0.0
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._last: asyncio.Future[Any] | None = None
        self._closing = False
        self._error: BaseException | None = None
        #: Running totals of what committed batches changed.
        self.committed = 0
        self.ignored = 0
        self.failed = 0

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> LedgerWriter:
        """Start the writer thread and the batching task. Idempotent."""
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._wake = asyncio.Event()
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="harvest-ledger")
            self._task = asyncio.create_task(self._run(), name="harvest-ledger-writer")
        return self

    async def close(self) -> None:
        """Commit everything submitted, then stop the thread. Idempotent; raises a stored error."""
        if self._task is None or self._closing:
            return
        self._closing = True
        assert self._wake is not None and self._executor is not None
        self._wake.set()
        try:
            await asyncio.wait_for(self._task, timeout=self.call_timeout)
        except asyncio.TimeoutError:
            self._error = self._error or LedgerError(
                f"ledger writer did not finish within {self.call_timeout} s")
        finally:
            self._executor.shutdown(wait=False)
        if self._error is not None:
            raise LedgerError(f"ledger writes failed: {self._error}") from self._error

    async def __aenter__(self) -> LedgerWriter:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---------------------------------------------------------------- the hot path

    def complete(self, result: Completion) -> None:
        """Queue a result for commit. Returns at once; ``flush`` waits for durability."""
        self._submit("complete", result)

    def fail(self, failure: Failure) -> None:
        """Queue an item failure for commit."""
        self._submit("fail", failure)

    def skip(self, item: Failure) -> None:
        """Queue an item skipped without being sent (its reason and class in ``item``)."""
        self._submit("skip", item)

    def charge_attempt(self, item_id: str | Key) -> None:
        """Queue one charged attempt for an item."""
        self._submit("charge", item_id)

    def _submit(self, kind: str, payload: Any) -> None:
        if self._error is not None:
            raise LedgerError(f"ledger writes failed earlier: {self._error}") from self._error
        if self._task is None or self._closing:
            raise LedgerError("the ledger writer is not running")
        ops = self._ops
        ops.append((kind, payload))
        if len(ops) == 1:
            self._first_at = self._loop.time()  # type: ignore[union-attr]
            self._wake.set()  # type: ignore[union-attr]
        elif len(ops) >= self.batch_size:
            self._wake.set()  # type: ignore[union-attr]

    # ---------------------------------------------------------------- calls that wait

    async def flush(self) -> None:
        """Return once everything submitted so far is committed."""
        await self._call(lambda: None)

    async def release(self, ids: Iterable[str | Key]) -> int:
        """Put running items back to pending, no attempt charged. Returns how many moved."""
        ids = list(ids)
        return await self._call(functools.partial(self._ledger.release, ids))

    async def claim(self, n: int) -> list[ItemRow]:
        """Claim up to ``n`` pending items (after committing what is waiting)."""
        raw = await self._call(functools.partial(self._ledger.claim_raw, n))
        return self._ledger.item_rows(raw)  # decoded here, off the ledger thread

    async def ingest(self, batch: IngestBatch) -> IngestReport:
        """Commit one prepared batch of input records (see ``Ledger.commit_ingest``)."""
        return await self._call(functools.partial(self._ledger.commit_ingest, batch))

    async def counts(self) -> dict[Status, int]:
        return await self._call(self._ledger.counts)

    async def check_totals(self) -> Totals:
        return await self._call(self._ledger.check_totals)

    async def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the ledger thread after every operation submitted before it."""
        if self._error is not None:
            raise LedgerError(f"ledger writes failed earlier: {self._error}") from self._error
        if self._task is None:
            raise LedgerError("the ledger writer is not running")
        handed = self._hand_over()
        fut = self._loop.run_in_executor(self._executor, fn)  # type: ignore[union-attr]
        try:
            result = await asyncio.wait_for(asyncio.shield(fut), timeout=self.call_timeout)
        except asyncio.TimeoutError:
            raise LedgerError(f"ledger call did not finish within {self.call_timeout} s") from None
        if handed is not None and not handed.cancelled() and handed.exception() is not None:
            self._error = self._error or handed.exception()
        if self._error is not None:
            raise LedgerError(f"ledger writes failed: {self._error}") from self._error
        return result

    # ---------------------------------------------------------------- batching

    def _hand_over(self) -> asyncio.Future[Any] | None:
        """Send the waiting operations to the ledger thread as one batch (FIFO after earlier ones)."""
        if not self._ops:
            return None
        ops, self._ops = self._ops, []
        fut = self._loop.run_in_executor(self._executor, self._ledger.apply, ops)  # type: ignore[union-attr]
        fut.add_done_callback(self._done)
        self._last = fut
        return fut

    def _done(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            self._error = self._error or exc
            return
        report: ApplyReport = fut.result()
        self.committed += report.committed
        self.ignored += report.ignored
        self.failed += report.failed

    def _timeout_error(self) -> LedgerError:
        return LedgerError(f"a ledger commit took longer than {self.call_timeout} s")

    async def _run(self) -> None:
        loop = self._loop
        wake = self._wake
        assert loop is not None and wake is not None
        while True:
            if self._closing and not self._ops:
                break
            try:
                await asyncio.wait_for(wake.wait(), timeout=self._idle_tick)
            except asyncio.TimeoutError:
                pass
            wake.clear()
            if not self._ops:
                continue
            # Let the batch fill up to batch_size, at most max_delay after its first operation.
            while len(self._ops) < self.batch_size and not self._closing:
                remaining = self._first_at + self.max_delay - loop.time()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(wake.wait(), timeout=remaining)
                except asyncio.TimeoutError:
                    break
                wake.clear()
            fut = self._hand_over()
            if fut is None:
                continue
            try:
                await asyncio.wait_for(asyncio.shield(fut), timeout=self.call_timeout)
            except asyncio.TimeoutError:
                self._error = self._error or self._timeout_error()
                return
            except Exception:  # recorded by _done; stop accepting work
                return
        if self._last is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._last), timeout=self.call_timeout)
            except asyncio.TimeoutError:
                self._error = self._error or self._timeout_error()
            except Exception:
                pass


__all__ = ["LedgerWriter"]
