"""Every command's --help: readable text (no raw reST markup, no option it does not have) that
ends with what its exit codes mean."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

from harvest.cli.main import COMMANDS, EXIT_CODES


#: One process prints ``harvest --help`` and every ``harvest COMMAND --help`` through the command
#: group, as ``python -m harvest`` runs it (prog name "harvest", no terminal: click's 80 columns).
HELPS = """
import contextlib, io, json
from harvest.cli.main import COMMANDS, cli
texts = {}
for command in [""] + list(COMMANDS):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main([*command.split(), "--help"], prog_name="harvest", standalone_mode=False)
    texts[command] = (code, out.getvalue())
print(json.dumps(texts))
"""


@functools.cache
def all_helps() -> dict[str, tuple[int, str]]:
    """Every help text, read once for this module's tests (each test only reads them)."""
    out = subprocess.run([sys.executable, "-c", HELPS], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return {name: (code, text) for name, (code, text) in json.loads(out.stdout).items()}


def help_text(command: str = "") -> str:
    code, text = all_helps()[command]
    assert code == 0, text
    return text


def group_help() -> str:
    return help_text()


def test_the_help_is_what_the_command_line_prints():
    """The texts above are the command line's own: ``python -m harvest run --help`` prints the same."""
    out = subprocess.run([sys.executable, "-m", "harvest", "run", "--help"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout == help_text("run")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_ends_with_the_exit_codes(name):
    text = help_text(name)
    tail = " ".join(text.split()[-60:])
    assert "Exit codes: 0" in tail and tail.endswith("."), text
    assert " ".join(EXIT_CODES[name].split()) in " ".join(text.split())
    assert "``" not in text, f"raw reST markup in harvest {name} --help"


def test_every_command_has_its_exit_codes():
    assert set(EXIT_CODES) == set(COMMANDS)


def test_preflight_help_names_only_options_it_has():
    text = help_text("preflight")
    assert "--config" not in text  # CONFIG is its argument; --host replaces the config's [host]


def test_demo_options_are_explained():
    text = " ".join(help_text("demo").split())
    for option in ("--engine-python", "--dir", "--port", "--max-tokens", "--concurrency"):
        after = text.split(option, 1)[1].split(" --", 1)[0]
        assert len(after.split()) > 3, f"{option} has no help: {after!r}"


def test_the_group_help_ends_with_the_shared_exit_codes():
    text = group_help()
    tail = " ".join(text.split()[-40:])
    assert tail.endswith("Exit codes: 0 success; 1 the check or job failed; 2 usage or configuration error; "
                         "130 interrupted. Each command's --help says what they mean for it."), text
    assert all(name in text for name in COMMANDS), text


def test_the_group_help_gives_each_command_a_whole_sentence_and_names_every_engine():
    text = group_help()
    lines = {ln.split()[0]: ln for ln in text.split("Commands:")[1].splitlines() if ln.strip()[:1].isalpha()
             and ln.startswith("  ") and ln.split()[0] in COMMANDS}
    assert set(lines) == set(COMMANDS), text
    for name, line in lines.items():
        summary = line.split(None, 1)[1]
        assert summary.endswith(".") and "..." not in summary, f"harvest {name}: {summary!r}"
        assert summary[0].isupper(), summary
    flat = " ".join(text.split())
    for engine in ("vLLM", "SGLang", "llama.cpp", "transformers serve", "OpenAI-compatible"):
        assert engine in flat, flat


@pytest.mark.parametrize("name", list(COMMANDS))
def test_option_help_is_one_style(name):
    """Option help starts lower case (an acronym such as HTML aside); click's own `--help` line is
    click's."""
    text = help_text(name)
    options = text.split("Options:", 1)[1] if "Options:" in text else ""
    for line in options.splitlines():
        parts = line.strip().split("  ", 1)
        if line.startswith("  -") and len(parts) == 2 and parts[1].strip() and "Show this message" not in parts[1]:
            word = parts[1].strip().split()[0]
            assert not (word[0].isupper() and word[1:2].islower()), f"harvest {name}: {line.strip()!r}"
