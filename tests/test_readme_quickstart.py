"""The README's quick start as a newcomer runs it, and the rules its opening and its configuration
examples keep.

- The first ten lines: the title, what harvest is, then one code block holding exactly the two
  set-up commands, `make demo` and `make test` (`.ci/run` runs `make test`).

- "A server that is already running" (under "Your first job"): its job file is written as given, with
  only the endpoint URL, the model name and the data path pointed at the shared llama-server and a
  few rows of the test's; every `harvest` command of its shell block then runs as written (through
  ``python -m harvest``), the run finishes every item, and each export holds the statuses it asked
  for (one that would hold none exits 1, as the README says); one of them takes the truncated
  answers too, so the first job ends in a file even when every answer fills `max_tokens`.
- "llama.cpp's llama-server": its job file, with the GGUF file, the binary (`[server] command`), the
  port and the data path pointed at the test's, launches llama-server, finishes every item, stops
  it clean, and the context per slot is the README's (`-c` split between the `--parallel` slots).
- Every ```toml block of the README and of the guides its table links (tests/guides.py) loads with
  harvest's own loader (every table and setting it shows exists), and every comment in those blocks
  is at most two lines: the line it starts on (a setting's trailing comment, a commented-out
  setting, or a comment line after a line without one) plus at most one comment-only line below it.
  Longer explanations belong in prose.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from harvest.config import load_config
from tests import engines
from tests.guides import ROOT, documents

README = Path(__file__).resolve().parents[1] / "README.md"
QUICKSTART = "### A server that is already running\n"
LLAMA = "### llama.cpp's llama-server\n"
ROWS = 6


def quickstart(heading: str = QUICKSTART) -> tuple[str, list[str]]:
    """The section's job file and its `harvest` commands, comments stripped."""
    text = README.read_text()
    start = text.index(heading)
    end = min(i for i in (text.find("\n## ", start), text.find("\n### ", start + 1), len(text)) if i >= 0)
    body = text[start:end]
    (toml,) = re.findall(r"```toml\n(.*?)```", body, re.S)
    commands = [ln.split("#")[0].strip() for block in re.findall(r"```sh\n(.*?)```", body, re.S)
                for ln in block.splitlines() if ln.strip().startswith("harvest ")]
    return toml, commands


def substitute(toml: str, key: str, value: object) -> str:
    """Replace the value of the one `key = ...` line (a string, a list of strings or a number),
    keeping its comment."""
    pattern = re.compile(rf'^{key} = ("[^"]*"|\[[^\]]*\]|\d+)', re.M)
    assert len(pattern.findall(toml)) == 1, f"the README's job has no single `{key} = ...` line"
    return pattern.sub(lambda _: f"{key} = {json.dumps(value)}", toml)


def write_rows(folder: Path) -> Path:
    data = folder / "data" / "prompts.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"prompt": f"What is {i} squared?"}) + "\n" for i in range(ROWS)))
    return data


def harvest(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harvest", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


def test_the_readme_opens_with_what_harvest_is_and_the_two_commands():
    head = README.read_text().splitlines()[:10]
    assert head[0] == "# harvest" and head[2].startswith("harvest "), head
    fences = [i for i, line in enumerate(head) if line.startswith("```")]
    assert len(fences) == 2, head  # the first code block opens and closes within the ten lines
    commands = [line.split("#")[0].strip() for line in head[fences[0] + 1:fences[1]]]
    assert commands == ["make demo", "make test"], commands


def test_ci_runs_the_readmes_two_commands_as_written():
    """`.ci/run` takes its commands from the README's first code block (`.ci/readme-commands`), so
    what CI runs is what a user types; the demo's outcome is checked by scripts/check-demo."""
    root = README.parent
    listed = subprocess.run([str(root / ".ci" / "readme-commands")], capture_output=True, text=True, timeout=30,
                            check=True).stdout.splitlines()
    head = README.read_text().splitlines()[:10]
    fences = [i for i, line in enumerate(head) if line.startswith("```")]
    assert listed == [line.split("#")[0].strip() for line in head[fences[0] + 1:fences[1]]] == ["make demo",
                                                                                                  "make test"]
    ci = (root / ".ci" / "run").read_text()
    assert ".ci/readme-commands" in ci and "scripts/check-demo harvest-demo" in ci
    # never typed out again (`make test-fast`, the developers' loop run against its time budget, is no
    # README command)
    assert "make test" not in ci.replace("make test-fast", "").replace('"make test"', "").replace("`make test`", "")
    assert "make test-fast" in ci


def test_the_quick_start_job_runs_as_written(tmp_path, llama_server):
    toml, commands = quickstart()
    assert 'engine = "openai"' in toml and len(toml.splitlines()) <= 16, toml
    assert [c.split()[:2] for c in commands][:3] == [["harvest", "run"], ["harvest", "status"],
                                                     ["harvest", "export"]], commands
    with urllib.request.urlopen(llama_server.url + "/v1/models", timeout=10) as r:
        model = json.loads(r.read())["data"][0]["id"]
    data = write_rows(tmp_path)
    job = substitute(substitute(substitute(toml, "base_url", llama_server.url + "/v1"), "model", model),
                     "path", str(data))
    assert job.count("\n") == toml.count("\n")
    (tmp_path / "job.toml").write_text(job)
    out_dir = tmp_path / load_config(tmp_path / "job.toml").output.dir

    counts: dict[str, int] = {}
    for command in commands:
        argv = shlex.split(command)[1:]
        res = harvest(argv, tmp_path)
        said = f"{command}\n{res.stdout}\n{res.stderr}"
        if argv[0] != "export":
            assert res.returncode == 0, said
        if argv[0] == "run":
            status = harvest(["status", "job.toml", "--json"], tmp_path)
            assert status.returncode == 0, status.stderr
            doc = json.loads(status.stdout)
            counts = doc["counts"]
            assert counts["done"] + counts["truncated"] == ROWS and doc["totals"]["ok"], doc
            assert counts["failed"] == counts["skipped"] == counts["pending"] == 0, counts
            assert doc["model"] == model, doc
        elif argv[0] == "status":
            assert "truncated" in res.stdout and "done" in res.stdout, said
        elif argv[0] == "export":
            statuses = argv[argv.index("--status") + 1].split(",") if "--status" in argv else ["done"]
            expected = sum(counts[s] for s in statuses)
            exported = out_dir / "export.sharegpt.jsonl"
            if expected:
                assert res.returncode == 0, said
                lines = [json.loads(ln) for ln in exported.read_text().splitlines()]
                assert len(lines) == expected, (statuses, len(lines), counts)
                # a file to use: each line the item's id and its conversation, ending with the answer
                assert all(ln["id"] and ln["conversations"][-1]["role"] == "assistant"
                           for ln in lines), lines[0]
            else:  # the README: an export that would hold no item exits 1 and says what the run holds
                assert res.returncode == 1 and "no item of status done to export" in res.stderr, said
    assert counts, "the quick start's commands never ran `harvest run`"
    assert any("done,truncated" in c for c in commands), commands  # so one export always holds every item


def test_the_llama_server_job_runs_as_written(tmp_path, llama_server_bin, tiny_gguf):
    toml, commands = quickstart(LLAMA)
    assert 'engine = "llamacpp"' in toml and commands == ["harvest run llama-job.toml"], (toml, commands)
    job, port = toml, engines.free_port()
    for key, value in (("model", str(tiny_gguf)), ("command", [llama_server_bin]), ("port", port),
                       ("path", str(write_rows(tmp_path)))):
        job = substitute(job, key, value)
    assert job.count("\n") == toml.count("\n")
    (tmp_path / "llama-job.toml").write_text(job)
    res = harvest(shlex.split(commands[0])[1:], tmp_path)
    said = res.stdout + res.stderr
    assert res.returncode == 0, said
    assert "verified stop: CLEAN" in said, said
    with socket.socket() as s:  # the server harvest launched is gone: its port refuses
        assert s.connect_ex(("127.0.0.1", port)) != 0
    # -c 32768 split between max_running_requests = 8 slots, as the README says
    assert "context: 4096 tokens (n_ctx per slot" in said, said
    status = harvest(["status", "llama-job.toml", "--json"], tmp_path)
    counts = json.loads(status.stdout)["counts"]
    assert counts["done"] + counts["truncated"] == ROWS and counts["failed"] == counts["pending"] == 0, counts


def toml_blocks() -> list[tuple[str, int, str]]:
    """(document, line number in it, text) of every ```toml block of the README and its guides."""
    found = []
    for doc in documents():
        text = doc.read_text()
        found += [(str(doc.relative_to(ROOT)), text[:m.start()].count("\n") + 2, m.group(1))
                  for m in re.finditer(r"```toml\n(.*?)```", text, re.S)]
    return found


#: A comment-only line that is a commented-out setting (`# n = 4  # ...`): it starts its own comment.
COMMENTED_SETTING = re.compile(r"#\s*[A-Za-z_][\w.]*\s*=")


def comments(block: str) -> list[tuple[int, int]]:
    """(first line, number of lines) of each comment in a TOML block."""
    found: list[tuple[int, int]] = []
    previous_had_comment = False
    for i, line in enumerate(block.splitlines()):
        stripped = line.strip()
        only = stripped.startswith("#")
        has = only or " #" in line
        if only and previous_had_comment and not COMMENTED_SETTING.match(stripped):
            first, n = found[-1]
            found[-1] = (first, n + 1)
        elif has:
            found.append((i, 1))
        previous_had_comment = has
    return found


def test_readme_config_comments_are_at_most_two_lines_and_every_block_loads(tmp_path):
    blocks = toml_blocks()
    assert len(blocks) >= 5 and any("[client]" in b and "concurrency" in b for _, _, b in blocks)
    documents_with_jobs = {doc for doc, _, _ in blocks}
    assert {"README.md", "docs/endpoints.md", "docs/remote.md", "docs/ray.md"} <= documents_with_jobs
    long = [(doc, line + first, n) for doc, line, block in blocks for first, n in comments(block) if n > 2]
    assert not long, f"comments over two lines at (document, line, lines) {long}: say it in prose"
    for doc, line, block in blocks:
        path = tmp_path / f"{doc.replace('/', '-')}-{line}.toml"
        path.write_text(block)
        load_config(path)  # raises naming the table and field of a setting harvest does not have


def test_the_comment_rule_counts_continuations():
    block = ('[client]\nconcurrency = "auto"  # one\n                      # two\n# n = 4  # own\n'
             "# three\nport = 1\n# a\n# b\n# c\n")
    assert comments(block) == [(1, 2), (3, 2), (6, 3)]
