"""The ``harvest`` command: a click group whose subcommands live one module each in this package.

Exit codes, shared by every subcommand: 0 success, 1 the check or job failed (or an unexpected
error: its traceback is printed with every secret hidden), 2 usage or configuration error, 130
interrupted.
"""

from __future__ import annotations

import importlib
import sys
import threading
import traceback
from types import TracebackType
from typing import Any

import click

from harvest.version import __version__
from harvest.engine_pins import pins_text
from harvest.errors import ConfigError, RemoteError, StopError, UnsafePathError
from harvest.redact import escape_controls, redact_text

#: name -> (module, attribute) of every subcommand, in help order. Each module defines one click
#: command; it is imported only when that command runs (or for ``--help``): a ``harvest stop`` or
#: a far ``harvest ps --json`` does not pay for the campaign's imports (aiohttp, numpy).
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("harvest.cli.init", "init"),
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


#: Each command's line in ``harvest --help``: one whole short sentence (click would cut the
#: docstring's first sentence at 45 characters, mid-phrase).
SUMMARIES: dict[str, str] = {
    "init": "Write a commented job file to start from.",
    "gpus": "Show GPUs, their processes, host RAM and swap.",
    "preflight": "Check that a server can be launched safely now.",
    "serve": "Launch a server supervised; stop it verified.",
    "stop": "Stop servers harvest started, then verify.",
    "ps": "List servers harvest started, as measured.",
    "run": "Run or resume a campaign (file or flags).",
    "demo": "Run the demo campaign on a tiny local model.",
    "status": "Show where a run stands.",
    "export": "Write a run's results to a file.",
    "compare": "Compare candidate servers' quality.",
    "tune": "Sweep server settings under a quality gate.",
    "report": "Write a folder's HTML report.",
    "version": "Print harvest's version.",
}


#: What each command's exit code means; ``--help`` ends with it. 2 is always a usage or
#: configuration error (named in one line), 130 an interrupt (Ctrl-C).
EXIT_CODES: dict[str, str] = {
    "init": "0 the job file was written; 2 usage error, or the file exists (without --force)",
    "gpus": "0 shown; 1 a GPU or host could not be probed; 2 usage or configuration error",
    "preflight": "0 safe to launch; 1 not safe (or still not safe when --wait ran out); "
                 "2 usage or configuration error",
    "serve": "0 stopped clean (or detached once ready); 1 refused by preflight, the engine failed to start "
             "or exited on its own, or the stop was dirty; 2 usage or configuration error; "
             "130 interrupted during start-up",
    "stop": "0 every server stopped clean (a run going on: stopped, nothing left running), or nothing to "
            "stop; 1 a stop was dirty (GPU memory or the port not freed, a process left); 2 no such folder, "
            "or a record that cannot be read or is refused",
    "ps": "0 listed (also when nothing runs); 2 usage or configuration error",
    "run": "0 every item accounted for (done + truncated + failed + skipped = unique input) within the "
           "limits; 1 the run did not finish (server down, stopped early by the breaker, refused by "
           "preflight) or too many failed or skipped ([run] max_failed_share, [data] max_skipped_share); "
           "2 usage or configuration error; 130 interrupted (run it again to resume)",
    "demo": "0 the demo ran and exported; 1 it did not finish; 2 usage or configuration error; "
            "130 interrupted",
    "status": "0 the run folder was read, whatever state the run is in; 2 no readable harvest ledger there; "
              "with --watch: 0 the run finished, 1 it ended otherwise, 130 Ctrl-C (the run goes on)",
    "export": "0 the file holds every selected item; 1 no item selected (unless --allow-empty) or "
              "malformed results left out (named); 2 no readable ledger, or the options do not fit",
    "compare": "0 every candidate passed the quality gate; 1 one did not; 2 usage or configuration error; "
               "130 interrupted",
    "tune": "0 a setting passed (and, with --then-run, the campaign finished); 1 none passed or the "
            "campaign did not finish; 2 usage or configuration error; 130 interrupted",
    "report": "0 the report was written (its path printed); 2 the folder is not a run, tune or compare "
              "folder, or cannot be read",
    "version": "0",
}


def exit_codes_epilog(name: str) -> str:
    """The last paragraph of ``harvest NAME --help``."""
    return "Exit codes: " + EXIT_CODES[name] + "."


def _said(exc: BaseException) -> str:
    """An error fit for the terminal: it may quote a URL, a record or a ledger another user wrote,
    so secrets by shape are hidden and control characters escaped."""
    return escape_controls(redact_text(str(exc)))


def unexpected(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> str:
    """An error harvest did not mean to raise (a bug), for the terminal: its traceback with
    secrets by shape hidden (a URL's key, a Bearer token) and control characters escaped."""
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    return (f"error: unexpected {exc_type.__name__} (a bug in harvest: please report it with the traceback "
            f"below; secrets in it are hidden)\n" + escape_controls(redact_text(text)).rstrip())


def _hide_secrets_in_uncaught() -> None:
    """Uncaught exceptions (the main thread's, a thread's) print through :func:`unexpected`."""
    def main_hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        sys.stderr.write(unexpected(exc_type, exc, tb) + "\n")

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
            sys.stderr.write(unexpected(args.exc_type, args.exc_value, args.exc_traceback) + "\n")

    sys.excepthook = main_hook
    threading.excepthook = thread_hook


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
        command.epilog = exit_codes_epilog(cmd_name)
        command.short_help = SUMMARIES[cmd_name]
        return command

    def invoke(self, ctx: click.Context) -> Any:
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
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise  # click's own: usage errors (exit 2), --help, aborts
        except Exception as exc:  # a bug: one message, its traceback with every secret hidden
            click.echo(unexpected(type(exc), exc, exc.__traceback__), err=True)
            sys.exit(1)


#: The last paragraph of ``harvest --help``: what every command's exit codes share.
GROUP_EPILOG = ("Exit codes: 0 success; 1 the check or job failed; 2 usage or configuration error; "
                "130 interrupted. Each command's --help says what they mean for it.")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=GROUP_EPILOG)
@click.version_option(__version__, prog_name="harvest",
                      message="%(prog)s %(version)s\nengine adapters checked against:\n" + pins_text())
def cli() -> None:
    """harvest: generate large datasets with an LLM served by vLLM, SGLang, llama.cpp, `transformers
    serve` or any OpenAI-compatible endpoint, safely."""


def main() -> None:
    _hide_secrets_in_uncaught()
    cli(prog_name="harvest")


if __name__ == "__main__":
    main()
