"""docs/python-api.md runs: every ``python`` block of the page, in order and in one namespace (as a
notebook runs its cells), in a folder holding the ``job.toml`` and ``prompts.jsonl`` it names, against
bench/sim_engine.py on loopback serving the page's model (its URL put in for the page's); a block with
a top-level ``await`` runs inside an event loop, as in Jupyter. The README's Python line runs the
same way. And every function, argument, default and attribute the page's table names is checked
against the code, each check shown to catch a planted false fact (as tests/test_architecture_doc.py
holds docs/architecture.md)."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import inspect
import io
import json
import re
from pathlib import Path

import pytest

import harvest
import harvest.api
from tests.engines import sim_engine

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "python-api.md"
PAGE_URL = "http://127.0.0.1:8000/v1"
MODEL = "Qwen/Qwen3-8B"
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def run_block(code: str, namespace: dict) -> None:
    """One block: at the top level, or awaited inside a loop when it holds a top-level await."""
    compiled = compile(code, str(DOC), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if compiled.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(compiled, namespace))  # noqa: S307 - the page's own code, run as Jupyter runs it
    else:
        exec(compiled, namespace)  # noqa: S102


def test_every_example_of_the_page_and_the_readmes_python_line_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"say {i}"}) + "\n"
                                                    for i in range(6)))
    readme = re.findall(r"From Python: `([^`]*harvest\.run\([^`]*)`", (ROOT / "README.md").read_text())
    assert len(readme) == 1, readme
    codes = blocks(DOC.read_text())
    assert len(codes) >= 4 and any("await harvest.arun" in c for c in codes)
    printed = io.StringIO()
    with sim_engine("--model", MODEL, "--output-tokens", "3", "--token-latency", "0.001") as url:
        (tmp_path / "job.toml").write_text(
            f'[server]\nengine = "openai"\nbase_url = "{url}/v1"\nmodel = "{MODEL}"\n[data]\npath = "prompts.jsonl"\n'
            '[sampling]\nmax_tokens = 16\n[output]\ndir = "runs/first-job"\n')
        namespace: dict = {}
        with contextlib.redirect_stdout(printed):
            for code in codes:
                run_block(code.replace(PAGE_URL, url + "/v1"), namespace)
            exec(readme[0], {"harvest": harvest})  # noqa: S102
    said = printed.getvalue()
    assert "True finished" in said, said
    assert "no item of status failed to export (the run holds done 6)" in said, said
    assert said.count("runs/first-job") >= 2, said  # the page's run, then the README's resume of it
    assert harvest.status("runs/q").settled == 6 and Path("q.jsonl").read_text().count("\n") == 6


# -- what the table names ---------------------------------------------------------------------------

def _types() -> dict[str, type]:
    from harvest.campaign.outputs.export import ExportReport
    from harvest.campaign.outputs.status import RunStatus

    return {"RunResult": harvest.api.RunResult, "RunStatus": RunStatus, "ExportReport": ExportReport}


def table_rows(text: str) -> list[tuple[str, str]]:
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| `harvest.")]
    return [(cells[0].removeprefix("| ").strip("`"), cells[1]) for cells in rows]


def signature_problems(text: str) -> list[str]:
    """Each function of the table: it exists, with the arguments and defaults the page gives it."""
    problems = []
    for shown, _ in table_rows(text):
        name, _, args = shown.partition("(")
        func = getattr(harvest.api, name.rsplit(".", 1)[1], None)  # harvest.run & co. call these
        if func is None:
            problems.append(f"{name} does not exist")
            continue
        doc_def = ast.parse(f"def f({args[:-1]}): pass").body[0]
        assert isinstance(doc_def, ast.FunctionDef)
        real = inspect.signature(func).parameters
        doc_args = doc_def.args
        named = [(a.arg, d) for a, d in zip(doc_args.args, [None] * (len(doc_args.args) - len(doc_args.defaults))
                                             + list(doc_args.defaults))]
        named += list(zip((a.arg for a in doc_args.kwonlyargs), doc_args.kw_defaults))
        for arg, default in named:
            if arg not in real:
                problems.append(f"{name}: no argument {arg!r}")
            elif default is not None and real[arg].default != ast.literal_eval(default):
                problems.append(f"{name}: {arg} defaults to {real[arg].default!r}, the page says "
                                f"{ast.unparse(default)}")
        if doc_args.kwarg is not None and not any(p.kind is p.VAR_KEYWORD for p in real.values()):
            problems.append(f"{name}: takes no **{doc_args.kwarg.arg}")
    return problems


def attribute_problems(text: str) -> list[str]:
    """Each ``Type`` (`a`, `b`, ...) of the page: every name in the parentheses is a field of it."""
    problems = []
    for type_name, inside in re.findall(r"`(RunResult|RunStatus|ExportReport)` \(([^)]*)\)", text):
        fields = {f.name for f in dataclasses.fields(_types()[type_name])}
        for attr in re.findall(r"`(\w+)`", inside):
            if attr not in fields:
                problems.append(f"{type_name}.{attr} does not exist")
    return problems


def test_every_function_argument_and_attribute_the_page_names_exists():
    text = DOC.read_text()
    assert len(table_rows(text)) == 5
    assert signature_problems(text) == []
    assert attribute_problems(text) == []
    assert len(re.findall(r"`(RunResult|RunStatus|ExportReport)` \(", text)) == 3


def test_the_checks_catch_a_planted_false_fact():
    text = DOC.read_text()
    assert attribute_problems(text.replace("`eta_s`, `failed_by_class`", "`eta_s`, `errors`")) == [
        "RunStatus.errors does not exist"]
    assert signature_problems(text.replace("allow_empty=False, **options", "allow_empty=True, **options")) == [
        "harvest.export: allow_empty defaults to False, the page says True"]
    assert signature_problems(text.replace("errors_limit=10", "errors=10")) == ["harvest.status: no argument 'errors'"]
