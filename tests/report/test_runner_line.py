"""The report ``harvest run`` writes as it ends does not call its own process "alive": it says the
run that wrote the page ended, with the state it recorded; read later by ``harvest report``, the
runner is measured as before. Against bench/sim_engine.py on loopback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import harvest
from harvest.report import render_report
from tests import harvest_process
from tests.engines import sim_engine


def test_the_runner_line_of_the_report_a_run_writes_as_it_ends(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(3)))
    with sim_engine("--output-tokens", "2") as url:
        run = harvest.run(engine="openai", base_url=url + "/v1", model="sim-model", data=data, out=tmp_path / "run",
                          max_tokens=4)
    assert run.ok
    page, _ = render_report(tmp_path / "run")  # this process ran it: as `harvest run` writes its report
    assert f"pid {os.getpid()}: the harvest run that wrote this page as it ended (finished)" in page, \
        re.findall(r"runner.{0,200}", page)
    later = harvest_process.run([sys.executable, "-m", "harvest", "report", str(tmp_path / "run")], capture_output=True,
                                text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert later.returncode == 0, later.stderr
    text = (tmp_path / "run" / "report.html").read_text()
    assert "that wrote this page" not in text and f"pid {os.getpid()}" in text  # measured by another process
