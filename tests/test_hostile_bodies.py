"""Inputs that once reached a 500: each now gets a clear 4xx."""

import pytest

pytestmark = pytest.mark.django_db

DEEP = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize(
    "path", ["/api/community-layer/bulk-leave/", "/api/signals/", "/api/communities/", "/api/auth/token/"]
)
def test_json_nested_too_deeply_is_a_400(api, superuser, path) -> None:
    api.force_authenticate(superuser)
    response = api.post(path, DEEP, content_type="application/json")
    assert response.status_code == 400
    assert "nested too deeply" in response.json()["detail"]


@pytest.mark.parametrize("path", ["/api/communities/a%00b/", "/api/cohorts/a%00b/attribution/", "/api/communities/A/"])
def test_a_slug_outside_the_rule_is_a_404(api, superuser, path) -> None:
    api.force_authenticate(superuser)
    assert api.get(path).status_code == 404
