"""The far side's JSON documents read back into the same typed records the near side uses.

A remote stop returns the :class:`~harvest.stops.StopReport` the far harvest measured, not a
new shape; a remote preflight the same :class:`~harvest.gpu.preflight.PreflightReport`. A document
that does not fit raises :class:`RemoteError` naming the host and the step.
"""

from __future__ import annotations

from typing import Any

from harvest.errors import RemoteError
from harvest.gpu.preflight import PreflightReport, RuleResult
from harvest.stops import Holder, ProcessRef, StopReport, StopStep


def _ref(d: dict[str, Any]) -> ProcessRef:
    return ProcessRef(int(d["pid"]), float(d["create_time"]), d.get("name"))


def stop_report_from_dict(doc: dict[str, Any], *, host: str = "?") -> StopReport:
    """Parse ``harvest stop --json`` (schema harvest.stop/1) into a StopReport."""
    try:
        return StopReport(
            run_dir=str(doc["run_dir"]),
            verdict=doc["verdict"],
            steps=tuple(StopStep(s["name"], float(s["duration_s"]), s["outcome"], bool(s.get("ok", True)))
                        for s in doc["steps"]),
            escalated=bool(doc["escalated"]),
            baseline_mib={int(k): int(v) for k, v in doc.get("baseline_mib", {}).items()},
            final_mib={int(k): int(v) for k, v in doc.get("final_mib", {}).items()},
            holders=tuple(Holder(int(h["gpu"]), int(h["pid"]), h.get("name"), h.get("used_mib"), bool(h["ours"]))
                          for h in doc.get("holders", [])),
            survivors=tuple(_ref(p) for p in doc.get("survivors", [])),
            port_open=bool(doc.get("port_open", False)),
            port_holders=tuple(_ref(p) for p in doc.get("port_holders", [])),
            total_s=float(doc.get("total_s", 0.0)),
            deadline_s=float(doc.get("deadline_s", 0.0)),
            problems=tuple(doc.get("problems", [])),
            engine=doc.get("engine"),
            pid=int(doc["pid"]) if doc.get("pid") is not None else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RemoteError(host, "stop", 0.0, f"the far stop report does not parse: {exc!r}", exit_code=2) from None


def preflight_report_from_dict(doc: dict[str, Any], *, host: str = "?") -> PreflightReport:
    """Parse ``harvest preflight --json`` (schema harvest.preflight/1) into a PreflightReport."""
    try:
        results = tuple(RuleResult(r["rule"], bool(r["passed"]), f"[{host}] {r['detail']}", r.get("gpu"),
                                   dict(r.get("numbers", {})), bool(r.get("skipped", False)))
                        for r in doc["results"])
        return PreflightReport(results, tuple(doc.get("warnings", [])), int(doc.get("attempts", 1)),
                               float(doc.get("waited_s", 0.0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise RemoteError(host, "preflight", 0.0, f"the far preflight report does not parse: {exc!r}",
                          exit_code=2) from None


__all__ = ["preflight_report_from_dict", "stop_report_from_dict"]
