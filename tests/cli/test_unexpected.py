"""An error harvest did not mean to raise reaches the console through one handler, its traceback
with every secret hidden: the command's, an uncaught one's (main thread or another), a logged one's."""

from __future__ import annotations

import logging
import subprocess
import sys

from click.testing import CliRunner

from harvest.cli.live import ShownFilter
from harvest.cli.main import cli

KEY = "sk-live-0123456789abcdef"
URL = f"http://127.0.0.1:9/v1/models?api_key={KEY}"


def test_a_bug_in_a_command_prints_its_traceback_with_the_key_hidden_and_exits_1(tmp_path, monkeypatch):
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"cannot connect to {URL}")

    monkeypatch.setattr("harvest.api.status", broken)
    (tmp_path / "ledger.sqlite").write_text("")
    result = CliRunner().invoke(cli, ["status", str(tmp_path)])
    shown = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code == 1, shown
    assert KEY not in shown and "api_key=***" in shown
    assert "Traceback" in shown and "error: unexpected RuntimeError (a bug in harvest" in shown


def test_an_uncaught_exception_in_the_process_or_a_thread_hides_the_key():
    code = ("import threading; from harvest.cli.main import _hide_secrets_in_uncaught; _hide_secrets_in_uncaught(); "
            f"t = threading.Thread(target=lambda: 1 / 0 if False else (_ for _ in ()).throw(OSError({URL!r}))); "
            f"t.start(); t.join(); raise ValueError({URL!r})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert KEY not in done.stderr and done.stderr.count("api_key=***") >= 2, done.stderr
    assert "OSError" in done.stderr and "ValueError" in done.stderr


def test_a_logged_traceback_is_shown_with_the_key_hidden():
    try:
        raise ConnectionError(f"lost {URL}")
    except ConnectionError:
        record = logging.LogRecord("harvest", logging.ERROR, __file__, 1, "while asking %s", (URL,), sys.exc_info())
    assert ShownFilter().filter(record)
    text = logging.Formatter("%(message)s").format(record)
    assert KEY not in text and text.count("api_key=***") == 2 and "ConnectionError" in text
