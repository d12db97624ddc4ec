"""A real local Ray cluster for the cluster tests: a head and two worker "nodes" on this machine.

Started once per session with Ray's own multi-node test utility (``ray.cluster_utils.Cluster``),
which keeps the Popen handle of every process it starts and removes a node by those handles; no
test stops Ray by name. Every node is told apart by a custom resource (``node_a`` / ``node_b``);
only the workers carry ``engine`` slots, so servers never land on the head. All nodes bind
loopback (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray use 127.0.0.1 as each node's address),
so the engines bind loopback too. The worker processes import harvest from the same source as the
tests (PYTHONPATH, inherited by every Ray process this session starts).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import harvest
from tests.realparts import require

OBJECT_STORE = 100 * 1024 * 1024
#: Every node's address, given explicitly: the environment switch below is read when Ray is first
#: imported, which another test of the session may have done already.
LOOPBACK = "127.0.0.1"
#: Node liveness checked every second, dead after 3 misses (Ray's defaults take ~30 s). No idle
#: workers started ahead of use (Ray starts one per CPU for each node and driver: Python processes
#: importing Ray, ~1 s of CPU each, that harvest's actors never wait for here).
SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                 "health_check_initial_delay_ms": 1000, "enable_worker_prestart": False,
                 "prestart_worker_first_driver": False}
#: Every node without Ray's log monitor: it polls the session's log files all session long (26 s of
#: CPU in a 20-minute suite) to stream workers' output to drivers, and harvest's drivers ask for
#: none (``log_to_driver=False``).
NODE_ARGS = {"node_ip_address": LOOPBACK, "object_store_memory": OBJECT_STORE, "include_dashboard": False,
             "include_log_monitor": False}
#: Engine slots per worker node: a node can take the replacement of a lost neighbour.
ENGINE_SLOTS = 2


@dataclass
class LocalCluster:
    cluster: Any
    address: str
    state_dir: Path
    env: dict[str, str]
    workers: dict[str, Any] = field(default_factory=dict)  # "node_a" -> ray Node

    def add_worker(self, label: str) -> Any:
        node = self.cluster.add_node(num_cpus=2, resources={label: 1, "engine": ENGINE_SLOTS}, **NODE_ARGS)
        self.cluster.wait_for_nodes(timeout=120)
        self.workers[label] = node
        return node

    def node_id(self, label: str) -> str:
        return self.workers[label].node_id

    def raylet_pid(self, label: str) -> int:
        return self.workers[label].all_processes["raylet"][0].process.pid


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("ray-state")
    src = str(Path(harvest.__file__).resolve().parent.parent)
    patch = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
             "HARVEST_STATE_DIR": str(state),
             "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    mp = pytest.MonkeyPatch()
    for k, v in patch.items():
        mp.setenv(k, v)
    # Imported after the environment is set: Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER at import.
    require("ray", "Ray is the cluster backend these tests drive (a local cluster)")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 1, **NODE_ARGS, "_system_config": SYSTEM_CONFIG})
    try:
        local = LocalCluster(cluster, cluster.address, state, dict(os.environ))
        local.add_worker("node_a")
        local.add_worker("node_b")
        yield local
    finally:
        cluster.shutdown()  # every node's processes, by the Popen handles Cluster kept
        mp.undo()
