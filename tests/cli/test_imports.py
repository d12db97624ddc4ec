"""What a command imports before it runs: the commands that launch, stop, list or probe servers
(``serve``, ``stop``, ``ps``, ``preflight``, ``gpus``) do not pay for the client's HTTP stack
(aiohttp, the client core, prometheus_client), which only talking to an endpoint needs. The suite
starts these commands hundreds of times, and a far ``harvest ps --json`` runs over SSH on every look."""

from __future__ import annotations

import json
import subprocess
import sys

from harvest.cli.main import COMMANDS

LIGHT = ("serve", "stop", "ps", "preflight", "gpus")
HEAVY = ("aiohttp", "harvest.client.core", "harvest.transport", "prometheus_client")


def test_commands_that_handle_servers_do_not_import_the_http_client():
    modules = sorted({COMMANDS[name][0] for name in LIGHT})
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(json.dumps([h for h in {list(HEAVY)!r} if h in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [], f"{modules} import {out.stdout.strip()}"


def test_the_client_package_still_gives_every_name_it_lists():
    import harvest.client as client

    for name in client.__all__:
        assert getattr(client, name) is not None, name
    assert client.Client.__module__ == "harvest.client.core"


def _imported(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_commands_that_read_a_run_folder_do_not_import_numpy():
    """``status``, ``export``, ``report`` and ``stop RUN_DIR`` read a run folder: numpy (the timeline's
    binning, logprob records, the report's figures) loads only where one of those is made."""
    modules = ["harvest.cli.status", "harvest.cli.export", "harvest.cli.report", "harvest.cli.stoprun"]
    heavy = ("numpy", "harvest.campaign.run.session")
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(json.dumps([h for h in {heavy!r} if h in sys.modules]))")
    assert _imported(code) == [], modules


def test_the_package_top_loads_its_names_on_first_use():
    """``import harvest`` (which every ``harvest.<module>`` import runs first) loads no config model
    (pydantic); each name the top offers still resolves to the class it names."""
    code = ("import json, sys\nimport harvest\n"
            "before = [h for h in ('pydantic', 'harvest.config') if h in sys.modules]\n"
            "got = {n: getattr(harvest, n).__module__ for n in harvest.__all__ if n not in ('__version__',)}\n"
            "print(json.dumps([before, got, 'ClientConfig' in dir(harvest)]))")
    before, got, listed = _imported(code)
    assert before == []
    assert got["ClientConfig"] == "harvest.config.job" and got["StopError"] == "harvest.errors", got
    assert got["run"] == "harvest" and listed
