"""Writes are throttled through a shared cache; when that cache is down, they still succeed."""

import pytest
from django.test import override_settings

pytestmark = pytest.mark.django_db

UNREACHABLE_REDIS = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}
}


def test_a_write_succeeds_when_the_throttle_cache_is_unreachable(api, member) -> None:
    api.force_authenticate(member)
    with override_settings(CACHES=UNREACHABLE_REDIS):
        response = api.post(f"/api/community-layer/{member.pk}/leave/")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "left"
