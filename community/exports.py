"""The streaming CSV export of the stored records, shared by the API and the admin."""

from __future__ import annotations

from django.http import StreamingHttpResponse
from django.utils import timezone

from .display import status_csv
from .selectors import community_layer_record_rows


def csv_export_response(status: str | None) -> StreamingHttpResponse:
    """A streaming CSV of the stored records (of one status), in user id order.

    Rows are read a chunk at a time by keyset and written a thousand lines at a time, so
    memory stays constant whatever the count (README, "Lists and exports").
    """
    response = StreamingHttpResponse(status_csv(community_layer_record_rows(status=status)), content_type="text/csv")
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="community-layer-{status or "all"}-{stamp}.csv"'
    return response
