"""STYLE.md "State in one place, steps as collaborators": no class under ``src/harvest/campaign`` is
built from several of the project's own classes (mixins sharing state). Read from the source (a
base named by a class of the same module or by a name imported from ``harvest``), and checked once
more on the imported classes themselves."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import harvest.campaign

SRC = Path(__file__).resolve().parents[2] / "src" / "harvest"
CAMPAIGN = SRC / "campaign"


def _own_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names bound in the module to the project's own classes or modules: the classes it defines,
    the names it imports from ``harvest`` (or relatively), and the aliases of ``harvest`` modules."""
    names = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] == "harvest"):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "harvest":
                    modules.add(a.asname or a.name.split(".")[0])
    return names, modules


def _root(expr: ast.expr) -> str | None:
    """The first name of a base written ``Name``, ``a.b.Name`` or ``Name[...]``."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def mixed(root: Path) -> list[str]:
    """``file:line: Class(bases)`` of every class under ``root`` with more than one base of the project's own."""
    found = []
    for f in sorted(root.rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        names, modules = _own_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            own = []
            for base in node.bases:
                name = _root(base)
                if (isinstance(base, ast.Name) and name in names) or (
                        isinstance(base, ast.Attribute) and name in modules):
                    own.append(ast.unparse(base))
            if len(own) > 1:
                found.append(f"{f.relative_to(root)}:{node.lineno}: {node.name}({', '.join(own)})")
    return found


def test_no_campaign_class_has_several_bases_of_the_projects_own():
    assert mixed(CAMPAIGN) == []


def test_no_imported_campaign_class_has_several_bases_of_the_projects_own():
    """The same on the classes as Python made them (an alias or a re-export the source walk could miss)."""
    found, seen = [], 0
    for info in pkgutil.walk_packages(harvest.campaign.__path__, "harvest.campaign."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            seen += 1
            own = [b.__qualname__ for b in cls.__bases__ if b.__module__.split(".")[0] == "harvest"]
            if len(own) > 1:
                found.append(f"{cls.__module__}.{cls.__qualname__}({', '.join(own)})")
    assert seen > 20  # the walk found the campaign's classes
    assert found == []


def test_the_shape_check_sees_a_class_of_two_own_bases(tmp_path):
    """The checker itself: two bases of the project's own (imported, a module's attribute, or defined
    beside) are named with file:line; one own base beside others (a Generic, a stdlib class) is not."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "steps.py").write_text(
        "from typing import Generic, TypeVar\n"
        "from harvest.campaign.run.intake import Intake\n"
        "from harvest.campaign.run.supervise import Supervision as Sup\n"
        "import harvest.campaign.run.dispatch as dispatch\n"
        "T = TypeVar('T')\n"
        "class Mixed(Intake, Sup):\n    pass\n"
        "class Fine(Intake, Generic[T], Exception):\n    pass\n"
        "class Also(dispatch.Dispatch, Intake):\n    pass\n")
    (tmp_path / "local.py").write_text(
        "class A:\n    pass\n"
        "class B(A):\n    pass\n"
        "class C(A, B):\n    pass\n"
        "from .steps import Fine\n"
        "class D(Fine, dict):\n    pass\n")
    assert mixed(tmp_path) == [
        "local.py:5: C(A, B)",
        "run/steps.py:6: Mixed(Intake, Sup)",
        "run/steps.py:10: Also(dispatch.Dispatch, Intake)",
    ]


#: The run state's fields (``campaign/run/state.py``) and the one module of ``campaign/run`` that
#: changes each: the outcome and the rest the steps share through RunState's own methods. A change
#: is a write through a name ``state`` or an attribute ``.state`` (``self.state.fleet = ...``).
WRITERS = {"outcome": "state.py", "note": "state.py", "trip": "state.py", "moved": "state.py",
           "stop_reports": "state.py", "stop_requested": "state.py", "fleet": "supervise.py",
           "relaunches": "supervise.py", "requeued": "intake.py", "model": "connect.py",
           "resumed": "session.py", "timeline": "session.py", "on_event": "session.py",
           "folder": "session.py"}
def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        out: list[ast.expr] = []
        for t in node.targets:
            out.extend(t.elts if isinstance(t, ast.Tuple) else [t])
        return out
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)  # state.stop_reports.append(...)
            and node.func.attr in ("append", "extend", "clear", "set")):
        return [node.func.value]
    return []


def stray_writes(root: Path) -> list[str]:
    """``file:line: field`` of every change of a run-state field outside the module that owns it."""
    found: list[tuple[Path, int, int, str]] = []
    for f in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), filename=str(f))):
            for target in _targets(node):
                if not isinstance(target, ast.Attribute) or target.attr not in WRITERS:
                    continue
                owner = target.value
                if not ((isinstance(owner, ast.Name) and owner.id == "state")
                        or (isinstance(owner, ast.Attribute) and owner.attr == "state")):
                    continue  # another object's field of the same name (the breaker's trip, the display's note)
                if f.name != WRITERS[target.attr]:
                    found.append((f.relative_to(root), node.lineno, target.col_offset, target.attr))
    return [f"{f}:{line}: {attr}" for f, line, _, attr in sorted(found)]


def test_each_change_of_the_run_state_is_made_in_one_module():
    assert stray_writes(CAMPAIGN / "run") == []


def test_the_state_check_sees_a_stray_write(tmp_path):
    """A step that sets the outcome or the note itself, appends a stop report or sets the fleet
    outside supervise.py is named; the display's own ``progress.note`` and the owner's writes are not."""
    (tmp_path / "dispatch.py").write_text(
        "def react(state, progress):\n"
        "    state.outcome, state.note = 'stopped', 'why'\n"
        "    progress.note = state.note\n"
        "    state.stop_reports.append(1)\n"
        "    self.state.fleet = None\n")
    (tmp_path / "supervise.py").write_text("def stop(state):\n    state.fleet = None\n    state.relaunches += 1\n")
    assert stray_writes(tmp_path) == ["dispatch.py:2: outcome", "dispatch.py:2: note",
                                      "dispatch.py:4: stop_reports", "dispatch.py:5: fleet"]
