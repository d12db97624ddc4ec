"""Options shared by the commands that act on a placement: ``CONFIG`` (``-`` reads stdin) and
``--host USER@NAME`` with its flags (a box over SSH, or a container through ``--exec-prefix``).

``-`` as a CONFIG argument reads the configuration (JSON or TOML) from stdin: that is how a near
harvest hands ``[server]`` to the far one. What the flags name is turned into a placement by
:func:`harvest.placement.from_config`; nothing here decides where.
"""

from __future__ import annotations

import functools
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from harvest.config import HarvestConfig, HostConfig, Override, load_config, parse_config, parse_set
from harvest.errors import ConfigError


def load_config_arg(path: Path | str | None, overrides: tuple[Override, ...] = ()) -> HarvestConfig:
    """``load_config`` with the command's flags on top, or with ``-`` the configuration from stdin
    (a JSON object, else TOML); without a file, the job is the flags alone."""
    if path is None or str(path) != "-":
        return load_config(path, overrides)
    text = sys.stdin.read()
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else _toml(text)
    except ValueError as exc:
        raise ConfigError("<stdin>", [("<stdin>", f"not a JSON or TOML configuration: {exc}")]) from None
    if not isinstance(data, dict):
        raise ConfigError("<stdin>", [("<stdin>", "the configuration is not a table")])
    return parse_config(data, source="<stdin>", base=Path.cwd(), overrides=overrides)


def _toml(text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(text)


def host_from_flags(ssh: str | None, port: int | None, identity_file: str | None, exec_prefix: str | None,
                    ssh_options: tuple[str, ...], far_harvest: str | None) -> HostConfig | None:
    """A ``[host]`` table from command-line flags (None when no flag names a host)."""
    if ssh is None and exec_prefix is None:
        given = [flag for flag, v in (("--port", port), ("--identity-file", identity_file),
                                      ("--ssh-option", ssh_options or None), ("--far-harvest", far_harvest))
                 if v is not None]
        if given:
            raise ConfigError("--host", [(given[0], "needs --host USER@NAME (or --exec-prefix)")])
        return None
    table: dict[str, Any] = {"ssh": ssh, "exec_prefix": shlex.split(exec_prefix or ""),
                             "ssh_options": list(ssh_options)}
    if ssh is None and (port is not None or identity_file is not None or ssh_options):
        raise ConfigError("--host", [("--exec-prefix", "--port, --identity-file and --ssh-option need --host")])
    for key, value in (("port", port), ("identity_file", identity_file), ("harvest", far_harvest)):
        if value is not None:
            table[key] = value
    try:
        return HostConfig.model_validate(table)
    except ValidationError as exc:
        flag = {"ssh": "--host", "harvest": "--far-harvest", "ssh_options": "--ssh-option"}
        raise ConfigError("--host", [(flag.get(str(e["loc"][0]), "--" + str(e["loc"][0]).replace("_", "-")),
                                      e["msg"]) for e in exc.errors()]) from None


def host_options(func: Any) -> Any:
    """``--host USER@NAME`` [``--port``, ``--identity-file``, ``--ssh-option``, ``--exec-prefix``,
    ``--far-harvest``]: the command acts on that host; the function gets ``far_host`` (a HostConfig
    or None)."""

    @functools.wraps(func)
    def wrapper(*args: Any, ssh_host: str | None, ssh_port: int | None, identity_file: str | None,
                exec_prefix: str | None, ssh_options: tuple[str, ...], far_harvest: str | None,
                **kwargs: Any) -> Any:
        try:
            far = host_from_flags(ssh_host, ssh_port, identity_file, exec_prefix, ssh_options, far_harvest)
        except ConfigError as exc:  # a flag's problem: one line naming the flag
            click.echo("error: " + "; ".join(f"{where}: {why}" for where, why in exc.problems), err=True)
            sys.exit(2)
        if far is not None and kwargs.get("config_path") is not None:
            click.echo("error: --host: give --host (and its flags) or --config, not both", err=True)
            sys.exit(2)
        return func(*args, far_host=far, **kwargs)

    options = [
        click.option("--host", "ssh_host", default=None, metavar="USER@NAME",
                     help="act on this host over SSH (instead of the [host] of a config)"),
        click.option("--port", "ssh_port", type=click.IntRange(1, 65535), default=None,
                     help="with --host: its SSH port (default 22)"),
        click.option("--identity-file", default=None, metavar="KEY", help="with --host: the SSH key"),
        click.option("--ssh-option", "ssh_options", multiple=True, metavar="KEY=VALUE",
                     help="with --host: an `ssh -o` option (repeatable)"),
        click.option("--exec-prefix", default=None, metavar='"ARGV"',
                     help='argv run before every far command, e.g. "pct exec 101 --" (a container)'),
        click.option("--far-harvest", default=None, metavar="PATH",
                     help="the harvest executable on the far side (default: harvest)"),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


#: The common settings as flags: (option, table, key, click type, help). Any other: --set.
JOB_FLAGS: tuple[tuple[str, str, str, Any, str], ...] = (
    ("--engine", "server", "engine", str, "what serves the model: vllm, sglang, llamacpp, transformers, openai "
                                          "(a running endpoint) or command"),
    ("--model", "server", "model", str, "the model: a folder, a GGUF file or a hub name"),
    ("--base-url", "server", "base_url", str, "with --engine openai: the running endpoint, e.g. http://host:8000/v1"),
    ("--data", "data", "path", str, "the dataset file or folder (JSONL, JSON, Parquet, CSV, save_to_disk)"),
    ("--max-tokens", "sampling", "max_tokens", int, "tokens generated per answer at most"),
    ("--concurrency", "client", "concurrency", str, "requests in flight, or auto"),
    ("--out", "output", "dir", str, "the run folder"),
)


def job_flags(common: bool = True) -> Any:
    """The common job settings as flags (``--engine``, ``--model``, ``--data``, ``--base-url``,
    ``--max-tokens``, ``--concurrency``, ``--out``; without ``common``, only the next) and ``--set
    SECTION.KEY=VALUE`` (repeatable) for any other; the function gets them as ``overrides`` for
    :func:`load_config_arg`, checked by the same validation as the file, an error naming the flag."""
    flags = JOB_FLAGS if common else ()

    def decorate(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, set_values: tuple[str, ...], **kwargs: Any) -> Any:
            overrides: list[Override] = []
            for flag, table, key, _, _ in flags:
                value = kwargs.pop(flag[2:].replace("-", "_") + "_flag")
                if value is not None:
                    if key == "concurrency" and value != "auto":
                        try:
                            value = int(value)
                        except ValueError:
                            raise click.BadParameter(f"{value!r}: a number of requests or auto",
                                                     param_hint=flag) from None
                    overrides.append(Override(flag, (table, key), value))
            overrides += [parse_set(text) for text in set_values]  # a malformed one: a ConfigError naming it
            return func(*args, overrides=tuple(overrides), **kwargs)

        options = [click.option(flag, flag[2:].replace("-", "_") + "_flag", type=kind, default=None, help=text,
                                metavar="N" if kind is int else "TEXT")
                   for flag, _, _, kind, text in flags]
        options.append(click.option("--set", "set_values", multiple=True, metavar="SECTION.KEY=VALUE",
                                    help="any other setting for this run, VALUE as in the job file (TOML), e.g. "
                                         "--set client.request_timeout=120 (repeatable)"))
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return decorate


__all__ = ["JOB_FLAGS", "host_from_flags", "host_options", "job_flags", "load_config_arg"]
