"""Where the leader of a destination is: Canal's ClusterNodeAccessStrategy, two ways.

- ``StaticResolver(urls)``: a list of server URLs (or one). The current candidate is
  the last URL a node redirected to (307), else the next URL of the list; a failure
  moves on to the next one. ``wait_change`` just waits.
- ``EtcdResolver(coordinator, keys, destination)``: reads the destination's running
  key (``read_running``; its create revision is the epoch) and follows it by watch.
  A record with a lower epoch than one already seen is ignored (stale read or event);
  ``wait_change`` returns early when the watch reports a change, so a retry after a
  failover happens as soon as the new leader is elected.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from canal_cluster.coordinator import Coordinator, KeyValue, Watch, WatchEvent, WatchEventType
from canal_cluster.keys import Keys
from canal_cluster.running import RunningInfo, read_running
from canal_protocol.errors import ConfigError, CoordinatorUnavailable

__all__ = ["EtcdResolver", "Leader", "LeaderResolver", "StaticResolver", "normalize_url"]

log = logging.getLogger("canal_client")


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError("server", f"expected http://host:port, got {url!r}")
    return url


@dataclass(frozen=True)
class Leader:
    """A node to talk to; ``epoch`` when known (etcd), else None (learned from replies)."""

    url: str
    epoch: int | None = None
    node: str = ""


class LeaderResolver(ABC):
    """Chooses the node the connector talks to."""

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

    def __init__(self, coordinator: Coordinator, keys: Keys, destination: str) -> None:
        self._coord = coordinator
        self.key = keys.running(destination)
        self.destination = destination
        self._cond = threading.Condition()
        self._leader: RunningInfo | None = None
        self._highest = 0
        self._version = 0
        self._closed = False
        self._watch: Watch | None = None

    def start(self) -> None:
        with self._cond:
            self._closed = False
        if self._watch is None:
            self._watch = self._coord.watch(self.key, self._on_event)
            self.reload()

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
        except CoordinatorUnavailable as exc:
            log.debug("%s: leader lookup failed: %s", self.destination, exc)
            return
        self._set(info)

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
            if info != self._leader:
                self._leader = info
                self._version += 1
                self._cond.notify_all()

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
