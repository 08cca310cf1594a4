"""The web console (``/console``) against a real 3-node cluster: its JSON routes and
the page itself in Debian's Chromium, driven headless by Selenium with Debian's
chromedriver (``/usr/bin/chromedriver``; Selenium Manager is kept offline).

The browser test: the page (served by a standby) shows the leader; after a SIGKILL of
the leader it shows the new leader and epoch without a reload; a visit without the
admin token cannot act (disabled buttons, and the server answers 401 to a wrong token);
with the token a rollback, a snapshot and a step-down work. It saves a screenshot of the
live cluster (into its temp dir; ``CANAL_CONSOLE_SCREENSHOT=docs/console.png`` makes the
README's picture).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SandboxFactory
from node_fixtures import DEST, WAIT_S, NodeProc, start_nodes, wait_leader
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_server.console import merge
from canal_server.metrics import lag_of

ADMIN = "console-admin-token"
CONSUMER = "console-consumer-token"
DB = "t_console"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# The README's picture: written where CANAL_CONSOLE_SCREENSHOT says (e.g.
# docs/console.png), else into the test's temporary dir: a test run leaves the tree as is.
SCREENSHOT_ENV = "CANAL_CONSOLE_SCREENSHOT"
BROWSER_WAIT_S = 90.0


@pytest.fixture(scope="module")
def table(sandbox: Sandbox) -> Iterator[Any]:
    p = sandbox.primary
    p.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, note VARCHAR(40)) ENGINE=InnoDB",
    )
    yield p
    p.execute(f"DROP DATABASE IF EXISTS {DB}")


@pytest.fixture(scope="module")
def cluster(
    sandbox: Sandbox, table: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[NodeProc]]:
    nodes = start_nodes(
        sandbox, 3, tmp_path_factory.mktemp("console"),
        auth={"tokens": [ADMIN], "consumer": [{"token": CONSUMER}]},
        destination={"filter": {"regex": f"{DB}\\..*"}},
    )  # fmt: skip
    try:
        yield nodes
    finally:
        for node in nodes:
            node.process.resume()
            node.process.stop(timeout_s=20)


class Writer:
    """Inserts a few rows every 0.3 s until stopped (the rows/s chart has data)."""

    def __init__(self, db: Any, first_id: int) -> None:
        self.db, self.next_id = db, first_id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.3):
            values = ", ".join(f"({self.next_id + i}, 'row')" for i in range(20))
            self.db.execute(f"INSERT INTO {DB}.t VALUES {values}")
            self.next_id += 20

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def outstanding_batch(leader: NodeProc, db: Any, client: str, first_id: int) -> int:
    """Subscribe ``client``, write a row and take a batch without acking it: its id."""
    base = f"/v1/destinations/{DEST}/clients/{client}"
    with leader.client() as http:
        r = http.put(f"{base}/subscription", json={"filter": ""})
        assert r.status_code == 200, r.text
        db.execute(f"INSERT INTO {DB}.t VALUES ({first_id}, 'x')")
        r = http.post(f"{base}/batches", json={"size": 100, "timeout_ms": 10_000})
        assert r.status_code == 200 and r.json()["id"] != -1, r.text
        return int(r.json()["id"])


def state_of(node: NodeProc) -> dict[str, Any]:
    r = httpx.get(f"{node.url}/v1/console/state", timeout=30)  # no token: read-only is open
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_console_state_and_actions_need_admin(cluster: list[NodeProc], table: Any) -> None:
    leader = wait_leader(cluster)
    standby = next(n for n in cluster if n is not leader)
    batch = outstanding_batch(leader, table, "c-api", 1)

    def shows_everything() -> bool:
        s = state_of(standby)
        d = s["destinations"][DEST]
        clients = {c["client_id"]: c for c in d["clients"]}
        return (
            s["etcd"]["reachable"] is True
            and sorted(n["node"] for n in s["nodes"] if n["alive"] and n["reachable"])
            == sorted(n.id for n in cluster)
            and d["leader"]["node"] == leader.id
            and d["reader_position"] is not None
            and d["binlog_end"] is not None
            and clients.get("c-api", {}).get("outstanding_batches") == 1
        )

    wait_until(shows_everything, "the standby's console state shows the cluster", WAIT_S)
    s = state_of(standby)
    assert s["node"] == standby.id
    assert any(e["change"] == "gained" for e in s["destinations"][DEST]["leadership"])
    page = httpx.get(f"{standby.url}/console", timeout=30)
    assert page.status_code == 200 and "console.js" in page.text
    assert httpx.get(f"{standby.url}/static/console/console.js", timeout=30).status_code == 200
    schema = httpx.get(f"{standby.url}/openapi.json", timeout=30).json()
    assert {"/v1/console/state", "/v1/console/node", "/v1/console/actions"} <= set(schema["paths"])

    metrics = httpx.get(f"{leader.url}/metrics", timeout=30).text  # what Grafana plots
    for name in (
        "canal_store_capacity_bytes",
        "canal_reader_lag_bytes",
        "canal_reader_lag_seconds",
    ):
        assert f'{name}{{destination="{DEST}"}}' in metrics, name

    act = f"{standby.url}/v1/console/actions"
    body = {"action": "rollback", "destination": DEST, "client_id": "c-api"}
    assert httpx.post(act, json=body, timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(act, json=body, headers=wrong, timeout=30).status_code == 401
    consumer = {"Authorization": f"Bearer {CONSUMER}"}
    r = httpx.post(act, json=body, headers=consumer, timeout=30)
    assert r.status_code == 403 and r.json()["error"] == "forbidden"
    admin = {"Authorization": f"Bearer {ADMIN}"}
    r = httpx.post(act, json={"action": "rollback", "destination": DEST}, headers=admin, timeout=30)
    assert r.status_code == 400 and r.json()["field"] == "client_id", r.text
    r = httpx.post(act, json={**body, "action": "reboot"}, headers=admin, timeout=30)
    assert r.status_code == 400 and r.json()["field"] == "action", r.text

    r = httpx.post(act, json=body, headers=admin, timeout=30)  # forwarded to the leader
    assert r.status_code == 200, r.text
    assert r.json()["leader"] == leader.url and r.json()["result"] == {"rolled_back": None}
    with leader.client() as http:  # rolled back: the batch is no longer outstanding
        again = http.post(f"/v1/destinations/{DEST}/clients/c-api/batches/{batch}/ack")
        assert again.status_code == 409, again.text


def browser() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1500", "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[webdriver.Chrome]:
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager: never download anything
    d = browser()
    try:
        yield d
    finally:
        d.quit()


# The page re-renders its cluster view every poll: what lies in it is read and clicked
# in one script (atomic in the page), never through element handles that go stale.


def query(driver: webdriver.Chrome, selector: str, what: str) -> Any:
    """``what`` ("text", "disabled", "points", "count", "click") of the first element
    matching ``selector`` (None when there is none), read in the page in one go."""
    script = """
        const els = document.querySelectorAll(arguments[0]), el = els[0], what = arguments[1];
        if (what === "count") return els.length;
        if (!el) return null;
        if (what === "click") { setTimeout(() => el.click(), 0); return true; }  // confirm() blocks
        if (what === "points") return el.getAttribute("points");
        if (what === "disabled") return el.disabled;
        return el.textContent;
    """
    return driver.execute_script(script, selector, what)


def leader_shown(driver: webdriver.Chrome) -> tuple[str, int]:
    card = f'.dest[data-destination="{DEST}"]'
    node = query(driver, f"{card} .leader-node", "text") or ""
    epoch = query(driver, f"{card} .leader-epoch", "text") or ""
    return str(node), int(epoch) if str(epoch).isdigit() else -1


def wait_for(driver: webdriver.Chrome, what: str, cond: Any) -> Any:
    wait = WebDriverWait(
        driver, BROWSER_WAIT_S, poll_frequency=0.5,
        ignored_exceptions=(StaleElementReferenceException,),
    )  # fmt: skip
    return wait.until(cond, what)


def confirm_and_result(driver: webdriver.Chrome, expect: str) -> str:
    """Accept the confirmation the action asks, then the result the page shows."""
    wait_for(driver, "the confirmation", ec.alert_is_present())
    driver.switch_to.alert.accept()
    result = driver.find_element(By.ID, "action-result")  # static: never re-rendered
    wait_for(driver, f"the result {expect!r}", lambda _: expect in result.text)
    return str(result.text)


def chart_points(driver: webdriver.Chrome) -> int:
    points = query(driver, f'.dest[data-destination="{DEST}"] svg.chart polyline', "points")
    return len(str(points).split()) if points else 0


def outstanding_shown(driver: webdriver.Chrome, client: str) -> str:
    return str(query(driver, f'tr[data-client="{client}"] td.outstanding', "text") or "")


def test_console_in_chromium(
    cluster: list[NodeProc], table: Any, driver: webdriver.Chrome, tmp_path: Path
) -> None:
    leader = wait_leader(cluster)
    page_node = next(n for n in cluster if n is not leader)  # it survives the leader's kill
    outstanding_batch(leader, table, "c-web", 1000)
    driver.get(f"{page_node.url}/console")
    driver.execute_script("window.__same_page = true")  # gone if the page reloads
    wait_for(driver, "the leader", lambda d: leader_shown(d)[0] == leader.id)
    _, epoch = leader_shown(driver)
    assert epoch > 0

    # read-only: buttons disabled, a wrong token is refused by the server
    wait_for(driver, "c-web's row", lambda d: outstanding_shown(d, "c-web") == "1")
    rollback = 'button[data-action="rollback"][data-client="c-web"]'
    assert query(driver, rollback, "disabled") is True
    assert not driver.find_element(By.ID, "step-down").is_enabled()
    assert "read-only" in driver.find_element(By.ID, "mode").text
    driver.find_element(By.ID, "token").send_keys("not-the-token")
    driver.find_element(By.ID, "token-use").click()
    assert query(driver, rollback, "click")
    assert "HTTP 401" in confirm_and_result(driver, "HTTP 401")
    assert outstanding_shown(driver, "c-web") == "1"

    # admin: a rollback
    driver.find_element(By.ID, "token-forget").click()
    driver.find_element(By.ID, "token").send_keys(ADMIN)
    driver.find_element(By.ID, "token-use").click()
    wait_for(driver, "admin mode", lambda d: "admin" in d.find_element(By.ID, "mode").text)
    assert query(driver, rollback, "click")
    assert '"rolled_back": null' in confirm_and_result(driver, "HTTP 200")
    wait_for(driver, "no outstanding batch", lambda d: outstanding_shown(d, "c-web") == "0")

    with Writer(table, 10_000):
        # SIGKILL of the leader: the page follows without a reload
        leader.kill()
        wait_for(
            driver, "the new leader",
            lambda d: leader_shown(d)[0] not in (leader.id, "none") and leader_shown(d)[1] > epoch,
        )  # fmt: skip
        new_node, new_epoch = leader_shown(driver)
        assert driver.execute_script("return window.__same_page === true")
        assert new_node != leader.id and new_epoch > epoch

        gone = f'#nodes tr[data-node="{leader.id}"]'  # its lease expired: not a successor
        wait_for(
            driver, "the killed node gone", lambda d: not d.find_elements(By.CSS_SELECTOR, gone)
        )

        # admin: a snapshot, then a step-down to the page's node (or away from it)
        driver.find_element(By.ID, "snap-tables").send_keys(f"{DB}\\.t")
        driver.find_element(By.ID, "snap-start").click()
        confirm_and_result(driver, "HTTP 201")
        snapshot_rows = f'.dest[data-destination="{DEST}"] table.snapshots tr[data-snapshot]'
        wait_for(
            driver, "the snapshot's row", lambda d: d.find_elements(By.CSS_SELECTOR, snapshot_rows)
        )
        driver.find_element(By.ID, "step-down").click()
        confirm_and_result(driver, "HTTP 200")
        wait_for(
            driver, "the successor after the step-down",
            lambda d: leader_shown(d)[0] not in (new_node, leader.id, "none")
            and leader_shown(d)[1] > new_epoch,
        )  # fmt: skip
        # a few rows/s samples (one per 5 s) for the screenshot
        wait_for(driver, "the rows/s chart", lambda d: chart_points(d) >= 4)
    assert driver.execute_script("return window.__same_page === true")
    shot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "console.png")
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(shot))


def test_console_banner_when_the_node_loses_etcd(
    make_sandbox: SandboxFactory, tmp_path: Path, driver: webdriver.Chrome
) -> None:
    box = make_sandbox(etcd_members=1)  # its own etcd: frozen here, nobody else's
    (node,) = start_nodes(box, 1, tmp_path)
    try:
        wait_leader([node])
        driver.get(f"{node.url}/console")
        wait_for(driver, "the leader", lambda d: leader_shown(d)[0] == node.id)
        banner = driver.find_element(By.ID, "etcd-banner")
        assert not banner.is_displayed()
        etcd = box.etcd_cluster.members[0].process
        etcd.pause()
        try:
            wait_for(driver, "the etcd banner", lambda _: banner.is_displayed())
            assert f"Node {node.id} has lost etcd" in banner.text
        finally:
            etcd.resume()
        wait_for(driver, "the banner gone", lambda _: not banner.is_displayed())
    finally:
        node.process.stop(timeout_s=20)


def test_lag_of() -> None:
    end = {"journal": "b.000002", "offset": 900}
    at = {"journal": "b.000002", "offset": 400, "timestamp_ms": 10_000}
    assert lag_of(at, end, 12_500) == (500, 2.5)
    assert lag_of({**at, "offset": 900}, end, 12_500) == (0, 0.0)  # at the end: no lag
    assert lag_of({**at, "journal": "b.000001"}, end, 12_500) == (None, 2.5)  # bytes unknown
    assert lag_of(None, end, 12_500) == (None, None)


def _part(node: str, role: str, epoch: int, rows: list[list[float]]) -> dict[str, Any]:
    d = {"role": role, "epoch": epoch, "reader": {"state": "running"}, "lag_bytes": 0,
         "clients": [{"client_id": "c"}] if role == "leader" else [], "snapshots": [],
         "rows_per_s": rows, "leadership": [{"at_ms": epoch, "node": node, "change": "gained",
         "epoch": epoch, "reason": "won", "detail": ""}]}  # fmt: skip
    return {"node": node, "url": f"http://{node}", "version": "1", "row_decoder": "c",
            "etcd": {"reachable": True, "error": ""}, "destinations": {"d": d}}  # fmt: skip


def test_merge_takes_the_leader_from_etcd_and_its_detail_from_its_node() -> None:
    cluster = {
        "nodes": [{"node": n, "url": f"http://{n}", "destinations": ["d"]} for n in "abc"],
        "destinations": {"d": {"leader": {"node": "b", "url": "http://b", "epoch": 9},
                               "nodes": ["a", "b", "c"]}},
    }  # fmt: skip
    a = _part("a", "standby", 9, [[5000, 1.0]])
    b = _part("b", "leader", 9, [[5000, 2.0], [10000, 4.0]])
    down = {"node": "c", "url": "http://c", "error": "ConnectError: refused"}
    out = merge(a, cluster, {"a": a, "b": b, "c": down})
    d = out["destinations"]["d"]
    assert d["leader"]["node"] == "b" and d["clients"] == [{"client_id": "c"}]
    assert d["rows_per_s"] == [[5000, 3.0], [10000, 4.0]]  # summed over the nodes
    assert sorted(e["node"] for e in d["leadership"]) == ["a", "b"]  # every node's records
    rows = {n["node"]: n for n in out["nodes"]}
    assert rows["b"]["leads"] == ["d"] and rows["c"]["reachable"] is False
    assert rows["c"]["alive"] is True and "refused" in rows["c"]["error"]
    assert out["etcd"]["reachable"] is True

    lost = merge(a, None, {"a": a}, etcd_error="CoordinationError: etcd timed out")
    assert lost["etcd"] == {"reachable": False, "error": "CoordinationError: etcd timed out"}
    assert [n["node"] for n in lost["nodes"]] == ["a"] and lost["nodes"][0]["alive"] is None
    assert lost["destinations"]["d"]["leader"] is None  # a standby knows no leader detail
