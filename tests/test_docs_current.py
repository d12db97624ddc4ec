"""The documents tell the current state: BENCHMARKS.md holds the latest figure of each target in at
most 500 lines (history in docs/bench-results/), docs/architecture.md exists and is cited where
the layering is enforced, no tracked file outside the raw results names how the work was
organised (numbered rounds of work, tracker numbers) instead of what the code does, and the
live panel of docs/live-display.md is the one the terminal test last captured."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from harvest.cli.live import PANEL_WIDTH

ROOT = Path(__file__).resolve().parents[1]
#: Raw outputs keep what they recorded, dates and all.
RAW = ("docs/bench-results/", "docs/gpu-results/")
#: The word "session" or "issue" followed by a number: words about the work, not about harvest.
#: (harvest's own sessions of a run, "this session", "a session's items", are not numbered.)
WORK_WORDS = re.compile(r"\b(?:session|issue)s? ?#?\d+\b", re.IGNORECASE)


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    return [f for f in out.stdout.splitlines() if not f.startswith(RAW)]


def test_benchmarks_is_the_current_state_in_at_most_500_lines():
    lines = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 500, f"BENCHMARKS.md has {len(lines)} lines; history goes to docs/bench-results/"


def test_architecture_is_written_and_cited_where_the_layers_are_enforced():
    assert (ROOT / "docs" / "architecture.md").is_file()
    for citing in (".importlinter", "tests/test_architecture.py"):
        assert "docs/architecture.md" in (ROOT / citing).read_text(encoding="utf-8"), citing


def test_no_tracked_file_names_rounds_of_work():
    found = []
    for name in tracked():
        path = ROOT / name
        if not path.is_file() or path.suffix in (".png", ".pdf", ".gguf", ".parquet", ".sqlite"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if WORK_WORDS.search(line):
                found.append(f"{name}:{n}: {line.strip()[:120]}")
    assert found == [], "say what the code does and which measurement pins it:\n" + "\n".join(found)


def test_the_pattern_finds_the_words_it_is_for():
    word, other = "Sess" + "ion", "iss" + "ue"  # spelled apart so this file names no round itself
    assert WORK_WORDS.search(f"as measured in {word} 8") and WORK_WORDS.search(f"see {other} #41")
    assert not WORK_WORDS.search("this session's work") and not WORK_WORDS.search("a session of the run")


def test_the_guide_shows_the_live_panel_as_the_terminal_test_captured_it():
    """docs/live-display.txt is written by tests/cli/test_live_terminal.py (run it with
    HARVEST_UPDATE_DOCS=1); the screen of docs/live-display.md is its generating screen, verbatim,
    and neither holds a path of the machine it was captured on."""
    guide = (ROOT / "docs" / "live-display.md").read_text(encoding="utf-8")
    capture = (ROOT / "docs" / "live-display.txt").read_text(encoding="utf-8")
    assert capture.startswith("while the server launches:\n\n") and "\n\n\nwhile it generates:\n\n" in capture
    generating = capture.split("while it generates:\n\n", 1)[1]
    mention = ("(tmux, 130 columns; `tests/cli/test_live_terminal.py`, kept in\n"
               "[live-display.txt](live-display.txt)):")
    assert mention in guide, "docs/live-display.md no longer says where its screen comes from"
    shown = guide.split(mention, 1)[1].split("```text\n", 1)[1].split("```\n", 1)[0]
    assert shown == generating, "docs/live-display.md's screen is not docs/live-display.txt's: copy it"
    frames = [line for line in capture.splitlines() if line.startswith(("╭", "│", "╰"))]
    assert frames and {len(line) for line in frames} == {PANEL_WIDTH}, "a frame of the capture is not whole"
    assert "▶ launching" in capture and "log: " in capture and "▶ generating" in capture
    for local in ("/root/", "/home/", "/tmp/", ".cache/"):
        assert local not in capture, f"the capture names a path of the machine it ran on ({local})"
