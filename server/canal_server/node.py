"""The node process minus HTTP: etcd registration, one RunningMonitor per destination.

``Node(config).start()``:

* registers ``{p}/cluster/{node}`` and ``{p}/destinations/{d}/cluster/{node}`` under a
  node lease kept alive by a thread; after an outage (lease expired) it grants a new
  lease and registers again;
* builds one ``Instance`` per destination and its server RunningMonitor, which keeps
  the leaders spread over the nodes (a ``Balancer``, ``[balance]``);
* keeps a cache of each destination's leader record (a watch on its running key,
  refreshed by the registration loop; the answer of the newer etcd revision wins), for
  the standby redirect and a step-down's wait for its successor.

The node record (``{"node", "url", "pid", "destinations"}``) carries ``canal``, the
``host:port`` of the node's Canal listener when it has one: ``canal_address(node)``
reads it for a standby that relays a Canal client to the leader.

``step_down(d, to)`` hands a led destination over to another node (the REST admin
route). ``stop()`` hands every led destination over to the least loaded live node
configured for it (graceful handover: final meta flush, then the successor takes over
at once), releases the ones nobody else can take, revokes the node lease and closes
the coordinator. ``begin_leaving()`` is the quick first half (SIGTERM): stop answering
and parsing at once, mark the node record ``leaving`` and start the handovers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from canal_cluster.balance import Balancer
from canal_cluster.coordinator import Coordinator, Lease, Watch, WatchEvent, WatchEventType
from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.keys import Keys
from canal_cluster.retry import wait_until
from canal_cluster.running import RunningInfo, RunningMonitor, server_running_monitor
from canal_protocol.errors import (
    CoordinationError,
    Fenced,
    HandoverFailed,
    HandoverTimeout,
    RetryExhausted,
    UnknownDestination,
)
from canal_server.config import NodeConfig
from canal_server.embedded import EmbeddedServer
from canal_server.instance import Instance, Role, build_instance
from canal_server.metrics import (
    ClientGauge,
    DestinationGauges,
    NodeMetrics,
    SnapshotGauge,
    lag_of,
)
from canal_server.parse import rowcodec

__all__ = ["CANAL_ADDRESS_TTL_S", "ETCD_CHECK_TTL_S", "DestinationView", "EtcdProbe", "Node"]

log = logging.getLogger(__name__)


ETCD_CHECK_TTL_S = 1.0
CANAL_ADDRESS_TTL_S = 2.0  # a node record's Canal address is read again after this


class EtcdProbe:
    """Whether etcd answers a read (bounded by the coordinator's timeout), asked at
    most once per ``ttl_s``; concurrent callers wait for the one check under way."""

    def __init__(
        self, check: Callable[[], object], ttl_s: float = ETCD_CHECK_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self._check, self._ttl_s, self._clock = check, ttl_s, clock
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, Any]] | None = None

    def get(self) -> dict[str, Any]:
        with self._lock:
            cached = self._cached
            if cached is not None and self._clock() - cached[0] < self._ttl_s:
                return cached[1]
            try:
                self._check()
                result: dict[str, Any] = {"reachable": True, "error": ""}
            except (CoordinationError, OSError) as exc:
                result = {"reachable": False, "error": f"{type(exc).__name__}: {exc}"}
            self._cached = (self._clock(), result)
            return result


@dataclass(frozen=True)
class DestinationView:
    """What the API needs to route one request for a destination: the one answer to
    "does this node serve it now" (``serving``, set exactly when ``role`` is LEADER)."""

    role: Role
    epoch: int  # ours when leading, else the known leader's (0 = unknown)
    leader: RunningInfo | None
    handing_to: str | None = None  # this node is handing it over to that node
    serving: tuple[EmbeddedServer, int] | None = None  # (server, epoch) while leading


class Node:
    def __init__(self, config: NodeConfig, coordinator: Coordinator | None = None) -> None:
        self.config = config
        self.id = config.node.id
        self.url = config.advertise_url
        self.keys = Keys(config.etcd.prefix)
        self.coord = coordinator or EtcdCoordinator(
            config.etcd.endpoints, timeout_s=config.etcd.timeout_s,
            security=config.etcd.security(),
        )  # fmt: skip
        self.metrics = NodeMetrics()
        self.instances: dict[str, Instance] = {}
        self.monitors: dict[str, RunningMonitor] = {}
        self._leaders: dict[str, RunningInfo | None] = {}
        self._leaders_rev: dict[str, int] = {}  # the etcd revision each cached record is of
        self._leaders_lock = threading.Lock()
        self._watches: list[Watch] = []
        self._lease: Lease | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._etcd = EtcdProbe(lambda: self.coord.get(self.keys.node(self.id)))
        self._canal_addresses: dict[str, tuple[float, str | None]] = {}
        election = config.election.election_config()
        self._leaving = False
        self._leave_thread: threading.Thread | None = None
        self._leave_lock = threading.Lock()
        self._balance_thread: threading.Thread | None = None
        self.balancer = Balancer(
            self.coord, self.keys, self.id, self.led,
            hold_s=config.balance.hold_s,
            defer_s=max(election.switch_delay_s, 2 * election.loop_interval_s),
            refresh_s=election.loop_interval_s,
            handover_timeout_s=election.ttl_s,
        )  # fmt: skip
        for name, dest in config.destinations.items():
            inst = build_instance(
                dest,
                self.coord,
                self.keys,
                flush_period_ms=config.meta.flush_period_ms,
                metrics=self.metrics.instance(name),
            )
            monitor = server_running_monitor(
                self.coord, self.keys, name, self.id, self.url, election,
                on_gained=inst.on_gained, on_lost=inst.on_lost,
                placement=self.balancer.placement(name) if config.balance.enable else None,
            )  # fmt: skip
            inst.attach(monitor)
            self.instances[name] = inst
            self.monitors[name] = monitor
            self._leaders[name] = None
        self.metrics.watch_state(self)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Node:
        for name in self.instances:
            key = self.keys.running(name)
            self._watches.append(self.coord.watch(key, self._leader_watch(name)))
        self._register()
        self._refresh_leaders()
        self._thread = threading.Thread(target=self._keepalive_loop, name="node-lease", daemon=True)
        self._thread.start()
        if self.config.balance.enable:
            self.balancer.refresh()  # the first view before the first campaign
            self._balance_thread = threading.Thread(
                target=self.balancer.run, args=(self._stop,), name="balance-view", daemon=True
            )
            self._balance_thread.start()
        for monitor in self.monitors.values():
            monitor.start()
        log.info(
            "node %s up at %s (destinations: %s; row decoder: %s)",
            self.id, self.url, ", ".join(self.instances), rowcodec.decoder_name(),
        )  # fmt: skip
        return self

    def close_serving(self) -> None:
        for inst in self.instances.values():
            inst.close_serving()

    def begin_leaving(self) -> None:
        """SIGTERM: stop serving now; hand the led destinations over in the background
        (``stop()`` waits for it)."""
        self.close_serving()
        with self._leave_lock:
            if self._leave_thread is None:
                self._leave_thread = threading.Thread(
                    target=self.leave, name="node-leave", daemon=True
                )
                self._leave_thread.start()

    def leave(self) -> None:
        """Mark the node record ``leaving`` (no node picks it any more), campaign for
        nothing, and hand each led destination over to the least loaded live node
        configured for it, all at once; what nobody can take is released by ``stop``."""
        self._leaving = True
        self.balancer.leave()
        with contextlib.suppress(CoordinationError):  # else the others learn it at its end
            self._put_records()
        handovers = []
        for name in sorted(self.led()):
            t = threading.Thread(target=self._leave_one, args=(name,), name=f"leave {name}")
            t.start()
            handovers.append(t)
        for t in handovers:
            t.join(4 * self.coord.timeout_s + 5)

    def _leave_one(self, name: str) -> None:
        try:
            successor = self.balancer.successor(name)
            if successor is None:
                log.info("%s: no other node configures it: released at stop", name)
                return
            epoch = self.monitors[name].hand_over(successor, f"node {self.id} is leaving")
            log.info(
                "%s: handed over to node %s (node %s, epoch %d)", name, successor, self.id, epoch
            )
        except CoordinationError as exc:  # released (or expires) at stop instead
            log.warning("%s: handover on leaving failed (node %s): %s", name, self.id, exc)

    def stop(self) -> None:
        """Hand every destination over (or release it), revoke the node lease, close etcd."""
        self.close_serving()
        if self._leave_thread is None:
            self.leave()
        else:
            self._leave_thread.join(4 * self.coord.timeout_s + 5)
        self._stop.set()
        for monitor in self.monitors.values():
            monitor.stop(release=True)
        for w in self._watches:
            w.cancel()
        for thread in (self._thread, self._balance_thread):
            if thread is not None:
                thread.join(4 * self.coord.timeout_s + 5)
        lease, self._lease = self._lease, None
        if lease is not None:
            try:
                self.coord.revoke(lease)
            except CoordinationError as exc:
                log.warning("node %s: revoking the node lease failed: %s", self.id, exc)
        self.coord.close()
        log.info("node %s stopped", self.id)

    # -- registration ----------------------------------------------------------------------

    def _record(self) -> bytes:
        data: dict[str, Any] = {
            "node": self.id,
            "url": self.url,
            "pid": os.getpid(),
            "destinations": list(self.instances),
        }
        if self.config.canal.enable:
            data["canal"] = self.config.canal.advertised
        if self._leaving:
            data["leaving"] = True
        return json.dumps(data).encode()

    def _put_records(self, lease: Lease | None = None) -> None:
        lease = lease or self._lease
        if lease is None:
            return
        value = self._record()
        self.coord.register(self.keys.node(self.id), value, lease)
        for name in self.instances:
            self.coord.register(self.keys.destination_node(name, self.id), value, lease)

    def _register(self) -> bool:
        try:
            lease = self.coord.grant_lease(self.config.election.ttl_s)
            self._put_records(lease)
        except CoordinationError as exc:
            self.metrics.etcd_errors.inc()
            log.warning("node %s: registration failed, will retry: %s", self.id, exc)
            return False
        self._lease = lease
        log.info("node %s registered (lease %x)", self.id, lease.id)
        return True

    def _keepalive_loop(self) -> None:
        period = max(self.config.election.ttl_s / 3, 0.2)
        while not self._stop.wait(period):
            lease = self._lease
            try:
                if lease is None:
                    self._register()
                else:
                    self.coord.keepalive(lease)
                self._refresh_leaders()
            except Fenced as exc:  # the lease expired (etcd outage longer than the TTL)
                self.metrics.etcd_errors.inc()
                log.warning("node %s: node lease expired, registering again: %s", self.id, exc)
                self._lease = None
                self._register()
            except CoordinationError as exc:  # unreachable: keep trying the same lease
                self.metrics.etcd_errors.inc()
                log.warning("node %s: node lease keepalive failed: %s", self.id, exc)

    # -- leaders -------------------------------------------------------------------------------

    def _leader_watch(self, name: str) -> Any:
        def on_event(event: WatchEvent) -> None:
            if event.type is WatchEventType.RESYNC:
                self._refresh_leaders((name,))
                return
            info = None
            if event.type is WatchEventType.PUT:
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    data = json.loads(event.value)
                    info = RunningInfo(
                        str(data["node"]), str(data.get("url", "")), event.create_revision
                    )
            self._note_leader(name, info, event.mod_revision)

        return on_event

    def _refresh_leaders(self, names: Iterable[str] | None = None) -> None:
        for name in names if names is not None else list(self.instances):
            key = self.keys.running(name)
            try:  # a range read: its revision dates the answer, an absent key too
                read = self.coord.get_prefix(key)
            except CoordinationError:
                self.metrics.etcd_errors.inc()
                return
            kv = next((kv for kv in read.items if kv.key == key), None)
            self._note_leader(name, RunningInfo.from_kv(kv) if kv else None, read.revision)

    def _note_leader(self, name: str, info: RunningInfo | None, revision: int) -> None:
        """Cache ``info`` as ``name``'s leader as of etcd ``revision``, unless the cache
        is newer already: a watch event can land between a refresh's read and this, and
        a refresh between a change and the watch's event of it."""
        with self._leaders_lock:
            if revision >= self._leaders_rev.get(name, 0):
                self._leaders[name], self._leaders_rev[name] = info, revision

    # -- handovers ---------------------------------------------------------------------------

    def led(self) -> set[str]:
        """The destinations this node leads right now."""
        return {name for name, m in self.monitors.items() if m.is_leader()}

    def step_down(
        self, destination: str, to: str | None = None, timeout_s: float = 10.0
    ) -> dict[str, Any]:
        """Hand ``destination`` over to ``to`` (else the least loaded live node configured
        for it) and wait until it leads: ``{destination, from, to, epoch, new_epoch,
        took_ms}``. ``InvalidArgument("to")`` for a node that cannot take it,
        ``HandoverFailed`` when this node does not lead it or no node can take it,
        ``HandoverTimeout`` when the successor did not lead within ``timeout_s`` (also when
        this node's part, its final flush, had not ended by then: the handover goes on)."""
        self.instance(destination)  # UnknownDestination
        monitor = self.monitors[destination]
        if monitor.leader_epoch() is None:
            raise HandoverFailed(f"{destination}: node {self.id} does not lead it")
        successor = self.balancer.successor(destination, to)
        if successor is None:
            raise HandoverFailed(f"{destination}: no other live node configures it")
        started = time.monotonic()
        epoch = monitor.hand_over(successor, f"step-down asked on node {self.id}", timeout_s)
        log.info("%s: stepped down for node %s (node %s, epoch %d)", destination, successor,
                 self.id, epoch)  # fmt: skip
        remaining = max(0.1, timeout_s - (time.monotonic() - started))
        new = self._await_leader(destination, successor, epoch, remaining)
        return {
            "destination": destination, "from": self.id, "to": successor, "epoch": epoch,
            "new_epoch": new.epoch, "took_ms": round((time.monotonic() - started) * 1000, 1),
        }  # fmt: skip

    def _await_leader(
        self, destination: str, successor: str, epoch: int, timeout_s: float
    ) -> RunningInfo:
        found: list[RunningInfo] = []

        def leads() -> bool:
            info = self._leaders.get(destination)
            if info is not None and info.node == successor and info.epoch > epoch:
                found[:] = [info]
            return bool(found)

        try:
            wait_until(leads, f"{successor} leads {destination}", timeout_s, 0.005, 0.05)
        except RetryExhausted:
            raise HandoverTimeout(
                f"{destination}: node {self.id} handed epoch {epoch} over to {successor}, which "
                f"has not taken over within {timeout_s:.1f}s; the handover expires after "
                f"{self.config.election.ttl_s:g}s and the other nodes campaign"
            ) from None
        return found[0]

    # -- what the API asks ----------------------------------------------------------------------

    def instance(self, destination: str) -> Instance:
        inst = self.instances.get(destination)
        if inst is None:
            raise UnknownDestination(f"destination {destination!r} is not served by this cluster")
        return inst

    def view(self, destination: str) -> DestinationView:
        """How this node stands for ``destination``: serving it (``Instance.serving``,
        the term's own answer), starting to (won the election, the term is loading),
        fenced, or a standby that knows the leader. ``UnknownDestination`` else."""
        inst = self.instance(destination)
        serving = inst.serving()
        leader = self._leaders.get(destination)
        if serving is not None:
            return DestinationView(Role.LEADER, serving[1], leader, serving=serving)
        role, epoch = inst.role()
        if role is Role.LEADER:  # it began serving between the two reads
            role = Role.STARTING
        if role is Role.STANDBY:
            monitor = self.monitors[destination]
            ours = monitor.leader_epoch()
            if ours is None and monitor.campaigning():  # etcd may name us already
                ours = leader.epoch if leader is not None and leader.node == self.id else 0
            elif ours is None:  # a campaign may have been won between the two reads
                ours = monitor.leader_epoch()
            if ours is not None:
                role, epoch = Role.STARTING, ours  # serving in moments
            if leader is not None and leader.node == self.id:
                leader = None  # no usable leader elsewhere
        if epoch is None:
            epoch = leader.epoch if leader is not None else 0
        return DestinationView(role, epoch, leader, self.monitors[destination].handing_to())

    def canal_address(self, node_id: str) -> str | None:
        """The Canal listener (``host:port``) of node ``node_id`` as its etcd record has
        it (None: no such node, or it has no listener); read at most every
        ``CANAL_ADDRESS_TTL_S``. Blocks on etcd (raises CoordinationError)."""
        now = time.monotonic()
        cached = self._canal_addresses.get(node_id)
        if cached is not None and now - cached[0] < CANAL_ADDRESS_TTL_S:
            return cached[1]
        kv = self.coord.get(self.keys.node(node_id))
        address = None
        if kv is not None:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                found = json.loads(kv.value).get("canal")
                address = str(found) if found else None
        self._canal_addresses[node_id] = (now, address)
        return address

    def epoch_of(self, destination: str) -> int:
        try:
            return self.view(destination).epoch
        except UnknownDestination:
            return 0

    def health(self) -> dict[str, Any]:
        """``/v1/health``; asks etcd, and each destination's database (with the led
        sources' ``binlog_end``), at most once a second each, with short timeouts (a
        few seconds at most when etcd or a database hangs)."""
        dests: dict[str, Any] = {}
        for name, inst in self.instances.items():
            v = self.view(name)
            leader = v.leader
            if v.role is Role.LEADER:
                leader = RunningInfo(self.id, self.url, v.epoch)
            dests[name] = {
                "role": v.role.value,
                "epoch": v.epoch,
                "leader_node": leader.node if leader else None,
                "leader_url": leader.url if leader else None,
                "reader": inst.reader_status().to_dict(),
                "reader_position": inst.reader_position(),
                "binlog_end": inst.binlog_end() if v.role is Role.LEADER else None,
                "database": inst.database(),
            }
        return {
            "node": self.id,
            "url": self.url,
            "row_decoder": rowcodec.decoder_name(),
            "etcd": self._etcd.get(),
            "destinations": dests,
        }

    def cluster(self) -> dict[str, Any]:
        """Nodes and leaders as etcd has them (raises CoordinationError)."""
        try:
            nodes = [
                json.loads(kv.value) for kv in self.coord.get_prefix(self.keys.nodes_prefix()).items
            ]
            dests: dict[str, Any] = {}
            for kv in self.coord.get_prefix(f"{self.keys.prefix}/destinations/").items:
                parts = kv.key[len(self.keys.prefix) + len("/destinations/") :].split("/")
                if len(parts) == 2 and parts[1] == "running":
                    info = RunningInfo.from_kv(kv)
                    entry = dests.setdefault(parts[0], {"leader": None, "nodes": []})
                    entry["leader"] = {"node": info.node, "url": info.url, "epoch": info.epoch}
                elif len(parts) == 3 and parts[1] == "cluster":
                    dests.setdefault(parts[0], {"leader": None, "nodes": []})["nodes"].append(
                        parts[2]
                    )
        except CoordinationError:
            self.metrics.etcd_errors.inc()
            raise
        return {"nodes": nodes, "destinations": dests}

    # -- metrics (StateSource) -------------------------------------------------------------------

    def gauges(self) -> Iterable[DestinationGauges]:
        for name, inst in self.instances.items():
            v = self.view(name)
            entries, size = inst.store_stats()
            clients: list[ClientGauge] = []
            if v.role is Role.LEADER and inst.metrics is not None:
                newest = inst.metrics.newest_event_ms
                for c in inst.meta.clients():
                    cursor = inst.meta.cursor(c)
                    lag = None
                    if cursor is not None and newest:
                        lag = max(0.0, (newest - cursor.position.timestamp_ms) / 1000)
                    clients.append(ClientGauge(c, len(inst.meta.batches(c)), lag))
            snapshots = [
                SnapshotGauge(s["id"], s["state"], s["tables_done"], s["tables_total"], s["rows"],
                              s["chunks"], s["rows_per_s"])
                for s in (inst.snapshots.runs() if v.role is Role.LEADER else ())
            ]  # fmt: skip
            lag_bytes, lag_s = self._reader_lag(inst) if v.role is Role.LEADER else (None, None)
            yield DestinationGauges(
                name, v.epoch, v.role is Role.LEADER, entries, size, clients, snapshots,
                inst.config.memory.buffer_bytes, lag_bytes, lag_s,
            )  # fmt: skip

    @staticmethod
    def _reader_lag(inst: Instance) -> tuple[int | None, float | None]:
        """(bytes, seconds) the leader's reader is behind the binlog end (``lag_of``;
        the end is cached for 1 s)."""
        return lag_of(inst.reader_position(), inst.binlog_end(), int(time.time() * 1000))
