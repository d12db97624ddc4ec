"""The tests' own engine launcher: what a stopped test run leaves behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from tests.budget import child_env
from tests.engines import ROOT

NESTED = '''
import os
import sys
import time
from pathlib import Path

from tests import engines


def test_holds_an_engine(tmp_path):
    port = engines.free_port()
    engine = engines.start_engine([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                                  port=port, model="none", log_path=tmp_path / "engine.log", health="/",
                                  timeout=60.0)
    Path(os.environ["ENGINE_PIDFILE"]).write_text(f"{engine.proc.pid} {engine.create_time}")
    time.sleep(120)
'''


def _alive(pid: int, create_time: float) -> bool:
    try:
        p = psutil.Process(pid)
        return p.create_time() == create_time and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_test_run_stopped_by_sigterm_stops_the_engines_it_started(tmp_path: Path) -> None:
    """A pytest run ended by SIGTERM (a runner's timeout) used to leave its vLLM servers running,
    in the sessions of their own they were started in. Now the run stops them first, each by the
    group recorded at launch, and still dies of the SIGTERM."""
    (tmp_path / "test_nested.py").write_text(textwrap.dedent(NESTED))
    pidfile = tmp_path / "engine.pid"
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
                            "-q", "-s", f"--basetemp={tmp_path / 'child'}", str(tmp_path / "test_nested.py")],
                           cwd=ROOT, env=child_env(ENGINE_PIDFILE=str(pidfile)),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    engine: tuple[int, float] | None = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not pidfile.exists() and run.poll() is None:
            time.sleep(0.2)
        assert pidfile.exists(), run.communicate(timeout=30)[0].decode(errors="replace")[-3000:]
        pid, created = pidfile.read_text().split()
        engine = (int(pid), float(created))
        assert _alive(*engine), "the engine was not running"
        os.kill(run.pid, signal.SIGTERM)
        out = run.communicate(timeout=60)[0].decode(errors="replace")
        assert run.returncode == -signal.SIGTERM, (run.returncode, out[-3000:])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(*engine):
            time.sleep(0.1)
        assert not _alive(*engine), "the engine outlived the test run that started it"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)  # the nested run's own session, recorded at launch
            run.wait(timeout=30)
        if engine is not None and _alive(*engine):
            os.killpg(engine[0], signal.SIGKILL)  # its group, checked by create time just above
