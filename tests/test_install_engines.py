"""scripts/install-engines moves an engine environment built earlier from a slower build of its own
Python version onto the faster one (scripts/pick-python's), keeps it there when the engine's own
check passes on it, and puts it back when the check fails. Driven on SGLang's slot with environments
made here: one whose ``sglang.srt.server_args`` passes the installer's check, one whose import fails.
Where ``python3`` is already the fastest build here, both stay as built and nothing is said."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install-engines"
PASSES = ("import argparse\nclass ServerArgs:\n    @staticmethod\n"
          "    def add_cli_args(parser):\n        parser.add_argument('--model-path')\n")
FAILS = "raise ImportError('this build cannot load it')\n"


def _python3() -> str:
    out = subprocess.run(["python3", "-c", "import os, sys; print(os.path.realpath(sys.executable))"],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def _pick() -> str:
    out = subprocess.run([str(ROOT / "scripts" / "pick-python"), "--json", "--rounds", "10"],
                         capture_output=True, text=True, timeout=120, check=True)
    doc = json.loads(out.stdout)
    return os.path.realpath(next(r["executable"] for r in doc["candidates"] if r["python"] == doc["pick"]))


def _engine_env(root: Path, python: str, module: str) -> Path:
    venv = root / "sglang-0.5.23"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    pkg = site / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(module)
    (venv / ".harvest-ok").touch()
    return venv


def _install(root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["HARVEST_ENGINES"] = str(root)
    return subprocess.run([str(SCRIPT), "sglang"], capture_output=True, text=True, timeout=300, env=env,
                          check=False)


@pytest.mark.parametrize("module, moved", [(PASSES, True), (FAILS, False)], ids=["check-passes", "check-fails"])
def test_an_engine_environment_moves_to_the_faster_build_only_where_its_check_passes(tmp_path, module, moved):
    slow, fast = _python3(), _pick()
    if slow == fast:  # python3 is this machine's fastest build: the environment stays as built, silently
        moved = None
    venv = _engine_env(tmp_path, slow, module)
    out = _install(tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(venv / "bin" / "python")
    now = os.path.realpath(venv / "bin" / "python")
    home = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    ran = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print(sys.prefix)"], capture_output=True,
                         text=True, timeout=60, check=True).stdout.strip()
    assert ran == str(venv)  # still the environment, whichever build runs it
    if moved is None:
        assert now == slow and "runs on" not in out.stderr and "stays on" not in out.stderr, out.stderr
    elif moved:
        assert now == fast and os.path.realpath(home["executable"]) == fast, (now, home)
        assert f"now runs on {fast}" in out.stderr, out.stderr
        # Once moved, a second call leaves it as it is and says nothing of it.
        again = _install(tmp_path)
        assert again.returncode == 0 and "runs on" not in again.stderr, again.stderr
        assert os.path.realpath(venv / "bin" / "python") == fast
    else:
        assert now == slow and os.path.realpath(home["executable"]) == slow, (now, home)
        assert f"stays on {slow}" in out.stderr, out.stderr
        # Put back once: a second call does not try that build again.
        again = _install(tmp_path)
        assert again.returncode == 0 and "stays on" not in again.stderr and "runs on" not in again.stderr, again.stderr
        assert os.path.realpath(venv / "bin" / "python") == slow
