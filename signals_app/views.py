from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from community.access import needs, own_user_id_or
from community.models import ChangeSource
from community.permissions import ADD_SIGNALS, ERASE_ANY, READ_ANY_SIGNALS
from community.serializers.groups import TopItemSerializer, TopItemsSerializer, WindowQuerySerializer
from community.views.groups import CohortViewSet, CommunityViewSet
from community.views.user_ids import USER_ID_PARAM, parse_path_user_id
from tidalproject.api import WriteRateThrottle
from tidalproject.roles import is_service_account

from .erasure import erasure_job_create, user_erase
from .models import ErasureJobUser
from .selectors import erasure_job_progress, top_items, user_recent_signals
from .serializers import (
    BulkErasureSerializer,
    ErasureJobSerializer,
    ErasureJobUserSerializer,
    ErasureReceiptSerializer,
    IngestResultSerializer,
    PaginatedSignalsSerializer,
    SignalBatchSerializer,
    SignalOutSerializer,
)
from .services.ingest import signals_ingest
from .validation import SignalBatchInvalid, parse_signal_batch


class SignalIngestView(APIView):
    """Accept a batch of signals: validated whole, stored as pending, processed by the workers."""

    permission_classes = [IsAuthenticated, needs(ADD_SIGNALS, "Posting signals")]
    throttle_classes = [WriteRateThrottle]

    @extend_schema(
        request=SignalBatchSerializer,
        responses={202: IngestResultSerializer},
        summary="Post up to 1,000 signals (all or nothing)",
    )
    def post(self, request: Request) -> Response:
        try:
            signals = parse_signal_batch(
                request.data,
                now=timezone.now(),
                max_skew=timedelta(seconds=settings.SIGNAL_MAX_CLOCK_SKEW_SECONDS),
                require_keys=settings.SIGNAL_REQUIRE_IDEMPOTENCY_KEYS and is_service_account(request.user),
            )
        except SignalBatchInvalid as exc:
            raise ValidationError(exc.detail) from None
        result = signals_ingest(sender=request.user, signals=signals)
        return Response(
            {"accepted": result.accepted, "duplicates": result.duplicates, "suppressed": result.suppressed},
            status=status.HTTP_202_ACCEPTED,
        )


class UserSignalsView(GenericAPIView[Any]):
    """A user's recent signals, newest first, with what processing did with each."""

    permission_classes = [IsAuthenticated, own_user_id_or(READ_ANY_SIGNALS)]
    serializer_class = SignalOutSerializer

    @extend_schema(
        parameters=[USER_ID_PARAM, OpenApiParameter("limit", int), OpenApiParameter("offset", int)],
        responses=PaginatedSignalsSerializer,
        summary="A user's recent signals",
    )
    def get(self, request: Request, user_id: str) -> Response:
        uid = parse_path_user_id(user_id)
        page = self.paginate_queryset(user_recent_signals(user_id=uid))
        return self.get_paginated_response(SignalOutSerializer(page, many=True).data)


class EraseView(APIView):
    """Erase a user: they leave, their past contributions are taken back from every aggregate,
    their stored signals are deleted. A user may erase themselves; operators need their own
    permission (``community.erase_communityleave``)."""

    permission_classes = [IsAuthenticated, own_user_id_or(ERASE_ANY)]
    throttle_classes = [WriteRateThrottle]

    @extend_schema(
        request=None,
        parameters=[USER_ID_PARAM],
        responses=ErasureReceiptSerializer,
        summary="Erase a user: leave and take back every past contribution",
    )
    def post(self, request: Request, user_id: str) -> Response:
        uid = parse_path_user_id(user_id)
        receipt = user_erase(user_id=uid, actor=request.user, source=ChangeSource.API)
        return Response(ErasureReceiptSerializer(receipt).data)


CanEraseAnyone = needs(ERASE_ANY, "Bulk erasure")
JOB_ID_PARAM = OpenApiParameter("job_id", int, OpenApiParameter.PATH, description="The erasure job's id.")


class ErasureJobView(APIView):
    """Bulk erasure: many users erased by a Celery task, one transaction each, with progress."""

    permission_classes = [IsAuthenticated, CanEraseAnyone]
    throttle_classes = [WriteRateThrottle]

    @extend_schema(
        request=BulkErasureSerializer,
        responses={202: ErasureJobSerializer},
        summary="Erase many users, asynchronously (operators)",
    )
    def post(self, request: Request) -> Response:
        body = BulkErasureSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = erasure_job_create(user_ids=body.validated_data["user_ids"], actor=request.user, source=ChangeSource.API)
        return Response(ErasureJobSerializer(erasure_job_progress(job_id=job.pk)).data, status=status.HTTP_202_ACCEPTED)


class ErasureJobDetailView(APIView):
    permission_classes = [IsAuthenticated, CanEraseAnyone]

    @extend_schema(parameters=[JOB_ID_PARAM], responses=ErasureJobSerializer, summary="A bulk erasure's progress")
    def get(self, request: Request, job_id: int) -> Response:
        return Response(ErasureJobSerializer(erasure_job_progress(job_id=job_id)).data)


class ErasureJobResultsView(GenericAPIView[Any]):
    permission_classes = [IsAuthenticated, CanEraseAnyone]
    serializer_class = ErasureJobUserSerializer

    @extend_schema(
        parameters=[JOB_ID_PARAM, OpenApiParameter("limit", int), OpenApiParameter("offset", int)],
        responses=ErasureJobUserSerializer(many=True),
        summary="A bulk erasure's per-user results, in the order given",
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = erasure_job_progress(job_id=job_id)
        page = self.paginate_queryset(ErasureJobUser.objects.filter(job=job).order_by("position"))
        return self.get_paginated_response(ErasureJobUserSerializer(page, many=True).data)


# Top items read the signals' aggregates, so they are served here, on community's group
# viewsets (the same URLs: /api/communities/{slug}/trending/, /api/cohorts/{slug}/attribution/).


def _top_items(view: CommunityViewSet | CohortViewSet, request: Request) -> Response:
    group = view.get_object()
    query = WindowQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    items = top_items(type(group), group=group, **query.validated_data)
    return Response({"results": TopItemSerializer(items, many=True).data})


class CommunityTrendingViewSet(CommunityViewSet):
    @extend_schema(parameters=[WindowQuerySerializer], responses=TopItemsSerializer, summary="Trending items")
    @action(detail=True, methods=["get"])
    def trending(self, request: Request, slug: str) -> Response:
        return _top_items(self, request)


class CohortAttributionViewSet(CohortViewSet):
    @extend_schema(parameters=[WindowQuerySerializer], responses=TopItemsSerializer, summary="Attributed items")
    @action(detail=True, methods=["get"])
    def attribution(self, request: Request, slug: str) -> Response:
        return _top_items(self, request)
