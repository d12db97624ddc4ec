"""The scrape beside dispatch (``campaign/run/dispatch.py``'s ``scrape``) against an endpoint that
answers /metrics, then hangs on it: what it read, and then that it no longer knows, as progress.json
says it."""

from __future__ import annotations

import asyncio
import json

from harvest.campaign.outputs.progress import PROGRESS_FILE, Progress
from harvest.campaign.run.dispatch import scrape
from harvest.client import Client, MockTransport, RawResponse
from harvest.client.metrics import PrefixCacheMeter


async def test_an_engine_whose_metrics_did_not_come_shows_as_unknown_not_its_last_reading(tmp_path):
    """A scrape that does not come back (the server hangs on /metrics) must not leave the last
    reading as if it were current: running and waiting read None (shown "-") until one comes."""
    url, hang = "http://127.0.0.1:9001", False

    async def handler(method, path, body, headers):
        if hang:
            await asyncio.sleep(30)
        return RawResponse(200, b"vllm:num_requests_running 7\nvllm:num_requests_waiting 3\n")

    progress = Progress(tmp_path, total=300, already_final=0)
    meter = PrefixCacheMeter()

    def written() -> dict:
        progress.update()
        return json.loads((tmp_path / PROGRESS_FILE).read_text(encoding="utf-8"))

    async with Client([url], model="m", transport=MockTransport(handler)) as client:
        await scrape(client, progress, meter, None)
        assert progress.server == {"running": 7, "waiting": 3}
        assert progress.server_endpoints == {url: {"running": 7, "waiting": 3}}
        snap = written()
        assert snap["server"] == {"running": 7, "waiting": 3}
        assert snap["server_endpoints"] == {url: {"running": 7, "waiting": 3}}
        hang = True
        await scrape(client, progress, meter, None)
    assert progress.server == {"running": None, "waiting": None}
    assert progress.server_endpoints == {url: {"running": None, "waiting": None}}
    snap = written()
    assert snap["server"] == {"running": None, "waiting": None}
    assert snap["server_endpoints"] == {url: {"running": None, "waiting": None}}
