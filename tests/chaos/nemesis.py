"""The nemesis: random faults from the whole menu under a steady write load, then the
checker, a JSON history and a timeline picture (in the manner of Jepsen)::

    .venv/bin/python tests/chaos/nemesis.py --minutes 10 --seed 7 [--out DIR]

A private sandbox (MariaDB primary + GTID replica, three etcd members), three nodes
serving two destinations (``d1``, ``d2``; the replica configured as their standby),
the chaos load writer, and two consumer processes per destination. Until the time is
up, a ``random.Random(seed)`` picks the next fault, injects it, heals it and waits
until every consumer receives changes committed after the healing; then a quiet gap.

The menu (``MENU``): leader SIGKILL (restarted after the next leader reads), leader
SIGSTOP shorter than the TTL, leader SIGSTOP longer than the TTL (a zombie), a node
restarted (SIGTERM, start), one etcd member killed and restarted, one etcd member
paused, etcd quorum lost (two of three killed; every leader must fence) and restored,
the MariaDB primary killed and the replica promoted (once: there is no second
replica), a consumer killed before its ack (it stalls after logging a batch, SIGKILL,
a successor takes over).

At the end the chaos checker (``checker.check``): nothing lost, order per key,
duplicates within the bound (unacked batches, one flush period of acks before a fault,
the time fallback's replay after the database failover), no epoch served by two nodes.
``DIR`` (default ``tests/chaos/results/nemesis-<seed>``) gets ``history.json`` (faults
with start and end, leader samples, the writer's history, every consumer's batches and
acks, the check) and ``timeline.png`` (``timeline.py``). The exit code is 0 when the
check passes; any failure prints the seed and the command that replays it.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: tests/ holds node_fixtures and chaos
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node_fixtures import FAST_ELECTION, WAIT_S, NodeProc

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from chaos.checker import BatchSeen, CheckResult
from chaos.harness import RESULTS, ChaosRun
from chaos.timeline import draw_timeline

__all__ = ["MENU", "Nemesis", "NemesisOutcome", "main", "replay_command"]

log = logging.getLogger("chaos.nemesis")

DESTINATIONS = ("d1", "d2")
CLIENTS = ("c1", "c2")
ELECTION = {**FAST_ELECTION, "ttl_s": 4.0}  # a short pause (1 s) stays well inside it
FLUSH_S = 0.2
WINDOW_S = FLUSH_S + 1.0  # acks a crash may lose: one flush period plus one in flight
FALLBACK_S = 5  # the database failover's time fallback
RECOVERY_S = 120.0  # a fault must heal, and changes flow again, within this


@dataclass
class FaultRecord:
    kind: str
    target: str
    start: float
    end: float = 0.0


@dataclass
class NemesisOutcome:
    seed: int
    minutes: float
    result: CheckResult | None
    faults: list[FaultRecord]
    out: Path
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.result is not None and self.result.ok

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for f in self.faults:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        menu = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))
        line = self.result.line() if self.result is not None else "no check"
        text = f"[nemesis seed {self.seed}] {len(self.faults)} faults ({menu}); {line}"
        if not self.ok:
            text += f"\n{self.error}\nreplay: {replay_command(self.seed, self.minutes)}"
        return text


def replay_command(seed: int, minutes: float) -> str:
    return f".venv/bin/python tests/chaos/nemesis.py --minutes {minutes:g} --seed {seed}"


@dataclass
class Nemesis:
    """Random faults on one ``ChaosRun`` (see the module docstring)."""

    run: ChaosRun
    seed: int
    minutes: float
    out: Path
    rng: random.Random = field(init=False)
    records: list[FaultRecord] = field(default_factory=list)
    used: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # -- set-up -------------------------------------------------------------------------

    def start(self) -> None:
        box = self.run.box
        standby = {
            "standby": {"address": f"127.0.0.1:{box.replica.port}"},
            "fallback_interval_s": FALLBACK_S,
            "detecting": {
                "enable": True, "interval_s": 0.5, "retry_threshold": 2, "timeout_s": 1.0,
            },
        }  # fmt: skip
        self.run.start_multi(
            DESTINATIONS, nodes=3, seed=self.seed, destination=standby,
            election=ELECTION, meta={"flush_period_ms": int(FLUSH_S * 1000)},
        )  # fmt: skip
        for d in DESTINATIONS:
            for c in CLIENTS:
                self.run.start_consumer(c, d, *consumer_args(c))
        self.run.wait_subscribed()
        self.run.start_load()
        self.run.wait_consumers_ready()

    # -- the loop -----------------------------------------------------------------------

    def loop(self) -> None:
        end = time.time() + self.minutes * 60
        while time.time() < end:
            name, move = self.pick()
            move(self)
            healed = time.time()
            self.records[-1].end = healed
            self.run.wait_delivered_after(healed, RECOVERY_S)
            gap = self.rng.uniform(1.0, 4.0)
            time.sleep(max(0.0, min(gap, end - time.time())))
            log.info("nemesis: %s done", name)

    def pick(self) -> tuple[str, Callable[[Nemesis], None]]:
        menu = [(n, w, f) for n, (w, f, once) in MENU.items() if not (once and n in self.used)]
        name, _, move = self.rng.choices(menu, weights=[w for _, w, _ in menu])[0]
        self.used.add(name)
        return name, move

    def begin(self, kind: str, target: str, window_s: float | None = None) -> None:
        t = self.run.fault(f"{kind} {target}", window_s)
        self.records.append(FaultRecord(kind, target, t))

    def leader_of_some_destination(self) -> tuple[str, NodeProc]:
        d = self.rng.choice(DESTINATIONS)
        return d, self.run.leader(d)

    # -- the end ------------------------------------------------------------------------

    def finish(self) -> CheckResult:
        return self.run.finish(dup_window_s=WINDOW_S, drain_s=RECOVERY_S)

    def history(self, result: CheckResult | None, error: str) -> dict[str, Any]:
        run = self.run
        writer = run.writer
        streams = {
            name: [
                {"batch": e.seq, "t": e.t, "id": e.batch_id, "epoch": e.epoch,
                 "server": e.server, "changes": [list(c) for c in e.changes]}
                if isinstance(e, BatchSeen) else {"ack": e.seq, "t": e.t}
                for e in events
            ]
            for name, events in run.streams().items()
        }  # fmt: skip
        return {
            "seed": self.seed,
            "minutes": self.minutes,
            "replay": replay_command(self.seed, self.minutes),
            "destinations": list(DESTINATIONS),
            "clients": list(CLIENTS),
            "election": ELECTION,
            "faults": [asdict(f) for f in self.records],
            "leader_samples": [list(s) for s in run.leader_samples],
            "writes": [
                [c.table, c.key, c.op, c.version, c.txn, c.t, c.required]
                for c in (writer.history() if writer is not None else [])
            ],
            "streams": streams,
            "check": result.to_dict() if result is not None else None,
            "error": error,
        }

    def write(self, result: CheckResult | None, error: str) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        data = self.history(result, error)
        (self.out / "history.json").write_text(json.dumps(data, separators=(",", ":")))
        draw_timeline(data, self.out / "timeline.png")


# -- the menu ------------------------------------------------------------------------------


def leader_sigkill(n: Nemesis) -> None:
    d, leader = n.leader_of_some_destination()
    n.begin("leader SIGKILL", f"{leader.id} ({d})")
    leader.kill()
    n.run.leader(d, exclude=[leader])
    leader.restart()


def _pause(n: Nemesis, kind: str, seconds: float) -> None:
    d, leader = n.leader_of_some_destination()
    n.begin(kind, f"{leader.id} ({d}) {seconds:.1f}s")
    leader.pause()
    try:
        time.sleep(seconds)
    finally:
        leader.resume()


def pause_short(n: Nemesis) -> None:
    _pause(n, "leader SIGSTOP < TTL", 1.0)


def pause_long(n: Nemesis) -> None:
    _pause(n, "leader SIGSTOP > TTL", ELECTION["ttl_s"] + 2.0)


def node_restart(n: Nemesis) -> None:
    node = n.rng.choice(n.run.nodes)
    n.begin("node restart", node.id)
    node.stop()
    node.restart()


def etcd_member_kill(n: Nemesis) -> None:
    cluster = n.run.box.etcd_cluster
    member = n.rng.choice(cluster.members)
    n.begin("etcd member SIGKILL", member.name)
    member.process.kill()
    time.sleep(n.rng.uniform(1.0, 4.0))
    cluster.restart_member(member.name)


def etcd_member_pause(n: Nemesis) -> None:
    member = n.rng.choice(n.run.box.etcd_cluster.members)
    seconds = n.rng.uniform(1.0, 4.0)
    n.begin("etcd member SIGSTOP", f"{member.name} {seconds:.1f}s")
    member.process.pause()
    try:
        time.sleep(seconds)
    finally:
        member.process.resume()


def etcd_quorum_loss(n: Nemesis) -> None:
    cluster = n.run.box.etcd_cluster
    lost = n.rng.sample(cluster.members, 2)
    n.begin("etcd quorum lost", "+".join(m.name for m in lost))
    for m in lost:
        m.process.kill()
    try:
        wait_until(
            lambda: all(
                node.role(d) != "leader"
                for node in n.run.nodes
                if node.is_running()
                for d in DESTINATIONS
            ),
            "every leader fenced without quorum",
            WAIT_S,
        )
    finally:
        for m in lost:
            cluster.restart_member(m.name)


def db_failover(n: Nemesis) -> None:
    box, writer = n.run.box, n.run.writer
    assert writer is not None
    n.begin("MariaDB primary SIGKILL, replica promoted", "primary", FALLBACK_S + 2.0)
    errors = writer.errors
    box.primary.kill()
    box.replica.promote()
    writer.retarget(box.replica)
    wait_until(lambda: writer.errors > errors, "the writer noticed", WAIT_S)


def consumer_args(client: str) -> tuple[str, ...]:
    """The last client of each destination acks on its next get (``canal-ha consume``'s
    way), the others with a separate ack."""
    return ("--ack-on-get",) if client == CLIENTS[-1] else ()


def consumer_kill_before_ack(n: Nemesis) -> None:
    d, c = n.rng.choice(DESTINATIONS), n.rng.choice(CLIENTS)
    consumer = n.run.consumers[(d, c)][-1]
    n.begin("consumer SIGKILL before ack", f"{d}/{c}")
    consumer.process.signal(signal.SIGUSR1)
    n.run.log_has(consumer, "stalled", RECOVERY_S)
    consumer.process.kill()
    n.run.start_consumer(c, d, *consumer_args(c))


Move = Callable[[Nemesis], None]
MENU: dict[str, tuple[float, Move, bool]] = {  # name: (weight, move, at most once)
    "leader SIGKILL": (3.0, leader_sigkill, False),
    "leader SIGSTOP < TTL": (2.0, pause_short, False),
    "leader SIGSTOP > TTL": (2.0, pause_long, False),
    "node restart": (2.0, node_restart, False),
    "etcd member SIGKILL": (1.0, etcd_member_kill, False),
    "etcd member SIGSTOP": (1.0, etcd_member_pause, False),
    "etcd quorum lost": (1.0, etcd_quorum_loss, False),
    "database failover": (1.0, db_failover, True),
    "consumer SIGKILL before ack": (2.0, consumer_kill_before_ack, False),
}


def run_nemesis(run: ChaosRun, seed: int, minutes: float, out: Path) -> NemesisOutcome:
    """Start, loop, check, write; never raises for a failure of the system under test
    (the outcome carries it, with the seed)."""
    nemesis = Nemesis(run, seed, minutes, out)
    result: CheckResult | None = None
    error = ""
    try:
        nemesis.start()
        nemesis.loop()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        log.error("nemesis seed %d: %s\n%s", seed, error, traceback.format_exc())
    try:
        result = nemesis.finish()
    except Exception as exc:
        error = error or f"{type(exc).__name__}: {exc}"
    nemesis.write(result, error)
    outcome = NemesisOutcome(seed, minutes, result, nemesis.records, out, error)
    print(outcome.summary())
    print(
        f"[nemesis seed {seed}] history: {out / 'history.json'}, timeline: {out / 'timeline.png'}"
    )
    return outcome


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--minutes", type=float, default=10.0, help="how long faults are injected")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: a new one)")
    p.add_argument("--out", type=Path, default=None, help="where history and timeline go")
    args = p.parse_args(argv)
    if args.minutes <= 0:
        p.error("--minutes must be > 0")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    out = args.out or RESULTS / f"nemesis-{seed}"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("canal_cluster", "canal_client", "httpx", "chaos.load"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="canal-nemesis-") as tmp:
        box = Sandbox(Path(tmp) / "sandbox", etcd_members=3, standby=True).start()
        run = ChaosRun(f"nemesis-{seed}", box, Path(tmp))
        try:
            outcome = run_nemesis(run, seed, args.minutes, out)
        finally:
            run.close()
            box.stop()
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
