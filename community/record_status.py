"""A stored leave record's status evaluated by the database: the codec's rule in SQL.

Warming the leave cache, the admin's status filter, the status list and the verifier ask
the database for a record's status instead of fetching and decoding every value.
"""

from __future__ import annotations

from typing import Any

from django.db import NotSupportedError, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.sql.compiler import SQLCompiler

# RecordStatus's answer for a record that cannot be read (0 and 1 are MembershipStatus's).
CORRUPT = -1


class RecordStatus(models.Func):
    """SQL for a stored record's status: 0 active, 1 left, -1 corrupt.

    The same rule as ``deserialize_membership`` (exactly 9 bytes, first byte 0 or 1),
    evaluated by the database so that warming and the admin filter need not fetch and
    decode every value. A test holds the two to the same answers.
    """

    output_field = models.IntegerField()
    arity = 1

    def as_sql(
        self,
        compiler: SQLCompiler,
        connection: BaseDatabaseWrapper,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> Any:
        raise NotSupportedError(f"RecordStatus has no SQL for {connection.vendor}")

    def as_postgresql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any) -> Any:
        template = (
            "CASE WHEN octet_length(%(expressions)s) = 9 AND get_byte(%(expressions)s, 0) IN (0, 1)"
            " THEN get_byte(%(expressions)s, 0) ELSE -1 END"
        )
        return super().as_sql(compiler, connection, template=template, **extra_context)

    def as_sqlite(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any) -> Any:
        template = (
            "CASE WHEN typeof(%(expressions)s) = 'blob' AND length(%(expressions)s) = 9 THEN"
            " CASE substr(%(expressions)s, 1, 1) WHEN X'00' THEN 0 WHEN X'01' THEN 1 ELSE -1 END"
            " ELSE -1 END"
        )
        return super().as_sql(compiler, connection, template=template, **extra_context)
