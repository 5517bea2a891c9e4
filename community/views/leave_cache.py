"""This web process's leave cache, for operators."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ..access import needs
from ..cache import leave_cache
from ..permissions import READ_ANY
from ..serializers.layer import LeaveCacheSerializer


class LeaveCacheView(APIView):
    """This web process's leave cache after a sync: its fence position, size and counters.

    With ``?compare=1`` it is also checked against the records (a full read of the gated
    ids). Needs the permission to read any user's leave record.
    """

    permission_classes = [IsAuthenticated, needs(READ_ANY, "Reading the leave cache")]

    @extend_schema(
        parameters=[OpenApiParameter("compare", bool, description="Also compare with the records.")],
        responses=LeaveCacheSerializer,
        summary="This process's leave cache",
    )
    def get(self, request: Request) -> Response:
        compare = request.query_params.get("compare", "") in ("1", "true", "yes")
        return Response(leave_cache.report(compare=compare))
