"""One sweep launch and its judgement, shared by ``harvest compare`` and ``harvest tune``.

    launches = Launches(placement, force=False, on_preflight=None)
    outputs, launch = await launches.run("candidate-1", cfg, folder, bench.outputs, preflight=job.preflight)
    judged = judge(launch, bench.evaluate(outputs) if outputs is not None else None)
    judged.verdict   # "pass", "fail", "unsupported" or "failed"

:func:`launch_and_run` is the whole life of one server: launch, the caller's work on it, then the
verified stop -- always, whatever failed. How it went is a :class:`Launch` (ready time, KV
capacity, the stop, why it failed); launch and server failures are recorded there, never raised.
:class:`Launches` keeps a sweep's launches in order, each through the probe fleets of one
placement (``placement.fleet(probe=True)``, a single server). :func:`judge` turns a launch and its
evaluation into a verdict: a dirty stop fails the setting whatever it measured.

This module never signals a process itself: launches and stops go through the server factory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from harvest.config import PreflightConfig, ServerConfig
from harvest.errors import LaunchError, PreflightFailed, RequestError, ServerSick
from harvest.events import Listener
from harvest.gpu.preflight import GPU_MEMORY, HOST_RAM
from harvest.placement import Fleet, FleetFactory, OnPreflight, Placement
from harvest.quality.evaluate import GateResult, QualityReport
from harvest.stops import StopReport

log = logging.getLogger("harvest.sweep")

#: Preflight rules whose failure means "not enough memory for these settings".
MEMORY_RULES = frozenset({GPU_MEMORY, HOST_RAM})
T = TypeVar("T")


@dataclass(frozen=True)
class Launch:
    """How one launch went: ready time, KV capacity, the stop, and why it failed if it did."""

    label: str
    run_dir: str | None
    ready_s: float | None = None
    kv_capacity_tokens: int | None = None
    stop: StopReport | None = None
    #: Why the launch or the work on the server failed (None when both went well).
    error: str | None = None
    #: ``preflight``, a :class:`LaunchError` reason (``out_of_memory``, ``exited``, ``unsupported``, ...),
    #: ``server_sick`` or ``request``; None when nothing failed.
    reason: str | None = None
    #: The failure was for lack of memory (out of memory at start, or a preflight memory rule).
    memory_bound: bool = False

    @property
    def stopped_clean(self) -> bool:
        """True when nothing needed stopping or the stop measured everything gone."""
        return self.stop is None or self.stop.clean

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "run_dir": self.run_dir, "ready_s": self.ready_s,
                "kv_capacity_tokens": self.kv_capacity_tokens, "error": self.error, "reason": self.reason,
                "memory_bound": self.memory_bound,
                "stop": None if self.stop is None else {"verdict": self.stop.verdict,
                                                        "total_s": self.stop.total_s,
                                                        "escalated": self.stop.escalated,
                                                        "problems": list(self.stop.problems)}}


async def launch_and_run(label: str, config: ServerConfig, run_dir: Path,
                         work: Callable[[Fleet], Awaitable[T]], *,
                         preflight: PreflightConfig | None = None, force: bool = False,
                         on_preflight: OnPreflight | None = None,
                         on_event: Listener | None = None,
                         server_factory: FleetFactory) -> tuple[T | None, Launch]:
    """Launch ``config``, run ``work(server)``, then the verified stop -- always, whatever failed.

    ``server_factory`` makes the server (the fleets of a placement, ``placement.fleet(probe=True)``);
    ``work`` reaches it at ``server.client_config``. Launch and server failures are recorded in the
    returned :class:`Launch`, not raised; ``ConfigError`` (the user's configuration, e.g. a task
    scorer) and ``RemoteError`` (a far host that cannot be reached or checked) propagate after the stop.
    """
    server = server_factory(config, run_dir=run_dir / "server", preflight=preflight, force=force,
                            on_preflight=on_preflight, on_event=on_event)
    log.info("%s: launching %s (run dir %s)", label, config.engine, server.run_dir)
    t0 = time.monotonic()
    try:
        await server.start()
    except PreflightFailed as exc:
        failed = set(exc.failed_rules)
        return None, Launch(label, str(server.run_dir), error=str(exc), reason="preflight",
                            stop=server.stop_report,
                            memory_bound=bool(failed & MEMORY_RULES))
    except LaunchError as exc:
        first = str(exc).splitlines()[0]
        return None, Launch(label, str(server.run_dir), error=first, reason=exc.reason or "exited",
                            stop=server.stop_report, memory_bound=exc.reason == "out_of_memory")
    ready_s = round(time.monotonic() - t0, 2)
    result: T | None = None
    error = reason = None
    try:
        result = await work(server)
    except ServerSick as exc:
        error, reason = f"the server failed during the probe: {exc}", "server_sick"
    except RequestError as exc:
        error, reason = f"a probe request failed: {exc}", "request"
    finally:
        await server.stop()
        stop = server.stop_report  # a probe fleet holds one server: its verified stop
    log.info("%s: ready in %.1f s, %s; stop %s", label, ready_s, error or "probed",
             stop.verdict if stop is not None else "not needed")
    return result, Launch(label, str(server.run_dir), ready_s, server.kv_capacity_tokens, stop, error, reason)


class Launches:
    """The launches of one sweep, in order, each through the probe fleets of one placement.

    ``notes`` starts with the placement's own (why a probe uses fewer servers than the job would).
    Not reusable.
    """

    def __init__(self, placement: Placement, *, force: bool = False,
                 on_preflight: OnPreflight | None = None, on_event: Listener | None = None):
        self.factory = placement.fleet(probe=True)
        self.force, self.on_preflight, self.on_event = force, on_preflight, on_event
        #: Every launch so far, with its stop.
        self.done: list[Launch] = []
        self.notes: list[str] = []
        note = placement.note(True)
        if note is not None:
            self.notes.append(note)

    async def run(self, label: str, config: ServerConfig, folder: Path, work: Callable[[Fleet], Awaitable[T]],
                  *, preflight: PreflightConfig | None,
                  factory: FleetFactory | None = None) -> tuple[T | None, Launch]:
        """:func:`launch_and_run` in ``folder`` (its server records in ``folder/server``), recorded.
        ``factory``: another placement's fleets (a compare candidate that names its own)."""
        result, launch = await launch_and_run(label, config, folder, work, preflight=preflight,
                                              force=self.force, on_preflight=self.on_preflight,
                                              on_event=self.on_event, server_factory=factory or self.factory)
        self.done.append(launch)
        return result, launch


def dirty_problems(launch: Launch) -> str:
    """What a dirty stop left behind, on one line ("dirty" when it said nothing more)."""
    return "; ".join(launch.stop.problems) if launch.stop is not None and launch.stop.problems else "dirty"


@dataclass(frozen=True)
class Judged:
    """The verdict on one launched setting, with its reasons and what it measured."""

    #: "pass", "fail" (the quality gate), "unsupported" (this machine cannot run the setting) or
    #: "failed" (launch, probe or stop failed).
    verdict: str
    reasons: tuple[str, ...] = ()
    quality: QualityReport | None = None
    gate: GateResult | None = None


def judge(launch: Launch, evaluated: tuple[QualityReport, GateResult] | None) -> Judged:
    """The verdict on a launch and its evaluation (None when the launch or probe failed).

    A launch whose stop was dirty is "failed" whatever it measured: its setting leaves processes or
    memory behind. A launch the engine refused because this machine cannot run the setting (reason
    ``unsupported``, e.g. an FP8 KV cache on a CPU without AVX-512) is "unsupported": a configuration
    problem of that setting here, not a crash.
    """
    stop = () if launch.stopped_clean else (f"dirty stop: {dirty_problems(launch)}",)
    if launch.reason == "unsupported" and not stop:
        return Judged("unsupported", (f"not supported on this machine: {launch.error}",))
    if evaluated is None or launch.error is not None:
        return Judged("failed", stop + (launch.error or "no outputs",))
    report, result = evaluated
    verdict = "failed" if stop else ("pass" if result.passed else "fail")
    return Judged(verdict, stop + tuple(str(c) for c in result.failures), report, result)


__all__ = ["MEMORY_RULES", "Judged", "Launch", "Launches", "dirty_problems", "judge", "launch_and_run"]
