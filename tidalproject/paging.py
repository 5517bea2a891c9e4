"""Admin lists that stay cheap on big tables: counts, windows.

Counts that stay cheap on big tables: the planner's estimate, or a count that stops early.

An admin changelist counts its rows on every view to draw its pages. On a table of millions
of rows an exact ``COUNT(*)`` reads the whole table (or a whole index) each time. Here:

- unfiltered, the table's size is PostgreSQL's estimate (``pg_class.reltuples``, kept by
  autovacuum and ANALYZE), exact below ``EXACT_BELOW`` rows and on other databases;
- filtered, the count stops at ``COUNT_CAP``: it reads at most that many rows, in the list's
  own order (so the index that serves the page serves the count), and the list shows "more
  than …" past it.

Either way, the list offers at most ``COUNT_CAP`` rows' worth of pages: a deep ``OFFSET``
reads every row it skips.
"""

from __future__ import annotations

import math
from datetime import timedelta
from functools import cached_property
from typing import Any, ClassVar

from django.contrib.admin import ShowFacets, SimpleListFilter, display
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import SuspiciousOperation
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext

# Below this many rows (estimated), counting exactly is cheap: count exactly.
EXACT_BELOW = 100_000
# Filtered lists count at most this many rows (and page through them).
COUNT_CAP = 1_000


def estimated_rows(model: type[Model], *, using: str = "default") -> int | None:
    """The planner's estimate of ``model``'s rows, or None where there is none.

    PostgreSQL only; reltuples is -1 for a table never vacuumed or analyzed.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [model._meta.db_table])
        row = cursor.fetchone()
    if row is None or row[0] is None or row[0] < 0:
        return None
    return int(row[0])


def is_unfiltered(queryset: QuerySet[Any]) -> bool:
    query = queryset.query
    return not query.where and not query.distinct and not query.is_sliced and not query.combinator


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator whose ``count`` is estimated (unfiltered) or capped (filtered); see above.

    ``estimated`` and ``capped`` say which, for the page to word the figure.
    """

    estimated = False
    capped = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        if is_unfiltered(queryset):
            if connections[queryset.db].vendor != "postgresql":
                return queryset.count()
            estimate = estimated_rows(queryset.model, using=queryset.db)
            if estimate is not None and estimate >= EXACT_BELOW:
                self.estimated = True
                return estimate
            if estimate is not None:
                return queryset.count()
            # never analyzed yet: counted like a filtered list
        # The list's own order is kept: the count reads the rows the first pages show.
        bounded = queryset[: COUNT_CAP + 1].count()
        if bounded > COUNT_CAP:
            self.capped = True
            return COUNT_CAP
        return bounded

    @cached_property
    def num_pages(self) -> int:
        """At most ``COUNT_CAP`` rows' worth of pages: deep offsets read every row they skip."""
        pages: int = super().num_pages
        return min(pages, max(1, math.ceil(COUNT_CAP / self.per_page)))


class BigTableAdminMixin:
    """For the changelists of tables with millions of rows: estimated or capped counts, no
    total count beside a filtered one, no per-choice facet counts (each a count of the table)."""

    paginator: ClassVar[type] = EstimatedCountPaginator
    show_full_result_count: ClassVar[bool] = False
    show_facets: ClassVar[ShowFacets] = ShowFacets.NEVER

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        """Only the list's own filters: any other lookup typed into the query string
        (``?value=xx``) is refused (400) instead of reaching SQL as it stands."""
        filters = self.get_list_filter(request) if request is not None else self.list_filter  # type: ignore[attr-defined]
        declared = {
            (item if isinstance(item, str) else item[0]).split("__")[0]
            if isinstance(item, str | tuple)
            else item.parameter_name
            for item in filters
        }
        return lookup.split("__")[0] in declared and super().lookup_allowed(lookup, value, request)  # type: ignore[misc]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        if any("\x00" in key or any("\x00" in v for v in values) for key, values in request.GET.lists()):
            raise SuspiciousOperation("A NUL character in the query string.")  # 400; PostgreSQL takes none
        return super().changelist_view(request, extra_context)  # type: ignore[misc]

    @display(description=mark_safe('<input type="checkbox" id="action-toggle">'))
    def action_checkbox(self, obj: Any) -> SafeString:
        """The stock column's markup, written directly: the stock one renders a form widget's
        template for every row, a third of a 100-row list's time."""
        label = format_html(gettext("Select this object for an action - {}"), str(obj))
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            ACTION_CHECKBOX_NAME,
            str(obj.pk),
            label,
        )


class RecentFilter(SimpleListFilter):
    """ "… in the last hour / day / 7 days / 30 days" on a time field: a bounded window where a
    date hierarchy would first read the distinct years, months or days of the whole table."""

    field_name = ""
    windows = {
        "1h": ("the last hour", timedelta(hours=1)),
        "24h": ("the last 24 hours", timedelta(days=1)),
        "7d": ("the last 7 days", timedelta(days=7)),
        "30d": ("the last 30 days", timedelta(days=30)),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(key, label) for key, (label, _) in self.windows.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        window = self.windows.get(self.value() or "")
        if window is None:
            return queryset
        return queryset.filter(**{f"{self.field_name}__gte": timezone.now() - window[1]})


def recent_filter(field_name: str, *, parameter: str, title: str) -> type[RecentFilter]:
    return type(
        f"Recent{parameter.title()}Filter",
        (RecentFilter,),
        {"field_name": field_name, "parameter_name": parameter, "title": title},
    )
