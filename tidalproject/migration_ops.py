"""Migration operations for tables that are large and written all the time."""

from __future__ import annotations

from typing import Any

from django.db.migrations.operations import AddIndex


class AddIndexConcurrently(AddIndex):
    """``CREATE INDEX CONCURRENTLY`` on PostgreSQL: the table stays writable while the index
    builds (minutes on millions of signals); a plain ``AddIndex`` elsewhere (SQLite).

    The migration that uses it must set ``atomic = False``: PostgreSQL builds a concurrent
    index outside a transaction.
    """

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, concurrently=True)
        return None

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)
        return None
