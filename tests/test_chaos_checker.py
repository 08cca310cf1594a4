"""The chaos checker on synthetic histories (fast; no database)."""

from __future__ import annotations

from pathlib import Path

from chaos.checker import (
    AckSeen,
    BatchSeen,
    ChangeId,
    ExpectedChange,
    Fault,
    check,
    parse_consumer_log,
)
from chaos.load import gtid_seq

T = "s_a.items"


def history(n: int = 6) -> list[ExpectedChange]:
    """Key 1: insert v1, updates v2..v(n-1), delete v(n-1); one change per txn, t = txn."""
    out = [ExpectedChange(T, 1, "I", 1, 1, 1.0)]
    out += [ExpectedChange(T, 1, "U", v, v, float(v)) for v in range(2, n)]
    out.append(ExpectedChange(T, 1, "D", n - 1, n, float(n)))
    return out


def ids(h: list[ExpectedChange], *idx: int) -> tuple[ChangeId, ...]:
    return tuple(h[i].id for i in idx)


def stream(
    *batches: tuple[tuple[ChangeId, ...], float, bool], epoch: int = 5
) -> list[BatchSeen | AckSeen]:
    """Batches (changes, time, acked 0.01 s later?) on one server."""
    events: list[BatchSeen | AckSeen] = []
    for seq, (changes, t, acked) in enumerate(batches, 1):
        events.append(BatchSeen(seq, t, seq, epoch, "http://n1", changes))
        if acked:
            events.append(AckSeen(seq, t + 0.01))
    return events


def test_clean_run_is_ok() -> None:
    h = history()
    s = stream((ids(h, 0, 1, 2), 10, True), (ids(h, 3, 4, 5), 11, True))
    r = check("clean", h, {"c1": s})
    assert r.ok, r.line()
    assert (r.lost, r.duplicates, r.delivered, r.rows_written) == (0, 0, 6, 6)


def test_missing_change_is_lost() -> None:
    h = history()
    r = check("lost", h, {"c1": stream((ids(h, 0, 1, 2, 3, 4), 10, True))})
    assert not r.ok
    assert r.lost == 1
    assert "lost" in r.samples


def test_expected_loss_still_checks_order() -> None:
    h = history()
    prefix = check("purged", h, {"c1": stream((ids(h, 0, 1), 10, True))}, lost_expected=True)
    assert prefix.ok and prefix.lost == 4
    gap = check("skip", h, {"c1": stream((ids(h, 0, 1, 4), 10, True))}, lost_expected=True)
    assert not gap.ok and gap.order_violations == 1


def test_gap_is_an_order_violation() -> None:
    h = history()
    s = stream((ids(h, 0, 2, 1, 3, 4, 5), 10, True))
    r = check("order", h, {"c1": s})
    assert r.order_violations == 2  # 0 -> 2 skips 1; after the rewind, 1 -> 3 skips 2
    assert r.lost == 0
    assert not r.ok


def test_skip_over_optional_change_is_fine() -> None:
    h = history()
    h[2] = ExpectedChange(T, 1, "U", 3, 3, 3.0, required=False)
    r = check("optional", h, {"c1": stream((ids(h, 0, 1, 3, 4, 5), 10, True))})
    assert r.ok, r.line()


def test_redelivery_of_unacked_batch_is_within_bound() -> None:
    h = history()
    s = stream((ids(h, 0, 1, 2), 10, False), (ids(h, 0, 1, 2, 3, 4, 5), 20, True))
    r = check("unacked", h, {"c1": s})
    assert r.ok, r.line()
    assert r.duplicates == 3
    assert r.dup_bound == 3


def test_redelivery_of_acked_batch_without_fault_is_outside_bound() -> None:
    h = history()
    s = stream((ids(h, 0, 1, 2), 10, True), (ids(h, 0, 1, 2, 3, 4, 5), 20, True))
    r = check("acked", h, {"c1": s})
    assert r.dups_outside_bound == 3
    assert not r.ok


def test_acks_within_window_before_fault_may_come_again() -> None:
    h = history()
    s = stream((ids(h, 0, 1, 2), 10.0, True), (ids(h, 0, 1, 2, 3, 4, 5), 20, True))
    near = check("near", h, {"c1": s}, faults=[Fault("kill", 10.5)], dup_window_s=1.0)
    assert near.ok, near.line()
    far = check("far", h, {"c1": s}, faults=[Fault("kill", 15.0)], dup_window_s=1.0)
    assert far.dups_outside_bound == 3
    # a fault with its own window (a database failover's time fallback)
    wide = check("wide", h, {"c1": s}, faults=[Fault("db", 15.0, window_s=6.0)], dup_window_s=1.0)
    assert wide.ok, wide.line()


def test_ack_after_fault_may_come_again() -> None:
    h = history()
    s = stream((ids(h, 0, 1, 2), 12.0, True), (ids(h, 0, 1, 2, 3, 4, 5), 20, True))
    r = check("late-ack", h, {"c1": s}, faults=[Fault("kill", 11.0)], dup_window_s=0.2)
    assert r.ok, r.line()


def test_same_epoch_from_two_nodes_is_split_brain() -> None:
    h = history()
    s: list[BatchSeen | AckSeen] = [
        BatchSeen(1, 10, 1, 7, "http://n1", ids(h, 0, 1, 2)),
        BatchSeen(2, 11, 2, 7, "http://n2", ids(h, 3, 4, 5)),
    ]
    r = check("split", h, {"c1": s})
    assert r.split_brain == {"7": ["http://n1", "http://n2"]}
    assert not r.ok
    r2 = check("claims", h, {"c1": stream((ids(h, 0, 1, 2, 3, 4, 5), 10, True))},
               leader_claims=[(9, "node1"), (9, "node1"), (10, "node2")])  # fmt: skip
    assert r2.ok and r2.epochs == [5, 9, 10]


def test_unknown_change_is_unexpected() -> None:
    h = history()
    s = stream(((*ids(h, 0, 1, 2, 3, 4, 5), (T, 1, "U", 99)), 10, True))
    r = check("unexpected", h, {"c1": s})
    assert r.unexpected == 1
    assert not r.ok


def test_failover_time_is_the_longest_stall_around_the_fault() -> None:
    h = history()
    s = stream(
        (ids(h, 0), 2.0, True),
        (ids(h, 1), 2.5, True),
        (ids(h, 1), 2.7, True),  # a redelivery is no progress
        (ids(h, 2, 3), 9.0, True),
        (ids(h, 4, 5), 9.5, True),
    )
    r = check("fo", h, {"c1": s}, faults=[Fault("kill", 2.6), Fault("late", 100)])
    assert r.failover_s == [6.5, None]
    assert r.max_failover_s == 6.5


def test_every_client_must_get_everything() -> None:
    h = history()
    full = stream((ids(h, 0, 1, 2, 3, 4, 5), 10, True))
    r = check("two", h, {"c1": full, "c2": stream((ids(h, 0, 1), 10, True))})
    assert r.lost == 4
    assert r.required == 12


def test_tables_restrict_the_check() -> None:
    h = [*history(), ExpectedChange("s_b.orders", 9, "I", 1, 99, 99.0)]
    r = check("tables", h, {"c1": stream((ids(h, 0, 1, 2, 3, 4, 5), 10, True))}, tables=[T])
    assert r.ok, r.line()
    assert r.rows_written == 6


def test_consumer_log_parsing_and_result_file(tmp_path: Path) -> None:
    lines = [
        '{"ev":"start","t":1}',
        '{"ev":"batch","seq":1,"t":2.0,"id":4,"epoch":3,"url":"u","ch":[["s_a.items",1,"I",1]]}',
        '{"ev":"ack","seq":1,"t":2.1}',
        '{"ev":"batch","seq":2,"t":3.0,"id":5,"ep',  # torn by SIGKILL
    ]
    events = parse_consumer_log(lines, seq_base=100)
    assert events == [BatchSeen(101, 2.0, 4, 3, "u", ((T, 1, "I", 1),)), AckSeen(101, 2.1)]
    r = check("file", [ExpectedChange(T, 1, "I", 1, 1, 1.0)], {"c": events})
    path = r.write(tmp_path)
    assert path.name == "file.json"
    assert '"ok": true' in path.read_text()
    assert r.line().startswith("[chaos file] OK: rows written 1")


def test_gtid_seq() -> None:
    assert gtid_seq("0-1-42") == 42
    assert gtid_seq("1-2-7,0-3-9") == 9
    assert gtid_seq("") is None
