"""The architecture of docs/architecture.md ("Who may import whom", "The placement seam"), checked
on every run of the suite rather than by eye.

- import-linter's contracts (.importlinter): the layers from cli down to config/errors/net, the
  placement kinds independent of each other, Ray imported only inside its kind;
- no import cycle between modules (every import statement counts, lazy ones inside functions too);
- only the placement layer decides where servers run: no other module tests ``cluster``,
  ``far_hosts()``, a placement record file, the type of a server object or a placement's kind, or
  asks a server or fleet what it has (``getattr`` / ``hasattr``): the Fleet and Placement ABCs
  have every verb, with a default where only one kind can do it;
- sizes (STYLE.md): no module over 600 lines, no function over 80.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "harvest"


def test_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.fail(f"lint-imports is not installed beside {sys.executable}: pip install -e '.[test]'")
    res = subprocess.run([str(lint), "--config", str(ROOT / ".importlinter")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout, res.stdout[-2000:]


def test_no_contract_is_waived():
    """An arrow that breaks a layer is fixed by moving code to the right layer, not listed as an
    exception: the contracts carry no ignore_imports."""
    text = (ROOT / ".importlinter").read_text()
    assert not re.search(r"^\s*ignore_imports\s*=", text, flags=re.M), "ignore_imports in .importlinter"


def _graph() -> dict[str, set[str]]:
    """Module -> the harvest modules it imports (any import statement, resolved to a module file)."""
    mods = {}
    for f in SRC.rglob("*.py"):
        rel = f.relative_to(SRC.parent).with_suffix("")
        mods[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = f

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        pkg = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - (node.level - 1)] + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                r = resolve(t)
                # a package's __init__ importing its own submodules (or a module its package) is no cycle
                if r and r != m and not m.startswith(r + ".") and not r.startswith(m + "."):
                    graph[m].add(r)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles():
    graph = _graph()
    assert len(graph) > 50  # the walk found the package
    assert _cycles(graph) == []


def test_cycle_check_sees_a_cycle():
    """The checker itself: a two-module cycle is found (so an empty answer above means something)."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


#: What deciding "where" looks like: the tests the placement layer makes once.
WHERE = [
    (re.compile(r"\.cluster\b(?!\.)|\bcluster is (not )?None"), "tests [cluster]"),
    (re.compile(r"\bfar_hosts\b"), "tests far_hosts()"),
    (re.compile(r"placement\.json|remote\.json|ray\.json|RAY_RECORD|REMOTE_RECORD"), "reads a placement record"),
    (re.compile(r"isinstance\([^)]*(RemoteServer|ServerGroup|RayServerGroup|Server)\b"), "tests a server's type"),
    (re.compile(r"^\s*(import ray\b|from ray\b)", re.M), "imports Ray"),
    (re.compile(r"\bplacement\w*\.kind\s*[!=]=|\bkind\s*[!=]=\s*[\"'](local|ssh|ray)[\"']"), "tests a placement's kind"),
    (re.compile(r"\b(getattr|hasattr)\(\s*(self\.)?(server|fleet|inner|group|placement)\w*\s*,"),
     "probes a server or fleet"),
]
#: Where what the tests above look for is defined: the config models (a whole file's ``cluster``
#: table and ``far_hosts()`` in ``config/file.py``; fields read by name in their own validators).
DEFINES = ("config/",)


def where_decisions(root: Path) -> list[str]:
    found = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        if rel.parts[0] == "placement" or str(rel).startswith(DEFINES):
            continue
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            for pattern, what in WHERE:
                if pattern.search(code):
                    found.append(f"{rel}:{n}: {what}: {line.strip()}")
    return found


def test_only_the_placement_layer_decides_where():
    assert where_decisions(SRC) == []


def test_where_check_sees_a_decision(tmp_path):
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "x.py").write_text("if cfg.cluster is not None:\n    hosts = cfg.far_hosts()\n")
    (tmp_path / "placement").mkdir()
    (tmp_path / "placement" / "y.py").write_text("if cfg.cluster is not None:\n    pass\n")
    found = where_decisions(tmp_path)
    assert [f.split(": ")[1] for f in found] == ["tests [cluster]", "tests far_hosts()"], found


@pytest.mark.parametrize(("line", "what"), [
    ('if placement.kind != "local":', "tests a placement's kind"),
    ("if self.placement.kind == 'ray':", "tests a placement's kind"),
    ('factory, note, kind = pick(cand)\nif kind == "local":', "tests a placement's kind"),
    ('attach = getattr(self.server, "attach_client", None)', "probes a server or fleet"),
    ('if hasattr(fleet, "detach"):', "probes a server or fleet"),
    ('n = getattr(server, "replacements", 0)', "probes a server or fleet"),
])
def test_where_check_sees_a_kind_test_and_a_probe(tmp_path, line, what):
    """A kind test or a probe of what a server has, outside placement/, is a finding; the same
    line inside placement/ is not, and neither are tests of other kinds (an event's, a rule's)."""
    (tmp_path / "campaign").mkdir()
    (tmp_path / "campaign" / "x.py").write_text(line + "\n")
    (tmp_path / "placement").mkdir()
    (tmp_path / "placement" / "y.py").write_text(line + "\n")
    (tmp_path / "campaign" / "z.py").write_text('if event.kind == "start":\n    x = getattr(r, "rule", None)\n')
    assert [f.split(": ")[1] for f in where_decisions(tmp_path)] == [what]


#: STYLE.md: a module past ~600 lines is two modules; a function a newcomer reads top to bottom
#: is split into named steps before it passes 80 lines.
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def oversized(root: Path) -> list[str]:
    """``file:line`` of every module under ``root`` over MAX_MODULE_LINES lines and of every function
    (``def`` or ``async def``: methods and nested functions too) over MAX_FUNCTION_LINES, counted from
    its ``def`` line to its last line; methods named with their class (``Session.run``)."""
    found = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        text = f.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{rel}:1: module of {lines} lines (at most {MAX_MODULE_LINES})")

        def visit(node: ast.AST, scope: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{scope}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        size = (child.end_lineno or child.lineno) - child.lineno + 1
                        if size > MAX_FUNCTION_LINES:
                            found.append(f"{rel}:{child.lineno}: {name} is {size} lines (at most "
                                         f"{MAX_FUNCTION_LINES})")
                    visit(child, f"{name}.")
                else:
                    visit(child, scope)

        visit(ast.parse(text, filename=str(f)), "")
    return found


def test_no_module_or_function_is_too_long():
    found = oversized(SRC)
    assert found == [], "over the sizes of STYLE.md (paths under src/harvest/):\n" + "\n".join(found)


def test_size_check_sees_an_offender(tmp_path):
    """The checker itself: a module one line over, a function, a method and a nested async function
    one line over are each named with file:line; a module and a function at the limits are not."""
    def func(header: str, n: int, indent: str = "") -> str:  # ``header`` and n - 1 lines below it
        return f"{indent}{header}\n" + "".join(f"{indent}    x{i} = {i}\n" for i in range(n - 1))

    over, limit = MAX_FUNCTION_LINES + 1, f"(at most {MAX_FUNCTION_LINES})"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "pkg" / "edge.py").write_text("x = 1\n" * (MAX_MODULE_LINES - MAX_FUNCTION_LINES)
                                              + func("def fits():", MAX_FUNCTION_LINES))
    (tmp_path / "funcs.py").write_text(func("def long():", over)
                                       + "class Job:\n" + func("def run(self):", over, "    ")
                                       + "def outer():\n" + func("async def inner():", over, "    ")
                                       + "    return inner\n")
    run_at = over + 2  # after long() and the class line
    outer_at = run_at + over
    assert oversized(tmp_path) == [
        f"funcs.py:1: long is {over} lines {limit}",
        f"funcs.py:{run_at}: Job.run is {over} lines {limit}",
        f"funcs.py:{outer_at}: outer is {over + 2} lines {limit}",
        f"funcs.py:{outer_at + 1}: outer.inner is {over} lines {limit}",
        f"pkg/big.py:1: module of {MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES})",
    ]
