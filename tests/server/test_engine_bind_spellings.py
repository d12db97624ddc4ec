"""Every spelling that sets the address or the API key, read from each installed engine's parser.

The options are found in the engine itself, not in harvest's lists: vLLM's and SGLang's argparse
actions by what they set (``dest`` ``host``, any ``*api_key*``), llama-server's entries of
``--help`` by the variable each names (``LLAMA_ARG_HOST``, ``LLAMA_API_KEY``). Every spelling of
those, every prefix and ``=``/``_`` form the parser takes, and every single-dash ``-X`` (letters and
digits: ``-H 0.0.0.0``) goes through the engine's real parser with ``0.0.0.0``; then through
harvest's config load in ``[server] extra_args``. Each token the engine reads as the host or a key
is refused at load, naming the token; each one the engine knows nothing of is refused too when an
address follows it (a build or wrapper that read it would listen there without a key).
"""

from __future__ import annotations

import json
import os
import re
import string
import subprocess
import textwrap

import pytest

from harvest.config import parse_config
from harvest.engine_flags import read_token
from harvest.errors import ConfigError

# Each engine's own argument parser, run in the engine's environment.
pytestmark = pytest.mark.engine

SHORT = ["-" + c for c in string.ascii_letters + string.digits]

#: Runs in the engine's Python: the actions that set the host or a key, every spelling the parser
#: may read as one of them, and what the parser makes of each token with the value 0.0.0.0.
READ_SETTERS = textwrap.dedent("""
    import argparse, contextlib, io, json, re, string, sys
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
    dests = [a.dest for a in parser._actions if a.option_strings and (a.dest == "host" or "api_key" in a.dest)]
    spellings = [s for a in parser._actions if a.dest in dests for s in a.option_strings]
    tokens = []
    for s in spellings:
        if s.startswith("--"):
            for end in range(3, len(s) + 1):
                tokens += [s[:end], s[:end] + "=0.0.0.0"]
            tokens.append("--" + s[2:].replace("-", "_"))
        else:
            tokens.append(s)
    tokens += json.loads(sys.argv[2])
    out = []
    for token in dict.fromkeys(tokens):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                ns = vars(parser.parse_args(base + ([token] if "=" in token else [token, "0.0.0.0"])))
        except SystemExit:
            ns = None
        sets = [d for d in dests if ns is not None and ns.get(d) in ("0.0.0.0", ["0.0.0.0"])]
        out.append({"token": token, "sets": sets, "unknown": re.search(r"unrecognized arguments: " + re.escape(token) + r"( |$)", err.getvalue().strip()) is not None})
    print("RESULT " + json.dumps({"dests": dests, "spellings": spellings, "tokens": out}))
""")


def refusal(engine: str, argv: list[str]) -> str | None:
    """harvest's config load of ``[server] extra_args = argv``: its message, or None when it loads."""
    try:
        parse_config({"server": {"engine": engine, "model": "m", "extra_args": argv}}, source="j.toml")
    except ConfigError as exc:
        return " ".join(msg for _, msg in exc.problems)
    return None


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_spelling_the_parser_reads_as_the_host_or_a_key_is_refused_at_load(engine, request, parser_hosts):
    python = request.getfixturevalue(f"{engine}_python")
    done = parser_hosts.run(engine, python, READ_SETTERS, [engine, json.dumps(SHORT)], timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    found = json.loads(lines[-1][len("RESULT "):])
    assert "host" in found["dests"] and "api_key" in found["dests"], found["dests"]
    setters = [t for t in found["tokens"] if t["sets"]]
    assert {"--host", "--api-key"} <= {t["token"] for t in setters}
    missed = []
    for t in setters:
        argv = [t["token"]] if "=" in t["token"] else [t["token"], "0.0.0.0"]
        problem = refusal(engine, argv)
        name = t["token"].partition("=")[0]
        if problem is None or f"holds {name}" not in problem:
            missed.append(f"{t['token']} (sets {t['sets']}): {problem}")
    # A short option the engine refuses is refused by harvest too when an address follows it.
    for t in found["tokens"]:
        if t["token"] in SHORT and t["unknown"]:
            reading = read_token(engine, t["token"])
            if reading is not None and reading.candidates and not (reading.bind or reading.secret):
                continue  # vLLM's -O: an option (-O3) that refuses an address rather than listen on it
            problem = refusal(engine, [t["token"], "0.0.0.0"])
            if problem is None or f"holds {t['token']} 0.0.0.0" not in problem:
                missed.append(f"{t['token']} (unknown to {engine}): {problem}")
    assert not missed, "\n".join(missed)
    assert any(t["token"] == "-H" and t["unknown"] for t in found["tokens"])  # no pinned parser reads -H
    assert len(setters) > 10  # the prefixes were read, not an empty table


def _help_entries(help_text: str) -> list[tuple[list[str], str]]:
    """``llama-server --help`` as (spellings, the entry's text) per option."""
    entries: list[tuple[list[str], str]] = []
    for line in help_text.splitlines():
        if line.startswith("-"):
            head = re.split(r"\s{2,}", line, maxsplit=1)[0]
            spellings = [w.split()[0] for w in head.split(",") if w.strip().startswith("-")]
            entries.append((spellings, line))
        elif entries and line.startswith(" "):
            entries[-1] = (entries[-1][0], entries[-1][1] + "\n" + line)
    return entries


def _llama_reads(binary: str, token: str) -> str | None:
    """The option llama-server reads ``token`` as (it names one that takes a value when the value is
    missing; a switch such as ``-h`` is read and acted on: "a switch"), or None when it refuses
    the token as an invalid argument."""
    done = subprocess.run([binary, "-m", os.devnull, token], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    text = done.stdout + done.stderr
    named = re.search(r'error while handling argument "([^"]+)"', text)
    if named:
        return named.group(1)
    return None if "error: invalid argument: " in text else "a switch"


def test_every_llama_server_spelling_of_the_host_or_the_key_is_refused_at_load(llama_server_bin):
    done = subprocess.run([llama_server_bin, "--help"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    entries = _help_entries(done.stdout + done.stderr)
    setters = [s for spellings, text in entries if re.search(r"\(env: (LLAMA_ARG_HOST|LLAMA_API_KEY)\)", text)
               for s in spellings]
    assert "--host" in setters and "--api-key" in setters, setters
    missed = []
    for token in setters:
        assert _llama_reads(llama_server_bin, token) == token
        problem = refusal("llamacpp", [token, "0.0.0.0"])
        if problem is None or f"holds {token}" not in problem:
            missed.append(f"{token}: {problem}")
    for token in SHORT:
        reads = _llama_reads(llama_server_bin, token)
        if reads is None or reads in setters:
            problem = refusal("llamacpp", [token, "0.0.0.0"])
            if problem is None or f"holds {token}" not in problem:
                missed.append(f"{token} (llama-server reads it as {reads}): {problem}")
    assert not missed, "\n".join(missed)
