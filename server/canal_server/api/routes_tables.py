"""A table's columns on the destination's leader: ``GET /v1/destinations/{d}/tables/{t}``.

``t`` is ``schema.table`` (split at the first dot). The leader asks
``information_schema`` of the database it reads (``canal_server.table_schema``): the
columns in the entries' type notation, nullability, the primary key and a ``version``
hash. The Spark source's typed mode builds its schema from this answer when a query
starts. A standby answers 307 like every destination route.
"""

from __future__ import annotations

import enum

import pymysql
from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response

from canal_protocol.errors import UnknownTable
from canal_server.api import models as m
from canal_server.api.deps import DestLead, check_token, in_thread, node_of
from canal_server.api.errors import ApiError, api_error_of, unavailable
from canal_server.api.openapi import ok
from canal_server.api.responses import respond

__all__ = ["router"]

_TAGS: list[str | enum.Enum] = ["destinations"]
router = APIRouter(
    prefix="/v1/destinations/{destination}", tags=_TAGS, dependencies=[Depends(check_token)]
)
TablePath = Path(description="`schema.table` (split at the first dot)", max_length=129)


def split_name(name: str) -> tuple[str, str]:
    """``schema.table`` → (schema, table); 400 naming ``table`` otherwise."""
    schema, dot, table = name.partition(".")
    if not dot or not schema or not table:
        raise ApiError(
            400, "invalid_argument", f"table: {name!r} is not schema.table", field="table"
        )
    return schema, table


@router.get("/tables/{table}", responses=ok(m.TableOut))
async def table_columns(request: Request, lead: DestLead, table: str = TablePath) -> Response:
    """The table's columns as the leader's database has them now (information_schema):
    names, `mysql_type` in the entries' notation, nullability, the primary key and a
    `version` hash. 404 `unknown_table`; 503 while the database does not answer."""
    schema, name = split_name(table)
    _, epoch = lead.leader()
    instance = node_of(request).instance(lead.destination)
    try:
        found = await in_thread(request, lambda: instance.table_schema(schema, name))
    except UnknownTable as exc:
        err = api_error_of(exc)
        assert err is not None
        raise err from None
    except (pymysql.err.MySQLError, OSError) as exc:
        raise unavailable(
            "unavailable", f"{lead.destination}: the database does not answer: {exc}"
        ) from None
    return respond(request, {"destination": lead.destination, **found.to_dict()}, epoch=epoch)
