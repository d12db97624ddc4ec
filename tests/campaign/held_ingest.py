"""``python -m tests.campaign.held_ingest run JOB ...``: the real ``harvest`` command line, with the
ingest held after its first batch until the file named by ``HARVEST_TEST_INGEST_GATE`` exists (or
120 s pass). A test uses it to kill a run while the ingest is certainly half-way, however fast the
machine reads the rest; everything else in the process is the command a user runs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import harvest.campaign.run.intake as intake
from harvest.cli.main import main

HOLD_LIMIT = 120.0  # the hold ends by itself: a test that never opens the gate still ends
_real = intake.prepare_ingest
_calls = 0


def _held(*args, **kwargs):
    global _calls
    _calls += 1
    if _calls > 1:
        gate = Path(os.environ["HARVEST_TEST_INGEST_GATE"])
        end = time.monotonic() + HOLD_LIMIT
        while not gate.exists() and time.monotonic() < end:
            time.sleep(0.01)
    return _real(*args, **kwargs)


intake.prepare_ingest = _held

if __name__ == "__main__":
    main()
