"""The ``harvest`` command: a click group whose subcommands live one module each in this package.

Exit codes, shared by every subcommand: 0 success, 1 the check or job failed, 2 usage or
configuration error, 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys

import click

from harvest import __version__
from harvest.engine_pins import pins_text
from harvest.errors import ConfigError, RemoteError, StopError, UnsafePathError
from harvest.redact import escape_controls, redact_text

#: name -> (module, attribute) of every subcommand, in help order. Each module defines one click
#: command; it is imported only when that command runs (or for ``--help``): a ``harvest stop`` or
#: a far ``harvest ps --json`` does not pay for the campaign's imports (aiohttp, numpy).
COMMANDS: dict[str, tuple[str, str]] = {
    "gpus": ("harvest.cli.gpus", "gpus"),
    "preflight": ("harvest.cli.preflight", "preflight"),
    "serve": ("harvest.cli.serve", "serve"),
    "stop": ("harvest.cli.serve", "stop"),
    "ps": ("harvest.cli.serve", "ps"),
    "run": ("harvest.cli.run", "run"),
    "demo": ("harvest.cli.demo", "demo"),
    "status": ("harvest.cli.status", "status"),
    "export": ("harvest.cli.export", "export"),
    "compare": ("harvest.cli.compare", "compare_cmd"),
    "tune": ("harvest.cli.tune", "tune_cmd"),
    "report": ("harvest.cli.report", "report"),
    "version": ("harvest.cli.version", "version"),
}


def _said(exc: BaseException) -> str:
    """An error fit for the terminal: it may quote a URL, a record or a ledger another user wrote,
    so secrets by shape are hidden and control characters escaped."""
    return escape_controls(redact_text(str(exc)))


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        command = getattr(importlib.import_module(where[0]), where[1])
        if command.name != cmd_name:  # the table and the module must agree
            raise RuntimeError(f"harvest.cli: {where[0]}.{where[1]} is named {command.name!r}, not {cmd_name!r}")
        return command

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            click.echo(f"error: {_said(exc)}", err=True)
            sys.exit(2)
        except UnsafePathError as exc:  # one line: the path and what is wrong with it; nothing written
            click.echo(f"error: refused: {_said(exc)}", err=True)
            sys.exit(2)
        except StopError as exc:  # no readable launch record: nothing is provably ours to stop
            click.echo(f"error: {_said(exc)}", err=True)
            sys.exit(2)
        except RemoteError as exc:  # one line: host, step, time waited
            click.echo(f"error: {_said(exc)}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="harvest",
                      message="%(prog)s %(version)s\nengine adapters checked against:\n" + pins_text())
def cli() -> None:
    """harvest: generate large datasets with an LLM served by SGLang or vLLM, safely."""


def main() -> None:
    cli(prog_name="harvest")


if __name__ == "__main__":
    main()
