"""The ``harvest gpus --json`` and ``harvest preflight --json`` documents (docs/json-schema.md).

Built here, beside the records they describe, so that every placement (this machine, a far box, a
Ray node) answers with the same document; the CLI only prints them.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from harvest import schemas
from harvest.gpu.preflight import PreflightReport
from harvest.gpu.records import GpuSnapshot, HostState

GPUS_SCHEMA = schemas.GPUS
PREFLIGHT_SCHEMA = schemas.PREFLIGHT


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def gpus_payload(snap: GpuSnapshot, host: HostState, *, time: str | None = None) -> dict[str, Any]:
    """The ``harvest gpus --json`` document."""
    return {
        "schema": GPUS_SCHEMA,
        "time": time or now_iso(),
        "source": snap.source,
        "driver_version": snap.driver_version,
        "unavailable_reason": snap.unavailable_reason,
        "warnings": list(snap.warnings),
        "gpus": [
            {
                "index": g.index, "uuid": g.uuid, "name": g.name,
                "total_mib": g.total_mib, "used_mib": g.used_mib, "free_mib": g.free_mib,
                "reserved_mib": g.reserved_mib, "utilization_pct": g.utilization_pct,
                "processes": [{"pid": p.pid, "name": p.name, "used_mib": p.used_mib, "visible": p.visible}
                              for p in g.processes],
            }
            for g in snap.gpus
        ],
        "host": {
            "ram_total_mib": host.ram_total_mib, "ram_available_mib": host.ram_available_mib,
            "swap_total_mib": host.swap_total_mib, "swap_used_mib": host.swap_used_mib,
        },
    }


def preflight_payload(report: PreflightReport, *, config: str, engine: str) -> dict[str, Any]:
    """The ``harvest preflight --json`` document."""
    return {
        "schema": PREFLIGHT_SCHEMA,
        "time": now_iso(),
        "config": config,
        "engine": engine,
        "passed": report.passed,
        "attempts": report.attempts,
        "waited_s": report.waited_s,
        "warnings": list(report.warnings),
        "results": [
            {"rule": r.rule, "passed": r.passed, "skipped": r.skipped, "gpu": r.gpu, "detail": r.detail,
             "numbers": dict(r.numbers)}
            for r in report.results
        ],
    }


__all__ = ["GPUS_SCHEMA", "PREFLIGHT_SCHEMA", "gpus_payload", "now_iso", "preflight_payload"]
