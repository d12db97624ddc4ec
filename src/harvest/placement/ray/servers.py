"""Servers on a Ray cluster: one campaign, each server a Ray actor supervised on its own node.

    [cluster]
    backend = "ray"
    address = "auto"            # or "HEAD:6379", "ray://HEAD:10001"
    servers = 4                 # or "per_node"
    gpus_per_server = 1

    group = RayServerGroup(config, config.server, run_dir=..., conn=RayConnection(config.cluster))
    await group.start(); group.urls; await group.stop()      # the campaign's RayFleet wraps it

``harvest ps`` and ``harvest stop RUN_DIR`` of a Ray run are :mod:`harvest.placement.ray.commands`;
the fleet the campaign sees, and its factory, :mod:`harvest.placement.ray.fleet`.

The driver (where ``harvest run`` runs) keeps the ledger and the client; the servers are Ray actors
(:class:`harvest.placement.ray.actor.ServerActor`) that run harvest's own supervisor on their nodes.
Steps, each with its budget:

1. Connect (a TCP check of the address within ``connect_timeout``, then ``ray.init``), then check
   room: the bundle ``{"CPU": 1, "GPU": gpus_per_server, **resources}`` against every alive node's
   total resources. Room for no server
   at all, or fewer than ``servers`` asks, is refused before anything is placed, naming the bundle
   and what each node has. A node whose address is not loopback needs ``[server] api_key_env``
   (the engine binds the node's address so that the driver can reach it).
2. Find: actors of this run (named ``harvest-<run id>-<slot>``, detached, recorded in
   ``server/placement.json``) that a killed earlier driver left serving are adopted as they are
   (``poll``, ``POLL_TIMEOUT_S``); the others are replaced.
3. Place: one placement group per server (one bundle, STRICT_PACK, so a tensor-parallel server
   never spans nodes), spread round-robin over the nodes with room (each group pinned to its node
   by Ray's ``ray.io/node-id`` label); waits ``connect_timeout`` for Ray to place it. A number of
   servers goes to the nodes with room *now* (what Ray says each node has free: a node busy with
   other work is not chosen while another has room), any left over where Ray finds room;
   ``per_node`` pins one to each node, busy or not. A group not placed in time leaves its server
   out, naming the bundle, the node it waited on and what is free there; its actor never ran, so
   it is removed without the stop calls that could only time out.
4. Launch: each actor's preflight, launch and readiness on its node, all together (each bounded by
   ``[server] ready_timeout`` + ``LAUNCH_SLACK_S``). A server that fails is named and left out;
   none left is a LaunchError.
5. Watch (beside the dispatch): every ``POLL_S`` each actor is polled (``POLL_TIMEOUT_S``). An
   engine that exited is stopped (verified) on its node; an actor that is gone (its node lost)
   cannot be: its report says so, unverified. Either way the client's endpoint for that server
   already holds its requests uncharged and sends them to the survivors; a replacement is placed
   wherever Ray has room (at most ``run.max_relaunches`` for the run) and the client's endpoint is
   pointed at it (``Client.replace_endpoint``).
6. Stop: each actor's verified stop on its node (``stop_deadline`` + ``STOP_SLACK_S``), one
   StopReport per server, then the actor and its placement group are removed.

harvest on the nodes: each actor imports harvest where Ray placed it, so every node needs the same
harvest as the driver (the actor refuses another version, naming both): installed on each node
(the ray extra: ``pip install -e '.[ray]'`` in the clone), or shipped with ``[cluster] runtime_env`` (``py_modules``, or
``env_vars = { PYTHONPATH = ... }`` for a shared source tree). Nodes started by ``ray start`` from
an environment where harvest imports pass that environment to their workers (the tests do this).
The API key (``[server] api_key_env``) reaches each actor as an argument of its launch, never in
the runtime_env or a record.

Promises: the driver never signals a process (only each actor's supervisor does, on its node, by
its record) and never stops Ray itself; ``ray.kill`` and ``remove_placement_group`` touch only this
run's named actors and groups, after their verified stop or once they are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harvest import safefiles
from harvest.version import __version__
from harvest.client import Client
from harvest.config import KEYLESS_ENGINES, HarvestConfig, PreflightConfig, ServerConfig, is_loopback
from harvest.errors import LaunchError, RemoteError
from harvest.placement.far_records import preflight_report_from_dict, stop_report_from_dict
from harvest.placement.ray.cluster import (
    RAY_RECORD,
    ClusterError,
    RayConnection,
    bundles_that_fit,
    describe_nodes,
    import_ray,
    lost_report,
    node_label,
    on_node,
    plain_resources,
    read_ray_record,
    run_id_of,
    short_error,
    write_ray_record,
)
from harvest.placement.base import OnPreflight
from harvest.placement.base import Readiness as RemoteReady
from harvest.server import StopReport

log = logging.getLogger("harvest.cluster")

POLL_S = 2.0
POLL_TIMEOUT_S = 10.0
#: Polls in a row without an answer before a server counts as lost (a busy node may answer late).
POLL_MISSES = 3
LAUNCH_SLACK_S = 60.0
STOP_SLACK_S = 30.0


@dataclass
class Member:
    """One server slot: its actor, placement group and what the actor reported."""

    slot: int
    name: str
    actor: Any = None
    pg: Any = None
    info: dict[str, Any] | None = None
    state: str = "new"  # new, ready, lost, stopped, failed
    report: StopReport | None = None
    adopted: bool = False
    misses: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    pinned: str | None = None  # the node id its placement group was pinned to (None: where Ray has room)
    placed: bool = False  # its placement group was seen placed (its actor may have run)

    @property
    def label(self) -> str:
        i = self.info or {}
        return node_label(i.get("node_ip"), i.get("node_id"))

    def record(self) -> dict[str, Any]:
        return {"slot": self.slot, "name": self.name, "state": self.state, "info": self.info,
                "verdict": self.report.verdict if self.report else None,
                "error": self.history[-1].get("error") if self.history else None}


class RayServerGroup:
    """The servers of one run on a Ray cluster; the same lifecycle as Server / ServerGroup."""

    def __init__(self, config: HarvestConfig, server: ServerConfig, *, run_dir: Path | safefiles.Folder,
                 conn: RayConnection,
                 preflight: PreflightConfig | None = None, force: bool = False, budget: dict[str, Any] | None = None,
                 on_preflight: OnPreflight | None = None):
        assert config.cluster is not None
        self.config = config
        self.cluster = config.cluster
        self.server_config = server
        #: The near record's folder, held by the caller (a campaign's), else written by its name.
        self.folder = run_dir if isinstance(run_dir, safefiles.Folder) else None
        self.run_dir = run_dir.path if isinstance(run_dir, safefiles.Folder) else Path(run_dir)
        self.conn = conn
        self.preflight_config = preflight
        self.force = force
        self.on_preflight = on_preflight
        self.run_id = run_id_of(self.run_dir.parent if self.run_dir.name == "server" else self.run_dir)
        self.members: list[Member] = []
        self.retired: list[Member] = []
        #: Replacements placed during this run, the client and its URLs (shared by one factory's groups).
        self.budget: dict[str, Any] = budget if budget is not None else {"relaunches": 0, "next_slot": 0}
        self.shared: dict[str, Any] = self.budget.setdefault("shared", {})
        self.ready: RemoteReady | None = None
        self.kv_capacity_tokens: int | None = None
        self.left_out: list[tuple[str, str]] = []
        self._client: Client | None = None
        self._watch: asyncio.Task[None] | None = None
        self._replacing: set[asyncio.Task[None]] = set()
        self._cancelled = False
        self._stopping = False
        self._gave_up = False

    # --- what the runner reads ------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [m.info["url"] for m in self.members if m.state == "ready" and m.info]

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def replacements(self) -> int:
        """Replacements placed during this run (all groups of one factory): ``max_relaunches`` spent."""
        return int(self.budget["relaunches"])

    def placed(self) -> list[dict[str, Any]]:
        return [{"where": m.label, "pid": (m.info or {}).get("pid"), "url": (m.info or {}).get("url")}
                for m in self.members if m.state == "ready"]

    def returncode(self) -> int | None:
        """-1 once no server is left and no replacement may be placed, else None."""
        return -1 if self._gave_up else None

    def cancel(self) -> None:
        """Give up the start-up: launches in flight are told to stop on their nodes (without waiting)."""
        self._cancelled = True
        for m in self.members:
            if m.state == "new" and m.actor is not None:
                with contextlib.suppress(Exception):
                    m.actor.stop.remote()

    def attach_client(self, client: Client) -> None:
        """The client whose endpoints follow the replacements (called once the client exists)."""
        self._client = client
        self.shared["client"], self.shared["urls"] = client, list(self.urls)

    # --- start ------------------------------------------------------------------------------------

    async def start(self) -> RayServerGroup:
        try:
            await asyncio.to_thread(self._plan)
            await asyncio.gather(*(asyncio.to_thread(self._launch, m) for m in self.members if m.state == "new"))
        except BaseException:
            await asyncio.shield(self.stop())
            raise
        if self._cancelled:
            await asyncio.shield(self.stop())
            raise LaunchError("start-up on the Ray cluster was cancelled; its servers were stopped",
                              reason="cancelled")
        for m in self.members:
            if m.state == "failed":
                self.left_out.append((m.name, m.history[-1].get("error", "?") if m.history else "?"))
                self.retired.append(m)
        self.members = [m for m in self.members if m.state == "ready"]
        self._save()
        if not self.members:
            await asyncio.shield(self.stop())
            raise LaunchError("no server launched on the Ray cluster: "
                              + "; ".join(f"{n}: {w}" for n, w in self.left_out), reason="exited")
        seconds = [m.info["ready_s"] for m in self.members if m.info and m.info.get("ready_s") is not None]
        self.ready = RemoteReady(max(seconds) if seconds else 0.0)
        caps = [m.info.get("kv_capacity_tokens") for m in self.members if m.info]
        self.kv_capacity_tokens = min((c for c in caps if c), default=None)
        client = self.shared.get("client")
        if client is not None:  # the runner relaunched the whole group: its client follows the new servers
            self._client = client
            for old, new in zip(self.shared.get("urls", []), self.urls):
                client.replace_endpoint(old, new)
            self.shared["urls"] = list(self.urls)
        self._watch = asyncio.create_task(self._watch_loop())
        return self

    def _plan(self) -> None:
        """Connect, check room, adopt what an earlier driver left serving, place the rest."""
        self.conn.connect()
        bundle = self.cluster.bundle()
        nodes = self.conn.alive_nodes()
        fit = {n["NodeID"]: bundles_that_fit(n["Resources"], bundle) for n in nodes}
        room = sum(fit.values())
        where = f"{self.config.source} [cluster]"
        if room == 0:
            raise ClusterError(self.config.source, where, f"no node has room for one server: each asks "
                               f"{json.dumps(bundle, sort_keys=True)}; the cluster has {describe_nodes(nodes)}")
        wanted = sum(1 for n in fit.values() if n) if self.cluster.servers == "per_node" else int(self.cluster.servers)
        if wanted > room:
            raise ClusterError(self.config.source, f"{where} servers",
                               f"{wanted} servers of {json.dumps(bundle, sort_keys=True)} asked, the cluster has "
                               f"room for {room}: {describe_nodes(nodes)}")
        public = sorted({n["NodeManagerAddress"] for n in nodes if fit[n["NodeID"]]
                         and not is_loopback(n["NodeManagerAddress"])})
        check_node_addresses(self.config.source, self.server_config, public)
        free = self.conn.free_by_node()  # before adoption: an adopted server's bundle is not free
        record = read_ray_record(self.folder or self.run_dir) or {}
        adopted = self._adopt(record)
        self.budget["next_slot"] = max(int(record.get("next_slot", 0)), self.budget["next_slot"],
                                       *(m.slot + 1 for m in adopted))
        self.members = list(adopted)
        count = wanted - len(adopted)
        plan: list[str | None]
        if self.cluster.servers == "per_node":  # one on each node that can hold one, busy or not
            plan = list(self._spread(nodes, fit, count, adopted))
        else:  # on the nodes with room now; the rest where Ray finds room (bounded by connect_timeout)
            plan = list(self._spread(nodes, self._room_now(fit, free, bundle, adopted), count, adopted))
            plan += [None] * (count - len(plan))
        for node_id in plan:
            self.members.append(self._place(node_id))
        self._save()

    @staticmethod
    def _room_now(fit: dict[str, int], free: dict[str, dict[str, float]] | None, bundle: dict[str, float],
                  adopted: list[Member]) -> dict[str, int]:
        """Per node, the servers of this run it can hold now: those it holds (adopted) and the bundles
        its free resources take, never more than its totals take; the totals where Ray cannot say
        what is free. A node busy with other work is then not chosen while another has room."""
        if free is None:
            return fit
        mine: dict[str, int] = {}
        for m in adopted:
            if m.info and m.info.get("node_id"):
                mine[m.info["node_id"]] = mine.get(m.info["node_id"], 0) + 1
        return {nid: min(n, mine.get(nid, 0) + bundles_that_fit(free.get(nid, {}), bundle)) for nid, n in fit.items()}

    def _adopt(self, record: dict[str, Any]) -> list[Member]:
        """Members of the record whose actor still answers with a running engine."""
        out: list[Member] = []
        for doc in record.get("members", []):
            if doc.get("state") not in ("ready", "new"):
                continue
            actor = self.conn.get_actor(doc["name"])
            if actor is None:
                log.warning("server %s of an earlier session is gone; a new one replaces it", doc["name"])
                continue
            try:
                state = self.conn.get(actor.poll.remote(), POLL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - any Ray error: that actor cannot be used
                log.warning("server %s of an earlier session does not answer (%s); it is replaced", doc["name"],
                            short_error(exc))
                gone = Member(int(doc["slot"]), doc["name"], actor=actor, info=doc.get("info"), state="lost",
                              placed=True)
                gone.pg = self.conn.placement_group(doc["name"])
                self._stop_member(gone, "it did not answer when this session began")
                self.retired.append(gone)
                continue
            m = Member(int(doc["slot"]), doc["name"], actor=actor, info=state["info"], adopted=True, placed=True)
            m.pg = self.conn.placement_group(doc["name"])
            if state["returncode"] is not None or state["info"] is None or state["stopped"]:
                log.warning("server %s of an earlier session has exited; it is stopped and replaced", doc["name"])
                self._stop_member(m, None)
                self.retired.append(m)
                continue
            m.state = "ready"
            log.warning("found server %s of an earlier session serving at %s on %s", m.name,
                        (m.info or {}).get("url"), m.label)
            out.append(m)
        return out

    @staticmethod
    def _spread(nodes: list[dict[str, Any]], fit: dict[str, int], count: int, adopted: list[Member]) -> list[str]:
        """Node ids for ``count`` new servers, round-robin over the nodes with room (fewest first)."""
        used: dict[str, int] = {n["NodeID"]: 0 for n in nodes}
        for m in adopted:
            if m.info and m.info.get("node_id") in used:
                used[m.info["node_id"]] += 1
        out: list[str] = []
        for _ in range(count):
            free = [nid for nid, n in fit.items() if n - used[nid] > 0]
            if not free:
                break
            nid = min(free, key=lambda i: (used[i], list(fit).index(i)))
            used[nid] += 1
            out.append(nid)
        return out

    def _place(self, node_id: str | None) -> Member:
        """A placement group of one bundle (pinned to ``node_id`` when given) and the actor in it."""
        ray = self.conn.ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        slot = self.budget["next_slot"]
        self.budget["next_slot"] = slot + 1
        name = f"harvest-{self.run_id}-{slot}"
        m = Member(slot, name, pinned=node_id)
        bundle = self.cluster.bundle()
        kwargs: dict[str, Any] = {"strategy": "STRICT_PACK", "name": name, "lifetime": "detached"}
        if node_id is not None:
            kwargs["bundle_label_selector"] = [{"ray.io/node-id": node_id}]
        m.pg = placement_group([bundle], **kwargs)
        doc = {"version": __version__, "server": self.server_config.model_dump(mode="json"),
               "preflight": self.preflight_config.model_dump(mode="json") if self.preflight_config else None,
               "force": self.force, "name": name, "run_id": self.run_id, "port_offset": slot}
        resources = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
        m.actor = _actor_class(self.conn).options(
            name=name, namespace=self.cluster.namespace, lifetime="detached", max_restarts=0,
            num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), resources=resources or None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(m.pg, placement_group_bundle_index=0),
        ).remote(doc)
        del ray
        return m

    def _no_room(self, m: Member) -> str:
        """Why ``m``'s placement timed out: the bundle, where it waited and what is free there now."""
        asked = f"Ray placed no bundle {json.dumps(self.cluster.bundle(), sort_keys=True)}"
        waited = f"within {self.cluster.connect_timeout:g} s"
        free = self.conn.free_by_node() if m.pinned else None
        if m.pinned and free is not None:
            ip = next((n.get("NodeManagerAddress") for n in self.conn.alive_nodes() if n["NodeID"] == m.pinned), None)
            return (f"{asked} on {node_label(ip, m.pinned)} {waited}; free there now: "
                    f"{plain_resources(free.get(m.pinned, {}))}")
        return f"{asked} {waited}; available now: {plain_resources(self.conn.ray.available_resources())}"

    def _launch(self, m: Member) -> None:
        """Wait for the placement, then the actor's launch on its node (bounded); records the outcome."""
        cfg = self.server_config
        try:
            try:
                self.conn.get(m.pg.ready(), self.cluster.connect_timeout)
            except self.conn.ray.exceptions.GetTimeoutError:
                raise LaunchError(self._no_room(m), reason="spawn_failed") from None
            m.placed = True
            key = cfg.api_key()
            m.info = self.conn.get(m.actor.launch.remote(key.get_secret_value() if key is not None else None),
                                   cfg.ready_timeout + LAUNCH_SLACK_S)
        except Exception as exc:  # noqa: BLE001 - Ray wraps the actor's error; its text names the cause
            why = short_error(exc)
            if m.info is None and m.actor is not None and m.placed:  # name the node the error was raised on
                with contextlib.suppress(Exception):
                    here = self.conn.get(m.actor.where.remote(), POLL_TIMEOUT_S)
                    why = f"{node_label(here.get('node_ip'), here.get('node_id'))}: {why}"
            log.warning("server %s left out: %s", m.name, why)
            m.history.append({"at": time.time(), "error": why})
            m.state = "failed"
            self._stop_member(m, None)
            m.state = "failed"
            return
        m.state = "ready"
        preflight = m.info.pop("preflight", None)  # the node's own preflight, shown as a local one would be
        if preflight is not None and self.on_preflight is not None:
            with contextlib.suppress(RemoteError):
                self.on_preflight(preflight_report_from_dict(preflight, host=m.label))
        log.info("server %s ready at %s on %s (GPUs %s)", m.name, m.info["url"], m.label, m.info.get("gpus"))

    # --- watch ------------------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        """Poll every server together each POLL_S; a lost one is replaced beside the others."""
        while not self._stopping:
            await asyncio.sleep(POLL_S)
            watched = [m for m in self.members if m.state == "ready"]
            if not watched or self._stopping:
                continue
            verdicts = await asyncio.to_thread(self._check, watched)
            for m, why in zip(watched, verdicts):
                if why is not None and not self._stopping and m.state == "ready":
                    m.state = "lost"
                    task = asyncio.create_task(self._replace(m, why))
                    self._replacing.add(task)
                    task.add_done_callback(self._replacing.discard)

    def _check(self, members: list[Member]) -> list[str | None]:
        """For each member: None while it serves, else why it is lost (one poll each, all at once,
        bounded by POLL_TIMEOUT_S together)."""
        ray = self.conn.ray
        refs = [m.actor.poll.remote() for m in members]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=POLL_TIMEOUT_S)
        answered = set(ready)
        out: list[str | None] = []
        for m, ref in zip(members, refs):
            if ref not in answered:
                m.misses += 1
                out.append(f"no answer to {m.misses} polls of {POLL_TIMEOUT_S:g} s" if m.misses >= POLL_MISSES
                           else None)
                continue
            try:
                state = ray.get(ref, timeout=1.0)
            except Exception as exc:  # noqa: BLE001 - the actor died, or its node was lost
                out.append(f"its actor is gone: {short_error(exc)}")
                continue
            m.misses = 0
            code = state["returncode"]
            out.append(f"its engine exited (code {code})" if code is not None else None)
        return out

    async def _replace(self, m: Member, why: str) -> None:
        """Stop (or write off) the lost server, then place and launch its replacement where Ray has
        room; the client's endpoint follows it once it is ready."""
        log.warning("server %s on %s lost: %s", m.name, m.label, why)
        old_url = m.info["url"] if m.info else None
        await asyncio.to_thread(self._stop_member, m, why)
        self.members.remove(m)
        self.retired.append(m)
        self._save()
        if self._stopping:
            return
        if self.budget["relaunches"] >= self.config.run.max_relaunches:
            log.error("no replacement for %s: run.max_relaunches (%d) used up", m.name, self.config.run.max_relaunches)
            self._give_up_if_empty()
            return
        self.budget["relaunches"] += 1
        new = await asyncio.to_thread(self._place, None)  # wherever Ray has room
        self.members.append(new)  # from now on a stop finds it, also mid-launch
        self._save()
        await asyncio.to_thread(self._launch, new)
        if new.state != "ready":
            if new in self.members:
                self.members.remove(new)
                self.retired.append(new)
            self._save()
            self._give_up_if_empty()
            return
        self._save()
        log.warning("replacement %d of %d: server %s at %s on %s", self.budget["relaunches"],
                    self.config.run.max_relaunches, new.name, new.info["url"] if new.info else "?", new.label)
        if self._client is not None and old_url is not None and new.info is not None and not self._stopping:
            self._client.replace_endpoint(old_url, new.info["url"])
            urls = self.shared.get("urls", [])
            self.shared["urls"] = [new.info["url"] if u == old_url else u for u in urls]

    def _give_up_if_empty(self) -> None:
        if not any(m.state in ("ready", "new") for m in self.members):
            self._gave_up = True

    # --- stop -------------------------------------------------------------------------------------

    def _stop_member(self, m: Member, lost: str | None) -> StopReport | None:
        """The verified stop on ``m``'s node (or, its actor gone, a report saying so); then its actor
        and placement group are removed."""
        deadline = self.server_config.stop_deadline
        report: StopReport | None = None
        if m.actor is not None and not m.placed and not self.conn.placed(m.pg):
            pass  # never placed: its actor never ran, nothing on a node to stop (removed below)
        elif m.actor is not None:
            try:
                doc = self.conn.get(m.actor.stop.remote(deadline), deadline + STOP_SLACK_S)
                if doc is not None:
                    report = stop_report_from_dict(doc, host=m.label)
                    report = on_node(report, m.label)
            except RemoteError as exc:
                log.error("server %s: the stop report does not parse: %s", m.name, exc)
            except Exception as exc:  # noqa: BLE001 - actor gone with its node, or no answer in time
                if m.info is not None:
                    report = lost_report(m.label, m.info.get("run_dir", "?"), lost or short_error(exc))
        elif m.info is not None:
            report = lost_report(m.label, m.info.get("run_dir", "?"), lost or "no actor")
        self.conn.remove(m.actor, m.pg)
        m.report = report
        if m.state != "failed":
            m.state = "lost" if lost else "stopped"
        if report is not None:
            log.log(logging.INFO if report.clean else logging.ERROR, "server %s on %s stopped: %s", m.name,
                    m.label, "clean" if report.clean else "DIRTY: " + "; ".join(report.problems))
        return report

    def detach(self) -> None:
        """Leave the servers running (``harvest serve --detach``): the actors are detached, the record
        says where they are, ``harvest stop RUN_DIR`` stops them on their nodes."""
        self._stopping = True
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()
        self._save()
        self.conn.close()

    async def stop(self, deadline: float | None = None) -> list[StopReport]:
        """Every server's verified stop on its node, together; one report each (lost ones included)."""
        self._stopping = True
        watch = self._watch
        if watch is not None and not watch.done():
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        live = [m for m in self.members if m.state in ("ready", "new")]
        with contextlib.suppress(Exception):
            await asyncio.gather(*(asyncio.to_thread(self._stop_member, m, None) for m in live))
        if self._replacing:  # a replacement mid-launch was stopped above: let its task see that and end
            await asyncio.wait(list(self._replacing), timeout=self.server_config.stop_deadline + STOP_SLACK_S)
        reports = [m.report for m in [*self.retired, *live] if m.report is not None]
        if self.members or self.retired:  # nothing placed (refused before placement): no record
            self._save()
        await asyncio.to_thread(self.conn.close)
        return reports

    def _save(self) -> None:
        members = [*self.retired, *self.members]
        write_ray_record(self.folder or self.run_dir, {"run_id": self.run_id, "address": self.cluster.address,
                                     "namespace": self.cluster.namespace, "next_slot": self.budget["next_slot"],
                                     "stop_deadline": self.server_config.stop_deadline,
                                     "members": [m.record() for m in members]})


def check_node_addresses(source: str, server: ServerConfig, public: list[str]) -> None:
    """On the driver, before anything is placed: a server binds its node's address, so a node whose
    address is not loopback needs an engine that takes an API key, and the key (``api_key_env``).
    The same rule [server] applies to ``host`` (config/server.py), said here with the node's address."""
    if not public:
        return
    where = ", ".join(public)
    if server.engine in KEYLESS_ENGINES:
        raise ClusterError(source, f"{source} [server] engine",
                           f"engine '{server.engine}' takes no API key, and the servers would bind their "
                           f"node's address ({where}), not loopback: use an engine that takes a key "
                           f"(vllm, sglang, llamacpp) with api_key_env, or nodes at loopback addresses")
    if not server.api_key_env:
        raise ClusterError(source, f"{source} [server] api_key_env",
                           f"the servers bind their node's address ({where}), not loopback: "
                           f"serving there needs an API key (set api_key_env)")


def _actor_class(conn: RayConnection) -> Any:
    from harvest.placement.ray.actor import ServerActor

    return conn.ray.remote(max_concurrency=4)(ServerActor)


__all__ = ["LAUNCH_SLACK_S", "POLL_MISSES", "POLL_S", "POLL_TIMEOUT_S", "STOP_SLACK_S", "ClusterError", "Member",
           "RAY_RECORD", "RayServerGroup", "check_node_addresses", "import_ray", "read_ray_record"]
