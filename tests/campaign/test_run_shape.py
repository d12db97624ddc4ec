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
