"""The pipeline's set-based writes, in the SQL of each supported database.

PostgreSQL gets whole batches as arrays through ``unnest`` (one statement, one parameter
per column); SQLite, the embedded default, gets multi-row VALUES. Both are upserts that
add to what is there, which the ORM's bulk_create(update_conflicts=...) cannot express.

Every value reaches the database through psycopg's adaptation (lists become typed arrays):
never a literal written by hand. PostgreSQL reads an unquoted ``null`` inside an array
literal as NULL, which once stalled every batch holding a signal of kind ``null``.

Communities and cohorts go through the same statements: each group class names its members
and aggregates (``community.groups``), whose tables and group keys, like the signal's lists of
the groups it was credited to, come from the models' ``_meta``, quoted by psycopg as
identifiers. The columns the twins share are those of their abstract bases.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from django.db import connection, models
from psycopg import sql

from community.groups import GroupAggregate, MemberGroup
from community.models import Cohort, Community

from ..models import Signal

# SQLite allows 32,766 parameters a statement; stay well under it.
SQLITE_ROWS_PER_STATEMENT = 2000

# (target id, hour, item id, kind) -> [count, weight sum, last time]
AggregateKey = tuple[int, datetime, int, str]
Increments = dict[AggregateKey, list[Any]]


def quoted(name: str) -> str:
    """A table or column name of the models, quoted as an SQL identifier."""
    return sql.Identifier(name).as_string()


def table_name(model: type[models.Model]) -> str:
    return quoted(model._meta.db_table)


def credited_column(aggregates: type[GroupAggregate]) -> str:
    """The column of the signal's list of the groups of ``aggregates``' kind it was credited to."""
    return cast("models.Field[Any, Any]", Signal._meta.get_field(aggregates.credited_field)).column


def on_postgresql() -> bool:
    return connection.vendor == "postgresql"


def binding_cursor() -> Any:
    """A cursor for the batch statements. On PostgreSQL one that binds on the server: the
    arrays go as typed parameters dumped by psycopg's C adapters, where Django's default
    client-side binding would quote every element into the query text in Python (about
    30 ms a batch of 500 signals). Same connection, same transaction, Django's execute
    wrappers still apply; no statement is prepared (Django's default), so a pooler in
    transaction mode is fine with it."""
    if not on_postgresql():
        return connection.cursor()
    from django.db.backends.postgresql import base  # the psycopg backend (no stubs for its cursors)

    connection.ensure_connection()
    binding_cursor = base.ServerBindingCursor(connection.connection)  # type: ignore[attr-defined]
    return connection._prepare_cursor(binding_cursor)  # type: ignore[attr-defined]


def sqlite_params(rows: Sequence[Sequence[Any]]) -> list[Any]:
    """Flatten rows, with datetimes in the text form Django's SQLite backend stores."""
    adapt = connection.ops.adapt_datetimefield_value
    return [adapt(p) if isinstance(p, datetime) else p for row in rows for p in row]


def chunks(rows: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def as_columns(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """Rows to one list per column (the arrays ``unnest`` takes)."""
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


# Cohorts first, as the pipeline adds to them (signals_process): the two lock aggregate rows
# table by table in the same order, or an erasure and a batch could deadlock each other.
GROUPS_IN_LOCK_ORDER: tuple[type[MemberGroup], ...] = (Cohort, Community)

HOUR_SQL = "date_trunc('hour', {} AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"  # hour_bucket, in SQL
