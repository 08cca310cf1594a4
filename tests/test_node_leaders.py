"""The node's cache of each destination's leader record (what standbys redirect to, what
a step-down waits for): a watch event that lands between a refresh's read of the running
key and the use of its answer is not overwritten by that older answer."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from memory_coordinator import MemoryCoordinator

from canal_cluster.coordinator import Delete, KeyValue, Op, Put, RangeResult
from canal_cluster.keys import Keys
from canal_cluster.running import HandoverHint, RunningInfo
from canal_server.config import config_from_dict
from canal_server.node import Node

DEST = "d"
KEYS = Keys()
RUNNING = KEYS.running(DEST)
LEASE_TTL_S = 60.0
# the node's own refresh comes every ttl_s / 3 (20 s): never during a test
CONFIG = {
    "node": {"id": "n1"},
    "election": {"ttl_s": 60.0},
    "destinations": {DEST: {"master": {"address": "127.0.0.1:1"}}},
}


class ChangeDuringRead(MemoryCoordinator):
    """Runs ``change`` once, in the thread that armed it, right after that thread's next
    read of ``key`` (a get, or a range read covering it) and before the read answers:
    the change's watch events reach the node between its read and the use of it."""

    def __init__(self) -> None:
        super().__init__()
        self._armed: tuple[int, str, Callable[[], None]] | None = None
        self.changed = False  # the armed change ran

    def arm(self, key: str, change: Callable[[], None]) -> None:
        self._armed = (threading.get_ident(), key, change)

    def get(self, key: str) -> KeyValue | None:
        kv = super().get(key)
        self._after_read(lambda armed_key: armed_key == key)
        return kv

    def get_prefix(self, prefix: str) -> RangeResult:
        result = super().get_prefix(prefix)
        self._after_read(lambda armed_key: armed_key.startswith(prefix))
        return result

    def _after_read(self, covers: Callable[[str], bool]) -> None:
        armed = self._armed
        if armed is not None and armed[0] == threading.get_ident() and covers(armed[1]):
            self._armed = None
            armed[2]()
            self.changed = True


@pytest.fixture
def coord() -> Iterator[ChangeDuringRead]:
    c = ChangeDuringRead()
    yield c
    c.close()


def hold(coord: ChangeDuringRead, node: str) -> int:
    """``node`` leads ``DEST``: its epoch."""
    result = coord.campaign(
        RUNNING, RunningInfo(node, f"http://{node}").to_bytes(), coord.grant_lease(LEASE_TTL_S)
    )
    assert result.won and result.epoch is not None
    return result.epoch


def hand_over(coord: ChangeDuringRead, source: str, epoch: int, to: str) -> None:
    """What a leader's step-down writes: the running key deleted, ``to`` named."""
    hint = HandoverHint(source, to, epoch, "test").to_bytes()
    named: Op = Put(KEYS.handover(DEST), hint, coord.grant_lease(LEASE_TTL_S))
    coord.fenced_txn(RUNNING, epoch, [named, Delete(RUNNING)])


@pytest.mark.parametrize("successor_leads", [True, False])
def test_a_leader_change_during_the_refresh_read_is_kept(
    coord: ChangeDuringRead, successor_leads: bool
) -> None:
    """x leads when the node's refresh reads the running key; before the read answers, x
    hands over to y (and y leads, or not yet): the watch reports it at once, and the
    refresh's older answer (x) must not bring x back into the cache (standbys would send
    307s to the deposed leader, a step-down wait for y would time out)."""
    old = hold(coord, "x")
    expected: list[RunningInfo | None] = [None]

    def x_hands_over() -> None:
        hand_over(coord, "x", old, "y")
        if successor_leads:
            expected[0] = RunningInfo("y", "http://y", hold(coord, "y"))

    node = Node(config_from_dict(CONFIG), coordinator=coord)
    coord.arm(RUNNING, x_hands_over)  # start() reads the running key in this thread
    try:
        node.start()
        assert coord.changed, "start() did not read the running key"
        assert node.view(DEST).leader == expected[0]
    finally:
        node.stop()
