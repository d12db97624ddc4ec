"""``python -m tests.campaign.held_ingest run JOB ...``: the real ``harvest`` command line, with the
ingest held after its first batch until the file named by ``HARVEST_TEST_INGEST_GATE`` exists (or
120 s pass). A test uses it to kill a run while the ingest is certainly half-way, however fast the
machine reads the rest; everything else in the process is the command a user runs.

``HARVEST_TEST_INGEST_BATCH`` sets the records per ingest transaction (the product's
``INGEST_BATCH``, 10,000): three batches of 1,000 hold the same order of events as three of 10,000
for a tenth of the items.
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
if os.environ.get("HARVEST_TEST_INGEST_BATCH"):
    intake.INGEST_BATCH = int(os.environ["HARVEST_TEST_INGEST_BATCH"])

if __name__ == "__main__":
    main()
