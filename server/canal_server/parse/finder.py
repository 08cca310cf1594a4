"""Where a (new) leader starts reading the binlog: Canal's findStartPosition.

``PositionFinder.find(link)`` walks the branches of Canal's findStartPosition
(docs/architecture.md, "Position finding"):

1. GTID mode: the latest position of the LogPositionManager if it has a GTID set;
   with no history at all, the configured master GTID; else on to 2.
2. No history: the configured position of the address we are connected to (master
   or standby): journal+offset as is; journal+timestamp → search that file by time
   (its start if nothing is older); timestamp only → search every binlog by time;
   nothing → the current end (SHOW MASTER STATUS).
3. History from the same address: reuse it; but when another database answers there
   now (a moved VIP: the history's identity names another ``@@server_id``; for
   positions recorded without one, Canal's rule: more than ``dump_error_threshold``
   dump errors, no standby configured and a changed server id), search by
   ``timestamp - fallback_interval_s``.
4. History from another address (database switch): search by
   ``timestamp - fallback_interval_s``.
5. A start inside a transaction moves back to its BEGIN (MariaDB: its GTID event):
   a configured position, a history position (a client cursor is the end of a batch,
   and batches are cut by entry count), or when the caller asks. The entries of that
   transaction the clients already acked are not delivered again: the store hands a
   client only what lies after its cursor. In GTID mode the history's GTID state is
   the resume point: an entry inside a transaction carries the state before it
   (``canal_server.parse.transaction``), so a resume there reads it again.

File positions are checked against SHOW BINARY LOGS (PurgedPosition, with what the
operator can do) and get their GTID state from BINLOG_GTID_POS, so they also serve a
GTID resume, and a timestamp (the end: the server clock; else the time of the event
there), so a later time fallback from them works. Every result carries the reasons
that led to it; they are logged.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from canal_protocol.errors import BinlogError, ConfigError, PositionNotFound, PurgedPosition
from canal_protocol.gtid import is_mariadb_gtid_state, is_mysql_gtid_set
from canal_protocol.positions import EntryPosition, LogIdentity, LogPosition
from canal_server.parse.binlog_search import (
    BINLOG_START_OFFSET,
    OPERATOR_HINT,
    BinlogInspector,
    BinlogSearch,
    Boundary,
    EventSource,
    SqlBinlogInspector,
    StreamEventSource,
    locate_gtid_state,
)

__all__ = [
    "ConfiguredPosition",
    "DatabaseLink",
    "FindReason",
    "FinderConfig",
    "FoundPosition",
    "LatestPositions",
    "PositionFinder",
]

log = logging.getLogger(__name__)


class FindReason(enum.StrEnum):
    GTID_HISTORY = "gtid-history"
    GTID_CONFIG = "gtid-config"
    CONFIG_POSITION = "config-position"  # configured journal + offset
    CONFIG_FILE_TIME = "config-file-time"  # configured journal + timestamp
    CONFIG_FILE_START = "config-file-start"  # configured journal, nothing older in it
    TIME_SEARCH = "time-search"  # configured timestamp only
    END = "end"
    HISTORY = "history"
    FALLBACK_SERVER_ID_CHANGED = "fallback-server-id-changed"
    FALLBACK_SOURCE_SWITCH = "fallback-source-switch"
    SWITCH_BY_GTID = "switch-by-gtid"  # another database: where the history's GTID state ends
    MOVED_TO_TRANSACTION_BEGIN = "moved-to-transaction-begin"


@dataclass(frozen=True)
class ConfiguredPosition:
    """``master.*`` or ``standby.*`` of a destination's config; ``address`` is host:port."""

    address: str = ""
    journal: str = ""
    offset: int = 0
    timestamp_ms: int = 0
    gtid: str = ""


@dataclass(frozen=True)
class FinderConfig:
    """What the finder needs from a destination's config."""

    destination: str
    master: ConfiguredPosition = field(default_factory=ConfiguredPosition)
    standby: ConfiguredPosition | None = None
    gtid_mode: bool = False
    fallback_interval_s: int = 60
    dump_error_threshold: int = 2
    slave_id: int = 0

    def __post_init__(self) -> None:
        if self.fallback_interval_s < 0:
            raise ConfigError(
                "fallback_interval_s", f"must be >= 0, not {self.fallback_interval_s}"
            )
        for name, cp in (("master", self.master), ("standby", self.standby)):
            if cp is not None and (cp.offset < 0 or cp.timestamp_ms < 0):
                raise ConfigError(f"{name}.position", "position and timestamp must be >= 0")


class LatestPositions(Protocol):
    """The part of a LogPositionManager the finder uses."""

    def get_latest(self, destination: str) -> LogPosition | None: ...


@dataclass(frozen=True)
class DatabaseLink:
    """The database we are connected to now: its address and how to look into it.
    ``identifies_server``: positions read there name the database's ``@@server_id``
    (a network source; not a directory of binlog files)."""

    address: str
    inspector: BinlogInspector
    source: EventSource
    identifies_server: bool = True
    locate_gtid: Callable[[str], tuple[str, int]] | None = None

    @classmethod
    def connect(cls, conn: Mapping[str, Any], slave_id: int) -> DatabaseLink:
        """A link from a DSN dict (host, port, user, password) and our slave id."""
        return cls(
            f"{conn['host']}:{conn['port']}",
            SqlBinlogInspector(conn, slave_id),
            StreamEventSource(conn, slave_id),
            locate_gtid=partial(locate_gtid_state, conn, slave_id),
        )


@dataclass(frozen=True)
class FoundPosition:
    """Where to start, for which source, and why (``reasons[0]`` is the branch).

    After a GTID_* reason resume by ``position.gtid`` (its journal/offset, if any, may
    belong to another server); otherwise by journal/offset, or by ``position.gtid``
    (the state at that offset). After ``FALLBACK_SERVER_ID_CHANGED`` the caller resets
    its dump error count.
    """

    position: EntryPosition
    identity: LogIdentity
    reasons: tuple[FindReason, ...]

    @property
    def reason(self) -> FindReason:
        return self.reasons[0]

    @property
    def log_position(self) -> LogPosition:
        return LogPosition(self.identity, self.position)


def _same_address(a: str, b: str) -> bool:
    return bool(a) and a.strip().lower() == b.strip().lower()


class PositionFinder:
    """Canal's findStartPosition for one destination."""

    def __init__(self, config: FinderConfig, positions: LatestPositions) -> None:
        self.config = config
        self.positions = positions

    def find(
        self,
        link: DatabaseLink,
        *,
        dump_errors: int = 0,
        previous_server_id: int | None = None,
        need_transaction_begin: bool = False,
    ) -> FoundPosition:
        """The start position on ``link``.

        ``dump_errors``: consecutive dump failures so far; ``previous_server_id``: the
        server id seen on this address before (default: the history position's);
        ``need_transaction_begin``: check any file position for a transaction around
        it (configured and history positions are always checked).
        """
        dest = self.config.destination
        search = BinlogSearch(link.inspector, link.source)
        run = _Run(self.config, link, search, dump_errors, previous_server_id)
        identity = LogIdentity(link.address, self.config.slave_id, run.identity_server_id())
        history = self.positions.get_latest(dest)
        gtid_start = self._gtid_start(history) if self.config.gtid_mode else None
        if gtid_start is not None:
            found = FoundPosition(gtid_start[0], identity, (gtid_start[1],))
        else:
            position, reason = run.internal(history)
            found = run.finish(position, reason, identity, need_transaction_begin)
        log.info(
            "%s: start position on %s: %s (%s)",
            dest,
            link.address,
            found.position,
            ", ".join(found.reasons),
        )
        return found

    def _gtid_start(self, history: LogPosition | None) -> tuple[EntryPosition, FindReason] | None:
        if history is not None:
            if history.position.gtid:
                return history.position, FindReason.GTID_HISTORY
            return None  # history from before GTID mode: use its file position
        master = self.config.master
        if not master.gtid:
            return None
        configured = EntryPosition(gtid=master.gtid, timestamp_ms=master.timestamp_ms)
        return configured, FindReason.GTID_CONFIG


@dataclass
class _Run:
    """One search on one link (keeps ``find`` and its branches small)."""

    config: FinderConfig
    link: DatabaseLink
    search: BinlogSearch
    dump_errors: int
    previous_server_id: int | None
    _server_id: int | None = None

    @property
    def dest(self) -> str:
        return self.config.destination

    def server_id(self) -> int:
        if self._server_id is None:
            self._server_id = self.link.inspector.server_id()
        return self._server_id

    def identity_server_id(self) -> int:
        """The ``source_server_id`` of positions read on the link (0: files)."""
        return self.server_id() if self.link.identifies_server else 0

    # -- branches 2-4 ------------------------------------------------------------

    def internal(self, history: LogPosition | None) -> tuple[EntryPosition, FindReason]:
        if history is None:
            return self.from_config()
        if not _same_address(history.identity.source_address, self.link.address):
            return self.by_gtid(history) or self.fall_back(
                history, FindReason.FALLBACK_SOURCE_SWITCH
            )
        if self.other_database(history):
            return self.by_gtid(history) or self.fall_back(
                history, FindReason.FALLBACK_SERVER_ID_CHANGED
            )
        self.check_exists(history.position, "the last position of this destination")
        return history.position, FindReason.HISTORY

    def other_database(self, history: LogPosition) -> bool:
        """The history was read from another database than the one at its address now:
        its identity names another ``@@server_id``; without one, ``vip_switched``."""
        known = history.identity.source_server_id
        if known:
            return known != self.identity_server_id()
        return self.vip_switched(history)

    def vip_switched(self, history: LogPosition) -> bool:
        """Positions without a ``source_server_id`` (recorded before it was kept): too
        many dump errors, no standby configured, and another server id now."""
        threshold = self.config.dump_error_threshold
        if threshold < 0 or self.dump_errors <= threshold:
            return False
        standby = self.config.standby
        if standby is not None and standby.address:
            return False
        before = self.previous_server_id
        if before is None:
            before = history.position.server_id or None
        return before is not None and before != self.server_id()

    def by_gtid(self, history: LogPosition) -> tuple[EntryPosition, FindReason] | None:
        """Another database: where a read of its binlog misses nothing a GTID dump from
        the history's MariaDB GTID state (or MySQL GTID set) sends (GTIDs keep their
        origin across replicas: no time fallback). None when the history has no such
        state or this database's binlog does not hold it."""
        state = history.position.gtid
        known = is_mariadb_gtid_state(state) or is_mysql_gtid_set(state)
        if self.link.locate_gtid is None or not known:
            return None
        try:
            journal, offset = self.link.locate_gtid(state)
        except (PositionNotFound, PurgedPosition, BinlogError) as exc:
            log.warning(
                "%s: %s does not hold GTID state %s (%s): falling back by time",
                self.dest, self.link.address, state, exc,
            )  # fmt: skip
            return None
        log.warning(
            "%s: %s: after GTID state %s of %s, reading from %s:%d on %s",
            self.dest, FindReason.SWITCH_BY_GTID, state, history.identity.source_address,
            journal, offset, self.link.address,
        )  # fmt: skip
        position = EntryPosition(
            journal, offset, self.server_id(), state, history.position.timestamp_ms
        )
        return position, FindReason.SWITCH_BY_GTID

    def fall_back(
        self, history: LogPosition, reason: FindReason
    ) -> tuple[EntryPosition, FindReason]:
        ts = history.position.timestamp_ms
        if ts <= 0:
            raise PositionNotFound(
                f"{self.dest}: cannot fall back by time from {history.position} of "
                f"{history.identity.source_address}: it has no timestamp; {OPERATOR_HINT}"
            )
        # before the cursor's own second at least (a search returns the latest boundary
        # at or before its target's second: after every transaction of that second)
        second_start = ts - ts % 1000
        target = max(min(ts - self.config.fallback_interval_s * 1000, second_start - 1), 0)
        log.warning(
            "%s: %s: searching %s by time %d (last %s of %s, minus %ss)",
            self.dest,
            reason,
            self.link.address,
            target,
            history.position,
            history.identity.source_address,
            self.config.fallback_interval_s,
        )
        try:
            journal, boundary = self.search.search_all(target)
        except (PositionNotFound, PurgedPosition) as exc:
            raise type(exc)(
                f"{self.dest}: {reason} from {history.position} of "
                f"{history.identity.source_address} to {self.link.address}: {exc}"
            ) from exc
        return self.at(journal, boundary), reason

    def from_config(self) -> tuple[EntryPosition, FindReason]:
        cp = self.configured()
        if cp is None or (not cp.journal and cp.timestamp_ms <= 0):
            return self.end(), FindReason.END
        if not cp.journal:
            journal, boundary = self.search.search_all(cp.timestamp_ms)
            return self.at(journal, boundary), FindReason.TIME_SEARCH
        if cp.offset > 0:
            pos = EntryPosition(cp.journal, cp.offset, self.server_id(), "", cp.timestamp_ms)
            self.check_exists(pos, "the configured position")
            return pos, FindReason.CONFIG_POSITION
        start = EntryPosition(cp.journal, BINLOG_START_OFFSET, self.server_id())
        self.check_exists(start, "the configured binlog")
        if cp.timestamp_ms > 0:
            in_file = self.search.search_file(cp.journal, cp.timestamp_ms)
            if in_file is not None:
                return self.at(cp.journal, in_file), FindReason.CONFIG_FILE_TIME
        return start, FindReason.CONFIG_FILE_START

    def configured(self) -> ConfiguredPosition | None:
        master, standby = self.config.master, self.config.standby
        if _same_address(master.address, self.link.address):
            return master
        if standby is not None and _same_address(standby.address, self.link.address):
            return standby
        return None

    # -- positions ------------------------------------------------------------------

    def at(self, journal: str, boundary: Boundary) -> EntryPosition:
        return EntryPosition(journal, boundary.offset, self.server_id(), "", boundary.timestamp_ms)

    def end(self) -> EntryPosition:
        """SHOW MASTER STATUS, timed by the server clock read just before it: no event
        after the end is older (short of a transaction that began earlier)."""
        now_s = self.link.inspector.clock()
        journal, offset = self.link.inspector.master_status()
        return EntryPosition(journal, offset, self.server_id(), "", now_s * 1000)

    def check_exists(self, pos: EntryPosition, what: str) -> None:
        """PurgedPosition when the file is gone; PositionNotFound past its end."""
        files = {f.name: f.size for f in self.link.inspector.binary_logs()}
        if pos.journal not in files:
            oldest = min(files, default="(none)")
            raise PurgedPosition(
                f"{self.dest}: {what} {pos.journal}:{pos.offset} is not on "
                f"{self.link.address} any more (its binlogs start at {oldest}; purged?); "
                f"{OPERATOR_HINT}"
            )
        if pos.offset > files[pos.journal]:
            raise PositionNotFound(
                f"{self.dest}: {what} {pos.journal}:{pos.offset} is past the end of that "
                f"binlog on {self.link.address} ({files[pos.journal]} bytes); {OPERATOR_HINT}"
            )

    # -- step 5 and the GTID state --------------------------------------------------------

    def finish(
        self, pos: EntryPosition, reason: FindReason, identity: LogIdentity, need_begin: bool
    ) -> FoundPosition:
        reasons = [reason]
        if need_begin or reason in (FindReason.CONFIG_POSITION, FindReason.HISTORY):
            begin = self.search.transaction_begin(pos.journal, pos.offset, pos.part > 0)
            if begin != pos.offset or pos.part:
                log.warning(
                    "%s: %s is inside a transaction; starting at its BEGIN %d",
                    self.dest,
                    pos,
                    begin,
                )
                pos = replace(pos, offset=begin, gtid="", part=0)
                reasons.append(FindReason.MOVED_TO_TRANSACTION_BEGIN)
        if not pos.gtid:
            pos = replace(pos, gtid=self.link.inspector.gtid_at(pos.journal, pos.offset))
        if pos.timestamp_ms <= 0:  # no time given: the time of the event there
            pos = replace(pos, timestamp_ms=self.search.time_at(pos.journal, pos.offset) * 1000)
        return FoundPosition(pos, identity, tuple(reasons))
