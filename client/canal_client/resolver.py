"""Where the leader of a destination is: Canal's ClusterNodeAccessStrategy, two ways.

- ``StaticResolver(urls)``: a list of server URLs (or one). The current candidate is
  the last URL a node redirected to (307), else the next URL of the list; a failure
  moves on to the next one. ``wait_change`` just waits.
- ``EtcdResolver(coordinator, keys, destination)``: reads the destination's running
  key (``read_running``; its create revision is the epoch) and follows it by watch.
  A record with a lower epoch than one already seen is ignored (stale read or event);
  ``wait_change`` returns early when the watch reports a change, so a retry after a
  failover happens as soon as the new leader is elected.

``add_listener(fn)``: ``fn()`` is called (outside any lock) whenever ``current()`` may
have changed; only the etcd resolver calls it (``follows_changes``), so a connector can
stop waiting on a deposed leader as soon as the watch names a new one.

``no_leader()`` says why ``current()`` is None, for a connector that has never reached
a leader yet: etcd not reachable, no node registered under the prefix, no leader elected
yet (all ``LeaderUnavailable``: worth waiting), or no registered node configures the
destination (``UnknownDestination``: final). etcd refusing our TLS certificate, user or
role (``CoordinatorAccessDenied``) is final too: ``reload`` raises it.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from canal_cluster.coordinator import Coordinator, KeyValue, Watch, WatchEvent, WatchEventType
from canal_cluster.keys import Keys
from canal_cluster.running import RunningInfo, read_running
from canal_protocol.errors import (
    ClientError,
    ConfigError,
    CoordinatorAccessDenied,
    CoordinatorUnavailable,
    LeaderUnavailable,
    UnknownDestination,
)

__all__ = [
    "EtcdResolver",
    "Leader",
    "LeaderResolver",
    "StaticResolver",
    "check_port",
    "normalize_url",
    "refuse_if_denied",
]

log = logging.getLogger("canal_client")


def normalize_url(url: str, option: str = "server") -> str:
    """``http(s)://host[:port]`` without a trailing slash; else ``ConfigError(option)``
    (a port outside 1-65535 is named as such)."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(option, f"expected http://host:port, got {url!r}")
    check_port(parts.netloc, url, option)
    return url


def check_port(netloc: str, url: str, option: str) -> None:
    """``ConfigError(option)`` unless the port of ``host[:port]`` is absent or 1-65535."""
    host_port = netloc.rpartition("@")[2].rpartition("]")[2]  # IPv6 brackets, userinfo
    raw = host_port.rpartition(":")[2] if ":" in host_port else ""
    if raw and not raw.isdigit():
        raise ConfigError(option, f"bad port {raw!r} in {url!r}")
    if raw and not 0 < int(raw) < 65536:
        raise ConfigError(option, f"port {int(raw)} out of range 1-65535 in {url!r}")


def refuse_if_denied(coord: Coordinator, prefix: str, write: bool) -> None:
    """``CoordinatorAccessDenied`` at once when etcd refuses our TLS, user or role under
    ``prefix``; etcd not answering is left to the caller's bounded waits."""
    try:
        coord.check_access(prefix, write=write)
    except CoordinatorAccessDenied:
        raise
    except CoordinatorUnavailable as exc:
        log.debug("access check on %s: %s", prefix, exc)


@dataclass(frozen=True)
class Leader:
    """A node to talk to; ``epoch`` when known (etcd), else None (learned from replies)."""

    url: str
    epoch: int | None = None
    node: str = ""


class LeaderResolver(ABC):
    """Chooses the node the connector talks to."""

    follows_changes = False  # True: listeners hear of every leader change (watch)

    def start(self) -> None:  # noqa: B027 - optional hook
        """Begin following the leader (idempotent)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop following; wakes any ``wait_change``."""

    @abstractmethod
    def current(self) -> Leader | None:
        """The node to use now; None when no leader is known."""

    @abstractmethod
    def failed(self, url: str) -> None:
        """The node at ``url`` failed or answered as a stale leader."""

    @abstractmethod
    def redirected(self, url: str) -> None:
        """A node said the leader is at ``url``."""

    @abstractmethod
    def wait_change(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s``; return early when the leader may have changed."""

    def reload(self) -> None:  # noqa: B027 - optional hook
        """Look the leader up again now (etcd)."""

    def add_listener(self, fn: Callable[[], None]) -> None:  # noqa: B027 - optional hook
        """Call ``fn()`` when the leader may have changed (no-op without a watch)."""

    def no_leader(self) -> ClientError | UnknownDestination:
        """Why ``current()`` is None: ``UnknownDestination`` when final, else
        ``LeaderUnavailable`` naming what is missing (may ask etcd)."""
        return LeaderUnavailable("no leader known")


class StaticResolver(LeaderResolver):
    """A fixed list of server URLs, following 307 redirects."""

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ConfigError("servers", "at least one server URL is needed")
        self.urls = [normalize_url(u) for u in urls]
        self._index = 0
        self._hint: str | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def current(self) -> Leader:
        with self._lock:
            return Leader(self._hint or self.urls[self._index])

    def failed(self, url: str) -> None:
        with self._lock:
            if self._hint is not None:
                self._hint = None  # back to the list: a live node will redirect again
            elif self.urls[self._index] == url:
                self._index = (self._index + 1) % len(self.urls)

    def redirected(self, url: str) -> None:
        with self._lock:
            self._hint = normalize_url(url)

    def start(self) -> None:
        self._closed.clear()

    def wait_change(self, timeout_s: float) -> None:
        self._closed.wait(timeout_s)

    def close(self) -> None:
        self._closed.set()


class EtcdResolver(LeaderResolver):
    """The leader as the destination's running key in etcd says, followed by watch."""

    follows_changes = True

    def __init__(
        self, coordinator: Coordinator, keys: Keys, destination: str, where: str = "etcd"
    ) -> None:
        self._coord = coordinator
        self._keys = keys
        self.key = keys.running(destination)
        self.destination = destination
        self.where = where  # "etcd http://…" in messages
        self._lookup_error: str | None = None
        self._cond = threading.Condition()
        self._leader: RunningInfo | None = None
        self._highest = 0
        self._version = 0
        self._closed = False
        self._watch: Watch | None = None
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)

    def start(self) -> None:
        with self._cond:
            self._closed = False
        if self._watch is None:
            refuse_if_denied(self._coord, self._keys.prefix, write=False)
            self._watch = self._coord.watch(self.key, self._on_event)
            try:
                self.reload()
            except CoordinatorAccessDenied:
                self.close()
                raise

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def reload(self) -> None:
        """Re-read the running key (after a failure, or a RESYNC)."""
        try:
            info = read_running(self._coord, self.key)
        except CoordinatorAccessDenied:
            raise  # no retry can fix it: the caller fails at once, naming the setting
        except CoordinatorUnavailable as exc:
            log.debug("%s: leader lookup failed: %s", self.destination, exc)
            self._lookup_error = str(exc)
            return
        self._lookup_error = None
        self._set(info)

    def no_leader(self) -> ClientError | UnknownDestination:
        d, prefix = self.destination, self._keys.prefix
        if self._lookup_error is not None:
            return LeaderUnavailable(f"{self.where} not reachable: {self._lookup_error}")
        try:
            nodes = self._coord.get_prefix(self._keys.nodes_prefix()).items
            serving = self._coord.get_prefix(self._keys.destination_nodes_prefix(d)).items
        except CoordinatorAccessDenied:
            raise
        except CoordinatorUnavailable as exc:
            return LeaderUnavailable(f"{self.where} not reachable: {exc}")
        names = sorted(kv.key.rsplit("/", 1)[-1] for kv in nodes)
        if not names:
            return LeaderUnavailable(
                f"no canal-ha node is registered in {self.where} under prefix {prefix!r} "
                "(are the servers up, is the prefix right?)"
            )
        if not serving:
            return UnknownDestination(
                f"destination {d!r} is unknown: none of the nodes registered under prefix "
                f"{prefix!r} ({', '.join(names)}) configures it"
            )
        serving_names = sorted(kv.key.rsplit("/", 1)[-1] for kv in serving)
        return LeaderUnavailable(
            f"no leader elected yet for destination {d!r} (nodes: {', '.join(serving_names)})"
        )

    def _on_event(self, event: WatchEvent) -> None:
        if event.type is WatchEventType.RESYNC:
            self.reload()
        elif event.type is WatchEventType.DELETE:
            self._set(None)
        else:
            kv = KeyValue(event.key, event.value, event.create_revision, event.mod_revision)
            self._set(RunningInfo.from_kv(kv))

    def _set(self, info: RunningInfo | None) -> None:
        with self._cond:
            if info is not None and info.epoch < self._highest:
                log.debug("%s: ignoring stale leader record epoch %d", self.destination, info.epoch)
                return
            if info is not None:
                self._highest = info.epoch
            changed = info != self._leader
            if changed:
                self._leader = info
                self._version += 1
                self._cond.notify_all()
        if changed:
            for fn in list(self._listeners):
                fn()

    def current(self) -> Leader | None:
        with self._cond:
            info = self._leader
        if info is None or not info.url:
            return None
        return Leader(info.url.rstrip("/"), info.epoch, info.node)

    def failed(self, url: str) -> None:
        self.reload()

    def redirected(self, url: str) -> None:
        self.reload()  # etcd is authoritative; the redirect only says to look again

    def wait_change(self, timeout_s: float) -> None:
        with self._cond:
            seen = self._version
            self._cond.wait_for(lambda: self._version != seen or self._closed, timeout_s)
