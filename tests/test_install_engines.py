"""scripts/install-engines moves an engine environment built earlier from a slower build of its own
Python version onto the faster one (scripts/pick-python's), keeps it there when the engine's own
check passes on it, and puts it back when the check fails. Driven on SGLang's slot with environments
made here: one whose ``sglang.srt.server_args`` passes the installer's check, one whose import fails.
Where ``python3`` is already the fastest build here, both stay as built and nothing is said; where
another build is clearly faster, the installer must have tried it."""

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


def _clearly_faster(slow: str) -> bool:
    """Whether a build of ``slow``'s version here is faster by far more than pick-python's margin and
    its noise (x0.8 of the probe's CPU), so the installer must choose it; between builds close to each
    other either choice is right."""
    out = subprocess.run([str(ROOT / "scripts" / "pick-python"), "--json", "--rounds", "20"],
                         capture_output=True, text=True, timeout=120, check=True)
    rows = json.loads(out.stdout)["candidates"]
    base = rows[0]
    assert os.path.realpath(base["executable"]) == slow, rows
    return any(r["usable"] is True and r["version"][:2] == base["version"][:2] and r["ms"] < 0.8 * base["ms"]
               for r in rows[1:])


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


@pytest.mark.parametrize("module, passes", [(PASSES, True), (FAILS, False)], ids=["check-passes", "check-fails"])
def test_an_engine_environment_moves_to_a_faster_build_only_where_its_check_passes(tmp_path, module, passes):
    slow = _python3()
    venv = _engine_env(tmp_path, slow, module)
    out = _install(tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(venv / "bin" / "python")
    now = os.path.realpath(venv / "bin" / "python")
    home = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    ran = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print(sys.prefix, *sys.version_info[:2])"],
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    built = subprocess.run([slow, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True,
                           timeout=60, check=True).stdout.split()
    assert ran == [str(venv), *built]  # still the environment and its version, whichever build runs it
    assert os.path.realpath(home["executable"]) == now, (now, home)
    tried = "stays on" in out.stderr or "runs on" in out.stderr
    if passes and now != slow:
        assert f"now runs on {now} (built on {slow})" in out.stderr, out.stderr
    elif passes:
        assert not tried, out.stderr  # nothing faster chosen here: left as built, silently
    else:
        assert now == slow, (now, home)
        assert not tried or f"stays on {slow}" in out.stderr, out.stderr
    if _clearly_faster(slow):  # then the installer had a faster build to try, and tried it
        assert tried and (now != slow) == passes, out.stderr
    # Decided once: a second call leaves it as it is and says nothing.
    again = _install(tmp_path)
    assert again.returncode == 0 and "stays on" not in again.stderr and "runs on" not in again.stderr, again.stderr
    assert os.path.realpath(venv / "bin" / "python") == now
