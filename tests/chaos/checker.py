"""The chaos checker: what consumers received against what the writer committed.

Inputs (plain values, so unit tests build them by hand):

* ``history``: every change the writer attempted and knows the fate of
  (``ExpectedChange``). ``required`` changes are in the database for good and must be
  delivered; optional ones (a commit lost by a database failover, a commit whose outcome
  is unknown) may or may not arrive.
* ``streams``: per client id, the ordered events its consumer processes logged
  (``BatchSeen`` and ``AckSeen``; a killed consumer's successor appends to the same
  stream).
* ``faults``: when each injected failure started (wall clock, like the consumer's).
* ``leader_claims``: (epoch, node) pairs observed from /v1/health or from the
  consumer (the URL that served a batch with that epoch).

Checks: every required change delivered (``lost``); per key, deliveries follow the
commit order except for rewinds (redeliveries) and skips over optional changes
(``order_violations``); every redelivery comes from a batch that was never acked, or
was acked at most ``dup_window_s`` before a fault that preceded the redelivery
(``dups_outside_bound``); a change nobody wrote is ``unexpected``; no epoch served by
two nodes (``split_brain``). ``failover_s`` is, per fault, the longest time a
consumer went without a new change around it (from its last progress before the fault).
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "AckSeen",
    "BatchSeen",
    "ChangeId",
    "CheckResult",
    "ExpectedChange",
    "Fault",
    "applied_state",
    "check",
    "parse_consumer_log",
]

ChangeId = tuple[str, int, str, int]  # (schema.table, key, op I|U|D, version)


@dataclass(frozen=True)
class ExpectedChange:
    """One row change the writer made: ``version`` is the row's version after it (the
    deleted row's version for ``D``); ``t`` is the commit's wall-clock time."""

    table: str
    key: int
    op: str
    version: int
    txn: int
    t: float
    required: bool = True

    @property
    def id(self) -> ChangeId:
        return (self.table, self.key, self.op, self.version)


@dataclass(frozen=True)
class BatchSeen:
    """A non-empty batch a consumer received; ``seq`` is unique within its stream."""

    seq: int
    t: float
    batch_id: int
    epoch: int
    server: str
    changes: tuple[ChangeId, ...]
    reads: tuple[ChangeId, ...] = ()  # every row in order, snapshot READ rows (op R) too


@dataclass(frozen=True)
class AckSeen:
    """The consumer's ack of the batch with ``seq`` returned at ``t``."""

    seq: int
    t: float


@dataclass(frozen=True)
class Fault:
    """A fault injected at ``t``; ``window_s`` (None: the check's ``dup_window_s``) is how
    long before it an ack may be and still come again (e.g. a database failover's time
    fallback replays more than one flush period)."""

    kind: str
    t: float
    window_s: float | None = None


@dataclass
class CheckResult:
    scenario: str
    rows_written: int = 0
    required: int = 0  # required changes × client streams: deliveries expected
    delivered: int = 0
    deliveries: int = 0
    lost: int = 0
    duplicates: int = 0
    dup_bound: int = 0
    dups_outside_bound: int = 0
    order_violations: int = 0
    unexpected: int = 0
    split_brain: dict[str, list[str]] = field(default_factory=dict)
    epochs: list[int] = field(default_factory=list)
    failover_s: list[float | None] = field(default_factory=list)
    samples: dict[str, list[str]] = field(default_factory=dict)
    lost_expected: bool = False  # the scenario destroys data (purged binlogs)

    @property
    def ok(self) -> bool:
        return not (
            (self.lost and not self.lost_expected)
            or self.dups_outside_bound
            or self.order_violations
            or self.unexpected
            or self.split_brain
        )

    @property
    def max_failover_s(self) -> float | None:
        known = [f for f in self.failover_s if f is not None]
        return max(known) if known else None

    def line(self) -> str:
        fo = self.max_failover_s
        return (
            f"[chaos {self.scenario}] {'OK' if self.ok else 'FAIL'}: "
            f"rows written {self.rows_written}, expected deliveries {self.required}, "
            f"delivered {self.delivered}, "
            f"lost {self.lost}{' (expected)' if self.lost_expected else ''}, "
            f"duplicates {self.duplicates} (bound {self.dup_bound}, "
            f"outside {self.dups_outside_bound}), order violations {self.order_violations}, "
            f"unexpected {self.unexpected}, split brain {len(self.split_brain)}, "
            f"epochs {len(self.epochs)}, failover "
            f"{'n/a' if fo is None else f'{fo:.2f}s'}"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(ok=self.ok, max_failover_s=self.max_failover_s)
        return data

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.scenario}.json"
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return path


# -- the checks ---------------------------------------------------------------------------


def _sample(result: CheckResult, what: str, text: str, limit: int = 20) -> None:
    items = result.samples.setdefault(what, [])
    if len(items) < limit:
        items.append(text)


def _order_check(
    result: CheckResult,
    expected: Mapping[tuple[str, int], list[ExpectedChange]],
    delivered: Mapping[tuple[str, int], list[ChangeId]],
) -> None:
    """Per key: each delivery is the next expected change, a rewind, or a skip over
    optional changes only."""
    for key, seq in delivered.items():
        order = expected.get(key, [])
        index = {c.id: i for i, c in enumerate(order)}
        prev = -1
        for cid in seq:
            i = index.get(cid)
            if i is None:
                continue  # counted as unexpected
            if i > prev + 1 and any(c.required for c in order[prev + 1 : i]):
                result.order_violations += 1
                _sample(result, "order", f"{key}: {order[prev].id if prev >= 0 else None} -> {cid}")
            prev = i


def _ack_times(stream: Sequence[BatchSeen | AckSeen]) -> dict[int, float]:
    return {e.seq: e.t for e in stream if isinstance(e, AckSeen)}


def _fault_before(faults: Sequence[Fault], t: float) -> Fault | None:
    before = [f for f in faults if f.t <= t]
    return max(before, key=lambda f: f.t) if before else None


def _dup_check(
    result: CheckResult,
    stream: Sequence[BatchSeen | AckSeen],
    faults: Sequence[Fault],
    dup_window_s: float,
) -> None:
    """Attribute every redelivery to the batch that delivered it before."""
    acks = _ack_times(stream)
    last_batch: dict[ChangeId, BatchSeen] = {}
    at_risk: set[int] = set()
    for event in stream:
        if not isinstance(event, BatchSeen):
            continue
        for cid in event.changes:
            prev = last_batch.get(cid)
            if prev is not None:
                result.duplicates += 1
                acked = acks.get(prev.seq)
                fault = _fault_before(faults, event.t)
                window = dup_window_s
                if fault is not None and fault.window_s is not None:
                    window = fault.window_s
                if (
                    acked is None
                    or acked > event.t
                    or (fault is not None and acked >= fault.t - window)
                ):
                    at_risk.add(prev.seq)
                else:
                    result.dups_outside_bound += 1
                    _sample(result, "dups", f"{cid} batch {prev.batch_id} acked at {acked:.3f}")
            last_batch[cid] = event
    by_seq = {e.seq: e for e in stream if isinstance(e, BatchSeen)}
    result.dup_bound += sum(len(by_seq[s].changes) for s in at_risk)


def _progress_times(stream: Sequence[BatchSeen | AckSeen], known: set[ChangeId]) -> list[float]:
    """When the stream received a change it had not seen before."""
    seen: set[ChangeId] = set()
    times: list[float] = []
    for e in stream:
        if isinstance(e, BatchSeen):
            new = {cid for cid in e.changes if cid in known} - seen
            if new:
                seen |= new
                times.append(e.t)
    return times


def _failover_times(
    faults: Sequence[Fault],
    history: Sequence[ExpectedChange],
    streams: Mapping[str, Sequence[BatchSeen | AckSeen]],
) -> list[float | None]:
    """Per fault: the longest time a consumer went without new changes, from its last
    progress before the fault to its progress before the next fault (None: no progress
    after the fault)."""
    known = {c.id for c in history}
    progress = [_progress_times(s, known) for s in streams.values()]
    ordered = sorted(faults, key=lambda f: f.t)
    out: list[float | None] = []
    for i, f in enumerate(ordered):
        end = ordered[i + 1].t if i + 1 < len(ordered) else float("inf")
        worst: float | None = None
        for times in progress:
            after = [x for x in times if f.t < x < end]
            if not after:
                worst = None
                break
            before = [x for x in times if x <= f.t]
            points = [before[-1] if before else f.t, *after]
            gap = max(b - a for a, b in itertools.pairwise(points))
            worst = gap if worst is None else max(worst, gap)
        out.append(None if worst is None else round(worst, 3))
    return out


def _split_brain(claims: Iterable[tuple[int, str]]) -> tuple[dict[str, list[str]], list[int]]:
    by_epoch: dict[int, set[str]] = defaultdict(set)
    for epoch, node in claims:
        if epoch > 0:
            by_epoch[epoch].add(node)
    bad = {str(e): sorted(n) for e, n in by_epoch.items() if len(n) > 1}
    return bad, sorted(by_epoch)


def check(
    scenario: str,
    history: Sequence[ExpectedChange],
    streams: Mapping[str, Sequence[BatchSeen | AckSeen]],
    *,
    faults: Sequence[Fault] = (),
    leader_claims: Iterable[tuple[int, str]] = (),
    dup_window_s: float = 1.0,
    tables: Iterable[str] | None = None,
    lost_expected: bool = False,
) -> CheckResult:
    """Check every client stream against the history (restricted to ``tables``);
    ``lost_expected``: losses do not fail the result (order and the rest still do)."""
    wanted = set(tables) if tables is not None else None
    hist = [c for c in history if wanted is None or c.table in wanted]
    result = CheckResult(scenario, rows_written=len(hist), lost_expected=lost_expected)
    result.required = sum(c.required for c in hist) * len(streams)
    expected: dict[tuple[str, int], list[ExpectedChange]] = defaultdict(list)
    for c in sorted(hist, key=lambda c: c.txn):
        expected[(c.table, c.key)].append(c)
    known = {c.id for c in hist}
    claims = list(leader_claims)
    for client, stream in streams.items():
        delivered: dict[tuple[str, int], list[ChangeId]] = defaultdict(list)
        unique: set[ChangeId] = set()
        for e in stream:
            if isinstance(e, BatchSeen):
                claims.append((e.epoch, e.server))
                for cid in e.changes:
                    if wanted is not None and cid[0] not in wanted:
                        continue
                    result.deliveries += 1
                    delivered[(cid[0], cid[1])].append(cid)
                    if cid not in known:
                        result.unexpected += 1
                        _sample(result, "unexpected", f"{client}: {cid}")
                    unique.add(cid)
        result.delivered += len(unique & known)
        for c in hist:
            if c.required and c.id not in unique:
                result.lost += 1
                _sample(result, "lost", f"{client}: {c.id} (txn {c.txn})")
        _order_check(result, expected, delivered)
        _dup_check(result, stream, faults, dup_window_s)
    result.split_brain, result.epochs = _split_brain(claims)
    result.failover_s = _failover_times(faults, hist, streams)
    return result


def applied_state(stream: Sequence[BatchSeen | AckSeen]) -> dict[tuple[str, int], int]:
    """What a consumer that applies its stream in order holds: (table, key) → version
    (READ and INSERT/UPDATE set it, DELETE removes it), batch after batch as received."""
    state: dict[tuple[str, int], int] = {}
    for e in stream:
        if not isinstance(e, BatchSeen):
            continue
        for table, key, op, version in e.reads or e.changes:
            if op == "D":
                state.pop((table, key), None)
            else:
                state[(table, key)] = version
    return state


# -- the consumer's log ---------------------------------------------------------------------


def parse_consumer_log(lines: Iterable[str], seq_base: int = 0) -> list[BatchSeen | AckSeen]:
    """Events of one consumer log (JSON Lines written by ``consumer.py``). A torn last
    line (the process was killed while writing) is ignored. ``seq_base`` keeps batch
    numbers of successive processes of one client apart."""
    events: list[BatchSeen | AckSeen] = []
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if data.get("ev") == "batch":
            rows = tuple((str(c[0]), int(c[1]), str(c[2]), int(c[3])) for c in data["ch"])
            events.append(
                BatchSeen(
                    seq_base + int(data["seq"]),
                    float(data["t"]),
                    int(data["id"]),
                    int(data["epoch"]),
                    str(data["url"]),
                    tuple(r for r in rows if r[2] != "R"),
                    rows if any(r[2] == "R" for r in rows) else (),
                )
            )
        elif data.get("ev") == "ack":
            events.append(AckSeen(seq_base + int(data["seq"]), float(data["t"])))
    return events
