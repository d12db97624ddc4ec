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
from harvest.redact import escape_controls

#: (module, attribute) of every subcommand, in help order. Each module defines one click command.
COMMANDS: list[tuple[str, str]] = [
    ("harvest.cli.gpus", "gpus"),
    ("harvest.cli.preflight", "preflight"),
    ("harvest.cli.serve", "serve"),
    ("harvest.cli.serve", "stop"),
    ("harvest.cli.serve", "ps"),
    ("harvest.cli.run", "run"),
    ("harvest.cli.demo", "demo"),
    ("harvest.cli.status", "status"),
    ("harvest.cli.export", "export"),
    ("harvest.cli.compare", "compare_cmd"),
    ("harvest.cli.tune", "tune_cmd"),
    ("harvest.cli.report", "report"),
    ("harvest.cli.version", "version"),
]


class _Group(click.Group):
    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except UnsafePathError as exc:  # one line: the path and what is wrong with it; nothing written
            click.echo(f"error: refused: {escape_controls(str(exc))}", err=True)
            sys.exit(2)
        except StopError as exc:  # no readable launch record: nothing is provably ours to stop
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except RemoteError as exc:  # one line: host, step, time waited
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="harvest",
                      message="%(prog)s %(version)s\nengine adapters checked against:\n" + pins_text())
def cli() -> None:
    """harvest: generate large datasets with an LLM served by SGLang or vLLM, safely."""


for _module, _attr in COMMANDS:
    cli.add_command(getattr(importlib.import_module(_module), _attr))


def main() -> None:
    cli(prog_name="harvest")


if __name__ == "__main__":
    main()
