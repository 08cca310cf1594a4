// canal-ha web console: polls /v1/console/state and renders it; admin actions go to
// POST /v1/console/actions with the token typed into the page (kept in sessionStorage,
// sent as "Authorization: Bearer ..."). Plain JS, no dependencies.
"use strict";

const POLL_MS = 2000;
const FETCH_TIMEOUT_MS = 8000;
const TOKEN_KEY = "canal-ha-console-token";
let state = null;

const $ = (sel) => document.querySelector(sel);

function esc(v) {
  return String(v === null || v === undefined ? "" : v)
    .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

function yesNo(v) {
  if (v === null || v === undefined) return '<span class="muted">?</span>';
  return v ? '<span class="yes">yes</span>' : '<span class="no">no</span>';
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

function fmtPos(p) {
  if (!p) return '<span class="muted">-</span>';
  return esc(p.journal + ":" + p.offset) + (p.gtid ? ' <span class="muted">gtid ' + esc(p.gtid) + "</span>" : "");
}

function fmtCursor(c) {
  if (!c || !c.position) return '<span class="muted">-</span>';
  return esc(c.position.journal + ":" + c.position.offset);
}

function fmtTime(ms) { return new Date(ms).toLocaleTimeString(); }

function bar(done, total) {
  const pct = total > 0 ? Math.min(100, Math.round((100 * done) / total)) : 0;
  return '<span class="bar" title="' + pct + '%"><span style="width:' + pct + '%"></span></span> ' + pct + "%";
}

function chart(points) {
  const w = 320, h = 70, pad = 4;
  if (!points || points.length < 2) {
    return '<svg class="chart" width="' + w + '" height="' + h + '"><text x="8" y="38" fill="#6b7280">collecting rows/s samples…</text></svg>';
  }
  const t0 = points[0][0], t1 = points[points.length - 1][0];
  const max = Math.max(1, ...points.map((p) => p[1]));
  const xy = points.map((p) => {
    const x = pad + ((w - 2 * pad) * (p[0] - t0)) / Math.max(1, t1 - t0);
    const y = h - pad - ((h - 2 * pad - 12) * p[1]) / max;
    return x.toFixed(1) + "," + y.toFixed(1);
  });
  const last = points[points.length - 1][1];
  const span = Math.round((t1 - t0) / 1000);
  const spanText = span < 120 ? span + " s" : Math.round(span / 60) + " min";
  return '<svg class="chart" width="' + w + '" height="' + h + '" role="img" aria-label="rows per second">' +
    '<polyline fill="none" stroke="#2563eb" stroke-width="1.5" points="' + xy.join(" ") + '"/>' +
    '<text x="6" y="12" font-size="10" fill="#6b7280">max ' + max.toFixed(0) + ' rows/s · now ' + last.toFixed(0) +
    " · last " + spanText + "</text></svg>";
}

function renderNodes(nodes) {
  $("#nodes tbody").innerHTML = nodes.map((n) =>
    '<tr data-node="' + esc(n.node) + '"><td>' + esc(n.node) + (n.leaving ? ' <span class="muted">(leaving)</span>' : "") +
    "</td><td>" + esc(n.url) + "</td><td>" + yesNo(n.alive) + "</td><td>" + yesNo(n.reachable) +
    (n.error ? ' <span class="muted">' + esc(n.error) + "</span>" : "") + "</td><td>" + esc(n.version || "?") +
    "</td><td>" + esc(n.row_decoder || "?") + "</td><td>" + esc(n.destinations.join(", ")) +
    "</td><td>" + esc(n.leads.join(", ")) + "</td></tr>").join("");
}

function renderClients(name, clients) {
  if (!clients.length) return '<p class="muted">no clients</p>';
  return '<table class="clients"><thead><tr><th>client</th><th>cursor</th><th>lag</th><th>outstanding batches</th>' +
    "<th>active consumer</th><th></th></tr></thead><tbody>" + clients.map((c) =>
      '<tr data-client="' + esc(c.client_id) + '"><td>' + esc(c.client_id) + "</td><td>" + fmtCursor(c.cursor) +
      "</td><td>" + (c.lag_s === null ? "?" : esc(c.lag_s.toFixed(1)) + " s") + '</td><td class="outstanding">' +
      esc(c.outstanding_batches) + "</td><td>" + esc(c.active_consumer || "-") + "</td><td>" +
      '<button class="admin" data-action="rollback" data-dest="' + esc(name) + '" data-client="' + esc(c.client_id) +
      '">Roll back</button></td></tr>').join("") + "</tbody></table>";
}

function renderSnapshots(name, snaps) {
  if (!snaps.length) return '<p class="muted">no snapshots</p>';
  return '<table class="snapshots"><thead><tr><th>id</th><th>state</th><th>tables</th><th>progress</th><th>rows</th>' +
    "<th>chunks</th><th>rows/s</th><th></th></tr></thead><tbody>" + snaps.map((s) => {
      const running = s.state === "running" || s.state === "pending";
      const tables = s.tables.map((t) => esc(t.table) + (t.done ? " ✓" : "")).join("<br>");
      return '<tr data-snapshot="' + esc(s.id) + '"><td>' + esc(s.id) + "</td><td>" + esc(s.state) +
        (s.error ? ' <span class="no">' + esc(s.error) + "</span>" : "") + "</td><td>" + tables + "</td><td>" +
        bar(s.state === "done" ? 1 : s.tables_done, s.state === "done" ? 1 : s.tables_total) + "</td><td>" + esc(s.rows) +
        "</td><td>" + esc(s.chunks) + "</td><td>" + esc(Math.round(s.rows_per_s)) + "</td><td>" +
        (running ? '<button class="admin" data-action="cancel_snapshot" data-dest="' + esc(name) +
          '" data-snapshot="' + esc(s.id) + '">Cancel</button>' : "") + "</td></tr>";
    }).join("") + "</tbody></table>";
}

function renderLeadership(events) {
  if (!events.length) return '<p class="muted">none seen by the live nodes</p>';
  return '<table class="leadership"><thead><tr><th>time</th><th>node</th><th>change</th><th>epoch</th><th>reason</th></tr></thead><tbody>' +
    events.map((e) => "<tr><td>" + esc(fmtTime(e.at_ms)) + "</td><td>" + esc(e.node) + "</td><td>" + esc(e.change) +
      "</td><td>" + esc(e.epoch) + "</td><td>" + esc(e.reason) + (e.detail ? ' <span class="muted">' + esc(e.detail) + "</span>" : "") +
      "</td></tr>").join("") + "</tbody></table>";
}

function renderDestination(name, d) {
  const leader = d.leader;
  const reader = d.reader ? esc(d.reader.state) + (d.reader.error ? ' <span class="no">' + esc(d.reader.error) + "</span>" : "") : "?";
  const fill = d.store_capacity_bytes ? bar(d.store_bytes || 0, d.store_capacity_bytes) + " " + fmtBytes(d.store_bytes) +
    " (" + esc(d.store_entries) + " entries)" : "?";
  return '<div class="dest" data-destination="' + esc(name) + '"><h3>destination ' + esc(name) + "</h3>" +
    '<div class="row"><dl class="kv">' +
    '<dt>leader</dt><dd class="leader-badge"><span class="leader-node">' + esc(leader ? leader.node : "none") +
    '</span> epoch <span class="leader-epoch">' + esc(leader ? leader.epoch : "-") + "</span></dd>" +
    "<dt>nodes</dt><dd>" + esc(d.nodes.join(", ")) + "</dd>" +
    "<dt>reader</dt><dd>" + reader + "</dd>" +
    "<dt>reader position</dt><dd>" + fmtPos(d.reader_position) + "</dd>" +
    "<dt>binlog end</dt><dd>" + fmtPos(d.binlog_end) + "</dd>" +
    '<dt>lag</dt><dd class="lag">' + (d.lag_bytes === null ? "?" : esc(d.lag_bytes) + " bytes") + " / " +
    (d.lag_s === null ? "?" : esc(d.lag_s.toFixed(1)) + " s") + "</dd>" +
    "<dt>store</dt><dd>" + fill + "</dd></dl>" +
    "<div><div class=\"muted\">rows/s</div>" + chart(d.rows_per_s) + "</div></div>" +
    "<h4>Clients</h4>" + renderClients(name, d.clients) +
    "<h4>Snapshots</h4>" + renderSnapshots(name, d.snapshots) +
    "<h4>Recent leadership changes</h4>" + renderLeadership(d.leadership) + "</div>";
}

function syncSelect(sel, values, keepFirst) {
  const current = sel.value;
  const opts = (keepFirst ? [sel.options[0].outerHTML] : []).concat(
    values.map((v) => '<option value="' + esc(v) + '">' + esc(v) + "</option>"));
  const html = opts.join("");
  if (sel.dataset.html !== html) { sel.innerHTML = html; sel.dataset.html = html; }
  if ([...sel.options].some((o) => o.value === current)) sel.value = current;
}

function render(s) {
  state = s;
  $("#served-by").textContent = "served by " + s.node + " (" + s.url + ")";
  $("#updated").textContent = "updated " + fmtTime(s.at_ms);
  const banner = $("#etcd-banner");
  if (s.etcd && s.etcd.reachable === false) {
    banner.textContent = "Node " + s.node + " has lost etcd (" + s.etcd.error + "): what you see is its own, possibly stale, view.";
    banner.hidden = false;
  } else {
    banner.hidden = true;
  }
  renderNodes(s.nodes);
  const names = Object.keys(s.destinations).sort();
  $("#destinations").innerHTML = names.map((n) => renderDestination(n, s.destinations[n])).join("");
  syncSelect($("#act-dest"), names, false);
  syncSelect($("#step-to"), s.nodes.filter((n) => n.alive).map((n) => n.node), true);
  applyMode();
}

function applyMode() {
  const admin = token() !== "";
  const mode = $("#mode");
  mode.textContent = admin ? "admin token set" : "read-only";
  mode.className = "mode " + (admin ? "admin" : "readonly");
  document.querySelectorAll("button.admin").forEach((b) => { b.disabled = !admin; });
}

async function poll() {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
  try {
    const r = await fetch("/v1/console/state", { signal: ctl.signal, cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    $("#fetch-banner").hidden = true;
  } catch (e) {
    const b = $("#fetch-banner");
    b.textContent = "This node does not answer (" + e.message + "): showing the last state seen" +
      (state ? " at " + fmtTime(state.at_ms) : "") + ".";
    b.hidden = false;
  } finally {
    clearTimeout(timer);
    setTimeout(poll, POLL_MS);
  }
}

function showResult(ok, text) {
  const el = $("#action-result");
  el.className = "result " + (ok ? "ok" : "fail");
  el.textContent = text;
  el.hidden = false;
}

async function act(body, question) {
  if (!window.confirm(question)) {
    showResult(false, "cancelled: " + question);
    return;
  }
  showResult(true, "sending " + body.action + " …");
  try {
    const headers = { "Content-Type": "application/json", Accept: "application/json" };
    if (token()) headers.Authorization = "Bearer " + token();
    const r = await fetch("/v1/console/actions", { method: "POST", headers, body: JSON.stringify(body) });
    const out = await r.json().catch(() => ({}));
    const result = out.result || out;
    showResult(r.ok, body.action + " on " + body.destination + ": HTTP " + r.status + "\n" + JSON.stringify(result, null, 1));
  } catch (e) {
    showResult(false, body.action + " failed: " + e.message);
  }
}

document.addEventListener("click", (ev) => {
  const b = ev.target.closest("button[data-action]");
  if (!b) return;
  if (b.dataset.action === "rollback") {
    act({ action: "rollback", destination: b.dataset.dest, client_id: b.dataset.client },
      "Roll back every outstanding batch of client " + b.dataset.client + " on " + b.dataset.dest + "?");
  } else if (b.dataset.action === "cancel_snapshot") {
    act({ action: "cancel_snapshot", destination: b.dataset.dest, snapshot_id: b.dataset.snapshot },
      "Cancel snapshot " + b.dataset.snapshot + " of " + b.dataset.dest + "?");
  }
});

$("#step-down").addEventListener("click", () => {
  const d = $("#act-dest").value, to = $("#step-to").value;
  const body = { action: "step_down", destination: d };
  if (to) body.to = to;
  const leader = state && state.destinations[d] && state.destinations[d].leader;
  act(body, "Ask the leader of " + d + (leader ? " (" + leader.node + ", epoch " + leader.epoch + ")" : "") +
    " to step down" + (to ? " for " + to : "") + "?");
});

$("#snap-start").addEventListener("click", () => {
  const d = $("#act-dest").value;
  const tables = $("#snap-tables").value.split(",").map((t) => t.trim()).filter((t) => t);
  act({ action: "start_snapshot", destination: d, tables }, "Start a snapshot of " + tables.join(", ") + " on " + d + "?");
});

$("#token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const t = $("#token").value.trim();
  if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
  $("#token").value = "";
  applyMode();
});

$("#token-forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  applyMode();
});

applyMode();
poll();
