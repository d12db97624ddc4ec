"""The real-part gate itself (tests/realparts.py), on the suite's own tests in a child pytest.

A part is hidden with HARVEST_TEST_HIDE (as if it were not installed); with CI=true the child run
fails naming it, without CI it skips, and either way the summary lists it under "real parts that
did not run". Nothing real starts: the gate acts before the browser or the sshd would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.realparts import missing, parts_in, require

ROOT = Path(__file__).resolve().parents[1]
BROWSER = "tests/report/test_report_browser.py"  # gated per test (an autouse fixture)
SSHD = "tests/hosts/test_ssh_faults.py::test_wrong_key_is_one_line_exit_2"  # gated in the sshd fixture


def child(target: str, *, ci: bool, hide: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HARVEST_TEST_HIDE", "PYTEST_ADDOPTS")}
    env["HARVEST_TEST_HIDE"] = hide
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", target],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_ci_fails_naming_a_hidden_chromium():
    out = child(BROWSER, ci=True, hide="chromium")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "real part missing: chromium (hidden by HARVEST_TEST_HIDE)" in text, text[-3000:]
    last = text.splitlines()[-1]
    assert " error" in last and " passed" not in last and "skipped" not in last, last
    assert "real parts that did not run" in text and "chromium: " in text, text[-3000:]
    assert "test_report_browser.py::" in text and "(error)" in text, text[-3000:]


def test_without_ci_a_hidden_chromium_skips_and_is_listed():
    out = child(BROWSER, ci=False, hide="chromium")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    last = text.splitlines()[-1]
    assert "skipped" in last and " passed" not in last and "error" not in last, last
    assert "real part missing: chromium" in text, text[-3000:]
    assert "real parts that did not run" in text and "chromium: " in text, text[-3000:]
    assert "(skipped)" in text, text[-3000:]


def test_ci_fails_naming_a_hidden_sshd_in_a_fixture():
    out = child(SSHD, ci=True, hide="sshd")
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
