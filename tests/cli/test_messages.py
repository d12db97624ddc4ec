"""The messages a newcomer meets, each read as printed: what happened and what to do, in one line.

- an endpoint that refuses connections: the outcome, then "what to do: start the server ..., then
  run `harvest run ...` again" with the same flags;
- every row skipped: the fix, without "raise max_skipped_share" (an all-skipped run always fails);
- one row is "1 row", never "1 rows";
- `harvest export` / `status` / `report` of a folder that does not exist, and `report` of a folder that
  is not a run: the folder named and what to give instead, exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import harvest_process
from tests.engines import free_port


def harvest(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *argv], cwd=cwd, capture_output=True, text=True,
                               timeout=120, stdin=subprocess.DEVNULL, env=env)


def test_a_closed_endpoint_says_what_to_do_and_one_row_is_a_row(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there: connections are refused
    out = harvest("run", "--engine", "openai", "--base-url", url, "--model", "m", "--data", "p.jsonl",
                  "--out", "run", "--set", "client.start_deadline=2", "--no-live", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    said = out.stdout + out.stderr
    assert "refused the connection" in said
    assert ("what to do: start the server (or correct [server] base_url / [client] endpoints), then run "
            f"`harvest run --engine openai --model m --base-url {url} --data p.jsonl --out run --set "
            "client.start_deadline=2` again: the 1 item not finished will resume, no attempt charged") in out.stderr
    assert "input: 1 row, 1 unique, 0 duplicates" in said and "(1 row, 0 duplicates)" in said
    assert "1 rows" not in said
    assert (tmp_path / "run" / "report.html").is_file()  # the report was drawn


def test_every_row_skipped_gives_the_fix_and_no_share_to_raise(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
    out = harvest("run", "--engine", "openai", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "--model", "m",
                  "--data", "bad.jsonl", "--out", "run", "--no-live", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("FAILED:")]
    assert line == ("FAILED: every input row (2) was skipped: nothing was generated; fix [data] (or the rows) and "
                    "run again: the skipped rows are read again"), line
    assert "max_skipped_share" not in out.stderr
    # A file without rows (blank lines only) fails the same way, naming the file, nothing sent.
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    out = harvest("run", "--engine", "openai", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "--model", "m",
                  "--data", "empty.jsonl", "--out", "run-empty", "--no-live", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("FAILED:")]
    assert line == (f"FAILED: the dataset ({tmp_path / 'empty.jsonl'}) has no rows: nothing was generated; point "
                    "[data] path at the rows (or fill the file) and run again"), line
    assert "ids: none (no rows)" in out.stdout + out.stderr and "refused" not in out.stdout + out.stderr


def test_folders_that_do_not_exist_or_are_not_runs_are_named_with_what_to_give(tmp_path):
    for command, extra in (("export", ["--format", "sharegpt"]), ("status", [])):
        out = harvest(command, "nosuch", *extra, cwd=tmp_path)
        assert out.returncode == 2
        assert out.stderr.strip() == (f"error: nosuch does not exist: give a run folder (a job's [output] dir) or "
                                      f"the job file, e.g. `harvest {command} runs/first-job`"), out.stderr
    out = harvest("report", "nosuch", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: nosuch does not exist: give the folder `harvest run`, `tune` or `compare` wrote (a job's "
        "[output] dir)"), out.stderr
    (tmp_path / "notarun").mkdir()
    out = harvest("report", "notarun", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("error: notarun is not a run folder (ledger.sqlite)"), out.stderr
    assert "give the folder `harvest run`, `tune` or `compare` wrote" in out.stderr
    assert "invalid configuration" not in out.stderr
    assert "Traceback" not in out.stderr
