"""Text harvest did not write itself is shown as text: ``[bold]``, ``[/]`` and ``[client]`` in an
engine's error, an item's id and a path reach the screen as they are, never read as rich markup.

A campaign on a managed llama-server whose every request the engine refuses with a 400 that quotes
what it was sent (``response_format type must be one of "text" or "json_object", but got: ...``),
into a run folder and with ids that hold the three tags. ``harvest run --live`` draws its panel on
the console of the command; off a terminal rich prints the panel's last state once, so the test
reads the panel as drawn. Then ``harvest status`` (a rich table of the last errors, with ids).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from harvest.campaign.outputs.progress import Progress
from harvest.cli.panel import run_panel
from harvest.cli.phases import PhaseBoard
from harvest.safefiles import hold
from tests import engines, harvest_process

pytestmark = [pytest.mark.engine]

TAGS = "[bold]B[/] [client]C"
N = 6


def squash(text: str) -> str:
    """The text without blanks and box drawing: a phrase a panel wrapped reads whole again."""
    return re.sub(r"[\s│╭╮╰╯─]", "", text)


def harvest(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *args], capture_output=True, text=True, timeout=300,
                               env=env, stdin=subprocess.DEVNULL)


def job(tmp_path: Path, llama_server_bin: str, tiny_gguf: Path, run_dir: Path, breaker_window: int) -> Path:
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"id[bold]{i}[/][client]", "prompt": f"Say {i}."}) + "\n"
                            for i in range(N)))
    doc = (f'[data]\npath = "{data}"\n'
           f'[sampling]\nmax_tokens = 4\nextra_body = {{ response_format = {{ type = {json.dumps(TAGS)} }} }}\n'
           f'[client]\nconcurrency = 2\nmax_retries = 0\n'
           f'[run]\nbreaker_window = {breaker_window}\nprogress_interval = 0.2\n'
           f'[output]\ndir = {json.dumps(str(run_dir))}\n'
           f'[server]\nengine = "llamacpp"\nmodel = "{tiny_gguf}"\ncommand = ["{llama_server_bin}"]\n'
           f'port = {engines.free_port()}\nmax_running_requests = 2\nextra_args = ["-c", "2048"]\n'
           f'ready_timeout = 60\nstop_grace = 2\nstop_deadline = 15\n'
           f'[preflight]\nmin_disk_free_gib = 0.05\nram_reserve_gib = 0\n')
    path = tmp_path / f"job-{breaker_window}.toml"
    path.write_text(doc)
    return path


def test_engine_errors_ids_and_paths_with_markup_are_shown_as_text(tmp_path, llama_server_bin, tiny_gguf):
    run_dir = tmp_path / "out[bold]x[/]y[client]z"
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "130"}
    engine_said = f'but got: {TAGS}'

    # The breaker trips on the engine's refusal: the panel's note and phase row quote it.
    first = harvest(env, "run", str(job(tmp_path, llama_server_bin, tiny_gguf, run_dir, breaker_window=4)), "--live")
    shown = first.stderr
    assert first.returncode == 1 and "Traceback" not in shown, shown
    assert "╭" in shown and "╰" in shown, f"no panel was drawn:\n{shown}"
    panel = shown[shown.rindex("╭"):shown.rindex("╰")]
    assert squash(f"harvest run: {run_dir}") in squash(panel), panel
    said = f'(http_400): HTTP 400: response_format type must be one of "text" or "json_object", {engine_said}'
    assert squash(said) in squash(panel.split("note", 1)[-1]), panel  # the note row
    assert squash(f"stopped (4 requests in a row failed the same way {said})") \
        in squash(panel), panel  # the phase row
    assert squash(f"STOPPED: 4 requests in a row failed the same way (http_400)") in squash(first.stderr + first.stdout)

    # Without the breaker each item fails with the engine's words: `harvest status` lists them by id.
    second = harvest(env, "run", str(job(tmp_path, llama_server_bin, tiny_gguf, run_dir, breaker_window=0)), "--live")
    # every item failed: accounted for, and more than [run] max_failed_share of them, so exit 1
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr
    assert "more than [run] max_failed_share" in second.stderr, second.stderr
    status = harvest(env, "status", str(run_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    table = squash(status.stdout)
    assert squash(f"harvest run {run_dir}") in table, status.stdout
    for i in range(N):
        assert f"id[bold]{i}[/][client]" in status.stdout, status.stdout
    assert squash(engine_said) in table, status.stdout


def test_the_panel_note_keeps_its_bracketed_setting_names(tmp_path):
    """The note a run that lost its endpoints ends with names ``[client] health_deadline``."""
    folder = hold(tmp_path, create=True)
    progress = Progress(folder, total=3, already_final=0)
    progress.note = "every endpoint stayed down past [client] health_deadline"
    progress.state = "server_down"
    console = Console(file=io.StringIO(), width=130, record=True)
    console.print(run_panel(progress.view(), PhaseBoard(), 120))
    drawn = console.export_text()
    assert "every endpoint stayed down past [client] health_deadline" in drawn, drawn
    assert f"harvest run: {tmp_path}" in drawn
    folder.close()
