"""schemathesis over every operation of the OpenAPI document, on a real leader and a
real standby (issue 37): valid and invalid requests (positive and negative modes); the
run fails on any 5xx, any dropped connection and any answer the document does not
describe (status, content type, headers, body schema), and on invalid input a route
accepts. Bounded: ``EXAMPLES`` cases per operation and mode, long polls capped at 50 ms.

Leadership must not move during the run (a 503 while a new leader starts would be
right, but is not what this run looks for): a step-down, direct or as a console action,
names the leader itself as its successor (400).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from node_fixtures import DEST, NodeProc, start_nodes, wait_leader
from reader_fixtures import collect_leaked_sockets

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox

DB = "t_fuzz"
TOKEN = "fuzz-admin-token"
EXAMPLES = 12


@pytest.fixture(scope="module")
def nodes(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    collect_leaked_sockets()
    sandbox.primary.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, v VARCHAR(20))",
        f"INSERT INTO {DB}.t VALUES (1, 'a'), (2, 'b')",
    )
    started = start_nodes(
        sandbox,
        2,
        tmp_path_factory.mktemp("fuzz"),
        auth={"tokens": [TOKEN]},
        # etcd's default bound: the fixtures' 0.5 s made a loaded machine's subscribe a 503
        etcd={"timeout_s": 2.0},
        election={"ttl_s": 8.0},
        destination={"filter": {"regex": f"{DB}\\..*"}},
    )
    try:
        wait_leader(started)
        yield started
    finally:
        for n in started:
            n.stop()
        sandbox.primary.execute(f"DROP DATABASE IF EXISTS {DB}")


def _tame(case: Any, leader: NodeProc) -> None:
    """The admin token on every case but those whose headers are the negative part (a
    missing token: 401); long polls capped at 50 ms; a step-down names the leader
    itself (never moves)."""
    from schemathesis.core.parameters import ParameterLocation

    meta = case.meta
    header = meta.components.get(ParameterLocation.HEADER) if meta is not None else None
    if header is None or not header.mode.is_negative:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {TOKEN}"}
    for holder in (case.body, case.query):
        t = holder.get("timeout_ms") if isinstance(holder, dict) else None
        if isinstance(t, int) and not isinstance(t, bool) and t > 50:
            holder["timeout_ms"] = 50
    body = case.body
    if case.path.endswith("/step-down") and not isinstance(body, dict | list | str | bytes):
        case.body = body = {}  # no body: the defaults, a real step-down
    if isinstance(body, dict) and (
        case.path.endswith("/step-down") or body.get("action") == "step_down"
    ):
        body["to"] = leader.id


@pytest.mark.parametrize("role", ["leader", "standby"])
def test_schemathesis_finds_no_error_no_drop_and_no_mismatch(
    nodes: list[NodeProc], role: str
) -> None:
    import schemathesis
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    leader = wait_leader(nodes)
    node = leader if role == "leader" else next(n for n in nodes if n is not leader)
    schema = schemathesis.openapi.from_url(f"{node.url}/openapi.json")
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
    ]
    failures: list[str] = []
    statuses: dict[int, int] = {}
    session = requests.Session()
    operations = [r.ok() for r in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 20
    positive, negative = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
    for op in operations:
        # the real destination (its routes' own answers), then any valid input, then
        # invalid input (which must be refused)
        real = {"destination": DEST} if "destination" in op.path_parameters else None
        for mode, fixed in ((positive, real), (positive, None), (negative, None)):
            if mode is positive and fixed is None and real is None:
                continue  # no destination to vary: the first pass covered it
            extra = [negative_data_rejection] if mode is negative else []
            run = _fuzz(op, mode, fixed, node, leader, session, checks + extra, failures, statuses)
            try:
                run()
            except Unsatisfiable:  # nothing invalid to send: an operation without inputs
                assert mode is negative and not op.path_parameters, op.path
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:15])
    assert sum(statuses.values()) > 300, statuses
    expected = {200, 400, 401, 404} if role == "leader" else {307, 400, 401, 404}
    assert expected <= set(statuses), statuses
    wait_until(lambda: all(n.is_running() for n in nodes), "both nodes still running", 5)
    assert wait_leader(nodes) is leader  # leadership never moved


def _fuzz(
    op: Any,
    mode: Any,
    path_parameters: dict[str, str] | None,
    node: NodeProc,
    leader: NodeProc,
    session: requests.Session,
    checks: list[Any],
    failures: list[str],
    statuses: dict[int, int],
) -> Any:
    """The hypothesis test of one operation in one mode against ``node``."""
    from hypothesis import HealthCheck, given, settings
    from schemathesis.core.failures import FailureGroup

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    def run(case: Any) -> None:
        _tame(case, leader)
        label = f"{case.method} {case.formatted_path} ({mode.value})"
        try:
            response = case.call(
                base_url=node.url, session=session, timeout=30, allow_redirects=False
            )
        except requests.RequestException as exc:  # a dropped connection
            failures.append(f"{label}: {type(exc).__name__}: {exc}")
            return
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        try:
            case.validate_response(response, checks=checks)
        except (AssertionError, FailureGroup) as exc:
            failures.append(f"{label} -> {response.status_code}: {str(exc)[:600]}")

    return run
