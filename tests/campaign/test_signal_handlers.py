"""A campaign run in-process takes SIGINT and SIGTERM while it runs, and gives them back."""

from __future__ import annotations

import asyncio
import json
import signal

from tests.placed import run_campaign
from harvest.config import parse_config


def test_a_run_in_process_gives_back_the_signal_handlers_it_found(tmp_path):
    """While it runs, a campaign takes SIGINT and SIGTERM for a clean stop; after, the program that
    embeds it has its own handlers back. ``loop.remove_signal_handler`` leaves the default: a test
    session's SIGTERM handler, which stops the engines it started, was lost after the first
    in-process run."""
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"qid": i}) + "\n" for i in range(3)))
    config = parse_config({"server": {"engine": "openai", "base_url": "http://127.0.0.1:9", "model": "m"},
                           "data": {"path": str(tmp_path / "in.jsonl")},
                           "output": {"dir": str(tmp_path / "run")}}, source=str(tmp_path / "job.toml"))
    calls: list[int] = []

    def mine(signum: int, frame: object) -> None:
        calls.append(signum)

    before = {s: signal.signal(s, mine) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        report = asyncio.run(run_campaign(config))
        assert report.outcome == "finished", report  # every row skipped (no prompt): nothing to send
        assert signal.getsignal(signal.SIGINT) is mine and signal.getsignal(signal.SIGTERM) is mine
    finally:
        for s, h in before.items():
            signal.signal(s, h)
