"""RunningMonitor: lease-based election of one holder per running key.

The same class serves as ServerRunningMonitor (``/…/{d}/running``: the leader of a
destination) and ClientRunningMonitor (``/…/{d}/{client}/running``: the active
consumer of a client id).

``cycle(now)`` makes every decision and returns the ``Reason`` it acted on; the
monitor thread calls it every ``loop_interval_s`` and earlier when the watch on the
running key fires (not for the record its own campaign wrote). Rules:

- campaign = create the key under a fresh lease; the epoch is its create revision;
- the leader keeps its lease alive and checks the key is still its own, every
  ``loop_interval_s``; a new term's first keepalive comes after a random fraction of
  it (``keepalive_phase``), so the term's keepalives do not inherit the phase of
  etcd's lease-expiry sweep (see ``_delay``);
- it fences itself (``FENCED``) once no keepalive has succeeded for
  ``ttl_s - safety_margin_s`` by its monotonic clock; ``is_leader()`` turns false at
  that instant even while the thread is blocked in a call to etcd;
- when the key disappears, the previous owner campaigns at once, everyone else
  waits ``switch_delay_s`` first (no flapping on a blip); a node seeing its own
  stale record (earlier incarnation, lapsed lease) deletes it and campaigns at once;
- a writer whose fenced write failed calls ``report_fenced(epoch)``: step down;
- ``stop()`` releases: callbacks first (a final flush still holds the epoch), then
  the key is deleted if it is still ours and the lease revoked;
- graceful handover (``hand_over(to)``, or the ``Placement`` finding this node over its
  fair share): callbacks first (final flush), then one fenced transaction deletes the
  key and writes the handover key naming the successor (short lease). While that key
  exists the named node campaigns at once (``TOOK_OVER``) and every other node,
  the old leader included, waits (``WAITING_HANDOVER``);
- with a ``Placement`` a follower about to campaign for a free key lets a node under
  its fair share go first (``DEFERRED``, bounded), and a leaving node never campaigns.

``on_gained(epoch)`` / ``on_lost(epoch)`` run on the monitor thread and should be
quick (start or stop work elsewhere); ``is_leader()`` is already true while
``on_gained`` runs, so gate serving on your own "ready" flag set at its end. Node names
must be unique per key: a monitor treats a record carrying its own node name but not
its lease as its own stale record (an earlier incarnation) and deletes it.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import itertools
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from canal_cluster.coordinator import (
    Coordinator,
    Delete,
    KeyValue,
    Lease,
    Op,
    Put,
    Watch,
    WatchEvent,
    WatchEventType,
)
from canal_cluster.keys import Keys
from canal_protocol.errors import (
    CanalError,
    ConfigError,
    CoordinationError,
    CoordinatorUnavailable,
    Fenced,
    HandoverFailed,
    HandoverTimeout,
)
from canal_protocol.ids import validate_id

__all__ = [
    "ElectionConfig",
    "EpochCallback",
    "HandoverHint",
    "HandoverTarget",
    "MonitorEvent",
    "Placement",
    "Reason",
    "RunningInfo",
    "RunningMonitor",
    "client_running_monitor",
    "read_handover",
    "read_running",
    "server_running_monitor",
]

log = logging.getLogger(__name__)
EpochCallback = Callable[[int], None]
_SEQ = itertools.count(1)


class Reason(enum.Enum):
    """What one ``cycle`` decided."""

    WON = "won"  # campaign won (first start, or after the switch delay)
    RECAMPAIGN_AS_PREVIOUS_OWNER = "recampaign_as_previous_owner"  # we held it last: won at once
    STILL_LEADER = "still_leader"  # keepalive ok and the key is still ours
    KEEPALIVE_FAILED = "keepalive_failed"  # leader, etcd unreachable, still within the window
    FENCED = "fenced"  # leader, no keepalive for ttl - safety margin: stepped down
    LOST = "lost"  # leader, lease expired or key deleted/replaced: stepped down
    STALE_EPOCH = "stale_epoch"  # a fenced write failed (report_fenced): stepped down
    OTHER_LEADER = "other_leader"  # someone else holds the key
    WAITING_SWITCH_DELAY = "waiting_switch_delay"  # key gone, not ours last: waiting
    ETCD_UNAVAILABLE = "etcd_unavailable"  # not leader and etcd unreachable
    ACTIVATION_FAILED = "activation_failed"  # on_gained raised: released the key
    RELEASED = "released"  # graceful stop (key deleted if still ours)
    HANDED_OVER = "handed_over"  # leader, asked (step-down, node leaving): successor named
    REBALANCED = "rebalanced"  # leader over its fair share: handed over to a node under it
    HANDOVER_FAILED = "handover_failed"  # etcd did not take the handover: key expires by TTL
    TOOK_OVER = "took_over"  # a handover named us: campaigned at once and won
    WAITING_HANDOVER = "waiting_handover"  # key gone, a handover names another node
    DEFERRED = "deferred"  # key free, at our fair share: a node under it goes first
    LEAVING = "leaving"  # this node is leaving: no campaign


_STEP_DOWN = frozenset({Reason.LOST, Reason.FENCED, Reason.STALE_EPOCH})
_GAINED = frozenset({Reason.WON, Reason.RECAMPAIGN_AS_PREVIOUS_OWNER, Reason.TOOK_OVER})
_HANDED = frozenset({Reason.HANDED_OVER, Reason.REBALANCED, Reason.HANDOVER_FAILED})
_ENDED = _STEP_DOWN | _HANDED | {Reason.RELEASED, Reason.ACTIVATION_FAILED}


@dataclass(frozen=True)
class ElectionConfig:
    """Timing of one election; validated against the coordinator's call timeout."""

    ttl_s: float = 10.0
    safety_margin_s: float = 2.0
    loop_interval_s: float = 1.0
    switch_delay_s: float = 5.0

    def validate(self, call_timeout_s: float) -> ElectionConfig:
        if self.loop_interval_s <= 0:
            raise ConfigError("election.loop_interval_s", "must be > 0")
        if self.switch_delay_s < 0:
            raise ConfigError("election.switch_delay_s", "must be >= 0")
        if not 0 < self.safety_margin_s < self.ttl_s:
            raise ConfigError("election.safety_margin_s", "must be > 0 and < election.ttl_s")
        need = self.loop_interval_s + 2 * call_timeout_s
        if self.ttl_s - self.safety_margin_s < need:
            raise ConfigError(
                "election.ttl_s",
                f"ttl_s - safety_margin_s ({self.ttl_s - self.safety_margin_s:g}) must be >= "
                f"loop_interval_s + 2 x etcd timeout ({need:g}): room for two keepalives",
            )
        return self


@dataclass(frozen=True)
class RunningInfo:
    """The record in a running key; ``epoch`` comes from the key's create revision."""

    node: str
    url: str
    epoch: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps({"node": self.node, "url": self.url}).encode()

    @classmethod
    def from_kv(cls, kv: KeyValue) -> RunningInfo:
        try:
            data = json.loads(kv.value)
            return cls(str(data["node"]), str(data.get("url", "")), kv.create_revision)
        except (ValueError, TypeError, KeyError):
            return cls("", "", kv.create_revision)  # unreadable: someone else's


def read_running(coordinator: Coordinator, key: str) -> RunningInfo | None:
    """The current holder of ``key`` (with its epoch), or None."""
    kv = coordinator.get(key)
    return RunningInfo.from_kv(kv) if kv is not None else None


@dataclass(frozen=True)
class HandoverHint:
    """The handover key: ``source`` (node) handed ``epoch`` over to ``to`` because ``why``."""

    source: str
    to: str
    epoch: int
    why: str = ""

    def to_bytes(self) -> bytes:
        data = {"from": self.source, "to": self.to, "epoch": self.epoch, "why": self.why}
        return json.dumps(data).encode()

    @classmethod
    def from_kv(cls, kv: KeyValue) -> HandoverHint | None:
        try:
            data = json.loads(kv.value)
            return cls(
                str(data["from"]), str(data["to"]), int(data["epoch"]), str(data.get("why", ""))
            )
        except (ValueError, TypeError, KeyError):
            return None  # unreadable: ignored (it expires with its lease)


def read_handover(coordinator: Coordinator, key: str) -> HandoverHint | None:
    """The handover recorded at ``key`` (``Keys.handover``), or None."""
    kv = coordinator.get(key)
    return HandoverHint.from_kv(kv) if kv is not None else None


@dataclass(frozen=True)
class HandoverTarget:
    """Where a ``Placement`` wants a destination to go, and why (logged, recorded)."""

    node: str
    why: str


class Placement(Protocol):
    """Where leaders should be, asked by a server monitor's cycle (node.py wires one
    ``canal_cluster.balance.Balancer`` per node; see there)."""

    def leaving(self) -> bool:
        """The node is leaving: never campaign."""

    def surplus(self, led_for_s: float) -> HandoverTarget | None:
        """Leader (for ``led_for_s``): hand over to whom and why, None to keep leading."""

    def defer(self, waited_s: float) -> str | None:
        """Follower about to campaign for a free key (free for ``waited_s`` beyond the
        switch delay): why to let another node take it first, None to campaign now."""


@dataclass(frozen=True)
class MonitorEvent:
    """One recorded decision; ``seq`` orders events across monitors of this process;
    ``detail`` says why for the balancing and handover decisions."""

    seq: int
    reason: Reason
    epoch: int | None
    at: float
    detail: str = ""


@dataclass
class _HandoverRequest:
    """A ``hand_over`` call waiting for the monitor's cycle to act on it."""

    to: str
    why: str
    done: threading.Event = field(default_factory=threading.Event)
    epoch: int | None = None
    error: CanalError | None = None

    def finish(self, epoch: int | None = None, error: CanalError | None = None) -> None:
        self.epoch, self.error = epoch, error
        self.done.set()


class RunningMonitor:
    """Election for one running key; see the module docstring."""

    def __init__(
        self,
        coordinator: Coordinator,
        key: str,
        node: str,
        url: str = "",
        config: ElectionConfig | None = None,
        on_gained: EpochCallback | None = None,
        on_lost: EpochCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        handover_key: str | None = None,
        placement: Placement | None = None,
        keepalive_phase: Callable[[], float] = random.random,
    ) -> None:
        self.config = (config or ElectionConfig()).validate(coordinator.timeout_s)
        self._keepalive_phase = keepalive_phase  # fraction of loop_interval_s, per term
        self.key = key
        self.node = validate_id(node, "node")
        self._coord = coordinator
        self._record_value = RunningInfo(node, url).to_bytes()
        self._on_gained = on_gained
        self._on_lost = on_lost
        self._clock = clock
        self._state = threading.Lock()  # guards the fields is_leader() reads
        self._epoch: int | None = None
        self._lease: Lease | None = None
        self._valid_until = float("-inf")
        self._stale_report: int | None = None
        self._pending: tuple[Lease, float] | None = None  # campaign lease, outcome unknown
        self._stale_leases: list[Lease] = []
        self._last_holder: str | None = None  # node of the last holder seen; None = none yet
        self._absent_since: float | None = None
        self._last_reason: Reason | None = None
        self._event_epoch: int | None = None  # the epoch a step-down or release concerned
        self.keepalives_ok = 0  # successful keepalives (tests watch it to see time pass)
        self._history: collections.deque[MonitorEvent] = collections.deque(maxlen=1000)
        self._cycle_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._release_on_stop = True
        self._thread: threading.Thread | None = None
        self._watch: Watch | None = None
        self._handover_key = handover_key  # None: no graceful handovers (client monitors)
        self._placement = placement
        self._request: _HandoverRequest | None = None
        self._gained_at = 0.0
        self._detail = ""  # why, for the event the current cycle records
        self._handing_to: str | None = None  # successor of a handover not yet seen leading

    # -- what the server / client asks ------------------------------------------------

    def is_leader(self) -> bool:
        return self.leader_epoch() is not None

    def leader_epoch(self) -> int | None:
        """Our epoch while we lead and the fencing deadline has not passed, else None."""
        with self._state:
            if self._epoch is not None and self._clock() < self._valid_until:
                return self._epoch
            return None

    @property
    def valid_until(self) -> float:
        """Monotonic time at which we stop leading unless a keepalive succeeds first."""
        with self._state:
            return self._valid_until

    def campaigning(self) -> bool:
        """A campaign of ours is in flight (etcd may already show us as the holder)."""
        return self._pending is not None

    def handing_to(self) -> str | None:
        """The node this monitor is handing over to (or handed over to and has not yet
        seen leading): answers can send clients there instead of asking them to wait."""
        return self._handing_to

    def history(self) -> list[MonitorEvent]:
        with self._state:
            return list(self._history)

    def report_fenced(self, epoch: int) -> None:
        """A fenced write with ``epoch`` was rejected: stop leading now, step down."""
        with self._state:
            if self._epoch == epoch:
                self._stale_report = epoch
                self._valid_until = float("-inf")
        self._wake.set()

    def hand_over(self, to: str, why: str = "requested", timeout_s: float | None = None) -> int:
        """Hand the lead over to node ``to`` now (step-down): the cycle stops leading
        (``on_lost``: final flush), then deletes the key and names ``to`` in the
        handover key in one fenced transaction. Returns the epoch handed over;
        ``HandoverFailed`` when this monitor does not lead, etcd did not take it, or
        the cycle did not get to it within ``timeout_s``; ``HandoverTimeout`` when the
        cycle took it but had not ended it by then (it goes on: ``to`` takes over)."""
        validate_id(to, "to")
        if to == self.node:
            raise HandoverFailed(f"{self.key}: cannot hand over to this node ({to})")
        if self._handover_key is None:
            raise HandoverFailed(f"{self.key}: this monitor does not hand over")
        if self._stop.is_set():
            raise HandoverFailed(f"{self.key}: the monitor of node {self.node} is stopping")
        request = _HandoverRequest(to, why)
        with self._state:
            if self._request is not None:
                raise HandoverFailed(f"{self.key}: a handover is already under way")
            self._request = request
        self._wake.set()
        if self._thread is None:  # driven by cycle() only (tests)
            self.cycle(self._clock())
        wait = timeout_s if timeout_s is not None else 2 * self._coord.timeout_s + 5
        if not request.done.wait(wait) and not self._ended_late(request, wait):
            raise HandoverFailed(f"{self.key}: the handover to {to} did not start in {wait:g}s")
        if request.error is not None:
            raise request.error
        assert request.epoch is not None
        return request.epoch

    def _ended_late(self, request: _HandoverRequest, waited_s: float) -> bool:
        """``hand_over`` waited ``waited_s`` in vain: False when the cycle had not taken
        the request (withdrawn: nothing happened), True when it ended just now;
        ``HandoverTimeout`` when the cycle is still in it (the final flush, then the
        transaction naming the successor), which goes on without this caller."""
        with self._state:
            if self._request is request:
                self._request = None
                return False
        if request.done.is_set():
            return True
        raise HandoverTimeout(
            f"{self.key}: the handover to {request.to} is under way (node {self.node}'s "
            f"final flush, then the transaction naming it) and did not end in {waited_s:g}s; "
            f"{request.to} takes over once it ends"
        )

    # -- thread ------------------------------------------------------------------------

    def start(self) -> RunningMonitor:
        if self._thread is not None:
            raise RuntimeError(f"monitor for {self.key} already started")
        self._watch = self._coord.watch(self.key, self._on_watch)
        self._thread = threading.Thread(
            target=self._loop, name=f"running-monitor {self.key}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, release: bool = True, timeout_s: float | None = None) -> None:
        """Stop the thread; ``release`` deletes our key (False simulates a crash)."""
        self._release_on_stop = release
        self._stop.set()
        self._wake.set()
        if self._thread is None and release:  # driven by cycle() only (tests)
            with self._cycle_lock:
                self._record(self._release(), self._clock())
        if self._watch is not None:
            self._watch.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s if timeout_s is not None else 4 * self._coord.timeout_s + 5)

    def _on_watch(self, event: WatchEvent) -> None:
        if event.type is WatchEventType.PUT and event.value == self._record_value:
            return  # our own campaign's record (node names are unique per key): no news
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                reason = self.cycle(self._clock())
            except Exception:  # a bug must not kill the election thread silently
                log.exception("%s: cycle failed", self.key)
                reason = Reason.ETCD_UNAVAILABLE
            self._wake.wait(self._delay(reason))
        if self._release_on_stop:
            with self._cycle_lock:
                self._record(self._release(), self._clock())

    def _delay(self, reason: Reason) -> float:
        """How long the thread waits before the next cycle (a watch event or a request
        wakes it earlier). A new term's first keepalive comes after a random fraction of
        ``loop_interval_s``: etcd revokes expired leases on a fixed tick (500 ms in 3.4)
        and a standby wins a fixed switch delay after a revocation, so keepalives kept on
        the win's schedule would expire just after a tick, and the key would go a whole
        tick late after the next crash, every time; a random phase makes that lateness
        half a tick on average."""
        if reason in _STEP_DOWN:
            return 0.0  # the previous owner re-campaigns at once
        delay = self.config.loop_interval_s
        if reason in _GAINED:
            phase = min(max(self._keepalive_phase(), 0.0), 1.0)
            delay *= phase
        now = self._clock()
        if self._epoch is not None:
            delay = min(delay, self._valid_until - now)
        if reason is Reason.WAITING_SWITCH_DELAY and self._absent_since is not None:
            delay = min(delay, self._absent_since + self.config.switch_delay_s - now)
        return max(delay, 0.01)

    # -- the decision --------------------------------------------------------------------

    def cycle(self, now: float) -> Reason:
        """Decide and act once; returns why. Safe to call from tests without start()."""
        with self._cycle_lock:
            self._detail = ""
            if self._stop.is_set() and self._release_on_stop:
                reason = self._release()
            elif self._epoch is not None:
                reason = self._leader_cycle(now)
            else:
                reason = self._follower_cycle(now)
            if self._epoch is None:  # a request made meanwhile waits for the next cycle
                self._fail_request(f"{self.key}: node {self.node} does not lead it")
            self._record(reason, now)
        return reason

    def _take_request(self) -> _HandoverRequest | None:
        with self._state:
            request, self._request = self._request, None
        return request

    def _fail_request(self, message: str) -> None:
        request = self._take_request()
        if request is not None:
            request.finish(error=HandoverFailed(message))

    def _leader_cycle(self, now: float) -> Reason:
        assert self._epoch is not None and self._lease is not None
        if self._stale_report == self._epoch:
            return self._step_down(Reason.STALE_EPOCH)
        if now >= self._valid_until:
            return self._step_down(Reason.FENCED)
        request = self._take_request()
        if request is not None:
            return self._hand_over(request.to, Reason.HANDED_OVER, request.why, request)
        try:
            self._coord.keepalive(self._lease)
        except Fenced:
            return self._step_down(Reason.LOST)
        except CoordinatorUnavailable:
            if self._clock() >= self._valid_until:
                return self._step_down(Reason.FENCED)
            return Reason.KEEPALIVE_FAILED
        self._extend(now)
        self.keepalives_ok += 1
        reason = self._check_still_ours()
        if reason is Reason.STILL_LEADER and self._placement is not None:
            target = self._placement.surplus(now - self._gained_at)
            if target is not None:
                return self._hand_over(target.node, Reason.REBALANCED, target.why)
        return reason

    def _hand_over(
        self, to: str, reason: Reason, why: str, request: _HandoverRequest | None = None
    ) -> Reason:
        """Stop leading (callback first: the final flush still holds the epoch), then
        delete the key and name ``to`` in the handover key, fenced by our epoch."""
        assert self._handover_key is not None
        with self._state:
            epoch, lease = self._epoch, self._lease
            self._epoch, self._lease = None, None
            self._valid_until = float("-inf")
            self._stale_report = None
            self._handing_to = to
        assert epoch is not None and lease is not None
        self._event_epoch, self._detail = epoch, f"to {to}: {why}"
        log.info(
            "%s: %s, handing over to node %s: %s (node %s, epoch %d)",
            self.key, reason.value, to, why, self.node, epoch,
        )  # fmt: skip
        self._notify(self._on_lost, epoch, "on_lost")
        self._stale_leases.append(lease)  # revoked below, or expires: the key goes with it
        error: CanalError | None = None
        try:
            hint = HandoverHint(self.node, to, epoch, why).to_bytes()
            hint_lease = self._coord.grant_lease(self.config.ttl_s)
            ops: list[Op] = [Put(self._handover_key, hint, hint_lease), Delete(self.key)]
            self._coord.fenced_txn(self.key, epoch, ops)
            self._last_holder, self._absent_since = to, None
        except CoordinationError as exc:  # Fenced: no longer ours anyway; else expires by TTL
            error = HandoverFailed(f"{self.key}: handover of epoch {epoch} to {to} failed: {exc}")
            log.warning("%s (node %s)", error, self.node)
            reason, self._last_holder, self._handing_to = Reason.HANDOVER_FAILED, "", None
        with contextlib.suppress(CoordinatorUnavailable):
            self._revoke_stale()
        if request is not None:
            request.finish(epoch, error)
        return reason

    def _extend(self, started: float) -> None:
        assert self._lease is not None
        ttl = min(self.config.ttl_s, self._lease.ttl_s)
        with self._state:
            if self._stale_report != self._epoch:
                until = started + ttl - self.config.safety_margin_s
                self._valid_until = max(self._valid_until, until)

    def _check_still_ours(self) -> Reason:
        try:
            kv = self._coord.get(self.key)
        except CoordinatorUnavailable:
            return Reason.STILL_LEADER  # the lease is alive, so is our key
        if kv is None or kv.create_revision != self._epoch:
            return self._step_down(Reason.LOST)
        return Reason.STILL_LEADER

    def _step_down(self, reason: Reason) -> Reason:
        with self._state:
            epoch, lease = self._epoch, self._lease
            self._epoch, self._lease = None, None
            self._valid_until = float("-inf")
            self._stale_report = None
        assert epoch is not None
        self._event_epoch = epoch
        if lease is not None:
            self._stale_leases.append(lease)  # revoked when etcd answers
        self._last_holder = self.node
        self._absent_since = None
        log.warning(
            "%s: %s, stepping down (node %s, epoch %d)", self.key, reason.value, self.node, epoch
        )
        self._notify(self._on_lost, epoch, "on_lost")
        return reason

    def _follower_cycle(self, now: float) -> Reason:
        try:
            self._revoke_stale()
            kv = self._coord.get(self.key)
            if kv is not None:
                return self._observe_holder(kv, now)
            return self._key_absent(now)
        except (CoordinatorUnavailable, Fenced) as exc:  # Fenced: campaign lease lapsed
            log.debug("%s: etcd unavailable: %s", self.key, exc)
            return Reason.ETCD_UNAVAILABLE

    def _revoke_stale(self) -> None:
        while self._stale_leases:
            self._coord.revoke(self._stale_leases[0])
            self._stale_leases.pop(0)

    def _observe_holder(self, kv: KeyValue, now: float) -> Reason:
        self._absent_since = None
        self._handing_to = None
        if self._pending is not None and kv.lease == self._pending[0].id:
            lease, granted_at = self._pending  # our campaign won though the reply was lost
            return self._activate(kv.create_revision, lease, granted_at, Reason.WON)
        self._drop_pending()
        holder = RunningInfo.from_kv(kv)
        if holder.node == self.node:  # our own stale record: clear it, campaign at once
            self._coord.resign(self.key, kv.create_revision)
            self._last_holder = self.node
            return self._campaign(now)
        self._last_holder = holder.node
        return Reason.OTHER_LEADER

    def _key_absent(self, now: float) -> Reason:
        self._drop_pending()
        hint = self._handover_hint()
        leaving = self._placement is not None and self._placement.leaving()
        if hint is not None and hint.to == self.node and not leaving:
            self._detail = f"from {hint.source} (epoch {hint.epoch}): {hint.why}"
            return self._campaign(now, Reason.TOOK_OVER)
        if self._absent_since is None:
            self._absent_since = now
        if leaving:  # named or not: the handover expires and the others campaign
            return Reason.LEAVING
        if hint is not None:
            self._detail = f"{hint.source} handed epoch {hint.epoch} to {hint.to}"
            return Reason.WAITING_HANDOVER
        self._handing_to = None  # the handover expired: whoever campaigns now
        if self._last_holder is not None and self._last_holder == self.node:
            return self._campaign(now)  # the previous owner: at once
        waited = now - self._absent_since
        if self._last_holder is not None:  # someone else held it: the switch delay first
            if waited < self.config.switch_delay_s:
                return Reason.WAITING_SWITCH_DELAY
            waited -= self.config.switch_delay_s
        why = self._placement.defer(waited) if self._placement is not None else None
        if why is not None:
            self._detail = why
            return Reason.DEFERRED
        return self._campaign(now)

    def _handover_hint(self) -> HandoverHint | None:
        if self._handover_key is None:
            return None
        return read_handover(self._coord, self._handover_key)

    def _drop_pending(self) -> None:
        if self._pending is not None:
            self._stale_leases.append(self._pending[0])
            self._pending = None

    def _campaign(self, now: float, why: Reason | None = None) -> Reason:
        previous_owner = self._last_holder == self.node
        granted_at = self._clock()
        lease = self._coord.grant_lease(self.config.ttl_s)
        self._pending = (lease, granted_at)
        result = self._coord.campaign(self.key, self._record_value, lease)
        if not result.won or result.epoch is None:
            self._pending = None
            self._stale_leases.append(lease)
            self._last_holder = RunningInfo.from_kv(result.holder).node if result.holder else ""
            self._absent_since = None
            return Reason.OTHER_LEADER
        reason = why or (Reason.RECAMPAIGN_AS_PREVIOUS_OWNER if previous_owner else Reason.WON)
        return self._activate(result.epoch, lease, granted_at, reason)

    def _activate(self, epoch: int, lease: Lease, granted_at: float, reason: Reason) -> Reason:
        ttl = min(self.config.ttl_s, lease.ttl_s)
        with self._state:  # campaigning() until leader_epoch() is set: never neither
            self._epoch, self._lease = epoch, lease
            self._valid_until = granted_at + ttl - self.config.safety_margin_s
            self._stale_report = None
            self._pending = None
        self._last_holder = self.node
        self._absent_since = None
        self._gained_at = granted_at
        log.info("%s: %s, leading (node %s, epoch %d)", self.key, reason.value, self.node, epoch)
        if reason is Reason.TOOK_OVER:  # the hint has served: the others need not wait for it
            self._clear_handover(epoch)
        if self._notify(self._on_gained, epoch, "on_gained"):
            return reason
        self._release()
        self._last_holder = ""  # let the others try first: we wait the switch delay
        return Reason.ACTIVATION_FAILED

    def _clear_handover(self, epoch: int) -> None:
        assert self._handover_key is not None
        try:
            self._coord.fenced_txn(self.key, epoch, [Delete(self._handover_key)])
        except CoordinationError as exc:  # it expires with its lease
            log.debug("%s: handover key not deleted (epoch %d): %s", self.key, epoch, exc)

    def _release(self) -> Reason:
        """Stop leading (callback first, while the epoch is still valid), delete our key."""
        self._detail = ""
        with self._state:
            epoch, lease = self._epoch, self._lease
            self._epoch, self._lease = None, None
            self._valid_until = float("-inf")
        self._drop_pending()
        self._event_epoch = epoch
        if epoch is not None:
            self._notify(self._on_lost, epoch, "on_lost")
            try:
                self._coord.resign(self.key, epoch)
            except CoordinatorUnavailable as exc:
                log.warning("%s: release of epoch %d failed: %s", self.key, epoch, exc)
        if lease is not None:
            self._stale_leases.append(lease)
        with contextlib.suppress(CoordinatorUnavailable):  # else they expire by themselves
            self._revoke_stale()
        if epoch is not None:
            log.info("%s: released (node %s, epoch %d)", self.key, self.node, epoch)
        return Reason.RELEASED

    def _notify(self, callback: EpochCallback | None, epoch: int, what: str) -> bool:
        if callback is None:
            return True
        try:
            callback(epoch)
            return True
        except Exception:
            log.exception("%s: %s(%d) failed (node %s)", self.key, what, epoch, self.node)
            return False

    def _record(self, reason: Reason, now: float) -> None:
        epoch = self._epoch
        if epoch is None and reason in _ENDED:
            epoch = self._event_epoch
        if reason is self._last_reason and reason not in _GAINED | _ENDED:
            return
        if reason in (Reason.DEFERRED, Reason.WAITING_HANDOVER):
            log.info("%s: %s: %s (node %s)", self.key, reason.value, self._detail, self.node)
        elif reason not in (Reason.STILL_LEADER, Reason.OTHER_LEADER):
            log.debug("%s: %s (node %s, epoch %s)", self.key, reason.value, self.node, epoch)
        with self._state:
            self._last_reason = reason
            self._history.append(MonitorEvent(next(_SEQ), reason, epoch, now, self._detail))


def server_running_monitor(
    coordinator: Coordinator,
    keys: Keys,
    destination: str,
    node: str,
    url: str,
    config: ElectionConfig | None = None,
    on_gained: EpochCallback | None = None,
    on_lost: EpochCallback | None = None,
    placement: Placement | None = None,
) -> RunningMonitor:
    """ServerRunningMonitor: the leader of ``destination`` (hands over gracefully; with a
    ``placement``, keeps the destinations spread over the nodes)."""
    key = keys.running(destination)
    return RunningMonitor(
        coordinator, key, node, url, config, on_gained, on_lost,
        handover_key=keys.handover(destination), placement=placement,
    )  # fmt: skip


def client_running_monitor(
    coordinator: Coordinator,
    keys: Keys,
    destination: str,
    client_id: str,
    node: str,
    url: str = "",
    config: ElectionConfig | None = None,
    on_gained: EpochCallback | None = None,
    on_lost: EpochCallback | None = None,
) -> RunningMonitor:
    """ClientRunningMonitor: the one active consumer of (destination, client id)."""
    key = keys.client_running(destination, client_id)
    return RunningMonitor(coordinator, key, node, url, config, on_gained, on_lost)
