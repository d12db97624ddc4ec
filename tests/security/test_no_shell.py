"""R6: no command line goes through a shell. An AST scan of every Python file of the repository
(product, benchmarks, scripts, tests) for calls that would hand a string to /bin/sh: any call with
``shell=`` other than a literal False, and the shell-only helpers (``os.system``, ``os.popen``,
``subprocess.getoutput``/``getstatusoutput``, ``asyncio.create_subprocess_shell``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = {".venv", "venv", ".git", "build", "dist", "node_modules", "__pycache__"}
SHELL_HELPERS = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"),
                 ("subprocess", "getstatusoutput"), ("asyncio", "create_subprocess_shell")}


def python_files() -> list[Path]:
    out = []
    for p in ROOT.rglob("*.py"):
        rel = p.relative_to(ROOT)
        if not SKIP.intersection(rel.parts) and not any(part.endswith(".egg-info") for part in rel.parts):
            out.append(p)
    return sorted(out)


def shell_calls(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                found.append((node.lineno, f"shell={ast.unparse(kw.value)}"))
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if (func.value.id, func.attr) in SHELL_HELPERS:
                found.append((node.lineno, f"{func.value.id}.{func.attr}()"))
    return found


def test_the_scan_finds_what_it_looks_for():
    sample = ("import os, subprocess\nsubprocess.run(cmd, shell=True)\nsubprocess.Popen(c, shell=flag)\n"
              "os.system('ls')\nsubprocess.run(['ls'], shell=False)\n")
    assert [line for line, _ in shell_calls(ast.parse(sample))] == [2, 3, 4]


def test_no_call_goes_through_a_shell():
    files = python_files()
    assert any(p.relative_to(ROOT).parts[:2] == ("src", "harvest") for p in files)
    offenders = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        offenders += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in shell_calls(tree)]
    assert offenders == []
