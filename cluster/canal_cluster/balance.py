"""Fair share of leaders over the nodes: the ``Placement`` of a node's server monitors.

With D destinations (those the live nodes configure) on N live nodes that are not
leaving, a node's **fair share** is ceil(D / N). ``Balancer`` (one per node) keeps a
view of the cluster (``refresh()`` reads the node records under ``{p}/cluster/`` and
the running keys under ``{p}/destinations/``: two reads; the node calls it every
``refresh_s`` from its own thread) and answers the questions each server monitor's
cycle asks (``running.Placement``) from that view alone, never calling etcd itself;
the monitor acts, logs and records the decision with its reason:

- ``surplus`` (a leader): hand this destination over when this node leads more than
  its share, has led the destination for ``hold_s`` at least, has no other handover
  in flight, and a live node configured for it leads fewer than its share (the least
  loaded one, ties by node id). A cluster where no node is over its share makes no
  handover: it is settled, nothing flaps. Each handover lowers the total surplus, so
  the cluster settles after at most that many handovers.
- ``defer`` (a follower about to campaign for a free key): when this node already
  leads its share and a node configured for it leads fewer, let that node go first,
  for at most ``defer_s``. So a dead node's destinations spread over the others
  instead of going to whoever campaigns first.
- ``leave()``: the node is leaving (SIGTERM): its monitors never campaign;
  ``successor`` picks where each of its destinations goes, spreading them.

A node that does not see itself among the live nodes (its registration lapsed) or
whose view is older than ``3 x refresh_s`` (etcd unreachable) decides nothing (its
monitors behave as without a placement).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from canal_cluster.coordinator import Coordinator
from canal_cluster.keys import Keys
from canal_cluster.running import HandoverTarget, Placement, RunningInfo
from canal_protocol.errors import CoordinationError, InvalidArgument
from canal_protocol.ids import validate_id

__all__ = ["Balancer", "ClusterView", "fair_share", "read_view"]

log = logging.getLogger(__name__)


def fair_share(destinations: int, nodes: int) -> int:
    """ceil(destinations / nodes); every destination when there is no node."""
    return math.ceil(destinations / nodes) if nodes > 0 else destinations


@dataclass(frozen=True)
class ClusterView:
    """Live nodes (with the destinations each configures), the leaving ones, and who
    leads each destination (as etcd had them at one read)."""

    nodes: Mapping[str, frozenset[str]]
    leaving: frozenset[str] = frozenset()
    leaders: Mapping[str, str] = field(default_factory=dict)

    @property
    def destinations(self) -> frozenset[str]:
        return frozenset().union(*self.nodes.values())

    @property
    def active(self) -> list[str]:
        """Live nodes that are not leaving, sorted."""
        return sorted(n for n in self.nodes if n not in self.leaving)

    def share(self) -> int:
        return fair_share(len(self.destinations), len(self.active))

    def counts(self) -> dict[str, int]:
        """Destinations led by each active node."""
        counts = dict.fromkeys(self.active, 0)
        for node in self.leaders.values():
            if node in counts:
                counts[node] += 1
        return counts

    def eligible(self, destination: str, exclude: Collection[str] = ()) -> list[str]:
        """Active nodes configured for ``destination``, minus ``exclude``."""
        return [
            n for n in self.active if destination in self.nodes[n] and n not in exclude
        ]  # fmt: skip


def read_view(coordinator: Coordinator, keys: Keys) -> ClusterView:
    """The view from etcd in two reads, whatever the number of destinations: the node
    records, and the keys under ``{p}/destinations/`` (of which the running keys count).
    Raises ``CoordinationError``."""
    nodes: dict[str, frozenset[str]] = {}
    leaving: set[str] = set()
    for kv in coordinator.get_prefix(keys.nodes_prefix()).items:
        try:
            data = json.loads(kv.value)
            node = str(data["node"])
            nodes[node] = frozenset(str(d) for d in data.get("destinations", ()))
        except (ValueError, TypeError, KeyError):
            continue  # unreadable: not a node we can count on
        if data.get("leaving"):
            leaving.add(node)
    leaders: dict[str, str] = {}
    base = f"{keys.prefix}/destinations/"
    for kv in coordinator.get_prefix(base).items:
        destination, _, rest = kv.key[len(base) :].partition("/")
        if rest == "running":
            info = RunningInfo.from_kv(kv)
            if info.node:
                leaders[destination] = info.node
    return ClusterView(nodes, frozenset(leaving), leaders)


class Balancer:
    """The fair-share decisions of node ``node``; see the module docstring. ``own()``
    names the destinations this node leads right now (its monitors' truth)."""

    def __init__(
        self,
        coordinator: Coordinator,
        keys: Keys,
        node: str,
        own: Callable[[], Collection[str]],
        *,
        hold_s: float = 10.0,
        defer_s: float = 5.0,
        refresh_s: float = 1.0,
        handover_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = validate_id(node, "node")
        self.hold_s, self.defer_s = hold_s, defer_s
        self._coord, self._keys, self._own = coordinator, keys, own
        self._refresh_s, self._handover_timeout_s = refresh_s, handover_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._view: tuple[float, ClusterView] | None = None
        self._claims: dict[str, float] = {}  # free destinations we decided to campaign for
        self._handovers: dict[str, tuple[str, float]] = {}  # destination -> (to, since)
        self._leaving = False

    # -- the view -----------------------------------------------------------------------

    def refresh(self) -> ClusterView | None:
        """Read the view from etcd now (the node's thread, every ``refresh_s``); None
        (the old view kept) when etcd does not answer."""
        started = self._clock()
        try:
            view = read_view(self._coord, self._keys)
        except CoordinationError as exc:
            log.debug("node %s: cluster view not read: %s", self.node, exc)
            return None
        self._view = (started, view)
        return view

    def view(self) -> ClusterView | None:
        """The last view read, unless it is older than ``3 x refresh_s``."""
        cached = self._view
        if cached is None or self._clock() - cached[0] > 3 * self._refresh_s:
            return None
        return cached[1]

    def run(self, stop: threading.Event) -> None:
        """Refresh every ``refresh_s`` until ``stop`` is set (a node's thread)."""
        while not stop.is_set():
            self.refresh()
            stop.wait(self._refresh_s)

    def counts(self, view: ClusterView, claims: bool = False) -> dict[str, int]:
        """Leaders per active node: ours as our monitors know them (with ``claims``: plus
        the free keys we campaign for), the others' from ``view`` plus our handovers to
        them in flight."""
        now = self._clock()
        with self._lock:
            return self._counts(view, now, claims)

    def _counts(self, view: ClusterView, now: float, claims: bool = False) -> dict[str, int]:
        counts = view.counts()
        for d, (to, since) in list(self._handovers.items()):
            if view.leaders.get(d) == to or now - since > self._handover_timeout_s:
                del self._handovers[d]  # done (the view counts it), or it expired
            elif to in counts:
                counts[to] += 1
        ttl = self._refresh_s + self._handover_timeout_s  # a claim ends once someone leads
        self._claims = {
            d: t for d, t in self._claims.items() if now - t < ttl and d not in view.leaders
        }
        if self.node in counts:
            mine = set(self._own()) | (set(self._claims) if claims else set())
            counts[self.node] = len(mine)
        return counts

    # -- the monitors' questions ----------------------------------------------------------

    def placement(self, destination: str) -> Placement:
        """What the monitor of ``destination`` asks."""
        return _DestinationPlacement(self, destination)

    @property
    def leaving(self) -> bool:
        return self._leaving

    def leave(self) -> None:
        """From now on this node campaigns for nothing (it is shutting down)."""
        self._leaving = True

    def surplus(self, destination: str, led_for_s: float) -> HandoverTarget | None:
        if self._leaving or led_for_s < self.hold_s:
            return None
        view = self.view()
        if view is None or self.node not in view.active:
            return None
        now = self._clock()
        with self._lock:
            counts = self._counts(view, now)
            if self._handovers:
                return None  # one at a time: the next once the view shows this one done
            share, mine = view.share(), counts[self.node]
            if mine <= share:
                return None
            under = [n for n in view.eligible(destination, {self.node}) if counts[n] < share]
            if not under:
                return None
            to = min(under, key=lambda n: (counts[n], n))
            self._handovers[destination] = (to, now)
        return HandoverTarget(
            to,
            f"node {self.node} leads {mine} > fair share {share} ({len(view.destinations)} "
            f"destinations on {len(view.active)} nodes); {to} leads {counts[to]}",
        )

    def defer(self, destination: str, waited_s: float) -> str | None:
        view = self.view() if waited_s < self.defer_s else None
        now = self._clock()
        with self._lock:
            if view is not None and self.node in view.active:
                counts = self._counts(view, now, claims=True)
                share, mine = view.share(), counts[self.node]
                under = [n for n in view.eligible(destination, {self.node}) if counts[n] < share]
                if mine >= share and under:
                    return (
                        f"node {self.node} leads {mine} >= fair share {share}; "
                        f"{', '.join(under)} lead fewer: they campaign first "
                        f"(for up to {self.defer_s:g}s)"
                    )
            self._claims[destination] = now
        return None

    # -- handovers asked for (step-down, leaving) -----------------------------------------

    def successor(self, destination: str, to: str | None = None) -> str | None:
        """Who takes ``destination`` from this node: ``to`` once checked (a live node,
        not leaving, configured for it; ``InvalidArgument("to")`` otherwise), else the
        least loaded such node (None: there is none). ``CoordinationError`` when etcd
        cannot be read."""
        now = self._clock()
        view = read_view(self._coord, self._keys)
        self._view = (now, view)
        chosen = to
        if to is not None:
            self._check_successor(view, destination, validate_id(to, "to"))
        with self._lock:
            counts = self._counts(view, now)
            if to is None:
                cands = view.eligible(destination, {self.node})
                chosen = min(cands, key=lambda n: (counts[n], n)) if cands else None
            if chosen is not None:
                self._handovers[destination] = (chosen, now)
        return chosen

    def _check_successor(self, view: ClusterView, destination: str, to: str) -> None:
        if to == self.node:
            raise InvalidArgument("to", f"{to} is this node, the leader of {destination}")
        if to not in view.nodes:
            raise InvalidArgument("to", f"node {to!r} is not live (not registered in etcd)")
        if to in view.leaving:
            raise InvalidArgument("to", f"node {to!r} is leaving")
        if destination not in view.nodes[to]:
            raise InvalidArgument("to", f"node {to!r} does not configure {destination!r}")


@dataclass(frozen=True)
class _DestinationPlacement:
    """``running.Placement`` for one destination of a ``Balancer``."""

    balancer: Balancer
    destination: str

    def leaving(self) -> bool:
        return self.balancer.leaving

    def surplus(self, led_for_s: float) -> HandoverTarget | None:
        return self.balancer.surplus(self.destination, led_for_s)

    def defer(self, waited_s: float) -> str | None:
        return self.balancer.defer(self.destination, waited_s)
