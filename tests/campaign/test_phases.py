"""The phases a run records (``harvest.events.Phases`` inside its progress): progress.json lists
the ones running, in their order, as the events leave them; and the engines' queue the progress
scrape reads, as the run panel shows it (no engine)."""

from __future__ import annotations

import asyncio
import io
import json

from rich.console import Console

from harvest.campaign.outputs.progress import PROGRESS_FILE, Progress
from harvest.cli.panel import RunPanel, progress_line
from harvest.events import Event


def test_progress_json_lists_the_phases_running_in_their_order(tmp_path):
    progress = Progress(tmp_path, total=10, already_final=0)

    def running() -> list[str]:
        progress.update()
        return json.loads((tmp_path / PROGRESS_FILE).read_text())["phases"]

    progress.on_event(Event("launching", "start", {"engine": "vllm", "pid": 1}))
    progress.on_event(Event("ingest", "start", {"rows": 5}))
    assert running() == ["ingest", "launching"]  # the order of a run, not of the events
    progress.on_event(Event("connecting", "start"))
    assert running() == ["ingest", "connecting"]  # one sequential phase starting ends the one before
    progress.on_event(Event("ingest", "end", {"rows": 10}))
    progress.on_event(Event("generating", "start"))
    assert running() == ["generating"]
    progress.on_event(Event("stopping", "update", {"step": "sigterm"}))  # seen first mid-way: running
    assert running() == ["generating", "stopping"]
    progress.on_event(Event("trial", "start", {"index": 2, "of": 3}))  # a sweep's next trial: afresh
    assert running() == ["trial"]
    progress.on_event(Event("trial", "end"))
    assert running() == []


async def test_the_display_shows_an_engine_whose_metrics_did_not_come_as_unknown_not_its_last_reading(tmp_path):
    """A scrape that does not come back (the server hangs on /metrics) must not leave the last
    reading on the screen as if it were current: running and waiting read "-" until one comes."""
    from harvest.campaign.run.dispatch import scrape
    from harvest.client import Client, MockTransport, RawResponse
    from harvest.client.metrics import PrefixCacheMeter

    url, hang = "http://127.0.0.1:9001", False

    async def handler(method, path, body, headers):
        if hang:
            await asyncio.sleep(30)
        return RawResponse(200, b"vllm:num_requests_running 7\nvllm:num_requests_waiting 3\n")

    console = Console(file=io.StringIO(), width=120, force_terminal=True, record=True)
    panel = RunPanel(console, live=False)
    progress = Progress(tmp_path, total=300, already_final=0, watch=panel)
    panel.opened(progress.view)
    meter = PrefixCacheMeter()
    async with Client([url], model="m", transport=MockTransport(handler)) as client:
        await scrape(client, progress, meter, None)
        assert progress.server == {"running": 7, "waiting": 3}
        assert progress.server_endpoints == {url: {"running": 7, "waiting": 3}}
        console.print(panel)
        assert "server running 7   waiting 3" in console.export_text()
        line = progress_line(progress.snapshot())  # the --no-live line: a comma before each part
        assert ", server running 7 waiting 3" in line and "  server" not in line, line
        hang = True
        await scrape(client, progress, meter, None)
    assert progress.server == {"running": None, "waiting": None}
    assert progress.server_endpoints == {url: {"running": None, "waiting": None}}
    console.print(panel)
    assert "server running" not in console.export_text()
