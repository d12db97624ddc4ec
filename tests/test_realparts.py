"""The real-part gate itself (tests/realparts.py), on the suite's own tests in a child pytest.

A part is hidden with HARVEST_TEST_HIDE (as if it were not installed); with CI=true the child run
fails naming it, without CI it skips, and either way the summary lists it under "real parts that
did not run". Nothing real starts: the gate acts before the browser or the sshd would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.budget import child_env
from tests.realparts import missing, parts_in, require

ROOT = Path(__file__).resolve().parents[1]
BROWSER = "tests/report/test_report_browser.py"  # gated per test (an autouse fixture)
SSHD = "tests/hosts/test_ssh_faults.py::test_wrong_key_is_one_line_exit_2"  # gated in the sshd fixture


def child(target: str, tmp_path: Path, *, ci: bool, hide: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in child_env().items() if k not in ("CI", "HARVEST_TEST_HIDE", "HARVEST_NO_SKIPS", "PYTEST_ADDOPTS")}
    env["HARVEST_TEST_HIDE"] = hide
    if ci:
        env["CI"] = "true"
    # Its own temporary folder: a child on the shared numbered ones deletes the oldest (a whole
    # earlier suite's, seconds of I/O) before its first test.
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           f"--basetemp={tmp_path / 'child'}", target],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_ci_fails_naming_a_hidden_chromium(tmp_path):
    out = child(BROWSER, tmp_path, ci=True, hide="chromium")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "real part missing: chromium (hidden by HARVEST_TEST_HIDE)" in text, text[-3000:]
    last = text.splitlines()[-1]
    assert " error" in last and " passed" not in last and "skipped" not in last, last
    assert "real parts that did not run" in text and "chromium: " in text, text[-3000:]
    assert "test_report_browser.py::" in text and "(error)" in text, text[-3000:]


def test_without_ci_a_hidden_chromium_skips_and_is_listed(tmp_path):
    out = child(BROWSER, tmp_path, ci=False, hide="chromium")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    last = text.splitlines()[-1]
    assert "skipped" in last and " passed" not in last and "error" not in last, last
    assert "real part missing: chromium" in text, text[-3000:]
    assert "real parts that did not run" in text and "chromium: " in text, text[-3000:]
    assert "(skipped)" in text, text[-3000:]


def test_ci_fails_naming_a_hidden_sshd_in_a_fixture(tmp_path):
    out = child(SSHD, tmp_path, ci=True, hide="sshd")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "1 error" in text.splitlines()[-1], text[-500:]
    assert "real part missing: sshd (hidden by HARVEST_TEST_HIDE)" in text, text[-3000:]
    assert "sshd: 1 test(s)" in text and "test_wrong_key_is_one_line_exit_2 (error)" in text, text[-3000:]


def test_present_parts_pass_the_gate_and_unknown_findings_are_reported(monkeypatch):
    monkeypatch.delenv("HARVEST_TEST_HIDE", raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert missing("root") is None or os.geteuid() != 0
    monkeypatch.setenv("HARVEST_TEST_HIDE", "tmux, ray")
    assert missing("tmux") == missing("ray") == "hidden by HARVEST_TEST_HIDE"
    with pytest.raises(pytest.skip.Exception) as skipped:
        require("tmpfs", "a small disk", absent="mount refused: permission denied")
    assert parts_in(str(skipped.value)) == [("tmpfs", "mount refused: permission denied")]
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as failed:
        require("tmux", "a real terminal")
    assert parts_in(str(failed.value)) == [("tmux", "hidden by HARVEST_TEST_HIDE")]


#: What skips a test: pytest's own skip calls and markers, and an import that skips when it fails.
SKIP_FORMS = ("importorskip", "skipif", "pytest.skip(", "mark.skip(", "mark.skip\n", "unittest.skip")


def skips_outside_the_gate(tests_root: Path) -> list[str]:
    """``file:line: text`` of every skip under ``tests_root`` that is not the real-part gate's
    (``tests/realparts.py``) or a GPU test's (the conftest's ``gpu`` marker, and a test module that
    carries the marker): under CI=true nothing else may skip."""
    found = []
    for path in sorted(tests_root.rglob("*.py")):
        rel = path.relative_to(tests_root.parent).as_posix()
        text = path.read_text(errors="replace")
        if rel == "tests/realparts.py" or re.search(r"^pytestmark = pytest\.mark\.gpu$", text, re.M):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            if rel == "tests/conftest.py" and "needs an NVIDIA GPU" in line:
                continue  # the gpu marker's skip: no CI machine has an NVIDIA GPU
            if any(form in code + "\n" for form in SKIP_FORMS) and "SKIP_FORMS" not in code:
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_no_skip_anywhere_under_tests_but_the_gate_and_the_gpu_tests():
    found = skips_outside_the_gate(Path(__file__).resolve().parent)
    assert found == [], "skips that bypass tests/realparts.py (use require(part, reason)):\n" + "\n".join(found)


def test_the_skip_finder_finds_each_form(tmp_path):
    sk = "pytest." + "skip"  # spelled apart so that this file holds none of the forms it looks for
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "realparts.py").write_text(f"{sk}(message)\n")  # the gate itself
    (tests / "test_gpu_thing.py").write_text(f"pytestmark = pytest.mark.gpu\n{sk}('busy GPU')\n")
    (tests / "test_a.py").write_text(f"x = {sk[:7]}importor{sk[7:]}('ray')\n@pytest.mark.{sk[7:]}if(True, reason='r')\n"
                                     f"def f():\n    {sk}('no')  # a comment\n# {sk}( in a comment\n")
    assert skips_outside_the_gate(tests) == [
        f"tests/test_a.py:1: x = {sk[:7]}importor{sk[7:]}('ray')",
        f"tests/test_a.py:2: @pytest.mark.{sk[7:]}if(True, reason='r')",
        f"tests/test_a.py:4: {sk}('no')  # a comment",
    ]
