"""A Ray cluster as harvest sees it: the connection, the run's record and the words for errors.

    conn = RayConnection(config.cluster, source=config.source)   # Ray imported here (ClusterError if absent)
    conn.connect()                                               # bounded: a TCP check first, then ray.init
    conn.alive_nodes(); conn.get(ref, timeout); conn.remove(actor, pg); conn.close()

The campaign's servers on the cluster live in :mod:`harvest.placement.ray.servers`; this module holds
what they and ``harvest stop`` share. Budgets: the address check takes at most ``connect_timeout``
(``ray.init`` would retry an unreachable address without end); every other call names its own
timeout. It never starts or stops Ray itself, and removes only the actors and placement groups it
is given (this run's, by name).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from harvest import safefiles
from harvest.config import ClusterConfig
from harvest.errors import ConfigError
from harvest.placement import record
from harvest.server import StopReport, StopStep

KIND = "ray"
RAY_RECORD = record.RECORD
INSTALL_HINT = "install the ray extra into harvest's environment (pip install -e '.[ray]' in the clone)"


class ClusterError(ConfigError):
    """The cluster cannot take the job as configured (no Ray, no room, an unreachable address): one line."""

    def __init__(self, source: str, where: str, message: str):
        super().__init__(source, [(where, message)], message=f"{where}: {message}")


def import_ray(source: str = "[cluster]") -> Any:
    """Ray, or a ClusterError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ClusterError(source, f"{source} [cluster]", f'backend = "ray" needs Ray: {INSTALL_HINT}') from None
    return ray


def run_id_of(run_dir: Path) -> str:
    """A short, stable id of a run folder: the names of its actors and placement groups."""
    return hashlib.blake2b(str(Path(run_dir).resolve()).encode(), digest_size=6).hexdigest()


def read_ray_record(folder: record.Where) -> dict[str, Any] | None:
    """The driver's record of a Ray run's servers (``folder`` is the run or its server folder; a
    held one is read through its descriptor only)."""
    if isinstance(folder, safefiles.Folder):
        doc = record.read(folder)
        return doc if doc is not None and doc["kind"] == KIND else None
    for f in (Path(folder), Path(folder) / record.SERVER_DIR):
        doc = record.read(f)
        if doc is not None and doc["kind"] == KIND:
            return doc
    return None


def write_ray_record(folder: record.Where, doc: dict[str, Any]) -> None:
    record.write(folder, KIND, doc)


def bundles_that_fit(have: dict[str, float], bundle: dict[str, float]) -> int:
    """How many bundles fit in ``have``."""
    return int(min(have.get(k, 0.0) // v for k, v in bundle.items())) if bundle else 0


def node_label(node_ip: str | None, node_id: str | None) -> str:
    return f"node {node_ip or '?'} ({(node_id or '?')[:8]})"


def plain_resources(resources: dict[str, float]) -> str:
    """Resources without Ray's per-node and per-placement-group entries, as JSON."""
    return json.dumps({k: v for k, v in resources.items() if not k.startswith("node:") and "_group_" not in k
                       and k not in ("memory", "object_store_memory")}, sort_keys=True)


def describe_nodes(nodes: list[dict[str, Any]]) -> str:
    """What each alive node has, for error messages."""
    shown = []
    for n in nodes:
        shown.append(f"{node_label(n['NodeManagerAddress'], n['NodeID'])} {plain_resources(n['Resources'])}")
    return "; ".join(shown) or "no alive node"


def lost_report(where: str, run_dir: str, why: str) -> StopReport:
    """The report of a server whose node (or actor) is gone: nothing could be measured there."""
    return StopReport(run_dir=f"{where}:{run_dir}", verdict="dirty",
                      steps=(StopStep("node", 0.0, f"lost: {why}", ok=False),), escalated=False,
                      problems=(f"{where} lost ({why}): the verified stop could not run there; if that "
                                f"machine is still up, its engine may be too: `harvest stop {run_dir}` on it "
                                f"stops and verifies what that launch recorded",))


def split_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT``; None for anything else (``auto``)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    return (host.strip("[]"), int(port)) if sep and port.isdigit() else None


def init_bounded(ray: Any, timeout: float, **init_kwargs: Any) -> tuple[BaseException | None, float, bool]:
    """``ray.init(**init_kwargs)`` on a watchdog thread, waited for at most ``timeout`` seconds: (the
    error it raised or None, seconds waited, whether it was still going). On a thread of its own Ray
    leaves the process's SIGTERM handler alone, so a SIGTERM still reaches harvest's graceful stop."""
    outcome: dict[str, BaseException] = {}

    def init() -> None:
        try:
            ray.init(**init_kwargs)
        except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError...
            outcome["error"] = exc

    quiet = _Quiet()
    worker_log = logging.getLogger("ray._private.worker")
    worker_log.addFilter(quiet)
    t0 = time.monotonic()
    try:
        thread = threading.Thread(target=init, name="ray-connect", daemon=True)
        thread.start()
        thread.join(timeout)
    finally:
        worker_log.removeFilter(quiet)
    return outcome.get("error"), time.monotonic() - t0, thread.is_alive()


class _Quiet(logging.Filter):
    """Drops Ray's note that it left SIGTERM alone (harvest connects from a thread on purpose)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


class RayConnection:
    """One connection to the cluster and this run's names in it (each call bounded)."""

    def __init__(self, cluster: ClusterConfig, source: str = "[cluster]"):
        self.cluster = cluster
        self.source = source
        self.ray = import_ray(source)
        self.owned = False

    def connect(self) -> None:
        """``ray.init`` from a worker thread (as the group calls it): Ray then leaves the process's
        SIGTERM handler alone, so a SIGTERM still reaches harvest's own graceful stop."""
        ray = self.ray
        if ray.is_initialized():
            return
        self._reachable()
        error, waited, hung = init_bounded(
            ray, self.cluster.connect_timeout, address=self.cluster.address, namespace=self.cluster.namespace,
            runtime_env=self.cluster.runtime_env or None, log_to_driver=False, logging_level=logging.WARNING,
            configure_logging=False)
        where = f"{self.source} [cluster] address"
        if hung:
            raise ClusterError(self.source, where, f"Ray at {self.cluster.address!r} did not accept this driver "
                               f"within {waited:.1f} s (connect_timeout)")
        if error is not None:
            raise ClusterError(self.source, where,
                               f"cannot connect to Ray at {self.cluster.address!r}: {error}".splitlines()[0])
        self.owned = True

    def _reachable(self) -> None:
        """A ClusterError unless something answers at the cluster's address within connect_timeout
        (``ray.init`` itself retries an unreachable address without end)."""
        import socket

        where = f"{self.source} [cluster] address"
        address = self.cluster.address
        if address == "auto":
            try:
                from ray._private.services import canonicalize_bootstrap_address  # private; checked below

                address = canonicalize_bootstrap_address("auto") or ""
            except Exception as exc:  # noqa: BLE001 - Ray says there is no cluster to join
                raise ClusterError(self.source, where, f"address \"auto\" found no running Ray cluster: "
                                   f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
            if not address:
                raise ClusterError(self.source, where, 'address "auto" found no running Ray cluster (no '
                                   'RAY_ADDRESS, no `ray start` on this machine)')
        target = split_address(address)
        if target is None:
            raise ClusterError(self.source, where, f"{self.cluster.address!r} is not HOST:PORT, ray://HOST:PORT "
                               f"or auto")
        try:
            with socket.create_connection(target, timeout=self.cluster.connect_timeout):
                pass
        except OSError as exc:
            raise ClusterError(self.source, where, f"cannot connect to Ray at {address} within "
                               f"{self.cluster.connect_timeout:g} s: {exc.strerror or exc}") from None

    def close(self) -> None:
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()
        self.owned = False

    def alive_nodes(self) -> list[dict[str, Any]]:
        return sorted_alive_nodes(self.ray)

    def free_by_node(self) -> dict[str, dict[str, float]] | None:
        """What each node has free now, by node id, as Ray accounts it (its resources less what
        actors and placement groups hold); None where this Ray cannot say (a private API of Ray's,
        the only per-node one: read guarded, never trusted to exist)."""
        try:
            from ray._private.state import available_resources_per_node  # private; guarded

            got = available_resources_per_node()
        except Exception:  # noqa: BLE001 - another Ray, or the cluster did not answer: use the totals
            return None
        if not isinstance(got, dict):
            return None
        return {str(nid): {str(k): float(v) for k, v in res.items()} for nid, res in got.items()
                if isinstance(res, dict)}

    def remove(self, actor: Any, pg: Any) -> None:
        """Remove this run's actor and placement group from the cluster (after its verified stop, or
        once it is gone)."""
        from ray.util.placement_group import remove_placement_group

        if actor is not None:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
        if pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)

    def placed(self, pg: Any, wait: float = 1.0) -> bool:
        """Whether ``pg`` is placed, looked at now (bounded by ``wait``). An actor in a group that was
        never placed never ran: there is nothing on a node to stop, and a call to it would only wait
        out its timeout. A group of unknown state counts as placed (its actor is asked)."""
        if pg is None:
            return True
        try:
            self.ray.get(pg.ready(), timeout=wait)
        except self.ray.exceptions.GetTimeoutError:
            return False
        except Exception:  # noqa: BLE001 - removed, or Ray could not say: ask the actor as before
            return True
        return True

    def placement_group(self, name: str) -> Any:
        """This run's placement group of that name, or None."""
        from ray.util import get_placement_group

        try:
            return get_placement_group(name)
        except ValueError:
            return None

    def get_actor(self, name: str) -> Any:
        try:
            return self.ray.get_actor(name, namespace=self.cluster.namespace)
        except ValueError:
            return None

    def get(self, ref: Any, timeout: float) -> Any:
        return self.ray.get(ref, timeout=timeout)


def on_node(report: StopReport, label: str) -> StopReport:
    from dataclasses import replace

    return replace(report, run_dir=f"{label}:{report.run_dir}")


def short_error(exc: BaseException) -> str:
    """A (Ray-wrapped) exception as the user needs it, whole but without the traceback: the innermost
    cause; a pydantic validation error as every field and its message (never only pydantic's last
    "For further information" line); a ConfigError as each of its problems."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":
        try:
            parts = [f"{'.'.join(str(x) for x in e.get('loc', ())) or '(value)'}: {e.get('msg')}" for e in errors()]
            return f"{getattr(exc, 'title', 'config')}: " + "; ".join(parts)
        except Exception:  # noqa: BLE001 - fall back to the text below
            pass
    problems = getattr(exc, "problems", None)
    if isinstance(problems, list) and problems:
        return "; ".join(f"{where}: {why}" for where, why in problems)[:2000]
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("For further information")]
    return ("; ".join(lines) if lines else type(exc).__name__)[:2000]


def sorted_alive_nodes(ray: Any) -> list[dict[str, Any]]:
    """The cluster's alive nodes, head first, then by IP and id (the one order every listing uses)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes, key=lambda n: (not n.get("Resources", {}).get("node:__internal_head__"),
                                        n.get("NodeManagerAddress", ""), n["NodeID"]))


def record_dir(folder: Path) -> Path:
    """The folder that holds the Ray record (the run's server folder, or ``folder`` itself)."""
    return Path(folder) if record.read(folder) is not None else Path(folder) / record.SERVER_DIR


__all__ = ["INSTALL_HINT", "RAY_RECORD", "ClusterError", "RayConnection", "bundles_that_fit", "describe_nodes",
           "import_ray", "init_bounded", "lost_report", "node_label", "on_node", "plain_resources", "read_ray_record", "record_dir",
           "run_id_of", "short_error", "sorted_alive_nodes", "split_address", "write_ray_record"]
