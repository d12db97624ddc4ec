"""Placement ``ray``: servers as Ray actors, one supervised engine per placement-group bundle.

Ray is imported only inside this package (:func:`~harvest.placement.ray.cluster.import_ray`, one
install hint: the ray extra, ``pip install -e '.[ray]'`` in the clone), and only when a verb needs it. The verbs connect
with the job's ``[cluster]`` (or ``--cluster ADDRESS``), bounded by its ``connect_timeout`` (or
``--timeout``); every answer comes from the nodes themselves (a task pinned to each node, or each
server's actor). Nothing here starts or stops Ray itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from harvest import safefiles
from harvest.config import ClusterConfig, HarvestConfig
from harvest.placement.base import Answer, FleetFactory, Placement, Refused
from harvest.placement.base_results import GpusByPlace, PreflightByPlace
from harvest.placement.ray.cluster import KIND, read_ray_record
from harvest.server import DEFAULT_MARGIN_MIB, StopReport, StopStep

if TYPE_CHECKING:  # the probes are imported when a verb runs
    from harvest.placement.ray.probe import NodeAnswer


def _answers(nodes: Sequence[NodeAnswer]) -> tuple[Answer, ...]:
    """The nodes' answers (:class:`~harvest.placement.ray.probe.NodeAnswer`) as places, each with
    its node id, Ray resources and the time its answer took."""
    return tuple(Answer(a.label, a.doc, None if a.doc is not None else f"{a.error} (waited {a.waited_s:.1f} s)",
                        {"node_id": a.node_id, "resources": dict(a.resources), "waited_s": round(a.waited_s, 3)})
                 for a in nodes)


#: Seconds for the connection and each node's answer of ``gpus`` / ``preflight`` without a
#: ``[cluster]`` table or ``--timeout`` (with one: its ``connect_timeout``).
DEFAULT_TIMEOUT = 30.0


class RayPlacement(Placement):
    """Servers on the Ray cluster of ``[cluster]`` (or of ``--cluster ADDRESS``)."""

    kind: ClassVar[str] = KIND

    def __init__(self, cluster: ClusterConfig, source: str, *, config: HarvestConfig | None = None,
                 timeout: float | None = None):
        self.cluster = cluster
        self.source = source
        self.config = config
        self.timeout = timeout

    def where(self) -> str:
        return f"the Ray cluster at {self.cluster.address}"

    def _probe_timeout(self) -> float:
        """``--timeout``, else the job's ``connect_timeout``: a node's first answer starts a Ray
        worker process there, which a busy node can take tens of seconds to start."""
        if self.timeout:
            return self.timeout
        if self.config is not None and self.config.cluster is not None:
            return self.config.cluster.connect_timeout
        return DEFAULT_TIMEOUT

    def gpus(self) -> GpusByPlace:
        from harvest.placement.ray.probe import cluster_gpus

        answers = cluster_gpus(self.cluster.address, timeout=self._probe_timeout(),
                               runtime_env=self.cluster.runtime_env or None)
        return GpusByPlace(self.kind, self.where(), "node",
                       f"GPUs by Ray node ({self.cluster.address}, {len(answers)} alive)", _answers(answers))

    def preflight(self, cfg: HarvestConfig, *, output_dir: Path | None = None, wait_s: float | None = None,
                  on_wait: Callable[[], None] | None = None) -> PreflightByPlace:
        from harvest.placement.ray.probe import cluster_preflight

        if wait_s is not None:
            raise Refused("--wait", "--wait does not combine with a Ray cluster (each node is checked once)")
        server = cfg.require_server()
        answers = cluster_preflight(self.cluster.address, server.model_dump(mode="json"),
                                    cfg.preflight.model_dump(mode="json"), config=cfg.source,
                                    timeout=self._probe_timeout(),
                                    output_dir=str(output_dir) if output_dir is not None else None,
                                    runtime_env=self.cluster.runtime_env or None,
                                    gpus_by_ray=self.cluster.gpus_per_server > 0 and not server.gpus)
        gpus = ",".join(str(i) for i in server.gpus) or (
            f"{self.cluster.gpus_per_server} per server, chosen by Ray" if self.cluster.gpus_per_server else "none")
        header = (f"preflight of {cfg.source} on the Ray cluster {self.cluster.address} ({len(answers)} alive "
                  f"nodes): {server.engine}, GPUs {gpus}, tp {server.tp}")
        return PreflightByPlace(self.kind, self.where(), "node", header, cfg.source, server.engine, _answers(answers))

    def _job(self) -> HarvestConfig:
        if self.config is None:
            raise Refused("--cluster", "launching on a Ray cluster needs a job with a [cluster] table "
                                       "(--cluster only probes: gpus, preflight)")
        return self.config

    def fleet(self, *, probe: bool = False, all_hosts: bool = False) -> FleetFactory:
        """Servers as Ray actors; ``probe``: one server (tune / compare measure one)."""
        from harvest.placement.ray.fleet import ray_fleet_factory

        job = self._job()
        if probe and self.cluster.servers != 1:
            job = job.model_copy(update={"cluster": self.cluster.model_copy(update={"servers": 1})})
        return ray_fleet_factory(job, where=self.where())

    def note(self, probe: bool) -> str | None:
        if probe and self.cluster.servers != 1:
            return f"each launch places one server on {self.where()}: tune and compare measure one server"
        return None

    def ps(self, show_all: bool) -> list[dict[str, Any]]:
        from harvest.placement.ray.commands import ray_ps

        return ray_ps(self.cluster, self.source, show_all)

    def stop(self, run_dir: Path | None, *, deadline: float | None = None, grace: float | None = None,
             margin_mib: int = DEFAULT_MARGIN_MIB,
             on_step: Callable[[str, StopStep | None], None] | None = None) -> list[StopReport]:
        """The servers a Ray run recorded, each stopped on its node. A folder whose record is not a
        Ray run's (``harvest stop --config RAY_JOB RUN_DIR``) is stopped as its own record says."""
        from harvest.placement.ray.commands import stop_ray_run

        if run_dir is None:
            raise Refused(f"--config {self.source}", f"name the run folder of the servers on {self.where()} "
                                                     "(its record names them)")
        if read_ray_record(run_dir) is None:
            from harvest.placement import from_record

            return from_record(run_dir).stop(run_dir, deadline=deadline, grace=grace, margin_mib=margin_mib,
                                             on_step=on_step)
        return stop_ray_run(run_dir, deadline=deadline)

    def leftovers(self, server_dir: Path | safefiles.Folder) -> list[StopReport]:
        return []  # a Ray run's servers of an earlier session are adopted (or replaced) by its start


__all__ = ["DEFAULT_TIMEOUT", "KIND", "RayPlacement"]
