"""`canal-ha up`, `canal-ha down` and `canal-ha demo`: the embedded sandbox from the shell."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from canal_cluster.retry import wait_until
from canal_ha.args import positive_int
from canal_ha.console import say
from canal_ha.sandbox import STATE_FILE, Sandbox
from canal_ha.sandbox.ports import free_port
from canal_ha.sandbox.process import ManagedProcess
from canal_ha.sandbox.secure import SECRETS_DIR, SecureSetup
from canal_protocol.errors import ConfigError, RetryExhausted, SandboxStartError, SandboxStateError

__all__ = ["DEFAULT_WORKDIR", "demo", "down", "register", "up"]

DEFAULT_WORKDIR = Path(".canal-ha")
DESTINATION = "example"
NODE_READY_S = 90.0
FRESH_HINT = (
    "\n(a workdir keeps its MariaDB data and etcd state (clients, cursors, origin) across "
    "`down` and `up`; everything is stopped now: to start from scratch, remove {0} or "
    "use another --workdir)"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`up`, `down` and `demo`."""
    p = sub.add_parser("up", help="start the embedded sandbox (MariaDB, etcd, server nodes)")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="state and logs")
    p.add_argument("--nodes", type=positive_int("--nodes"), default=3, help="server nodes")
    p.add_argument("--etcd-members", type=int, choices=(1, 3), default=1)
    p.add_argument("--standby", action="store_true", help="also start a GTID replica")
    p.add_argument("--detach", action="store_true", help="return once everything is up")
    p.add_argument("--secure", action="store_true",
                   help="production security: etcd over TLS with client certificates and "
                        "users, MariaDB requiring TLS, admin and consumer tokens, every secret "
                        "a 0600 file under WORKDIR/secrets (docs/operations.md)")  # fmt: skip
    p.add_argument("--client-ids", type=_client_ids, default=None, metavar="IDS",
                   help="with --secure: client ids the consumers' etcd user may hold "
                        "exclusively (comma separated; default c1)")  # fmt: skip
    p.set_defaults(func=up)

    p = sub.add_parser("down", help="stop what `up` started in a workdir, by pid")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    p.set_defaults(func=down)

    p = sub.add_parser("demo", help="sandbox + a writer + a live binlog line; Ctrl-C stops")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    p.add_argument("--rate", type=positive_int("--rate"), default=2000, help="rows/s to write")
    p.add_argument("--duration", type=float, default=0.0, help="stop after S seconds (0 = never)")
    p.add_argument("--standby", action="store_true")
    p.add_argument("--nodes", type=positive_int("--nodes"), default=3,
                   help="server nodes; the rows are read with canal-ha consume (0: tail the "
                        "binlog directly)")  # fmt: skip
    p.add_argument("--kill-leader", type=float, nargs="?", const=10.0, default=None,
                   metavar="S", help="SIGKILL the leader after S s (default 10): failover "
                                     "without loss")  # fmt: skip
    p.set_defaults(func=demo)


def _client_ids(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated client ids, each a valid one."""
    from canal_cluster.keys import Keys
    from canal_protocol.errors import InvalidArgument

    ids = tuple(i.strip() for i in text.split(",") if i.strip())
    if not ids:
        raise argparse.ArgumentTypeError("give at least one client id")
    for cid in ids:
        try:
            Keys().client_prefix(DESTINATION, cid)
        except InvalidArgument as exc:
            raise argparse.ArgumentTypeError(f"{cid!r}: {exc}") from None
    return ids


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C so both stop everything cleanly.

    SIGINT gets Python's default handler explicitly: a shell that starts us in the
    background leaves SIGINT ignored, and Ctrl-C (or kill -INT) must still stop us.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous_term = signal.signal(signal.SIGTERM, handler)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def _refuse_if_running(workdir: Path) -> None:
    if not (workdir / STATE_FILE).exists():
        return
    try:
        old = Sandbox.load(workdir)
    except SandboxStateError:
        return
    running = [p.name for p in old.processes() if p.is_running()]
    if running:
        raise ConfigError(
            "--workdir",
            f"{workdir} already runs {', '.join(running)}; "
            f"run `canal-ha down --workdir {workdir}` first",
        )


def _refuse_other_mode(workdir: Path, secure: SecureSetup | None) -> None:
    """A workdir set up with --secure keeps etcd's auth and its secrets: no plain start."""
    if secure is None and (workdir / SECRETS_DIR).is_dir():
        raise ConfigError(
            "--secure",
            f"{workdir} was set up with --secure (etcd has auth on, the users' passwords "
            f"are in {workdir / SECRETS_DIR}): run `canal-ha up --secure --workdir "
            f"{workdir}`, or use another --workdir",
        )


def start_sandbox(
    workdir: Path, etcd_members: int, standby: bool, secure: SecureSetup | None = None
) -> Sandbox:
    _refuse_if_running(workdir)
    _refuse_other_mode(workdir, secure)
    t0 = time.monotonic()
    box = Sandbox(workdir, etcd_members=etcd_members, standby=standby, secure=secure).start()
    say(f"canal-ha sandbox up in {time.monotonic() - t0:.1f}s ({box.workdir})")
    return box


def print_summary(box: Sandbox, nodes: list[dict[str, Any]]) -> None:
    etcd = box.etcd_cluster
    secured = "; client certificates, users" if box.secure is not None else ""
    rows = [("etcd", f"{','.join(etcd.endpoints)}  ({len(etcd.members)} member(s){secured})")]
    for db in (box.primary_db, box.standby_db):
        if db is not None:
            d = db.dsn()
            tls = "  TLS required" if db.tls is not None else ""
            rows.append(
                (db.name, f"{d['url']}  server_id={d['server_id']}  pid {db.process.pid}{tls}")
            )
    rows.append(("app", f"{box.primary.app_dsn()['url']}  (read-write: write your data here)"))
    if box.secure is not None:
        rows += box.secure.summary(box.etcd_endpoints)
    for n in nodes:
        rows.append(
            (n["name"], f"{n['url']}  canal {n['canal']}  pid {n['pid']}  config {n['config']}")
        )
    rows.append(("state", str(box.workdir / STATE_FILE)))
    logs = ["etcd/*/etcd.log", "primary/error.log"]
    logs += ["standby/error.log"] if box.standby_db is not None else []
    logs += ["nodes/*.log"] if nodes else []
    rows.append(("logs", f"{box.workdir}/{{{','.join(logs)}}}"))
    for key, value in rows:
        say(f"  {key:<8} {value}")


# -- server nodes --------------------------------------------------------------------------


def _node_config(box: Sandbox, node_id: str, port: int, canal_port: int) -> dict[str, Any]:
    primary = box.primary.dsn()
    dest: dict[str, Any] = {
        "master": {"address": f"{primary['host']}:{primary['port']}"},
        "db": {"username": primary["user"], "password": primary["password"]},
    }
    if box.standby_db is not None:
        standby = box.standby_db.dsn()
        dest["standby"] = {"address": f"{standby['host']}:{standby['port']}"}
        dest["gtid_mode"] = True
    config = {
        "node": {"id": node_id, "listen": f"127.0.0.1:{port}",
                 "advertise_url": f"http://127.0.0.1:{port}"},
        "etcd": {"endpoints": box.etcd_endpoints, "prefix": "/canal"},
        "canal": {"listen": f"127.0.0.1:{canal_port}"},
        "destinations": {DESTINATION: dest},
    }  # fmt: skip
    return box.secure.node_config(config) if box.secure is not None else config


def start_nodes(box: Sandbox, count: int) -> list[dict[str, Any]]:
    """Start ``count`` server nodes serving destination ``example``; tracked by the sandbox."""
    from canal_server.config import render_toml

    nodes: list[dict[str, Any]] = []
    for i in range(1, count + 1):
        node_id = f"node{i}"
        port, canal_port = free_port(), free_port()
        path = box.workdir / "nodes" / f"{node_id}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_toml(_node_config(box, node_id, port, canal_port)))
        argv = (sys.executable, "-m", "canal_ha.cli", "server", "--config", str(path))
        proc = ManagedProcess(node_id, argv, path.with_suffix(".log"))
        proc.start()
        box.add_process(proc)
        nodes.append(
            {"name": node_id, "url": f"http://127.0.0.1:{port}",
             "canal": f"127.0.0.1:{canal_port}", "pid": proc.pid,
             "config": str(path), "log": str(proc.log_path)}
        )  # fmt: skip
    _write_nodes(box, nodes, None)
    return nodes


def _poll(nodes: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """(the leader whose reader runs, else None; why a leader cannot read, else "")."""
    import httpx

    failed = ""
    for n in nodes:
        try:
            health = httpx.get(f"{n['url']}/v1/health", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            continue
        d = health["destinations"][DESTINATION]
        reader = d["reader"]
        if d["role"] == "leader" and reader["state"] == "running":
            return {"node": n["name"], "url": n["url"], "epoch": d["epoch"]}, ""
        if d["role"] == "leader" and reader["state"] == "failed":
            error = f"{reader['error_type']}: {reader['error']}"
            failed = f"{n['name']} leads it but cannot read: {error}"
    return None, failed


def _leader_of(nodes: list[dict[str, Any]]) -> dict[str, Any] | None:
    return _poll(nodes)[0]


def wait_for_leader(box: Sandbox, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The node leading ``example`` with its reader running. Gives up (SandboxStartError
    with the cause from the nodes' health and logs) after ``NODE_READY_S``, or at once
    when every node exited or the leader's reader failed (the operator must act)."""
    seen: dict[str, Any] = {"leader": None, "cause": ""}
    names = {n["name"] for n in nodes}

    def settled() -> bool:
        seen["leader"], seen["cause"] = _poll(nodes)
        if not any(p.is_running() for p in box.processes() if p.name in names):
            seen["cause"] = "every node exited"
        return seen["leader"] is not None or bool(seen["cause"])

    try:
        wait_until(settled, f"a leader of {DESTINATION}", NODE_READY_S)
    except RetryExhausted:
        seen["cause"] = f"none within {NODE_READY_S:.0f}s"
    if seen["leader"] is None:
        reason = f"no node leads {DESTINATION!r}: {seen['cause']}{_log_errors(box, nodes)}"
        raise SandboxStartError("server nodes", reason + FRESH_HINT.format(box.workdir))
    _write_nodes(box, nodes, seen["leader"])
    return dict(seen["leader"])


def _log_errors(box: Sandbox, nodes: list[dict[str, Any]], per_node: int = 3) -> str:
    """The last ERROR lines of each node's log since its last start (else its last lines)."""
    out = [f"\nlast errors in the node logs ({box.workdir / 'nodes'}):"]
    for n in nodes:
        try:
            text = Path(n["log"]).read_text(errors="replace")
        except OSError as exc:
            out.append(f"  {n['name']}: cannot read {n['log']}: {exc}")
            continue
        lines = text[text.rfind("\n--- start ") + 1 :].splitlines()[1:]
        errors = [line for line in lines if " ERROR " in line or " CRITICAL " in line]
        for line in (errors or lines)[-per_node:]:
            out.append(f"  {n['name']}: {line[:800]}")
    return "\n".join(out)


def _write_nodes(box: Sandbox, nodes: list[dict[str, Any]], leader: dict[str, Any] | None) -> None:
    """cluster.json plus the node URLs, config files, logs and the leader."""
    state = box.state()
    state["nodes"] = nodes
    state["destinations"] = {DESTINATION: {"leader": leader}}
    path = box.workdir / STATE_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)


def _wait_forever(box: Sandbox) -> None:
    while True:
        time.sleep(1.0)
        dead = [p.name for p in box.processes() if not p.is_running()]
        if dead:
            say(f"canal-ha: {', '.join(dead)} exited; see the logs in {box.workdir}")


def _stop(box: Sandbox) -> None:
    stopped = box.stop()
    say(f"canal-ha: stopped {', '.join(stopped) if stopped else 'nothing (all had exited)'}")


def _import_node_config(nodes: int) -> None:
    """Import the node config's modules (pydantic's) before SIGTERM becomes an interrupt.

    One fresh-clone CI run (and 1 of 50 tries of SIGTERM 0-0.5 s after cluster.json)
    saw ``up`` stop everything on SIGTERM and then die of SIGINT instead of exiting 0,
    with no traceback, when the interrupt came while ``start_nodes`` imported them.
    """
    if nodes:
        import canal_server.config  # noqa: F401


def up(args: argparse.Namespace) -> int:
    """Start everything; stop it all on Ctrl-C/SIGTERM at any moment, even mid-start."""
    started: list[Sandbox] = []
    _import_node_config(args.nodes)
    with _sigterm_as_interrupt():
        try:
            box = start_sandbox(args.workdir, args.etcd_members, args.standby, _secure(args))
            started.append(box)
            _serve_up(box, args)
            if args.detach:
                started.clear()  # keeps running; `canal-ha down` stops it
        except KeyboardInterrupt:
            say()
        finally:
            _stop_all(started)
    return 0


def _secure(args: argparse.Namespace) -> SecureSetup | None:
    """``--secure``'s setup for the workdir (``--client-ids`` needs it)."""
    if not args.secure:
        if args.client_ids is not None:
            raise ConfigError("--client-ids", "needs --secure")
        return None
    ids = args.client_ids or SecureSetup.client_ids
    return SecureSetup(args.workdir.resolve() / SECRETS_DIR, DESTINATION, ids)


def _stop_all(boxes: list[Sandbox]) -> None:
    """Stop what was started; a second Ctrl-C/SIGTERM meanwhile cannot cut it short."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for box in boxes:
            _stop(box)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve_up(box: Sandbox, args: argparse.Namespace) -> None:
    nodes = start_nodes(box, args.nodes) if args.nodes else []
    print_summary(box, nodes)
    if nodes:
        leader = wait_for_leader(box, nodes)
        say(f"  leader   {leader['node']} {leader['url']} "
              f"(destination {DESTINATION}, epoch {leader['epoch']})")  # fmt: skip
        say(f"  console  {leader['url']}/console  (web console: every node serves it)")
    if args.detach:
        say(f"detached; stop with: canal-ha down --workdir {args.workdir}")
        return
    say("running; Ctrl-C stops everything")
    _wait_forever(box)


def down(args: argparse.Namespace) -> int:
    box = Sandbox.load(args.workdir)
    before = {p.name: p.pid for p in box.processes()}
    stopped = box.stop()
    if not stopped:
        say(f"canal-ha down: nothing was running in {box.workdir}")
    for name in stopped:
        say(f"stopped {name} (pid {before[name]})")
    return 0


def demo(args: argparse.Namespace) -> int:
    from canal_ha.demo import DemoRun

    if args.kill_leader is not None and args.nodes < 2:
        raise ConfigError("--kill-leader", "needs --nodes 2 or more")
    box: Sandbox | None = None
    run: DemoRun | None = None
    nodes: list[dict[str, Any]] = []
    stop = threading.Event()
    _import_node_config(args.nodes)
    with _sigterm_as_interrupt():
        try:
            box = start_sandbox(args.workdir, 1, args.standby)
            nodes = start_nodes(box, args.nodes) if args.nodes else []
            print_summary(box, nodes)
            if nodes:
                wait_for_leader(box, nodes)
            run = DemoRun(box, rate=args.rate, kill_leader_after_s=args.kill_leader,
                          find_leader=(lambda: _leader_of(nodes)) if nodes else None)  # fmt: skip
            run.start()
            what = "consuming them with canal-ha consume" if nodes else "reading the binlog"
            say(f"writing rows and {what}; Ctrl-C stops")
            run.report_until(stop, args.duration)
        except KeyboardInterrupt:
            say()
        finally:
            if run is not None:
                run.stop()
            if box is not None:
                _stop_nodes(box, nodes)
                _stop(box)
    if run is not None:
        say(run.final_line())
    return 0


def _stop_nodes(box: Sandbox, nodes: list[dict[str, Any]]) -> None:
    names = {n["name"] for n in nodes}
    stopped = [p.name for p in box.processes() if p.name in names and p.is_running()]
    for proc in box.processes():
        if proc.name in stopped:
            proc.stop(timeout_s=30)
    if stopped:
        say(f"canal-ha: stopped {', '.join(stopped)}")
