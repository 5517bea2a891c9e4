from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from accounts.views import ObtainToken
from community.views.layer import CommunityLayerViewSet
from community.views.leave_cache import LeaveCacheView
from community.views.webhooks import WebhookSubscriptionViewSet
from signals_app.views import (
    CohortAttributionViewSet,
    CommunityTrendingViewSet,
    EraseView,
    ErasureJobDetailView,
    ErasureJobResultsView,
    ErasureJobView,
    SignalIngestView,
    UserSignalsView,
)
from tidalproject.health import HealthView, WorkersHealthView
from tidalproject.metrics import metrics_view

router = DefaultRouter()
router.register("community-layer", CommunityLayerViewSet, basename="community-layer")
router.register("communities", CommunityTrendingViewSet, basename="community")
router.register("cohorts", CohortAttributionViewSet, basename="cohort")
router.register("webhooks", WebhookSubscriptionViewSet, basename="webhook")

urlpatterns = [
    path("admin/", admin.site.urls),
    path("health/", HealthView.as_view(), name="health"),
    path("health/workers/", WorkersHealthView.as_view(), name="health-workers"),
    path("metrics", metrics_view, name="metrics"),
    path("api/leave-cache/", LeaveCacheView.as_view(), name="leave-cache"),
    path("api/signals/", SignalIngestView.as_view(), name="signals"),
    path("api/community-layer/<str:user_id>/signals/", UserSignalsView.as_view(), name="user-signals"),
    path("api/community-layer/<str:user_id>/erase/", EraseView.as_view(), name="erase"),
    path("api/erasures/", ErasureJobView.as_view(), name="erasures"),
    path("api/erasures/<int:job_id>/", ErasureJobDetailView.as_view(), name="erasure-job"),
    path("api/erasures/<int:job_id>/results/", ErasureJobResultsView.as_view(), name="erasure-job-results"),
    path("api/", include(router.urls)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="schema", template_name="accounts/swagger_ui.html"),
        name="docs",
    ),
    path("api/auth/token/", ObtainToken.as_view(), name="api-token"),
    path("api/auth/", include("rest_framework.urls")),
]
