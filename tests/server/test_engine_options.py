"""Contract tests: the option lists harvest ships (``src/harvest/engine_options/``) are the pinned
engines' own, and harvest reads a token of ``extra_args`` as the engine's own parser does.

``scripts/engine-options`` is run against the installed engines (vLLM's ``make_arg_parser``,
SGLang's ``ServerArgs.add_cli_args``, ``llama-server --help``; the two parsers in the session's
parser hosts, tests/engine_parsers.py) and must give the shipped files byte for byte; a difference
fails naming the options added and removed. Then a table of tokens
(every prefix of every secret and address option, ``=`` forms, underscores, vLLM's dotted form,
single-dash forms, everyday flags) goes through each engine's real parser, in the engine's own
Python, and through :func:`harvest.engine_flags.read_token`: both must name the same option, the
same candidates of an ambiguous prefix, or nothing.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harvest.engine_flags import BIND_FLAGS, option_strings, read_token, secret_options
from harvest.engine_pins import PINS
from tests.engine_parsers import ParserHosts

# Each engine's own argument parser, run in the engine's environment.
pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "engine-options"
SHIPPED = ROOT / "src" / "harvest" / "engine_options"


def _regenerate(engine: str, where: str, hosts: ParserHosts) -> str:
    """What ``scripts/engine-options ENGINE --engine WHERE`` prints. llama.cpp: the script itself, as
    a command; vLLM and SGLang: the script's own functions over its own dump code, which runs in the
    session's parser host (tests/engine_parsers.py) instead of a fresh engine Python."""
    if engine == "llamacpp":
        done = subprocess.run([sys.executable, str(SCRIPT), engine, "--engine", where], capture_output=True,
                              text=True, timeout=600, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-4000:]
        return done.stdout
    loader = importlib.machinery.SourceFileLoader("engine_options_script", str(SCRIPT))
    script = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(script)

    def dump(engine: str, python: str) -> dict:
        done = hosts.run(engine, python, script.ARGPARSE_DUMP, [engine], timeout=600)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("OPTIONS ")]
        assert done.returncode == 0 and lines, done.stderr[-4000:]
        return json.loads(lines[-1][len("OPTIONS "):])

    script._argparse_options = dump
    return script.dumps(script.engine_options(engine, where))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp"])
def test_the_shipped_option_lists_are_the_pinned_engines_own(engine, request, parser_hosts):
    where = request.getfixturevalue({"vllm": "vllm_python", "sglang": "sglang_python",
                                     "llamacpp": "llama_server_bin"}[engine])
    fresh = _regenerate(engine, where, parser_hosts)
    shipped = (SHIPPED / f"{engine}.json").read_text()
    got, have = json.loads(fresh), json.loads(shipped)
    assert got["version"] == have["version"] == PINS[engine].version.split()[0], (got["version"], have["version"])
    added = sorted(" ".join(g) for g in got["options"] if g not in have["options"])
    removed = sorted(" ".join(g) for g in have["options"] if g not in got["options"])
    assert not added and not removed, (f"{engine}'s parser differs from src/harvest/engine_options/{engine}.json "
                                       f"(scripts/engine-options {engine} --write): new {added}, gone {removed}")
    assert fresh == shipped


#: Runs in the engine's Python: reads [token, ...] on stdin; prints what its parser made of each:
#: {"options": [spellings of each option the token set]} or {"ambiguous": [...]} or {"unknown": true}.
ARGPARSE_READ = textwrap.dedent("""
    import argparse, contextlib, io, json, re, sys
    engine = sys.argv[1]
    if engine == "sglang":
        from sglang.srt.server_args import ServerArgs
        parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        base = ["--model-path", "m"]
    else:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        parser = make_arg_parser(FlexibleArgumentParser())
        base = ["--model", "m"]
    by_dest = {a.dest: a.option_strings for a in parser._actions if a.option_strings}
    by_string = {s: a.option_strings for a in parser._actions for s in a.option_strings}

    UNSET = object()  # argparse leaves a value already in the namespace alone unless argv sets it

    def parse(argv):
        err = io.StringIO()
        namespace = argparse.Namespace(**{d: UNSET for d in by_dest})
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                return vars(parser.parse_args(base + argv, namespace)), ""
        except SystemExit:
            return None, err.getvalue()

    plain, _ = parse([])
    out = []
    for token in json.load(sys.stdin):
        argv = [token] if "=" in token else [token, "V0.0.0.0"]
        ns, err = parse(argv)
        if ns is None and re.search(r"unrecognized arguments: V0\\.0\\.0\\.0$", err.strip()):
            ns, err = parse([token])  # a switch: it takes no value
        if ns is not None:
            changed = [d for d in ns if d in by_dest and ns[d] is not UNSET and plain[d] is UNSET]
            out.append({"options": [by_dest[d] for d in changed]})
            continue
        m = re.search(r"ambiguous option: \\S+ could match (.*)", err)
        if m:
            out.append({"ambiguous": [by_string[s.strip()] for s in m.group(1).split(",")]})
            continue
        m = re.search(r"argument ([^\\s:/]+)(?:/\\S+)?: ", err)
        if m and m.group(1) in by_string:
            out.append({"options": [by_string[m.group(1)]]})
            continue
        out.append({"unknown": True, "error": err.strip().splitlines()[-1:]})
    print("RESULT " + json.dumps(out))
""")

#: Everyday flags of the tables of docs/engines.md and the brief forms around them.
EVERYDAY = {
    "vllm": ["--max-num-seqs", "--max_num_seqs=3", "--max-num-batched-tokens", "--enforce-eager",
             "--kv-cache-dtype", "--ssl-keyfile", "-tp", "-as", "-q8", "--max-logp", "--max-logprobs=30",
             "--ssl-keyfile=k", "--enable-prefix", "--api-server-count", "--max-model-len.x", "-tp.x"],
    "sglang": ["--max-running-requests", "--mem-fraction", "--kv-cache-dtype", "--ssl-keyfile", "--ssl-keyfile=k",
               "--enable-metrics", "--tp", "--max_running_requests", "--context-length=4096", "--hicache-size"],
}


def _tokens(engine: str) -> list[str]:
    """Every prefix (from ``--x``) of every secret and address option, alone and with ``=``,
    with ``_`` for ``-``, dotted (vLLM), upper case; and the everyday flags."""
    sensitive = sorted(s for s in secret_options(engine) | set(BIND_FLAGS) if s.startswith("--"))
    tokens: list[str] = []
    for flag in sensitive:
        for end in range(3, len(flag) + 1):
            prefix = flag[:end]
            tokens += [prefix, prefix + "=V0.0.0.0"]
        tokens += ["--" + flag[2:].replace("-", "_"), "--" + flag[2:-1].replace("-", "_") + "=V", flag.upper(),
                   flag[:-1] + ".x"]
    tokens += [s for s in secret_options(engine) if not s.startswith("--")]
    return list(dict.fromkeys(tokens + EVERYDAY[engine]))


def _harvest_reading(engine: str, token: str) -> dict:
    reading = read_token(engine, token)
    groups = [list(option_strings(engine)[c]) for c in (reading.candidates if reading else ())]
    if len(groups) > 1:
        return {"ambiguous": sorted(groups)}
    return {"options": groups} if groups else {"unknown": True}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_harvest_reads_each_token_as_the_engines_own_parser_does(engine, request, parser_hosts):
    python = request.getfixturevalue(f"{engine}_python")
    tokens = _tokens(engine)
    done = parser_hosts.run(engine, python, ARGPARSE_READ, [engine], stdin=json.dumps(tokens), timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    differ = []
    for token, real in zip(tokens, json.loads(lines[-1][len("RESULT "):])):
        if "ambiguous" in real:  # argparse lists each matching spelling; harvest one per option
            real = {"ambiguous": sorted({tuple(g) for g in real["ambiguous"]})}
            real = {"ambiguous": [list(g) for g in real["ambiguous"]]} if len(real["ambiguous"]) > 1 else \
                {"options": [list(g) for g in real["ambiguous"]]}
        real.pop("error", None)
        mine = _harvest_reading(engine, token)
        if real != mine:
            differ.append(f"{token}: {engine} reads {real}, harvest {mine}")
    assert not differ, "\n".join(differ)
    assert len(tokens) > 40  # the table is not empty by mistake


#: llama-server tokens: (token, the option it reads, or None for "invalid argument").
LLAMACPP_TOKENS = [("--api-key", "--api-key"), ("--api_key", "--api-key"), ("--api-ke", None),
                   ("--hf_token", "--hf-token"), ("-hft", "-hft"), ("--host", "--host"), ("--hos", None),
                   ("--ho_st", None), ("--HOST", None), ("--port=8", None), ("--api-key-file", "--api-key-file")]


@pytest.mark.parametrize(("token", "reads"), LLAMACPP_TOKENS)
def test_harvest_reads_llama_server_tokens_as_llama_server_does(llama_server_bin, token, reads):
    # The token last, without its value: llama-server names the option it read ("expected value
    # for argument") or refuses the token ("invalid argument"), and exits before loading anything.
    done = subprocess.run([llama_server_bin, "-m", os.devnull, token], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    text = done.stdout + done.stderr
    named = re.search(r'error while handling argument "([^"]+)"', text)
    real = named.group(1) if named else None
    assert done.returncode != 0 and (named or "error: invalid argument: " in text), text[-2000:]
    reading = read_token("llamacpp", token)
    mine = reading.candidates[0] if reading and reading.candidates else None
    assert (real, mine) == (reads, reads)
