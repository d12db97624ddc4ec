"""``harvest gpus --cluster`` and ``harvest preflight --cluster``: harvest's own probes on every Ray node.

The near side (where the command runs) connects to an existing Ray cluster as a driver, lists the
alive nodes, and runs one small task pinned to each node (``NodeAffinitySchedulingStrategy``,
``soft=False``: the task runs on that node or not at all; ``num_cpus=0``: busy nodes still answer).
The task runs harvest's own GPU probe (or its preflight rules) there and returns the very JSON
document ``harvest gpus --json`` (``harvest preflight --json``) prints, which the near side renders
in one table with a node column. The far node needs harvest importable by its Ray workers (installed
there, or ``PYTHONPATH`` in the node's environment or the job's ``runtime_env``).

Steps and what each may spend (``timeout`` seconds each):

    1. connect   a TCP connection to the address first (a closed port fails at once), then
                 ``ray.init`` on a watchdog thread: a cluster that does not answer is an error
                 naming the address and the time waited, never an endless retry
    2. nodes     the alive nodes from the cluster's own table (``ray.nodes()``)
    3. probe     every node's task at once; ``ray.wait`` up to ``timeout``: a node that has not
                 answered by then is named (node id, IP) with the time waited, its task cancelled
    4. detach    ``ray.shutdown()``, which for a driver connected to an existing cluster only
                 disconnects

Promises: nothing here starts or stops a Ray node or signals a process; the far task only measures
(the same probes as the local commands). Every verdict comes from a node's answer; a node that did
not answer is shown as such, never as "no GPU".
"""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harvest.errors import RemoteError
from harvest.placement.ray.cluster import (
    INSTALL_HINT,
    init_bounded,
    node_label,
    short_error,
    sorted_alive_nodes,
    split_address,
)


class RayMissing(RemoteError):
    """The ``ray`` package cannot be imported on the near side (a configuration problem: exit 2)."""

    def __init__(self) -> None:
        super().__init__("ray", "import", 0.0, f"Ray is not installed: {INSTALL_HINT}", exit_code=2)
        self.args = (str(self),)

    def __str__(self) -> str:
        return f"Ray is not installed: {INSTALL_HINT}"


@dataclass(frozen=True)
class NodeAnswer:
    """One node's answer: the far JSON document, or why there is none."""

    node_id: str
    ip: str
    resources: dict[str, float]
    doc: dict[str, Any] | None
    error: str | None
    waited_s: float

    @property
    def label(self) -> str:
        """``node 10.0.0.5 (1a2b3c4d)``: the same words as the campaign's (:func:`node_label`)."""
        return node_label(self.ip, self.node_id)


def import_ray() -> Any:
    """The ``ray`` module, or :class:`RayMissing` (the same install hint as the campaign's)."""
    try:
        import ray
    except ImportError:
        raise RayMissing() from None
    return ray


# -- far side: what the pinned task runs ----------------------------------------------------------


def far_gpus() -> dict[str, Any]:
    """On the node: its ``harvest.gpus/1`` measurement (a ProbeError is that node's ``error``)."""
    from harvest.gpu import host_state, open_probe
    from harvest.gpu.payload import gpus_payload

    probe = open_probe()
    try:
        return gpus_payload(probe.snapshot(), host_state())
    finally:
        probe.close()


def far_preflight(server: dict[str, Any], preflight: dict[str, Any], output_dir: str | None,
                  config: str, gpus_by_ray: bool = False) -> dict[str, Any]:
    """On the node: the ``harvest preflight --json`` document of ``server`` (a [server] table as
    JSON) with ``preflight``'s margins, checked at the node's address (where a run's server binds);
    the disk rule looks at ``output_dir`` (default: the node's temporary folder, where a run's server
    logs go). ``gpus_by_ray``: the job's bundle asks for GPUs, which Ray picks at placement."""
    import tempfile

    import ray

    from harvest.config import PreflightConfig, ServerConfig
    from harvest.gpu import NoGpuProbe, open_probe, run_preflight
    from harvest.gpu.payload import preflight_payload
    from harvest.gpu.preflight import GPUS_BY_RAY, NO_GPUS_LISTED
    from harvest.server import engine_paths

    # The rules look where a run's server binds: the node's address (whether a key is needed there
    # is the driver's check when it places servers, not a preflight rule).
    cfg = ServerConfig.model_validate(server).model_copy(update={"host": ray.util.get_node_ip_address()})
    rules = PreflightConfig.model_validate(preflight)
    probe = open_probe() if (cfg.launched and cfg.gpus) else NoGpuProbe("no GPUs listed")
    unlisted = GPUS_BY_RAY if gpus_by_ray else NO_GPUS_LISTED
    try:
        report = run_preflight(cfg, rules, probe=probe, output_dir=Path(output_dir or tempfile.gettempdir()),
                               unlisted_gpus=unlisted, paths=engine_paths(cfg))
    finally:
        probe.close()
    return preflight_payload(report, config=config, engine=cfg.engine)


# -- near side --------------------------------------------------------------------------------------


def _tcp_check(address: str, timeout: float) -> None:
    """A TCP connection to ``host:port`` (or ``ray://host:port``): a closed or unreachable address
    fails here at once instead of inside Ray's own retries."""
    target = split_address(address)
    if target is None:
        return  # "auto" and friends: Ray resolves them itself
    t0 = time.monotonic()
    try:
        with socket.create_connection(target, timeout=timeout):
            pass
    except OSError as exc:
        raise RemoteError(f"ray {address}", "connect", time.monotonic() - t0,
                          f"no Ray cluster answers there ({exc.strerror or exc})") from None


def connect(address: str, *, timeout: float, runtime_env: dict[str, Any] | None = None) -> Any:
    """Join the cluster at ``address`` as a driver, bounded by ``timeout``; returns the ``ray`` module."""
    ray = import_ray()
    _tcp_check(address, timeout)
    error, waited, hung = init_bounded(ray, timeout, address=address, log_to_driver=False, configure_logging=False,
                                       runtime_env=runtime_env or None, namespace="harvest-probe")
    if hung:
        raise RemoteError(f"ray {address}", "connect", waited, "the cluster did not accept this driver in time")
    if error is not None:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise RemoteError(f"ray {address}", "connect", waited, f"{type(error).__name__}: {first}")
    return ray


def probe_nodes(ray: Any, func: Any, args: tuple[Any, ...], *, timeout: float) -> list[NodeAnswer]:
    """``func(*args)`` on every alive node at once, each pinned to its node; one answer per node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_retries=0)(func)
    nodes = sorted_alive_nodes(ray)
    t0 = time.monotonic()
    refs = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                           name=f"harvest-probe-{n['NodeID'][:8]}").remote(*args) for n in nodes]
    done: dict[Any, float] = {}
    pending = list(refs)
    while pending:
        left = timeout - (time.monotonic() - t0)
        if left <= 0:
            break
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        for ref in ready:
            done[ref] = time.monotonic() - t0
    answers = []
    for node, ref in zip(nodes, refs):
        resources = {k: float(v) for k, v in (node.get("Resources") or {}).items()
                     if not k.startswith("node:")}
        base = {"node_id": node["NodeID"], "ip": node.get("NodeManagerAddress", "?"), "resources": resources}
        if ref not in done:
            with contextlib.suppress(Exception):  # the node is reported as silent either way
                ray.cancel(ref)
            answers.append(NodeAnswer(**base, doc=None, waited_s=time.monotonic() - t0,
                                      error=f"no answer within {timeout:g} s"))
            continue
        try:
            answers.append(NodeAnswer(**base, doc=ray.get(ref, timeout=timeout), error=None, waited_s=done[ref]))
        except Exception as exc:  # noqa: BLE001 - a far failure is that node's answer, one line
            answers.append(NodeAnswer(**base, doc=None, waited_s=done[ref], error=short_error(exc)))
    return answers


def cluster_gpus(address: str, *, timeout: float, runtime_env: dict[str, Any] | None = None) -> list[NodeAnswer]:
    """Every alive node's ``harvest gpus --json`` document."""
    ray = connect(address, timeout=timeout, runtime_env=runtime_env)
    try:
        return probe_nodes(ray, far_gpus, (), timeout=timeout)
    finally:
        ray.shutdown()


def cluster_preflight(address: str, server: dict[str, Any], preflight: dict[str, Any], *, config: str,
                      timeout: float, output_dir: str | None = None,
                      runtime_env: dict[str, Any] | None = None, gpus_by_ray: bool = False) -> list[NodeAnswer]:
    """Every alive node's ``harvest preflight --json`` document for ``server``."""
    ray = connect(address, timeout=timeout, runtime_env=runtime_env)
    try:
        return probe_nodes(ray, far_preflight, (server, preflight, output_dir, config, gpus_by_ray),
                           timeout=timeout)
    finally:
        ray.shutdown()


__all__ = ["INSTALL_HINT", "NodeAnswer", "RayMissing", "cluster_gpus", "cluster_preflight",
           "connect", "far_gpus", "far_preflight", "import_ray", "probe_nodes"]
