"""Loading a configuration: the TOML file read and parsed, relative paths resolved against the
file's folder, the models validated, and every mistake turned into one line a person can act on
(``file [table] field: message``, with "did you mean" for an unknown table or key).

A bad file is a :class:`harvest.errors.ConfigError` (tests/fuzz/test_config.py holds it to that);
nothing here creates anything.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from harvest.config.base import LAUNCHED_ENGINES, field_path
from harvest.config.file import HarvestConfig
from harvest.config.hosts import ClusterConfig, HostConfig
from harvest.config.job import (
    ClientConfig,
    DataConfig,
    OutputConfig,
    PreflightConfig,
    RunConfig,
    SamplingConfig,
)
from harvest.config.server import ServerConfig
from harvest.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


#: Where a job typed on the command line (flags only, no file) says it comes from.
COMMAND_LINE = "command line"
#: Where a job given to ``harvest.run``/``arun``/``load_job`` as keywords (no file) says it comes from.
KEYWORDS = "harvest.run keywords"
#: How a relative path in a job is read, said wherever a path was not found.
RELATIVE_PATHS = ("a relative path in a job file is read from the file's folder, one given as a flag or a "
                  "keyword from the folder harvest runs in")

#: The keys whose values are file paths (relative ones: to the file's folder, or to the current
#: folder when typed as a flag). ``[server] model`` is one only where harvest launches the engine
#: (which then reads it as a path when a file or folder of that name exists); to an endpoint it
#: is the name every request asks for, sent as typed.
_PATH_KEYS = (("server", "model"), ("server", "python"), ("data", "path"), ("output", "dir"))


@dataclass(frozen=True)
class Override:
    """One setting given apart from the job file: a flag (``--concurrency 3``) or
    ``--set client.concurrency=3``, or a keyword of :func:`harvest.run`. ``flag`` is how errors name
    it; ``path`` the table(s) and key; ``value`` already typed (``--set`` values are TOML)."""

    flag: str
    path: tuple[str, ...]
    value: Any


def parse_set(text: str, flag: str = "--set") -> Override:
    """``SECTION.KEY=VALUE`` (``server.env.NAME=VALUE`` too): VALUE as a TOML value (``3``, ``true``,
    ``"text"``, ``["-c", "4096"]``, ``{a = 1}``), else as the text itself."""
    name, sep, value = text.partition("=")
    path = tuple(p.strip() for p in name.split("."))
    if not sep or len(path) < 2 or not all(path):
        raise ConfigError(flag, [(f"{flag} {text}", "should be SECTION.KEY=VALUE, e.g. client.concurrency=3")])
    try:
        typed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError as exc:
        if value.strip()[:1] in _TOML_OPENERS:  # meant as a TOML array, table or string, and broken
            raise ConfigError(flag, [(f"{flag} {name.strip()}", f"{value} is not a TOML value ({exc}); a list is "
                                      f"[\"a\", \"b\"], a table {{a = 1}}, a text needs no quotes")]) from None
        typed = value
    return Override(f"{flag} {name.strip()}", path, typed)


#: How a TOML array, inline table or quoted string begins: a value that starts so and does not parse
#: is a mistake, never a text.
_TOML_OPENERS = ("[", "{", '"', "'")


def toml_text(value: Any) -> str:
    """``value`` as the job file (and ``--set``) would spell it: ``true``, ``['stop']``, ``{a = 1}``."""
    import json
    import re

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):  # a TOML literal string where it can be one (as pydantic quotes choices)
        plain = "'" not in value and not any(ord(c) < 32 or ord(c) == 127 for c in value)
        return f"'{value}'" if plain else json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        def key(k: Any) -> str:
            return str(k) if re.fullmatch(r"[A-Za-z0-9_-]+", str(k)) else json.dumps(str(k), ensure_ascii=False)
        return "{" + ", ".join(f"{key(k)} = {toml_text(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _check_once(overrides: Sequence[Override]) -> None:
    """Two flags (or keywords) that set one setting to two values is a mistake: which one was meant?"""
    first: dict[tuple[str, ...], Override] = {}
    for o in overrides:
        seen = first.setdefault(o.path, o)
        if seen is not o and seen.value != o.value:
            where = f"[{'.'.join(o.path[:-1])}] {o.path[-1]}"
            raise ConfigError(o.flag, [(f"{seen.flag} and {o.flag}", f"both set {where}, to {toml_text(seen.value)} "
                                                                      f"and {toml_text(o.value)}: give one")])


def _engine_of(data: dict[str, Any], overrides: Sequence[Override]) -> Any:
    """The job's ``[server] engine`` as it will be validated: the last override that sets it, else the file's."""
    for o in reversed(overrides):
        if o.path == ("server", "engine"):
            return o.value
        if o.path == ("server",) and isinstance(o.value, dict) and "engine" in o.value:
            return o.value["engine"]
    server = data.get("server")
    return server.get("engine") if isinstance(server, dict) else None


def _apply(data: dict[str, Any], overrides: Sequence[Override], engine: Any = None) -> None:
    """Put each override into the raw mapping, its relative paths resolved against the current folder."""
    _check_once(overrides)
    typed_here: dict[str, Any] = {}
    for o in overrides:
        node = typed_here
        for part in o.path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(o.flag, [(o.flag, f"{'.'.join(o.path[:-1])} is a value, not a table")])
        node[o.path[-1]] = o.value
    _resolve_paths(typed_here, Path.cwd(), engine)
    for o in overrides:
        value: Any = typed_here
        for part in o.path:
            value = value[part]
        node = data
        for part in o.path[:-1]:
            if not isinstance(node.get(part, {}), dict):
                raise ConfigError(o.flag, [(o.flag, f"[{'.'.join(o.path[:-1])}] is not a table in the job")])
            node = node.setdefault(part, {})
        node[o.path[-1]] = value


def _location(source: str, loc: tuple[Any, ...]) -> str:
    """Render a pydantic error location as ``file [table] field``."""
    parts = [str(p) for p in loc]
    tables: list[str] = []
    while parts and parts[0] in HarvestConfig.model_fields and parts[0] != "source":
        tables.append(parts.pop(0))
        if tables[-1] == "server" and parts and parts[0] == "env":
            tables.append(parts.pop(0))
        break
    table = f" [{'.'.join(tables)}]" if tables else ""
    field = " " + ".".join(parts) if parts else ""
    return f"{source}{table}{field}"


def _resolve_paths(data: dict[str, Any], base: Path, engine: Any = None) -> None:
    """Make relative file paths in the raw TOML relative to the config file's folder. ``[server]
    model`` is a path only for an engine harvest launches (``engine``: the job's, which may come from
    elsewhere than ``data``): an endpoint's model is a name, even where a file of that name exists."""

    def rel(value: str, always: bool = False) -> str:
        p = Path(value).expanduser()
        if p.is_absolute():
            return str(p)
        candidate = base / p
        return str(candidate) if (always or candidate.exists() or value.startswith(".")) else value

    server = data.get("server")
    if isinstance(server, dict):
        for key in ("model", "python") if engine in LAUNCHED_ENGINES else ("python",):
            if isinstance(server.get(key), str):
                # llama-server's model is always a file (-m); the others' may be a hub name
                server[key] = rel(server[key], always=key == "model" and engine == "llamacpp")
    def key_file(h: Any) -> Any:  # the key file is on this machine: relative to the config file
        if isinstance(h, dict) and isinstance(h.get("identity_file"), str):
            return {**h, "identity_file": str(base / Path(h["identity_file"]).expanduser())}
        return h

    if "host" in data:
        data["host"] = key_file(data["host"])
    if isinstance(data.get("hosts"), list):
        data["hosts"] = [key_file(h) for h in data["hosts"]]
    for table, key in (("data", "path"), ("output", "dir")):
        section = data.get(table)
        if isinstance(section, dict) and isinstance(section.get(key), str):
            p = Path(section[key]).expanduser()
            section[key] = str(p if p.is_absolute() else base / p)


def parse_config(data: dict[str, Any], source: str = "<memory>", base: Path | None = None,
                 overrides: Sequence[Override] = ()) -> HarvestConfig:
    """Validate an already-parsed mapping, with ``overrides`` on top. Raises :class:`ConfigError`
    naming table and field, or the flag that set it."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    engine = _engine_of(data, overrides)
    if base is not None:
        _resolve_paths(data, base, engine)
    _apply(data, overrides, engine)
    try:
        return HarvestConfig.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise ConfigError(source, _problems(source, exc.errors(), overrides)) from None


#: The model of each table, for "did you mean" (``hosts`` is an array of [host] tables).
_TABLES: dict[str, type[BaseModel]] = {
    "server": ServerConfig, "preflight": PreflightConfig, "data": DataConfig, "sampling": SamplingConfig,
    "client": ClientConfig, "output": OutputConfig, "run": RunConfig, "host": HostConfig, "hosts": HostConfig,
    "cluster": ClusterConfig,
}
#: pydantic's own prefixes of a validator's message, which say nothing to a person.
_PREFIXES = ("Value error, ", "Assertion failed, ")



#: Names other tools give a setting (vLLM's and SGLang's flags, llama.cpp's, OpenAI's and Hugging
#: Face's parameters, other job runners), and the table and key harvest reads it from.
_ALIASES: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("binary", "executable", "server_binary", "llama_server", "bin"), ("server", "command")),
    **dict.fromkeys(("tensor_parallel_size", "tp_size", "tensor_parallel"), ("server", "tp")),
    **dict.fromkeys(("max_num_seqs", "max_batch_size", "parallel", "slots"), ("server", "max_running_requests")),
    **dict.fromkeys(("gpu_ids", "devices", "cuda_visible_devices", "gpu"), ("server", "gpus")),
    **dict.fromkeys(("url", "endpoint", "api_base", "base", "openai_base_url"), ("server", "base_url")),
    **dict.fromkeys(("model_path", "model_name", "model_id"), ("server", "model")),
    **dict.fromkeys(("api_key", "openai_api_key"), ("server", "api_key_env")),
    **dict.fromkeys(("args", "extra_flags", "engine_args", "flags"), ("server", "extra_args")),
    **dict.fromkeys(("max_new_tokens", "max_completion_tokens", "max_length"), ("sampling", "max_tokens")),
    **dict.fromkeys(("num_samples", "samples", "num_return_sequences"), ("sampling", "n")),
    **dict.fromkeys(("top_logprobs",), ("sampling", "logprobs")),
    **dict.fromkeys(("file", "input", "dataset", "data_path", "input_path", "data_file"), ("data", "path")),
    **dict.fromkeys(("prompt_column", "prompt_key", "text_field"), ("data", "prompt_field")),
    **dict.fromkeys(("id_column", "id_key"), ("data", "id_field")),
    **dict.fromkeys(("num_workers", "workers", "max_parallel", "batch_size"), ("client", "concurrency")),
    **dict.fromkeys(("timeout",), ("client", "request_timeout")),
    **dict.fromkeys(("retries", "num_retries"), ("client", "max_retries")),
    **dict.fromkeys(("output_dir", "out_dir", "output", "out"), ("output", "dir")),
}


def _did_you_mean(name: str, choices: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _elsewhere(table: str, name: str) -> str:
    """Where ``name`` belongs when it is not a key of [table]: another table's key of that name, or
    the setting another tool calls so; "" when neither."""
    homes = [t for t, model in _TABLES.items() if t not in (table, "hosts") and name in model.model_fields]
    if homes:
        return f" here: it is a key of [{homes[0]}]" if len(homes) == 1 else \
            " here: it is a key of " + " and ".join(f"[{t}]" for t in homes)
    if name.lower() in _ALIASES and table not in ("host", "cluster"):  # their own timeouts and ports
        home, key = _ALIASES[name.lower()]
        return f" (harvest's name: {key!r})" if home == table else f" (harvest's name: [{home}] {key})"
    return ""


def _unknown(loc: tuple[Any, ...]) -> tuple[str | None, str]:
    """The message of an unknown table or key, with the closest known name, or the table where a key
    of that name belongs; the location to show (None: the usual one)."""
    name = str(loc[-1])
    if len(loc) == 1:  # a top-level name: a table
        tables = [t for t in HarvestConfig.model_fields if t != "source"]
        return f"[{name}]", f"unknown table{_did_you_mean(name, tables)}; tables: {', '.join(tables)}"
    model = _TABLES.get(str(loc[0]))
    if model is None or (loc[0] == "server" and loc[1:2] == ("env",)):
        return None, "unknown key"
    keys = list(model.model_fields)
    table = "host" if loc[0] == "hosts" else str(loc[0])
    if len(loc) == 2 or (loc[0] == "hosts" and len(loc) == 3):  # a key of the table itself
        hint = _elsewhere(table, name)
        if hint:
            return None, "unknown key" + hint
    return None, "unknown key" + _did_you_mean(name, keys)


def _flag_of(loc: tuple[Any, ...], overrides: Sequence[Override]) -> str | None:
    """The flag that set what ``loc`` points at (or the table it names), if one did: the last wins."""
    path = tuple(str(p) for p in loc)
    for o in reversed(overrides):
        n = min(len(path), len(o.path))
        if n and path[:n] == o.path[:n]:
            return o.flag
    return None


def _message(errs: list[Any]) -> str:
    """The message of one mistake, the value shown as the job file (and ``--set``) spells it."""
    if len(errs) > 1:  # a value of none of the union's types: one line, every accepted form
        forms = [e["msg"].removeprefix("Input should be ") for e in errs]
        return f"should be {' or '.join(forms)} (got {toml_text(errs[0].get('input'))})"
    err = errs[0]
    msg = err["msg"]
    for prefix in _PREFIXES:
        msg = msg.removeprefix(prefix)
    if err["type"] in ("literal_error", "int_type", "float_type", "string_type", "bool_type",
                       "int_from_float", "list_type", "dict_type"):
        msg = f"{msg} (got {toml_text(err.get('input'))})"
    return msg


def _problems(source: str, errors: list[Any], overrides: Sequence[Override] = ()) -> list[tuple[str, str]]:
    """One ``(location, message)`` per mistake: the errors of a union's members are one mistake. A
    value a flag gave is named by the flag (``--concurrency``, ``--set client.concurrency``)."""
    merged: dict[tuple[Any, ...], list[Any]] = {}
    for err in errors:
        merged.setdefault(field_path(tuple(err["loc"])), []).append(err)
    problems = []
    for loc, errs in merged.items():
        where = _location(source, loc)
        if errs[0]["type"] == "extra_forbidden":
            shown, msg = _unknown(loc)
            if shown is not None:
                where = f"{source} {shown}"
        else:
            msg = _message(errs)
        flag = _flag_of(loc, overrides)
        if flag is not None:
            where = f"{flag} ({where.removeprefix(source).strip() or 'the job'})"
        problems.append((where, msg))
    return problems


def load_config(path: str | Path | None, overrides: Sequence[Override] = (), *,
                source: str = COMMAND_LINE) -> HarvestConfig:
    """Read and validate a TOML configuration file, with ``overrides`` (flags, ``--set``) on top;
    without a file, the job is the overrides alone, said to come from ``source`` (the command
    line's flags, or :data:`KEYWORDS` from Python)."""
    if path is None:
        return parse_config({}, source=source, base=Path.cwd(), overrides=overrides)
    path = Path(path)
    source = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(source, [(source, f"cannot read: {exc.strerror or exc}")]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [(source, f"not UTF-8 text (byte {exc.start})")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [(source, f"TOML syntax: {exc}")]) from None
    except RecursionError:
        raise ConfigError(source, [(source, "TOML nested too deeply")]) from None
    return parse_config(data, source=source, base=path.resolve().parent, overrides=overrides)


__all__ = ["COMMAND_LINE", "KEYWORDS", "RELATIVE_PATHS", "Override", "load_config", "parse_config", "parse_set", "toml_text"]
