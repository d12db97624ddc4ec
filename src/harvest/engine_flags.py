"""``[server] extra_args`` and ``command`` read the way the engine's own parser reads them.

A flag is what the engine makes of it, not what it looks like: vLLM's and SGLang's parsers
(Python's argparse, ``allow_abbrev``) take any unambiguous prefix, so ``--api-ke KEY`` is
``--api-key KEY`` and ``--hos=0.0.0.0`` is ``--host 0.0.0.0``; vLLM also reads ``_`` as ``-``
in a ``--name`` and ``--name.field V`` as ``--name '{"field": V}'``; llama-server reads exact
spellings only, ``_`` as ``-`` in a ``--name``, and no ``--flag=value``. So harvest resolves
every token against the engine's option list before it judges it:

- a **secret flag** (:data:`harvest.redact.SECRET_FLAG`'s name rule on the option it resolves
  to, or on the token's own name) never goes on a command line: every user reads
  ``/proc/PID/cmdline``;
- ``--host`` and ``--port`` in ``extra_args`` are refused in any spelling: the address belongs
  to ``[server] host/port``, where a public host needs ``api_key_env``;
- an **ambiguous prefix** is refused only when one of its candidates is such a flag (another
  version of the engine, with one option fewer, would read it as that flag); otherwise the
  engine refuses it itself, with its own message, before it serves anything.

``command`` (the argv of a program harvest does not know, or llama-server's path) is read
**conservatively**, see :func:`read_conservatively`.

The option lists are data (``engine_options/<engine>.json``), made by ``scripts/engine-options``
from the pinned engines' parsers and held to them by ``tests/server/test_engine_options.py``.
Plain data and pure functions: no imports from the rest of harvest but ``redact``'s name rule,
no engine is run.
"""

from __future__ import annotations

import functools
import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType

from harvest.redact import SECRET_FLAG

#: Engines whose parser harvest knows, and how each reads a token (module docstring).
ENGINE_NAMES: Mapping[str, str] = MappingProxyType({"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp"})
#: The address flags: they belong to ``[server] host`` and ``port``.
BIND_FLAGS = ("--host", "--port")


@dataclass(frozen=True)
class Reading:
    """What a parser makes of one token of an argv."""

    #: The token as written.
    token: str
    #: Its option name as written (before ``=``; no value ever shows here).
    name: str
    #: The option spellings it may be read as: one when resolved, several when ambiguous, none
    #: when it names no known option.
    candidates: tuple[str, ...]
    #: The value written after ``=`` in the token itself (None: the value, if any, is the next token).
    inline_value: str | None
    #: The candidates that are secret flags (an option is one when any of its spellings has a
    #: secret name: llama.cpp's ``-hft`` is ``--hf-token``).
    secret_candidates: tuple[str, ...] = ()
    #: The address flags (:data:`BIND_FLAGS`) the candidates are spellings of (an alias of
    #: ``--host``, a short one included, is ``--host``).
    bind_candidates: tuple[str, ...] = ()

    @property
    def secret(self) -> str | None:
        """The secret flag it is (or may be) read as, else None."""
        if self.secret_candidates:
            return self.secret_candidates[0]
        return self.name if SECRET_FLAG.match(self.name) else None

    @property
    def bind(self) -> str | None:
        """``--host`` or ``--port`` when it is (or may be) read as one (any spelling of it), else None."""
        return next((c for c in (*self.bind_candidates, *self.candidates) if c in BIND_FLAGS), None)


@functools.cache
def _option_groups(engine: str) -> tuple[tuple[str, ...], ...]:
    """Every option of ``engine``'s pinned parser, each as its spellings (``engine_options/``)."""
    text = (resources.files("harvest") / "engine_options" / f"{engine}.json").read_text(encoding="utf-8")
    return tuple(tuple(g) for g in json.loads(text)["options"])


@functools.cache
def option_strings(engine: str) -> Mapping[str, tuple[str, ...]]:
    """Each spelling the engine's parser accepts -> every spelling of that option."""
    return MappingProxyType({s: group for group in _option_groups(engine) for s in group})


@functools.cache
def secret_options(engine: str) -> frozenset[str]:
    """The spellings of ``engine``'s secret options: any spelling of the option has a secret name."""
    return frozenset(s for s, group in option_strings(engine).items() if any(SECRET_FLAG.match(g) for g in group))


def _reading(engine: str, token: str, name: str, candidates: tuple[str, ...], inline: str | None) -> Reading:
    secrets = secret_options(engine)
    groups = option_strings(engine)
    binds = tuple(dict.fromkeys(f for c in candidates for f in groups.get(c, ()) if f in BIND_FLAGS))
    return Reading(token, name, candidates, inline, tuple(c for c in candidates if c in secrets), binds)


def _argparse_candidates(options: Mapping[str, tuple[str, ...]], arg: str) -> tuple[str, ...]:
    """The options Python's argparse (``allow_abbrev``, prefix ``-``) may read ``arg`` as
    (``ArgumentParser._parse_optional``): the exact spelling, the spelling before ``=``, else every
    option ``arg`` is a prefix of (a ``--`` name before ``=``); a single-dash token also matches a
    two-character option followed by its value (``-q8``). Spellings of one option count once."""
    if arg in options:
        return (arg,)
    if "=" in arg and arg.partition("=")[0] in options:
        return (arg.partition("=")[0],)
    if arg.startswith("--"):
        prefix = arg.partition("=")[0]
        found = [s for s in options if s.startswith(prefix)]
    else:
        found = [s for s in options if s == arg[:2] or s.startswith(arg)]
    seen: list[tuple[str, ...]] = []
    out = []
    for s in found:
        if options[s] not in seen:
            seen.append(options[s])
            out.append(s)
    return tuple(out)


def read_token(engine: str, token: str) -> Reading | None:
    """What ``engine``'s parser makes of ``token`` (None: not an option: a value, a positional, or
    ``--``, argparse's end of options; what follows it is still read, to be safe)."""
    if len(token) < 2 or not token.startswith("-") or token == "--":
        return None
    options = option_strings(engine)
    name, eq, value = token.partition("=")
    inline = value if eq else None
    if engine == "llamacpp":
        # common/arg.cpp: '_' read as '-' in a --name, then the exact spelling; no '=' form.
        spelling = "--" + token[2:].replace("_", "-") if token.startswith("--") else token
        return _reading(engine, token, name, (spelling,) if spelling in options else (), None)
    arg = token
    if engine == "vllm":
        # FlexibleArgumentParser.parse_args: in a --name, '_' read as '-' up to the first '.';
        # "--name.field V" becomes "--name JSON"; "-O3" is --optimization-level 3.
        if token.startswith("-O") and not token.startswith("--"):
            return _reading(engine, token, "-O", ("--optimization-level",), token[2:].lstrip("=") or None)
        key = name
        if token.startswith("--"):
            head, dot, tail = key[2:].partition(".")
            key = "--" + head.replace("_", "-") + dot + tail
        if "." in key:
            return _reading(engine, token, name, _argparse_candidates(options, key.partition(".")[0]), None)
        arg = key + (eq + value if eq else "")
    return _reading(engine, token, name, _argparse_candidates(options, arg), inline)


@functools.cache
def _sensitive_spellings() -> tuple[frozenset[str], frozenset[str]]:
    """Every secret option spelling of every known engine, and those plus the bind flags."""
    secrets = frozenset().union(*(secret_options(engine) for engine in ENGINE_NAMES))
    return secrets, secrets | frozenset(BIND_FLAGS)


def read_conservatively(token: str) -> Reading | None:
    """What a program harvest does not know may make of ``token``, assuming the worst.

    ``command`` is the argv of any program (``engine = "command"``) or llama-server's path, so
    its parser is unknown. A token is read as a secret flag or as ``--host``/``--port`` when any
    known engine (vLLM, SGLang, llama.cpp) could read it so: its name (before ``=`` and ``.``,
    ``_`` read as ``-``, any case) is such a spelling or a **prefix** of one, ambiguous or not
    (``--hos``, ``--api-ke``, ``--hf``); a token that names some engine's other option exactly
    is that option (``--ssl-keyfile`` is not ``--ssl-keyfile-password``). The secret name rule
    applies to the name itself too, as everywhere."""
    if len(token) < 2 or not token.startswith("-"):
        return None
    name, eq, value = token.partition("=")
    key = name.partition(".")[0]
    # A --name in any case and with '_' for '-'; a single-dash option as written (every known
    # parser tells -H from -h).
    key = "--" + key[2:].replace("_", "-").lower() if key.startswith("--") else key
    known = any(key in option_strings(engine) for engine in ENGINE_NAMES)
    secrets, sensitive = _sensitive_spellings()
    if key in sensitive or known:
        candidates: tuple[str, ...] = (key,) if key in sensitive else ()
    elif len(key) > 2:
        candidates = tuple(sorted(s for s in sensitive if s.startswith(key)))
    else:
        candidates = ()
    return Reading(token, name, candidates, value if eq else None, tuple(c for c in candidates if c in secrets))


def _reads_as(reading: Reading, flag: str, engine: str | None) -> str:
    """``--api-ke (vLLM reads it as --api-key)``: the flag as written and, when it differs, as read."""
    if reading.name == flag:
        return flag
    who = f"{ENGINE_NAMES[engine]} reads" if engine is not None and engine in ENGINE_NAMES else "harvest reads"
    return f"{reading.name} ({who} it as {flag})"


def _secret_message(field: str, shown: str) -> str:
    return (f"`{field}` holds {shown}: every user of this machine can read a server's command line "
            f"(/proc/PID/cmdline). Pass an API key with `api_key_env` (the name of an environment "
            f"variable holding it), and other secrets as environment variables in [server.env] (e.g. HF_TOKEN)")


def readings(engine: str | None, argv: Sequence[str], *, conservative: bool = False) -> list[tuple[int, Reading]]:
    """Each option token of ``argv`` with its position, as ``engine`` reads it (conservatively
    for an unknown engine, or when asked). A token the engine knows no option for is read
    conservatively too: the engine refuses it anyway, but only once it runs, with the token (and a
    secret after it) on its command line and in the launch record."""
    out = []
    for i, token in enumerate(argv):
        if conservative or engine is None or engine not in ENGINE_NAMES:
            reading = read_conservatively(token)
        else:
            reading = read_token(engine, token)
            if reading is not None and not reading.candidates:
                reading = read_conservatively(token)
        if reading is not None:
            out.append((i, reading))
    return out


def argv_problem(engine: str | None, argv: Sequence[str], field: str, *, binds: bool,
                 conservative: bool = False) -> str | None:
    """Why ``argv`` (``[server] <field>``) may not go to ``engine``: a secret flag, or with
    ``binds`` a ``--host``/``--port``, in any spelling the engine reads as one. None: fine.
    The message names the flag as written and as the engine reads it, never a value."""
    for _, reading in readings(engine, argv, conservative=conservative):
        wanted = [r for r in (reading.secret, reading.bind if binds else None) if r]
        if not wanted:
            continue
        flag = wanted[0]
        named = ENGINE_NAMES.get(engine) if engine is not None else None
        if len(reading.candidates) > 1 and not conservative and named is not None:
            return (f"`{field}` holds {reading.name}, which {named} may read as any of "
                    f"{', '.join(reading.candidates)}: write the option you mean in full, and no secret or "
                    f"address flag ({', '.join(BIND_FLAGS)} belong to [server] host/port)")
        by_engine = (not conservative and engine is not None and named is not None
                     and read_token(engine, reading.token) == reading)
        shown = _reads_as(reading, flag, engine if by_engine else None)
        if reading.secret:
            return _secret_message(field, shown)
        return (f"`{field}` holds {shown}: set [server] {flag[2:]} instead (harvest checks the address "
                f"there: a non-loopback host needs `api_key_env`)")
    return _unknown_address(engine, argv, field) if binds else None


def _value(argv: Sequence[str], i: int, reading: Reading) -> str | None:
    """The value of the option at ``argv[i]``: after ``=``, else the next token (None: none)."""
    if reading.inline_value is not None:
        return reading.inline_value
    return argv[i + 1] if i + 1 < len(argv) else None


def address_literal(value: str) -> str | None:
    """The IP address ``value`` names, as a listening address is written (``0.0.0.0``, ``::``,
    ``[::]:8000``, ``10.0.0.1:80``; of a comma-separated list, as llama-server's ``--host`` takes,
    the first that is not loopback, else the first), or None when it names none."""
    found = []
    for part in value.split(","):
        part = part.strip()
        for host in (part, part[1:].partition("]")[0] if part.startswith("[") else part.rpartition(":")[0]):
            try:
                found.append(ipaddress.ip_address(host))
                break
            except ValueError:
                continue
    if not found:
        return None
    return str(next((a for a in found if not a.is_loopback), found[0]))


def host_values(argv: Sequence[str]) -> list[tuple[str, str]]:
    """Each ``(flag as written, value)`` that a program may read as the address it listens on (read
    conservatively): an option read as ``--host`` (its value after ``=`` or the next token), and any
    other option whose value is an IP address (``-H 0.0.0.0``, ``--bind=::``, ``--listen
    0.0.0.0:8000``; a host name is only read so after a ``--host`` spelling)."""
    out = []
    for i, reading in readings(None, argv):
        value = _value(argv, i, reading)
        if value is None:
            continue
        if reading.bind == "--host":
            out.append((reading.name, value))
        elif reading.bind is None and _may_listen(reading.name) and (address := address_literal(value)) is not None:
            out.append((reading.name, address))
    return out


def _may_listen(name: str) -> bool:
    """Whether an option named ``name`` may take the address a server listens on: any name but one
    naming a file or a folder (``--hostname-file 0.0.0.0`` is a file's name)."""
    return name.lower().replace("_", "-").rpartition("-")[2] not in ("file", "path", "dir")


def _unknown_address(engine: str | None, argv: Sequence[str], field: str) -> str | None:
    """Why an option of ``argv`` the engine knows nothing of may not carry a public address
    (``-H 0.0.0.0``: no pinned engine reads ``-H``, but a build or wrapper that did would listen on
    every interface without a key), else None."""
    for i, reading in readings(engine, argv):
        known = engine in ENGINE_NAMES and bool((read := read_token(str(engine), reading.token)) and read.candidates)
        if known or reading.candidates:
            continue
        value = _value(argv, i, reading)
        address = address_literal(value) if value is not None and _may_listen(reading.name) else None
        if address is not None and not ipaddress.ip_address(address).is_loopback:
            who = ENGINE_NAMES.get(str(engine), "the engine")
            return (f"`{field}` holds {reading.name} {address}: {who} knows no option {reading.name}, and an "
                    f"option followed by a non-loopback address may make a server listen on it. Set [server] "
                    f"host instead (harvest checks the address there: a non-loopback host needs `api_key_env`)")
    return None


def hide_secret_values(engine: str | None, argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every token read as a secret flag (``=`` form or the next
    token) shown as ``***``: an argv fit to echo in an error."""
    out = list(argv)
    for i, reading in readings(engine, argv, conservative=engine not in ENGINE_NAMES):
        if reading.secret is None:
            continue
        if reading.inline_value is not None:
            out[i] = reading.name + "=***"
        elif i + 1 < len(out):
            out[i + 1] = "***"
    return out


__all__ = ["BIND_FLAGS", "ENGINE_NAMES", "Reading", "address_literal", "argv_problem", "hide_secret_values", "host_values",
           "option_strings", "read_conservatively", "read_token", "readings", "secret_options"]
