"""ClientRunningMonitor for a connector: one active consumer per (destination, client id).

``ActiveGate`` runs ``client_running_monitor`` on the client's running key. Only the
holder consumes; the others wait in ``wait_active``. ``generation`` grows on every
loss of the role, so the connector drops its session (the batches it had out are
rolled back by whoever is active next, which rolls back on connect; a batch that a get
brings after the role was lost, the connector rolls back itself). A get's long poll
waits at most ``valid_for()``: it ends before another consumer can take over. When the
active process dies, its key expires with its lease and a waiting one takes over after
the switch delay (Canal's ClientRunningMonitor). Giving the role up on ``stop()`` is a
normal end (logged at INFO); losing it otherwise is a WARNING. A monitor runs once:
``stop()`` makes a new one for the next ``start()`` (a connector connecting again).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import socket
import threading
import time
import uuid

from canal_client.resolver import refuse_if_denied
from canal_cluster.coordinator import Coordinator
from canal_cluster.keys import Keys
from canal_cluster.running import ElectionConfig, RunningMonitor, client_running_monitor
from canal_protocol.errors import ClientError

__all__ = ["ActiveGate", "Inactive", "consumer_node_name"]

log = logging.getLogger("canal_client")


class Inactive(ClientError):
    """This consumer is not the active one for its client id."""


def consumer_node_name() -> str:
    """A name unique to this process: host, pid and a random suffix (a valid id)."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class ActiveGate:
    """Is this consumer the active one for its client id?"""

    def __init__(
        self,
        coordinator: Coordinator,
        keys: Keys,
        destination: str,
        client_id: str,
        config: ElectionConfig | None = None,
        node: str | None = None,
    ) -> None:
        self.destination = destination
        self.client_id = client_id
        self.node = node or consumer_node_name()
        self._coord = coordinator
        self._client_prefix = keys.client_prefix(destination, client_id).rstrip("/")
        self._cond = threading.Condition()
        self._active_epoch: int | None = None
        self._generation = 0
        self._new_monitor = functools.partial(
            client_running_monitor,
            coordinator,
            keys,
            destination,
            client_id,
            self.node,
            config=config,
            on_gained=self._gained,
            on_lost=self._lost,
        )
        self._monitor: RunningMonitor = self._new_monitor()
        self._started = False
        self._stopping = False

    def check_access(self) -> None:
        """``CoordinatorAccessDenied`` at once when etcd refuses our writes to the client
        running key (before any wait for a leader)."""
        refuse_if_denied(self._coord, self._client_prefix, write=True)

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._stopping = False
            self._monitor.start()

    def stop(self) -> None:
        if self._started:
            self._stopping = True  # the role ends because we stop: not a warning
            self._monitor.stop(release=True)
            self._monitor = self._new_monitor()  # a monitor runs once: start() runs this one
            self._started = False
        with self._cond:
            self._cond.notify_all()

    @property
    def generation(self) -> int:
        with self._cond:
            return self._generation

    def is_active(self) -> bool:
        with self._cond:
            active = self._active_epoch is not None
        return active and self._monitor.is_leader()

    def valid_for(self) -> float:
        """Seconds left until the role's fencing deadline (0 when not active): past it
        another consumer may take over, so a long poll must end by then."""
        if not self.is_active():
            return 0.0
        return max(0.0, self._monitor.valid_until - time.monotonic())

    def wait_active(self, timeout_s: float) -> bool:
        with self._cond:  # woken by on_gained (is_leader() is already true then)
            self._cond.wait_for(self._active_now, timeout_s)
        return self.is_active()

    def _active_now(self) -> bool:
        return self._active_epoch is not None and self._monitor.is_leader()

    def _gained(self, epoch: int) -> None:
        log.info(
            "%s/%s: this consumer (%s) is now active (epoch %d)",
            self.destination,
            self.client_id,
            self.node,
            epoch,
        )
        with self._cond:
            self._active_epoch = epoch
            self._cond.notify_all()

    def _lost(self, epoch: int) -> None:
        log.log(
            logging.INFO if self._stopping else logging.WARNING,
            "%s/%s: this consumer (%s) is no longer active (epoch %d)%s",
            self.destination,
            self.client_id,
            self.node,
            epoch,
            ": stopped" if self._stopping else "",
        )
        with self._cond:
            self._active_epoch = None
            self._generation += 1
            self._cond.notify_all()
