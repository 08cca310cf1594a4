"""Ratios between the throughput parts and the printed table of a result document."""

from __future__ import annotations

from typing import Any

__all__ = ["BASELINES", "ratios", "render_table"]

BASELINES = {"vs_mysql_replication": "mysql_replication", "vs_c_decoder": "mariadb_binlog"}


def _rate(record: dict[str, Any] | None) -> float | None:
    if not record or record.get("status") != "ok" or "rows_per_s" not in record:
        return None
    return float(record["rows_per_s"])


def ratios(parts: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """For every part with rows/s: its rate divided by each baseline's (None if missing)."""
    out: dict[str, dict[str, float | None]] = {}
    for name, record in parts.items():
        rate = _rate(record)
        if rate is None:
            continue
        out[name] = {}
        for key, base in BASELINES.items():
            base_rate = _rate(parts.get(base))
            out[name][key] = round(rate / base_rate, 3) if base_rate else None
    return out


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _note(record: dict[str, Any]) -> str:
    status = record.get("status")
    if status != "ok":
        text = str(record.get("reason") or record.get("error") or "")
        return " ".join(text.split())[:160]
    notes = []
    if "runs" in record:
        notes.append("runs: " + ", ".join(f"{r:,.0f}" for r in record["runs"]))
    if "prefetch_rows_per_s" in record:
        notes.append(f"stream (prefetch) {record['prefetch_rows_per_s']:,.0f}")
    if "in_harness_rows_per_s" in record:
        notes.append(f"in the harness's process {record['in_harness_rows_per_s']:,.0f}")
    if record.get("duplicate_rows") or record.get("client_warnings"):
        notes.append(
            f"redelivered rows {record.get('duplicate_rows', 0):,}, "
            f"client warnings {record.get('client_warnings', 0)}"
        )
    if "vs_rest_msgpack" in record:
        notes.append(
            f"REST msgpack in the same run {record['rest_msgpack_rows_per_s']:,.0f} rows/s: "
            f"{record['vs_rest_msgpack']:.2f}x (goal {record['goal_vs_rest_msgpack']}x); CPU per "
            f"row node + consumer {record['node_cpu_us_per_row']} + "
            f"{record['consumer_cpu_us_per_row']} us vs "
            f"{record['rest_msgpack_node_cpu_us_per_row']} + "
            f"{record['rest_msgpack_consumer_cpu_us_per_row']}: "
            f"{record['cpu_vs_rest_msgpack']:.2f}x"
        )
    if record.get("reconnects"):
        notes.append(f"reconnects {record['reconnects']} (a term ended)")
    if "vs_mariadb_dump" in record:
        notes.append(
            f"mariadb-dump {record['mariadb_dump_rows_per_s']:,.0f} rows/s "
            f"({record['vs_mariadb_dump']:.2f}x), pymysql loop "
            f"{record['pymysql_loop_rows_per_s']:,.0f} ({record['vs_pymysql_loop']:.2f}x)"
        )
    if "node_rss_max_bytes" in record:
        notes.append(
            f"node RSS {record['node_rss_before_bytes'] / 2**20:.0f} -> max "
            f"{record['node_rss_max_bytes'] / 2**20:.0f} MiB"
        )
    if "first_batch_s" in record:
        notes.append(f"first micro-batch after {record['first_batch_s']:.1f} s")
    return "; ".join(notes)


def _machine_lines(result: dict[str, Any]) -> list[str]:
    m = result.get("machine", {})
    lines = [
        f"machine: {m.get('nproc')} CPUs, {m.get('cpu_model')}, "
        f"{m.get('memory_bytes', 0) / 2**30:.1f} GiB, Python {m.get('python')}, "
        f"load {m.get('loadavg_at_start')}"
    ]
    b = result.get("binlog")
    if b:
        lines.append(
            f"binlog: {b['rows']:,} row changes ({b['kinds']}) in {b['transactions']} "
            f"transactions over {len(b['tables'])} tables, {b['bytes'] / 2**20:.1f} MiB"
        )
    return lines


def _throughput_table(result: dict[str, Any]) -> list[str]:
    parts, rat = result.get("parts", {}), result.get("ratios", {})
    head = f"{'part':<44} {'status':<11} {'rows/s':>11} {'/py-repl':>9} {'/C':>7}  notes"
    lines = [head, "-" * len(head)]
    for name, rec in parts.items():
        if name in ("latency", "failover", "node_rss", *_SCALE, *_API):
            continue
        rate = _rate(rec)
        r = rat.get(name, {})
        lines.append(
            f"{rec.get('title', name):<44} {rec.get('status', '?'):<11} "
            f"{'-' if rate is None else f'{rate:,.0f}':>11} "
            f"{_fmt_ratio(r.get('vs_mysql_replication')):>9} "
            f"{_fmt_ratio(r.get('vs_c_decoder')):>7}  {_note(rec)}"
        )
    return lines


def _cpu_note(rate: dict[str, Any]) -> str:
    if "node_cpu_us_per_tx" not in rate:
        return ""
    return (
        f"; INSERT p50/p99 {rate['insert_p50_ms']:.1f}/{rate['insert_p99_ms']:.1f} ms, "
        f"commit -> client p50/p99 {rate['after_commit_p50_ms']:.1f}/"
        f"{rate['after_commit_p99_ms']:.1f} ms; node CPU {rate['node_cpu_us_per_tx']:.0f} us/tx, "
        f"load {rate['loadavg_1m']:.1f}{_wait_note(rate)}"
    )


def _wait_note(rate: dict[str, Any]) -> str:
    """The machine's busy share and how long the node's threads waited for a core."""
    if rate.get("node_cpu_wait") is None:
        return ""
    return (
        f", machine {rate['machine_busy_pct']:.0f}% busy, node threads waited "
        f"{rate['node_cpu_wait']:.2f} s/s for a core"
    )


def _latency_lines(rec: dict[str, Any]) -> list[str]:
    lines = []
    for rate in rec.get("rates", []):
        goal = rate.get("goal_p99_ms")
        verdict = "" if goal is None else f" (goal p99 <= {goal:g} ms: "
        if goal is not None:
            verdict += "met)" if rate["p99_ms"] <= goal else "NOT met)"
        ack = f", ack {rate['ack']}" if "ack" in rate else ""
        ack += f", {rate['http']}" if "http" in rate else ""
        lines.append(
            f"  {rate['target_tps']:>5.0f} tx/s (achieved {rate['achieved_tps']:.0f}{ack}): "
            f"p50 {rate['p50_ms']:.1f} ms, p99 {rate['p99_ms']:.1f} ms, max "
            f"{rate['max_ms']:.1f} ms over {rate['samples']} rows{verdict}{_cpu_note(rate)}"
        )
    return lines


def _failover_lines(rec: dict[str, Any]) -> list[str]:
    e = rec["election"]
    kinds = rec.get("kinds") or {"sigkill": rec}
    lines = [f"  ttl {e['ttl_s']} s, switch delay {e['switch_delay_s']} s"]
    for how, k in kinds.items():
        goal = ""
        if "goal_median_s" in k:
            met = "met" if k.get("meets_goal") else "NOT met"
            goal = (
                f" (goal median <= {k['goal_median_s']:.2f} s, "
                f"max <= {k['goal_max_s']:.2f} s: {met})"
            )
        phases = ""
        if k.get("median_elected_s") is not None:
            phases = (
                f"; medians: key gone {k['median_key_gone_s']:.2f} s, next leader "
                f"{k['median_elected_s']:.2f} s, then first batch "
                f"+{k['median_elected_to_batch_s']:.2f} s"
            )
        lines.append(
            f"  {how}: median {k['median_s']:.2f} s, max {k['max_s']:.2f} s over "
            f"{len(k['trials_s'])} trials{goal}{phases}; trials: "
            + ", ".join(f"{t:.2f}" for t in k["trials_s"])
        )
    return lines


def _rss_lines(rec: dict[str, Any]) -> list[str]:
    return [
        f"  RSS {rec['rss_before_bytes'] / 2**20:.1f} MiB -> {rec['rss_after_bytes'] / 2**20:.1f}"
        f" MiB with {rec['rows']:,} rows buffered: {rec['bytes_per_row']:.0f} bytes/row"
        f" (store estimate {rec.get('store_bytes_per_row', 0):.0f} bytes/row)"
    ]


def _handover_lines(rec: dict[str, Any]) -> list[str]:
    lines = []
    for key, what in (("sigterm", "rolling restart (SIGTERM)"), ("step_down", "step-down")):
        s = rec[key]
        lines.append(
            f"  {what}: stall median {s['median_ms']:.0f} ms, max {s['max_ms']:.0f} ms over "
            f"{len(s['stalls_ms'])} handovers"
        )
    lines.append(
        f"  rows written {rec['rows_written']:,}, duplicates {rec['duplicate_rows']}, "
        f"lost {rec['lost_rows']}"
    )
    return lines


def _curve_lines(rec: dict[str, Any]) -> list[str]:
    return [
        f"  {r['consumers']:>2} consumers: {r['aggregate_rows_per_s']:>9,} rows/s aggregate, "
        f"{r['per_client_rows_per_s']:>9,} per client (median), node CPU "
        f"{r['node_cpu_cores']:.2f} cores"
        for r in rec["runs"]
    ]


def _idle_lines(rec: dict[str, Any]) -> list[str]:
    lines = [
        f"  {r['destinations']:>2} destinations: RSS {r['rss_bytes'] / 2**20:.1f} MiB, CPU "
        f"{r['cpu_percent']:.2f}%, {r['threads']} threads"
        for r in rec["runs"]
    ]
    lines.append(
        f"  per destination: {rec['rss_per_destination_bytes'] / 2**20:.2f} MiB, "
        f"{rec['cpu_percent_per_destination']:.3f}% CPU"
    )
    return lines


def _settle_lines(rec: dict[str, Any]) -> list[str]:
    lines = [
        f"  {p['phase']}: {p['leaders']} after {p['seconds']:.1f} s, {p['moves']} handovers"
        for p in rec["phases"]
    ]
    lines.append(
        f"  settled: {rec['moves_in_quiet_window']} handovers in {rec['quiet_window_s']:g} s"
    )
    return lines


_SCALE = ("settle", "handover", "scale_clients", "scale_destinations", "idle_cost")


def _spark_lines(rec: dict[str, Any]) -> list[str]:
    """The canal source's steady state beside the two Spark anchors of the same run."""
    jvm, arrow, typed = rec["anchors"]["jvm_range"], rec["anchors"]["python_arrow"], rec["typed"]
    return [
        f"  canal source, map mode: {rec['rows_per_s']:,.0f} rows/s steady state "
        f"({rec['micro_batches']} micro-batches of ~{rec['rows_per_micro_batch']:,} rows, the "
        f"first after {rec['first_batch_s']:.1f} s; SparkSession start "
        f"{rec['session_start_s']:.1f} s, warm-up {rec['warm_up_s']:.1f} s)",
        f"  canal source, typed ({typed['table']}): {typed['rows_per_s']:,.0f} rows/s steady "
        f"state ({typed['rows']:,} rows, {typed['micro_batches']} micro-batches, the first "
        f"after {typed['first_batch_s']:.1f} s; over every micro-batch "
        f"{typed['batches_rows_per_s']:,.0f} rows/s, map mode {rec['batches_rows_per_s']:,.0f})",
        f"  Spark JVM range -> parquet: {jvm['rows_per_s']:,.0f} rows/s "
        f"(canal = {rec['vs_jvm_range']:.2f}x)",
        f"  Python data source, Arrow from memory -> parquet: {arrow['rows_per_s']:,.0f} rows/s "
        f"({arrow['rows_per_partition']:,} rows per partition; canal = "
        f"{rec['vs_python_arrow']:.2f}x); the typed rows: "
        f"{typed['python_arrow']['rows_per_s']:,.0f} rows/s (canal typed = "
        f"{typed['vs_python_arrow']:.2f}x)",
    ]


_API = ("api_filter_health", "api_long_polls")


def _ms(stats: dict[str, Any]) -> str:
    if not stats.get("samples"):
        return "no samples"
    return (
        f"p50 {stats['p50_ms']:.1f} / p99 {stats['p99_ms']:.1f} / max {stats['max_ms']:.1f} ms"
        f" ({stats['samples']})"
    )


def _api_filter_lines(rec: dict[str, Any]) -> list[str]:
    plain, bad = rec["anchor_plain_filter"], rec["pathological_filters"]
    return [
        f"  rows {rec['tps']:.0f}/s; /v1/health with a plain filter: {_ms(plain['health'])}",
        f"  with (.*){{50}}! and 40 of it polling ({bad['gets']} gets): {_ms(bad['health'])}",
    ]


def _api_poll_lines(rec: dict[str, Any]) -> list[str]:
    lines = []
    for key in ("within_limit", "over_limit"):
        run = rec[key]
        crowd, alone = run["concurrent"], run["anchor_one_poll"]
        lines.append(
            f"  {crowd['polls']} polls of {crowd['timeout_ms']} ms, limit "
            f"{run['max_long_polls']}: 200 x{crowd['answered_200']}, 503 x"
            f"{crowd['answered_503']}, lost {crowd['lost']}; over the timeout "
            f"{_ms(crowd['margin_over_timeout'])} (one alone: "
            f"{_ms(alone['margin_over_timeout'])}); refusals {_ms(crowd['refused_answer'])};"
            f" health {_ms(crowd['health'])}"
        )
    return lines


def _delta_lines(rec: dict[str, Any]) -> list[str]:
    lines = [
        f"  {rec['changes_per_batch']:,} row changes per micro-batch; ms per micro-batch "
        "(addBatch, median after the first): Delta MERGE | parquet full rewrite"
    ]
    for size in rec["sizes"]:
        d, p = size["delta"], size["parquet"]
        lines.append(
            f"  {size['rows']:>12,} rows: {d['median_add_batch_ms']:>8,.0f} | "
            f"{p['median_add_batch_ms']:>8,.0f}  (micro-batches {d['micro_batches']} | "
            f"{p['micro_batches']}, Delta files {d['files']})"
        )
    return lines


def render_table(result: dict[str, Any]) -> str:
    """The human-readable summary printed at the end of a run."""
    lines = [*_machine_lines(result), "", *_throughput_table(result)]
    render = {
        "spark_parquet": _spark_lines, "delta_mirror": _delta_lines, "latency": _latency_lines,
        "failover": _failover_lines, "node_rss": _rss_lines,
        "settle": _settle_lines, "handover": _handover_lines, "scale_clients": _curve_lines,
        "scale_destinations": _curve_lines, "idle_cost": _idle_lines,
        "api_filter_health": _api_filter_lines, "api_long_polls": _api_poll_lines,
    }  # fmt: skip
    for name, fn in render.items():
        rec = result.get("parts", {}).get(name)
        if rec is None:
            continue
        lines += ["", f"{rec.get('title', name)}: {rec.get('status')}"]
        if rec.get("status") == "ok":
            lines += fn(rec)
        else:
            lines.append("  " + _note(rec))
    return "\n".join(lines)
