"""A table's columns on the destination's leader: ``GET /v1/destinations/{d}/tables/{t}``.

``t`` is ``schema.table`` (split at the first dot). The leader asks
``information_schema`` of the database it reads (``canal_server.table_schema``): the
columns in the entries' type notation, nullability, the primary key and a ``version``
hash. The Spark source's typed mode builds its schema from this answer when a query
starts. A standby answers 307 like every destination route.
"""

from __future__ import annotations

import enum

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response

from canal_protocol.errors import UnknownTable
from canal_server.api import models as m
from canal_server.api.deps import DestLead, check_token, node_of
from canal_server.api.errors import ApiError
from canal_server.api.openapi import answers
from canal_server.api.responses import respond

__all__ = ["router", "split_name"]

_TAGS: list[str | enum.Enum] = ["destinations"]
router = APIRouter(
    prefix="/v1/destinations/{destination}", tags=_TAGS, dependencies=[Depends(check_token)]
)
MAX_NAME = 64  # MySQL's identifier length, in characters
TablePath = Path(description="`schema.table` (split at the first dot)", max_length=2 * MAX_NAME + 1)


def split_name(name: str) -> tuple[str, str]:
    """``schema.table`` → (schema, table); 400 naming ``table`` without a dot, 404
    ``unknown_table`` for a name no MySQL table can have (over 64 characters, NUL, or a
    character outside Unicode's Basic Multilingual Plane): the database is not asked."""
    schema, dot, table = name.partition(".")
    if not dot or not schema or not table:
        shown = name[:80]
        raise ApiError(
            400, "invalid_argument", f"table: {shown!r} is not schema.table", field="table"
        )
    for part in (schema, table):
        if len(part) > MAX_NAME or any(c == "\0" or ord(c) > 0xFFFF for c in part):
            raise UnknownTable("table", f"no table {name[:140]!r}: not a MySQL table name")
    return schema, table


@router.get(
    "/tables/{table}",
    responses=answers(m.TableOut, 307, 400, 401, 403, 404, 503),
)
async def table_columns(request: Request, lead: DestLead, table: str = TablePath) -> Response:
    """The table's columns as the leader's database has them now (information_schema):
    names, `mysql_type` in the entries' notation, nullability, the primary key and a
    `version` hash. 404 `unknown_table`; 503 `source_unavailable` while the database does
    not answer."""
    schema, name = split_name(table)
    instance = node_of(request).instance(lead.destination)
    found, epoch = await lead.call(lambda _server: instance.table_schema(schema, name))
    return respond(request, {"destination": lead.destination, **found.to_dict()}, epoch=epoch)
