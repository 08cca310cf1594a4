"""A canal-python 0.4 (PyPI) consumer, run as a subprocess by tests/test_canal_tcp.py.

Usage: ``canal_python_consumer.py OUT STOP DESTINATION USER PASSWORD ADDR [ADDR ...]``

Its loop is what a canal-python user writes, since the package has no reconnect logic:
connect to an address, log in (canal-python sends the password unscrambled), subscribe
as client 1001, then getWithoutAck and ack until an error, and on any
error go on with the next address. Each batch with entries is one JSON line in OUT
(written and flushed before its ack): the batch id, the address it came through and,
per entry, its header and, for rows, every column as canal-python decoded it. Events
(connect, errors) are lines too. It ends when the file STOP exists.

It must run with ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python`` (canal-python's
generated modules need it with protobuf 4 or newer); the tests never import it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from canal.client import Client
from canal.protocol import EntryProtocol_pb2 as E


def column(c: Any) -> dict[str, Any]:
    return {
        "index": c.index, "sqlType": c.sqlType, "name": c.name, "isKey": c.isKey,
        "updated": c.updated, "isNull": c.isNull, "value": c.value, "length": c.length,
        "mysqlType": c.mysqlType,
    }  # fmt: skip


def entry(e: Any) -> dict[str, Any]:
    h = e.header
    out: dict[str, Any] = {
        "entryType": E.EntryType.Name(e.entryType),
        "logfileName": h.logfileName, "logfileOffset": h.logfileOffset,
        "schemaName": h.schemaName, "tableName": h.tableName,
        "eventType": E.EventType.Name(h.eventType), "executeTime": h.executeTime,
    }  # fmt: skip
    if e.entryType == E.EntryType.ROWDATA:
        rc = E.RowChange()
        rc.MergeFromString(e.storeValue)
        out["isDdl"], out["sql"] = rc.isDdl, rc.sql
        out["rows"] = [
            {"before": [column(c) for c in r.beforeColumns],
             "after": [column(c) for c in r.afterColumns]}
            for r in rc.rowDatas
        ]  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    out_path, stop, destination, user, password, *addresses = argv
    out = open(out_path, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run

    def note(**fields: Any) -> None:
        out.write(json.dumps(fields) + "\n")
        out.flush()

    turn = 0
    while not Path(stop).exists():
        address = addresses[turn % len(addresses)]
        turn += 1
        host, port = address.rsplit(":", 1)
        client = Client()
        try:
            client.connect(host=host, port=int(port))
            client.check_valid(username=user.encode(), password=password.encode())
            client.subscribe(client_id=b"1001", destination=destination.encode(), filter=b"")
            note(event="connected", address=address)
            while not Path(stop).exists():
                message = client.get_without_ack(100)
                if message["entries"]:
                    entries = [entry(e) for e in message["entries"]]
                    note(batch=message["id"], address=address, entries=entries)
                if message["id"]:  # canal-python's own get() acks every batch id
                    client.ack(message["id"])
                else:
                    time.sleep(0.05)
        except Exception as exc:  # canal-python raises bare Exceptions and socket errors
            note(event="error", address=address, error=f"{type(exc).__name__}: {exc}")
            time.sleep(0.5)
        finally:
            with contextlib.suppress(Exception):
                client.disconnect()
    note(event="stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
