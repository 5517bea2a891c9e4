"""Webhook subscriptions and their delivery log."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import DjangoModelPermissions, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from tidalproject.api import WriteRateThrottle

from ..models import WebhookDelivery, WebhookSubscription
from ..serializers.webhooks import WebhookDeliverySerializer, WebhookSubscriptionSerializer
from ..webhooks.lag import lag_samples
from ..webhooks.ssrf import UnsafeTarget
from ..webhooks.subscriptions import webhook_subscription_create, webhook_subscription_update


class ReadPermissions(DjangoModelPermissions):
    """DjangoModelPermissions, with the view permission required to read."""

    perms_map = {**DjangoModelPermissions.perms_map, "GET": ["%(app_label)s.view_%(model_name)s"]}


# What a PATCH may change (``after`` is refused by the serializer: it is set only at creation).
UPDATABLE = ("name", "url", "actions", "is_active", "secret")


class WebhookSubscriptionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet[Any]
):
    """Webhook subscriptions: a URL, a secret, the actions wanted, on or paused; each with its
    acknowledged version and lag. The secret is shown once, in the answer to the creation."""

    queryset = WebhookSubscription.objects.all()
    serializer_class = WebhookSubscriptionSerializer
    permission_classes = [IsAuthenticated, ReadPermissions]
    throttle_classes = [WriteRateThrottle]

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        context["lags"] = {sub.pk: lag for sub, lag in lag_samples()}
        return context

    def create(self, request: Request) -> Response:
        body = WebhookSubscriptionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            subscription = webhook_subscription_create(
                name=data["name"],
                url=data["url"],
                actions=data.get("actions", []),
                secret=data.get("secret") or None,
                after=data.get("after"),
            )
        except UnsafeTarget as exc:
            raise ValidationError({"url": [str(exc)]}) from None
        answer = WebhookSubscriptionSerializer(subscription, context=self.get_serializer_context()).data
        return Response({**answer, "secret": subscription.secret}, status=201)

    def partial_update(self, request: Request, pk: str) -> Response:
        subscription = self.get_object()
        body = WebhookSubscriptionSerializer(subscription, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        changes = {k: v for k, v in body.validated_data.items() if k in UPDATABLE}
        try:
            webhook_subscription_update(subscription=subscription, **changes)
        except UnsafeTarget as exc:
            raise ValidationError({"url": [str(exc)]}) from None
        return Response(WebhookSubscriptionSerializer(subscription, context=self.get_serializer_context()).data)

    @extend_schema(responses=WebhookDeliverySerializer(many=True), summary="A subscriber's delivery log, newest first")
    @action(detail=True, methods=["get"], serializer_class=WebhookDeliverySerializer)
    def deliveries(self, request: Request, pk: str) -> Response:
        subscription = self.get_object()
        page = self.paginate_queryset(WebhookDelivery.objects.filter(subscription=subscription).order_by("-pk"))
        return self.get_paginated_response(WebhookDeliverySerializer(page, many=True).data)
