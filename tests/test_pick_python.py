"""scripts/pick-python: the interpreter .venv is built from (the Makefile's install step) is the
fastest measured build of ``python3``'s own major.minor, and ``python3`` where nothing beats it by
the margin."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "pick-python"


def _script():
    loader = importlib.machinery.SourceFileLoader("pick_python_script", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def _row(name, version, ms, usable=True):
    return {"python": name, "version": version, "ms": ms, "usable": usable}


def test_the_fastest_usable_build_of_the_same_version_is_chosen():
    choose = _script().choose
    base = _row("python3", [3, 11, 7], 7.5)
    rows = [base,
            _row("/usr/bin/python3.12", [3, 12, 3], 2.0),                 # another version: other wheels
            _row("/opt/py/python3.11", [3, 11, 9], 3.0, usable="No module named 'ensurepip'"),
            _row("/usr/bin/python3.11", [3, 11, 2], 4.6),
            _row("/usr/local/bin/python3.11", [3, 11, 4], 5.9)]
    assert choose(rows)["python"] == "/usr/bin/python3.11"


def test_python3_is_kept_when_nothing_beats_it_by_the_margin():
    mod = _script()
    base = _row("python3", [3, 11, 7], 5.0)
    close = _row("/usr/bin/python3.11", [3, 11, 2], 5.0 * (1 - mod.MARGIN / 2))
    assert mod.choose([base, close]) is base
    assert mod.choose([base]) is base


def test_the_script_picks_a_usable_build_of_python3s_version_here():
    python3 = shutil.which("python3")
    assert python3 is not None, "python3 is not on PATH"
    out = subprocess.run([str(SCRIPT), "--json", "--rounds", "5"], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = doc["candidates"]
    ran = subprocess.run([python3, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert os.path.realpath(rows[0]["executable"]) == os.path.realpath(ran), rows  # python3 comes first
    pick = next(r for r in rows if r["python"] == doc["pick"])
    assert pick["version"][:2] == rows[0]["version"][:2] and pick["usable"] is True, pick
    assert os.access(doc["pick"], os.X_OK)
    # No candidate twice: each build is measured once (a pyenv shim is not a build).
    real = [os.path.realpath(r["executable"]) for r in rows]
    assert len(real) == len(set(real)), rows
