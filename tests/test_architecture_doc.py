"""docs/architecture.md states facts about the code; each kind of fact it states is checked here
against the code, so the page cannot drift from it (as tests/test_configdoc.py holds docs/config.md).

Checked: the number of import-linter contracts and each contract it names; the layers block against
the ``layers`` contract; every file or folder it names in backticks exists; every ``harvest.x``
module it names imports; every class-like name (``CamelCase``, ``Class.attr``) and every name in a
"`file.py`: `A`, `B`" list is defined where it says; every test it names exists; every module that
sends a signal itself, and every module that imports Ray, is named on the page. Each check is shown
to catch a planted false fact.
"""

from __future__ import annotations

import ast
import configparser
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "harvest"
DOC = ROOT / "docs" / "architecture.md"
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
           "ten": 10}
TICKED = re.compile(r"`([^`\n]+)`")


def contracts() -> dict[str, configparser.SectionProxy]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    return {s.split(":", 2)[2]: parser[s] for s in parser.sections() if s.startswith("importlinter:contract:")}


@cache
def defined_names(path: Path) -> frozenset[str]:
    """Names a module defines at any depth: classes, functions, assignments, imports, attributes
    set on ``self``, dataclass fields."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(out)


@cache
def all_modules() -> tuple[Path, ...]:
    return tuple(sorted(SRC.rglob("*.py")))


def resolve(name: str) -> list[Path]:
    """The files or folders a path written on the page may mean: under src/harvest (also by its
    tail: ``session.py`` in a row about ``campaign/run/``), or from the repository's root."""
    name = name.rstrip("/")
    direct = [p for p in (ROOT / name, SRC / name) if p.exists()]
    if direct:
        return direct
    return [p for p in (*all_modules(), *(d for d in SRC.rglob("*") if d.is_dir()))
            if str(p).endswith("/" + name)]


def is_path(token: str) -> bool:
    return bool(re.fullmatch(r"[\w./-]+(\.py|/|\.md)", token)) and not token.startswith(("http", "."))


# --- the checks: each returns the problems it finds in a page's text -----------------------------------


def contract_problems(text: str) -> list[str]:
    found = contracts()
    problems = []
    m = re.search(r"`\.importlinter` defines (\w+) contracts", text)
    if m is None:
        problems.append("the page does not say how many contracts `.importlinter` defines")
    else:
        said = NUMBERS.get(m.group(1), int(m.group(1)) if m.group(1).isdigit() else -1)
        if said != len(found):
            problems.append(f"the page says {m.group(1)} contracts; .importlinter has {len(found)}: {sorted(found)}")
    for name in re.findall(r"\*\*`([\w-]+)`\*\*", text):
        if name not in found:
            problems.append(f"contract `{name}` named on the page is not in .importlinter")
    for name in found:
        if f"**`{name}`**" not in text:
            problems.append(f"contract `{name}` of .importlinter is not described on the page")
    return problems


def layers_problems(text: str) -> list[str]:
    block = re.search(r"```\n(cli\n.*?)```", text, re.S)
    if block is None:
        return ["no layers block on the page"]
    said = [line.strip() for line in block.group(1).strip().splitlines()]
    real = [line.strip() for line in contracts()["layers"]["layers"].strip().splitlines()]
    return [] if said == real else [f"the layers block {said} is not the layers contract's {real}"]


def path_problems(text: str) -> list[str]:
    return [f"`{t}` names no file or folder" for t in sorted(set(TICKED.findall(text)))
            if is_path(t) and not resolve(t)]


def module_problems(text: str) -> list[str]:
    problems = []
    for token in sorted(set(TICKED.findall(text))):
        if re.search(r"harvest\.[\w.]+/\d", token):  # a document's schema name (harvest.ps/1), not a module
            continue
        for name in re.findall(r"\bharvest(?:\.\w+)+", token):
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):  # harvest.a.b.Name: the module, then the attribute
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                try:
                    for attr in parts[cut:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    problems.append(f"`{name}`: {'.'.join(parts[:cut])} has no {'.'.join(parts[cut:])}")
                break
            else:
                problems.append(f"`{name}` does not import")
    return problems


def name_problems(text: str) -> list[str]:
    """Every ``CamelCase`` or ``Class.attr`` name is defined somewhere in src/harvest (or is a test
    name); every "`file.py`: `A`, `B`" list names what that file defines."""
    everywhere = frozenset().union(*(defined_names(p) for p in all_modules()))
    problems = []
    for token in sorted(set(TICKED.findall(text))):
        parts = token.split(".")
        if re.fullmatch(r"[A-Z][a-z]+[A-Z]\w*|[A-Z]\w*\.\w+", token) and any(p not in everywhere for p in parts):
            problems.append(f"`{token}` is defined nowhere in src/harvest")
    for path, names in re.findall(r"`([\w/]+\.py)`: ((?:`\w+`(?:, | and |, and )?)+)", text):
        files = [p for p in resolve(path) if p.is_file()]
        listed = re.findall(r"`(\w+)`", names)
        if len(listed) < 2:  # "`x.py`: `Name` does this" is a sentence, not a list of what x.py defines
            continue
        for name in listed:
            if files and not any(name in defined_names(f) for f in files):
                problems.append(f"`{name}` is not defined in `{path}`")
    return problems


def named_test_problems(text: str) -> list[str]:
    names = set(re.findall(r"`(test_\w+)`", text)) | set(re.findall(r"::(test_\w+)", text))
    tests = frozenset().union(*(defined_names(p) for p in (ROOT / "tests").rglob("test_*.py")))
    return [f"test `{n}` does not exist" for n in sorted(names) if n not in tests]


def _calls(path: Path, pattern: str) -> bool:
    return re.search(pattern, path.read_text()) is not None


def signal_and_ray_problems(text: str) -> list[str]:
    """The page names every module that signals a process itself and every one that imports Ray."""
    problems = []
    for path in all_modules():
        rel = str(path.relative_to(SRC))
        if _calls(path, r"\bos\.kill(pg)?\(|\.send_signal\(") and f"`{rel}`" not in text:
            problems.append(f"`{rel}` sends signals itself and the page does not name it")
        if _calls(path, r"^\s*import ray\b|^\s*from ray\b") and f"`{rel}`" not in text:
            problems.append(f"`{rel}` imports Ray and the page does not name it")
    return problems


CHECKS = [contract_problems, layers_problems, path_problems, module_problems, name_problems, named_test_problems,
          signal_and_ray_problems]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_the_page_states_the_code_as_it_is(check):
    assert check(DOC.read_text()) == []


@pytest.mark.parametrize("check, planted", [
    (contract_problems, lambda t: re.sub(r"defines \w+ contracts", "defines two contracts", t)),
    (layers_problems, lambda t: t.replace("```\ncli\n", "```\ncli\nhttp\n", 1)),
    (path_problems, lambda t: t + "\nSee `campaign/run/nowhere.py`.\n"),
    (module_problems, lambda t: t + "\nSee `harvest.campaign.nowhere` and `harvest.stops.NoSuchName`.\n"),
    (name_problems, lambda t: t + "\n`placement/record.py`: `RECORD`, `ServeWordsGone`; `DispatchStepsGone`.\n"),
    (named_test_problems, lambda t: t + "\n`test_that_was_never_written`\n"),
    (signal_and_ray_problems, lambda t: t.replace("`placement/ssh/tunnel.py`", "the tunnel")
                                           .replace("placement/ray/actor.py", "the actor")),
])
def test_each_check_finds_a_planted_false_fact(check, planted):
    assert check(planted(DOC.read_text())) != []
