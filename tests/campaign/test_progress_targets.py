"""The live progress line and progress.json carry the auto-concurrency target of each endpoint."""

from __future__ import annotations

import io
import json

from harvest.campaign.progress import PROGRESS_FILE, Progress


def test_progress_line_and_file_show_the_auto_targets(tmp_path):
    stream = io.StringIO()
    progress = Progress(tmp_path, total=10, already_final=0, stream=stream, live=False)
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
