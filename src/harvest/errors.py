"""Every exception harvest raises on purpose, in one tree.

    HarvestError                      base: anything harvest raises deliberately
    ├── ConfigError                   the user's configuration is wrong (file, table, field named)
    ├── InputError                    one dataset row is bad (source, line, reason); the row is skipped
    ├── ProbeError                    a GPU / host measurement failed (NVML call, nvidia-smi, GPU index)
    │   └── NoDriverError             no NVIDIA driver on this machine (a state, not a crash)
    ├── PreflightFailed               launching here is unsafe; carries the failed rule results
    ├── ServerError                   something about an engine server
    │   ├── LaunchError               the engine did not become ready (exit code, log tail)
    │   ├── ServerSick                the server answered 5xx / refused connections / failed health
    │   └── StopError                 a stop could not be carried out (state file unreadable, ...)
    ├── RemoteError                   a step on a far host failed or timed out (host, step, time waited)
    ├── RequestError                  one request failed for a reason that belongs to the item (4xx, its answer)
    ├── LedgerError                   the run's ledger refuses an operation (settings mismatch, ...)
    ├── NothingToExport               an export selected no item (no file written; the run's counts, the fix)
    └── UnsafePathError               a folder or file harvest would write is not safely its own (path named)

The split matters: "this item is bad" (InputError, RequestError), "the server is sick" (ServerSick)
and "the job is misconfigured" (ConfigError) are handled differently by the runner, and always by
type, never by matching text of a message.
"""

from __future__ import annotations

from collections.abc import Sequence

from harvest.checks import RuleResult


class HarvestError(Exception):
    """Base class of every error harvest raises on purpose."""


class ConfigError(HarvestError):
    """A configuration file or value is invalid.

    ``problems`` lists each problem as ``(location, message)`` where location reads like
    ``job.toml [server] mem_fraction_static``. ``message``: the whole text, where a subclass says
    its one problem in one line (a placement's refusal); else one line per problem under a heading.
    """

    def __init__(self, source: str, problems: Sequence[tuple[str, str]], *, message: str | None = None):
        self.source = source
        self.problems = list(problems)
        lines = [f"{loc}: {msg}" for loc, msg in self.problems]
        super().__init__(message if message is not None
                         else f"invalid configuration in {source}:\n  " + "\n  ".join(lines))


class InputError(HarvestError):
    """One input row cannot be used. The row is skipped; the run goes on."""

    def __init__(self, source: str, line: int | None, reason: str):
        self.source, self.line, self.reason = source, line, reason
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {reason}")


class ProbeError(HarvestError):
    """A measurement of GPU or host state failed. Verification never swallows this."""

    def __init__(self, message: str, *, gpu: int | None = None, call: str | None = None):
        self.gpu, self.call = gpu, call
        where = []
        if gpu is not None:
            where.append(f"GPU {gpu}")
        if call:
            where.append(call)
        super().__init__(f"{message}" + (f" ({', '.join(where)})" if where else ""))


class NoDriverError(ProbeError):
    """No NVIDIA driver (or no GPU) on this machine."""


class PreflightFailed(HarvestError):
    """Launching the server here is unsafe; ``results`` holds every rule, failures included."""

    def __init__(self, results: Sequence[RuleResult]):
        self.results = list(results)
        super().__init__("preflight failed: " + "; ".join(f"{r.rule}: {r.detail}" for r in self.failures))

    @property
    def failures(self) -> list[RuleResult]:
        """The rules that failed, in order."""
        return [r for r in self.results if not r.passed]

    @property
    def failed_rules(self) -> list[str]:
        """The names of the rules that failed, in order (``["port"]``: only the port was taken)."""
        return [r.rule for r in self.failures]

    def __reduce__(self) -> tuple[type[PreflightFailed], tuple[list[RuleResult]]]:
        # Raised in a Ray actor, it reaches the driver pickled: rebuilt from its results, not its text.
        return type(self), (self.results,)


class ServerError(HarvestError):
    """Base for engine-server problems."""


class LaunchError(ServerError):
    """The engine exited, logged a fatal line, or missed its readiness deadline."""

    #: Values of ``reason``: why the launch failed, for callers that react to the cause (e.g. retry
    #: on another port) without reading the message.
    #: ``unsupported``: the engine said this setting cannot run on this machine (a configuration
    #: problem of the setting, not a crash).
    REASONS = ("exited", "fatal_log", "port_in_use", "out_of_memory", "timeout", "spawn_failed", "cancelled",
               "unsupported")

    def __init__(self, message: str, *, argv: Sequence[str] = (), returncode: int | None = None,
                 log_path: str | None = None, log_tail: str = "", reason: str | None = None):
        self.argv, self.returncode, self.log_path, self.log_tail = list(argv), returncode, log_path, log_tail
        self.reason = reason
        parts = [message]
        if returncode is not None:
            parts.append(f"exit code {returncode}")
        if log_path:
            parts.append(f"log: {log_path}")
        text = "; ".join(parts)
        if log_tail:
            text += "\n--- log tail ---\n" + log_tail.rstrip()
        super().__init__(text)


class ServerSick(ServerError):
    """The server, not the item, is at fault: connection refused, 5xx, failed health check."""

    def __init__(self, message: str, *, endpoint: str | None = None, status: int | None = None):
        self.endpoint, self.status = endpoint, status
        super().__init__(f"{endpoint}: {message}" if endpoint else message)


class StopError(ServerError):
    """A stop could not even be attempted (no state file, unreadable record)."""


class RemoteError(HarvestError):
    """A step on another host (over SSH and/or an exec prefix) failed, or gave no answer in time.

    ``exit_code`` is what the CLI exits with: 2 when the configuration is at fault (a refused key,
    a missing or different far harvest), 1 when a check failed (unreachable, timed out, a far
    step that failed). The message is one line naming host, step and the time waited.
    """

    def __init__(self, host: str, step: str, waited_s: float, reason: str, *, exit_code: int = 1):
        self.host, self.step, self.waited_s, self.reason, self.exit_code = host, step, waited_s, reason, exit_code
        super().__init__(f"host {host}: {step} failed after {waited_s:.1f} s: {reason}")


class RequestError(HarvestError):
    """This item's request failed for a reason that is the item's (a 4xx other than 408/409/425/429)
    or its answer's (retries spent on answers that were oversized, malformed or no completion)."""

    def __init__(self, message: str, *, status: int | None = None, error_class: str | None = None):
        self.status = status
        #: The failure's class as the ledger records it: what the answer was (``oversized``,
        #: ``protocol``, ``bad_reply``, ``redirect``) where the client knows it, else ``http_<status>``,
        #: else ``request``.
        self.error_class = error_class or (f"http_{status}" if status else "request")
        super().__init__(f"HTTP {status}: {message}" if status else message)


class LedgerError(HarvestError):
    """The ledger refuses an operation (e.g. resuming with settings that change outputs)."""


class NothingToExport(HarvestError):
    """An export selected no item of the statuses asked for: no file was written (unless
    ``allow_empty``). The message says what the run holds and what to do; ``report`` is the
    ``ExportReport`` (``Any``: its type lives in the campaign layer, above this module)."""

    def __init__(self, message: str, report: object = None):
        self.report = report
        super().__init__(message)


class UnsafePathError(HarvestError):
    """A folder or file harvest would write in is not safely the user's own: owned by another user,
    writable by group or others, a symlink, or the record of a live server. Nothing was written."""

    def __init__(self, path: object, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")


__all__ = [
    "ConfigError",
    "HarvestError",
    "InputError",
    "LaunchError",
    "LedgerError",
    "NothingToExport",
    "NoDriverError",
    "PreflightFailed",
    "ProbeError",
    "RemoteError",
    "RequestError",
    "ServerError",
    "ServerSick",
    "StopError",
    "UnsafePathError",
]
