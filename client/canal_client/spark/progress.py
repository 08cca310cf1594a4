"""availableNow's view of the leader: where the source's binlog ends, how far the
leader's reader is (``GET /v1/health`` of the connector's current leader)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from canal_client.spark.connection import ConnectorLike
from canal_client.spark.options import CanalOptions
from canal_protocol.gtid import MariadbGtidState
from canal_protocol.ordering import AFTER_SNAPSHOTS, EntryKey, point_key

__all__ = [
    "BinlogPoint",
    "HttpProgress",
    "LeaderProgress",
    "ProgressProbe",
    "gtid_covers",
    "parse_progress",
]

log = logging.getLogger("canal_client.spark")


def gtid_covers(have: str, want: str) -> bool:
    """True when MariaDB GTID state ``have`` includes every transaction of ``want`` (not
    empty); False when either is not a MariaDB state."""
    wanted, state = MariadbGtidState.read(want), MariadbGtidState.read(have)
    if not wanted or state is None:
        return False
    return state.covers(wanted)


@dataclass(frozen=True)
class BinlogPoint:
    """A point of the source's binlog as ``/v1/health`` reports it."""

    key: EntryKey  # (journal, offset): the next event starts there
    gtid: str = ""
    source: str = ""  # host:port of the database

    @classmethod
    def parse(cls, d: Any) -> BinlogPoint | None:
        if not isinstance(d, Mapping):
            return None
        gtid, source = str(d.get("gtid") or ""), str(d.get("source_address") or "")
        try:
            key = point_key(str(d.get("journal") or ""), int(d.get("offset") or 0), source, gtid)
        except (TypeError, ValueError):
            return None
        if not key.file and not gtid:
            return None
        return cls(key, gtid, source)

    def reaches(self, target: BinlogPoint) -> bool:
        """At or after ``target``, by binlog file and offset or by GTID state (the GTID
        state also covers a binlog that ends with a rotation and no transaction)."""
        if self.source and target.source and self.source != target.source:
            return False
        if self.key.file and target.key.file and self.key >= target.key:
            return True
        return gtid_covers(self.gtid, target.gtid)

    @property
    def last_key(self) -> EntryKey:
        """After the point and the incremental snapshot entries put at it (they lie
        between it and the next binlog event)."""
        return replace(self.key, snap=AFTER_SNAPSHOTS)

    def __str__(self) -> str:
        return f"{self.key} gtid={self.gtid or '-'}"


@dataclass(frozen=True)
class LeaderProgress:
    """The leader's view of a destination: its epoch, reader position and binlog end."""

    epoch: int
    reader: BinlogPoint | None = None
    binlog_end: BinlogPoint | None = None


def parse_progress(health: Any, destination: str) -> LeaderProgress | None:
    """``destination``'s progress from a ``/v1/health`` body; None unless the node leads it."""
    dests = health.get("destinations") if isinstance(health, Mapping) else None
    d = dests.get(destination) if isinstance(dests, Mapping) else None
    if not isinstance(d, Mapping) or d.get("role") != "leader":
        return None
    return LeaderProgress(
        int(d.get("epoch") or 0),
        BinlogPoint.parse(d.get("reader_position")),
        BinlogPoint.parse(d.get("binlog_end")),
    )


ProgressProbe = Callable[[ConnectorLike], LeaderProgress | None]


class HttpProgress:
    """A ``ProgressProbe``: ``GET /v1/health`` of the connector's current leader."""

    def __init__(self, options: CanalOptions) -> None:
        self.options = options
        self._channel: Any = None

    def __call__(self, conn: ConnectorLike) -> LeaderProgress | None:
        url = conn.leader_url
        if not url or not url.startswith(("http://", "https://")):
            return None
        if self._channel is None:
            from canal_client.wire import HttpChannel

            self._channel = HttpChannel(wire="json", token=self.options.token, timeout_s=10.0)
        try:
            body = self._channel.request("GET", url, "/v1/health").body
        except Exception as exc:  # any failure only means "no answer": never fail the query
            log.info("%s: /v1/health of %s: %s", self.options.destination, url, exc)
            return None
        return parse_progress(body, self.options.destination)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
