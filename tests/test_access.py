"""Access by role: admin tokens (``auth.tokens``, ``[[auth.admin]]``) and consumer
tokens (``[[auth.consumer]]``, optionally limited to destinations and client ids).

Against a real node: a consumer token works on its own client routes, gets 403
``forbidden`` with a body naming its limit on another destination or client id, the
client raises ``Forbidden`` (never retried); admin and the old ``tokens`` keep every
right. ``require_admin`` (the dependency of routes that change the cluster) on a FastAPI
app of its own: 403 for a consumer token, 401 without one, open without tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import httpx
import pytest
from fastapi import Depends, FastAPI
from node_fixtures import DEST, NodeProc, wait_leader
from node_fixtures import node_cluster as _node_cluster  # noqa: F401 - the fixture

from canal_client.connector import SimpleConnector
from canal_cluster.retry import RetryPolicy
from canal_protocol.errors import ConfigError, Forbidden
from canal_server.api import errors
from canal_server.api.access import Access
from canal_server.api.deps import require_admin
from canal_server.config import AuthSection, config_from_dict

NodeCluster = Callable[..., list[NodeProc]]
LEGACY, ADMIN, MINE, ANY_CLIENT = "legacy-t", "admin-t", "consumer-c1", "consumer-any"
AUTH = {
    "tokens": [LEGACY],
    "admin": [{"token": ADMIN}],
    "consumer": [
        {"token": MINE, "destinations": [DEST], "clients": ["c1"]},
        {"token": ANY_CLIENT, "destinations": [DEST]},
    ],
}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def client_path(client: str, destination: str = DEST) -> str:
    return f"/v1/destinations/{destination}/clients/{client}"


def test_consumer_tokens_stay_within_their_destinations_and_client_ids(
    _node_cluster: NodeCluster,  # noqa: F811
) -> None:
    leader = wait_leader(_node_cluster(1, auth=AUTH))
    with httpx.Client(base_url=leader.url, timeout=30) as http:
        for token in (MINE, ANY_CLIENT, ADMIN, LEGACY):
            r = http.put(f"{client_path('c1')}/subscription", json={}, headers=bearer(token))
            assert r.status_code == 200, (token, r.text)
        r = http.post(f"{client_path('c2')}/rollback", headers=bearer(MINE))  # another client
        assert r.status_code == 403, r.text
        assert r.json() == {
            "error": "forbidden",
            "message": "this consumer token is limited to client id(s) c1, not 'c2'",
        }
        r = http.get(f"{client_path('c1', 'other')}/cursor", headers=bearer(ANY_CLIENT))
        assert r.status_code == 403 and "destination(s) example, not 'other'" in r.text
        for token in (ANY_CLIENT, ADMIN, LEGACY):  # their rights cover client c2
            r = http.post(f"{client_path('c2')}/rollback", headers=bearer(token))
            assert r.status_code == 200, (token, r.text)
        r = http.get(f"{client_path('c1', 'other')}/cursor", headers=bearer(ADMIN))
        assert r.status_code == 404  # an admin passes; the destination is unknown
        assert http.get("/v1/cluster", headers=bearer(MINE)).status_code == 200  # read-only
        r = http.get(f"{client_path('c1')}/cursor", headers=bearer("nope"))
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    policy = RetryPolicy(initial_s=0.01, attempts=3)
    with (
        pytest.raises(Forbidden, match=r"limited to client id\(s\) c1, not 'c2'"),
        SimpleConnector(leader.url, DEST, "c2", token=MINE, retry=policy) as conn,
    ):
        conn.subscribe()


def admin_app(auth: AuthSection) -> FastAPI:
    app = FastAPI()
    app.state.access = Access(auth)
    errors.install(app)

    @app.post("/v1/destinations/{destination}/steps", dependencies=[Depends(require_admin)])
    async def change(destination: str) -> dict[str, str]:
        return {"changed": destination}

    return app


def post(app: FastAPI, path: str, token: str | None = None) -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            return await http.post(path, headers=bearer(token) if token else {})

    return anyio.run(send)


def test_require_admin_refuses_consumer_tokens_on_routes_that_change_the_cluster() -> None:
    app = admin_app(AuthSection.model_validate(AUTH))
    path = f"/v1/destinations/{DEST}/steps"
    for token in (ADMIN, LEGACY):
        assert post(app, path, token).json() == {"changed": DEST}
    for token in (MINE, ANY_CLIENT):
        r = post(app, path, token)
        assert r.status_code == 403 and r.json()["error"] == "forbidden"
        assert "needs an admin token" in r.json()["message"]
    assert post(app, path).status_code == 401
    r = post(app, "/v1/destinations/other/steps", MINE)
    assert r.status_code == 403 and "not 'other'" in r.json()["message"]
    # no token configured: no auth, as before
    assert post(admin_app(AuthSection()), path).status_code == 200


@pytest.mark.parametrize(
    ("auth", "key"),
    [
        ({"consumer": [{"token": "a b"}]}, "auth.consumer.0.token"),
        ({"consumer": [{"token": "x", "destinations": []}]}, "auth.consumer.0.destinations"),
        ({"consumer": [{"token": "x", "clients": ["bad/id"]}]}, "auth.consumer.0.clients"),
        ({"consumer": [{"token": "x", "role": "admin"}]}, "auth.consumer.0.role"),
        ({"admin": [{"token": ""}]}, "auth.admin.0.token"),
        ({"tokens": ["x"], "admin": [{"token": "x"}]}, "auth"),
    ],
)
def test_bad_auth_config_names_the_key(auth: dict[str, object], key: str) -> None:
    data = {
        "node": {"id": "n1"},
        "auth": auth,
        "destinations": {"d": {"master": {"address": "127.0.0.1:3306"}}},
    }
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert info.value.key == key, info.value
