"""``python -m tests.chaos.slow_ingest run JOB ...``: the real ``harvest`` command line, with each
ingest commit held open for ``HOLD_S`` inside its write transaction, after its rows are written and
before its ``COMMIT``. The commit-kill rounds use it to land a kill inside the ingest's own
transaction on any machine: a few thousand short rows commit in milliseconds, which a poller on a
loaded machine can miss. What the transaction writes, and everything else, is the command a user runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from harvest.cli.main import main
from harvest.ledger.ingest import Ingest

HOLD_S = 0.3
_real = Ingest.commit_ingest


def _held_open(self, batch, resumed_from=0):
    write = self._write

    @contextlib.contextmanager
    def held() -> Iterator:
        with write() as conn:
            yield conn
            time.sleep(HOLD_S)  # the rows are in, the transaction still open

    self._write = held
    try:
        return _real(self, batch, resumed_from=resumed_from)
    finally:
        del self._write


Ingest.commit_ingest = _held_open

if __name__ == "__main__":
    main()
