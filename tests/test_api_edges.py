"""Edges of the REST API against a real node: ids `.`/`..`, the body size limit (413),
`/docs` served offline (every asset from the node itself)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from node_fixtures import DEST, NodeProc, start_nodes, wait_leader
from reader_fixtures import collect_leaked_sockets

from canal_ha.sandbox import Sandbox


@pytest.fixture(scope="module")
def node(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    collect_leaked_sockets()
    started = start_nodes(sandbox, 1, tmp_path_factory.mktemp("edges"))
    try:
        yield wait_leader(started)
    finally:
        for n in started:
            n.stop()


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (f"/v1/destinations/{DEST}/clients/%2E/subscription", "client_id"),
        (f"/v1/destinations/{DEST}/clients/%2E%2E/subscription", "client_id"),
        (f"/v1/destinations/{DEST}/clients/%2E/cursor", "client_id"),
        ("/v1/destinations/%2E/clients/c/subscription", "destination"),
        ("/v1/destinations/%2E%2E/clients/c/subscription", "destination"),
    ],
)
def test_dot_ids_are_refused_naming_the_field(node: NodeProc, path: str, field: str) -> None:
    with node.client() as http:
        method = "GET" if path.endswith("/cursor") else "PUT"
        r = http.request(method, path, json={} if method == "PUT" else None)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "invalid_argument" and r.json()["field"] == field


def test_a_body_over_the_limit_is_413(node: NodeProc) -> None:
    base = f"/v1/destinations/{DEST}/clients/big"
    with node.client() as http:
        r = http.put(f"{base}/subscription", json={"filter": "x" * (70 * 1024)})
        assert r.status_code == 413, r.text
        assert r.json()["error"] == "payload_too_large" and r.json()["field"] == "body"
        ok = http.put(f"{base}/subscription", json={"filter": ""})
        assert ok.status_code == 200, ok.text
        r = http.post(f"{base}/batches", content=b" " * (65 * 1024))
        assert r.status_code == 413, r.text


_ASSET = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")


def test_docs_load_every_asset_from_the_node(node: NodeProc) -> None:
    """Swagger UI works offline: no external URL in the page, each asset it names is
    served by the node itself."""
    with httpx.Client(base_url=node.url, timeout=30) as http:
        page = http.get("/docs")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        html = page.text
        assert "http://" not in html and "https://" not in html, html
        assets = _ASSET.findall(html)
        assert any(a.endswith(".js") for a in assets) and any(a.endswith(".css") for a in assets)
        for asset in assets:
            assert asset.startswith("/"), asset
            r = http.get(asset)
            assert r.status_code == 200, asset
            assert len(r.content) > 0
            if asset.endswith(".js"):
                assert "javascript" in r.headers["content-type"]
                assert b"SwaggerUIBundle" in r.content
            if asset.endswith(".css"):
                assert "text/css" in r.headers["content-type"]
        assert "/openapi.json" in html
        assert http.get("/openapi.json").status_code == 200
