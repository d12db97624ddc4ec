"""tests/README.md's table of the README's commands: every `harvest` command the README or a guide
its table links (tests/guides.py) tells a user to type (and `make demo`) has a row, and every test
a row names exists (file and function), so a command whose success path loses its test, or a new
command without one, fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.guides import documents

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Every command the README tells a user to type, and the test of its success path\n"


def table() -> dict[str, str]:
    text = (ROOT / "tests" / "README.md").read_text()
    body = text[text.index(SECTION):]
    body = body[:body.find("\n## ", 1)] if "\n## " in body[1:] else body
    rows = {}
    for line in body.splitlines():
        m = re.match(r"^\| `([^`]+)` \| (.+) \|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_every_readme_command_has_a_row():
    from harvest.cli.main import COMMANDS

    told = "\n".join(doc.read_text() for doc in documents())
    commands = {f"harvest {name}" for name in COMMANDS
                if re.search(rf"(`|^|\$ )harvest {name}\b", told, re.M)}
    assert {"harvest run", "harvest stop", "harvest gpus", "harvest tune", "harvest report"} <= commands, \
        commands
    missing = sorted(commands - set(table()) - {"harvest demo"})  # `make demo` runs `harvest demo`
    assert not missing, f"tests/README.md has no success-path row for {missing}"
    assert "make demo" in table()


def test_every_named_test_exists():
    named = [ref for cell in table().values() for ref in re.findall(r"`(tests/[^`]+\.py)(?:::(\w+))?`", cell)]
    assert len(named) >= 20, named
    for path, func in named:
        source = ROOT / path
        assert source.is_file(), f"tests/README.md names {path}, which does not exist"
        if func:
            defined = {n.name for n in ast.walk(ast.parse(source.read_text()))
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            assert func in defined, f"tests/README.md names {path}::{func}, which does not exist"
