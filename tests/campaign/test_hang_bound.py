"""A managed engine that is neither healthy nor answering (frozen whole: ``/health`` silent too) is
relaunched after ``[client] hang_deadline``, as a hung one is, not after ``health_deadline``; with
the default config that is 120 s where it was 600 s. What the panel and the status line say
meanwhile: no ETA while nothing comes back, the managed endpoint's bound and what follows it, an
endpoint harvest does not own told to be restarted.

The supervision's verdict at the default settings, on the client's stats as they stand (the real
frozen llama-server is in test_days.py); the figures of a progress snapshot and their words.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from harvest.campaign.outputs.progress import Progress
from harvest.campaign.run.state import RunState
from harvest.campaign.run.supervise import Supervision
from harvest.cli.panel import RunPanel, progress_line, run_panel
from harvest.client.endpoints import Endpoint
from harvest.client.hang import hung_line
from harvest.client.records import ClientStats, EndpointState
from harvest.config import parse_config
from harvest.events import Event

URL = "http://127.0.0.1:18000"
OTHER = "http://127.0.0.1:18001"


def _stats(*endpoints: Endpoint) -> ClientStats:
    now = time.monotonic()
    return ClientStats(in_flight=sum(e.outstanding for e in endpoints), held=0, completed=0, retries=0,
                       endpoints=tuple(e.stats(now) for e in endpoints))


def _frozen(url: str, sick_for: float) -> Endpoint:
    """An endpoint the hang check found quiet 45 s with /health silent, ``sick_for`` seconds ago."""
    e = Endpoint(url)
    now = time.monotonic()
    for _ in range(4):
        e.took(now - 45 - sick_for)
    e.failed(now - sick_for, hung_line(45, False), None)
    e.state = EndpointState.SICK
    return e


def _supervision() -> Supervision:
    config = parse_config({"server": {"engine": "llamacpp", "model": "m.gguf", "port": 18000},
                           "data": {"path": "in.jsonl"}})  # every [client] setting at its default
    assert config.client.hang_deadline == 120 and config.client.health_deadline == 600
    state = RunState(config, Path("run"), "h")
    state.fleet = SimpleNamespace(urls=[URL])  # type: ignore[assignment]  # what hung() reads of a fleet
    return Supervision(state, None, None, force=False, on_preflight=None)  # type: ignore[arg-type]


def test_a_frozen_managed_engine_is_relaunched_after_the_hang_deadline_not_the_health_deadline():
    supervision = _supervision()
    assert supervision.hung(SimpleNamespace(stats=lambda: _stats(_frozen(URL, 110)))) is None  # type: ignore[arg-type]
    why = supervision.hung(SimpleNamespace(stats=lambda: _stats(_frozen(URL, 121))))  # type: ignore[arg-type]
    assert why is not None and why.startswith("not answering: no answer for 45 s and /health did not answer; "
                                              "not healthy for 121 s (past [client] hang_deadline 120 s)"), why
    # an endpoint harvest does not manage: left to health_deadline (nothing of it to relaunch)
    assert supervision.hung(SimpleNamespace(stats=lambda: _stats(_frozen(OTHER, 500)))) is None  # type: ignore[arg-type]


def _progress(tmp_path, managed: bool) -> tuple[Progress, RunPanel]:
    panel = RunPanel(Console(file=io.StringIO(), width=130), live=False)
    progress = Progress(tmp_path, total=100, already_final=0, before={}, watch=panel)
    progress.health_deadline, progress.hang_deadline = 600.0, 120.0
    progress.managed = frozenset({URL} if managed else set())
    progress.begin("generating")
    for _ in range(30):
        progress.record("done", 5, 3, 0.1)
    return progress, panel


def _text(progress: Progress, panel: RunPanel) -> str:
    console = Console(file=io.StringIO(), width=130)
    console.print(run_panel(progress.view(), panel.board, 130))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return " ".join(text.replace("│", " ").split())  # wrapped rows joined again


def test_no_eta_while_nothing_comes_back_and_the_managed_endpoints_bound_is_its_hang_deadline(tmp_path):
    progress, panel = _progress(tmp_path, managed=True)
    assert progress.snapshot()["eta_s"] is not None  # answers come back: an ETA
    frozen = _frozen(URL, 30)
    progress.client_stats = lambda: _stats(frozen)
    snap = progress.snapshot()
    assert snap["eta_s"] is None and snap["stalled"] == hung_line(45, False)
    text = _text(progress, panel)
    assert "ETA" in text and "nothing comes back" in text
    assert "30 s waited of the 120 s hang_deadline, then relaunched" in text and "health_deadline" not in text
    assert "ETA - (nothing comes back)" in progress_line(snap)
    # the relaunch begins: said so, not a health deadline counting down
    progress.on_event(Event("generating", "end", {"outcome": "relaunching", "relaunch": 1, "of": 5, "why": "x"}))
    snap = progress.snapshot()
    assert snap["stalled"] == "the server is being relaunched" and snap["sick"][0]["state"] == "relaunching"
    assert f"{URL} being relaunched" in _text(progress, panel)
    progress.on_event(Event("generating", "start", {"relaunch": 1, "of": 5, "why": "x"}))
    progress.client_stats = lambda: _stats(Endpoint(URL))
    assert progress.snapshot()["stalled"] is None


def test_an_unmanaged_hung_endpoint_is_told_to_be_restarted(tmp_path):
    progress, panel = _progress(tmp_path, managed=False)
    hung = Endpoint(URL)
    now = time.monotonic()
    for _ in range(4):
        hung.took(now - 41)
    hung.hung_s, hung.failing_since, hung.last_error = 35.0, now - 6, hung_line(35)
    hung.state = EndpointState.HUNG
    progress.client_stats = lambda: _stats(hung)
    text = _text(progress, panel)
    assert "hung while /health answers: no new requests to it; restart the server" in text, text
    assert progress.snapshot()["eta_s"] is None
