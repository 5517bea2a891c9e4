"""The models and their migrations agree, and sharing a shape changed no table: communities'
and cohorts' members and aggregates keep the tables, columns and keys they were created with."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from community.models import Cohort, Community

# The tables as the migrations created them: moving fields to shared abstract bases must not
# rename, re-create or re-order anything in the database.
TABLES = {
    "community_communitymember": {"id", "community_id", "user_id", "joined_at"},
    "community_cohortmember": {"id", "cohort_id", "user_id", "joined_at"},
    "signals_app_communityaggregate": {
        "id",
        "community_id",
        "item_id",
        "kind",
        "hour",
        "count",
        "weight_sum",
        "last_at",
    },
    "signals_app_cohortaggregate": {"id", "cohort_id", "item_id", "kind", "hour", "count", "weight_sum", "last_at"},
}
CONSTRAINTS = {
    "community_communitymember": {"community_member_unique", "community_member_user_id_range"},
    "community_cohortmember": {"cohort_member_unique", "cohort_member_user_id_range"},
    "signals_app_communityaggregate": {"community_aggregate_key"},
    "signals_app_cohortaggregate": {"cohort_aggregate_key"},
}


@pytest.mark.django_db
def test_no_model_change_lacks_a_migration() -> None:
    out = StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit:
        pytest.fail(f"the models changed without a migration:\n{out.getvalue()}")
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_the_twins_keep_their_tables_and_columns() -> None:
    models = [model for group in (Community, Cohort) for model in (group.members_model, group.aggregate_model)]
    assert {model._meta.db_table for model in models} == set(TABLES)
    with connection.cursor() as cursor:
        for model in models:
            table = model._meta.db_table
            live = {column.name for column in connection.introspection.get_table_description(cursor, table)}
            assert live == TABLES[table]
            assert {field.column for field in model._meta.concrete_fields} == TABLES[table]
            constraints = connection.introspection.get_constraints(cursor, table)
            assert CONSTRAINTS[table] <= set(constraints)
