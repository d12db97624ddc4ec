"""What ``harvest ps`` and ``harvest stop RUN_DIR`` do on a Ray cluster, without a run's driver.

    ray_ps(cluster, source, show_all)     # every harvest server actor of the job's namespace
    stop_ray_run(run_dir)                 # every server a Ray run recorded, stopped on its node

Each call connects with the job's (or the record's) ``[cluster]``, asks the actors themselves
(each answer bounded), and closes the connection again. A stop goes by the run's record
(``server/placement.json``): each recorded actor's verified stop on its node, then its actor and
placement group removed; an actor that is gone is reported lost, unverified. Nothing here signals a
process or starts or stops Ray itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harvest.config import ClusterConfig
from harvest.errors import ConfigError
from harvest.placement.far_records import stop_report_from_dict
from harvest.placement.ray.cluster import (
    RAY_RECORD,
    RayConnection,
    lost_report,
    node_label,
    on_node,
    read_ray_record,
    record_dir,
    short_error,
    write_ray_record,
)
from harvest.placement.ray.servers import POLL_TIMEOUT_S, STOP_SLACK_S, Member
from harvest.server import StopReport


def ray_ps(cluster: ClusterConfig, source: str, show_all: bool) -> list[dict[str, Any]]:
    """``harvest ps`` of a Ray job: every harvest server actor in the job's namespace, asked where it
    runs and whether its engine is alive (each answer bounded by ``POLL_TIMEOUT_S``); the port is
    measured from here, where the client would reach it."""
    from harvest.net import port_listening

    conn = RayConnection(cluster, source)
    conn.connect()
    rows: list[dict[str, Any]] = []
    try:
        names = sorted(n for n in conn.ray.util.list_named_actors() if str(n).startswith("harvest-"))
        for name in names:
            actor = conn.get_actor(name)
            if actor is None:
                continue
            try:
                state = conn.get(actor.poll.remote(), POLL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - an actor that does not answer is listed as such
                rows.append({"where": f"Ray actor {name}", "name": name, "run_dir": None, "engine": None,
                             "url": None, "pid": None, "port": None, "gpus": [], "started_at": None,
                             "recorded": {"status": "unknown", "processes": 1},
                             "measured": {"leader_alive": False, "alive": 0, "port_listening": False},
                             "error": short_error(exc)})
                continue
            info = state.get("info") or {}
            alive = bool(info) and state.get("returncode") is None and not state.get("stopped")
            if not alive and not show_all:
                continue
            port = info.get("port")
            listening = port is not None and bool(port) and port_listening(str(info.get("node_ip")), int(port),
                                                                           timeout=0.5)
            rows.append({"where": node_label(info.get("node_ip"), info.get("node_id")), "name": name,
                         "run_dir": info.get("run_dir"), "engine": info.get("engine"), "url": info.get("url"),
                         "pid": info.get("pid"), "port": port, "gpus": list(info.get("gpus") or []),
                         "started_at": info.get("started_at"),
                         "recorded": {"status": "ready" if info else "launching", "processes": 1},
                         "measured": {"leader_alive": alive, "alive": int(alive), "port_listening": listening}})
    finally:
        conn.close()
    return rows


def stop_ray_run(folder: Path, deadline: float | None = None) -> list[StopReport]:
    """``harvest stop RUN_DIR`` of a Ray run: every recorded server stopped on its node (verified)."""
    record = read_ray_record(folder)
    if record is None:
        raise ConfigError(str(folder), [(str(folder), f"no {RAY_RECORD} here: not a Ray run")])
    cluster = ClusterConfig(address=record["address"], namespace=record["namespace"])
    conn = RayConnection(cluster, str(folder))
    conn.connect()
    out: list[StopReport] = []
    try:
        for doc in record.get("members", []):
            if doc.get("state") not in ("ready", "new"):
                continue
            m = Member(int(doc["slot"]), doc["name"], info=doc.get("info"))
            m.actor = conn.get_actor(doc["name"])
            m.pg = conn.placement_group(doc["name"])
            budget = float(deadline if deadline is not None else record.get("stop_deadline", 60.0))
            report: StopReport | None = None
            if m.actor is None:
                report = lost_report(m.label, (m.info or {}).get("run_dir", "?"), "its actor is gone")
            elif doc.get("state") == "new" and not conn.placed(m.pg):
                pass  # never placed: its actor never ran (removed below)
            else:
                try:
                    got = conn.get(m.actor.stop.remote(deadline), budget + STOP_SLACK_S)
                    report = on_node(stop_report_from_dict(got, host=m.label), m.label) if got else None
                except Exception as exc:  # noqa: BLE001 - the actor went with its node
                    report = lost_report(m.label, (m.info or {}).get("run_dir", "?"), short_error(exc))
            conn.remove(m.actor, m.pg)
            doc["state"] = "stopped"
            doc["verdict"] = report.verdict if report is not None else None
            if report is not None:
                out.append(report)
        write_ray_record(record_dir(folder), record)
    finally:
        conn.close()
    return out


__all__ = ["ray_ps", "stop_ray_run"]
