"""The live progress line and progress.json carry the auto-concurrency target of each endpoint."""

from __future__ import annotations

import io
import json

from rich.console import Console

from harvest.campaign.outputs.progress import PROGRESS_FILE, Progress
from harvest.cli.panel import RunPanel, run_panel
from harvest.cli.phases import PhaseBoard


def _lines(tmp_path, stream):
    """A progress watched off a terminal: its lines go to ``stream``."""
    return Progress(tmp_path, total=10, already_final=0, watch=RunPanel(Console(file=stream), live=False))


def test_progress_line_and_file_show_the_auto_targets(tmp_path):
    stream = io.StringIO()
    progress = _lines(tmp_path, stream)
    progress.update()
    assert "auto target" not in stream.getvalue()  # fixed concurrency: nothing to show
    progress.concurrency = {"http://127.0.0.1:8000": 48}
    progress.update()
    assert "(auto target 48)" in stream.getvalue().splitlines()[-1]
    progress.concurrency = {"http://a:1": 8, "http://b:1": 40}
    snap = progress.update()
    assert "(auto targets 8+40)" in stream.getvalue().splitlines()[-1]
    assert snap["concurrency_targets"] == {"http://a:1": 8, "http://b:1": 40}
    assert json.loads((tmp_path / PROGRESS_FILE).read_text())["concurrency_targets"] == {"http://a:1": 8, "http://b:1": 40}


def test_prefix_cache_hit_rate_in_the_line_the_panel_the_file_and_status(tmp_path):
    from harvest.campaign.outputs.status import read_progress

    stream = io.StringIO()
    progress = _lines(tmp_path, stream)
    progress.update()
    assert "prefix cache" not in stream.getvalue()  # no engine reported one
    progress.prefix_cache = {"hit_rate": 0.634, "hit_tokens": 634.0, "query_tokens": 1000.0}
    snap = progress.update()
    assert "prefix cache hits 63%" in stream.getvalue().splitlines()[-1]
    panel = io.StringIO()
    Console(file=panel, width=120).print(run_panel(progress.view(snap), PhaseBoard(), 110))
    assert "prefix cache hits 63%" in panel.getvalue()
    assert json.loads((tmp_path / PROGRESS_FILE).read_text())["prefix_cache"]["hit_rate"] == 0.634
    recorded, problem = read_progress(tmp_path)
    assert problem is None and recorded is not None and recorded.prefix_cache_hit_rate == 0.634
