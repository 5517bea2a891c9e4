from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from community.cache import leave_cache
from community.models import LeaveClock
from tests.factories import UserFactory


@pytest.fixture(autouse=True)
def _leave_clock_row(request: pytest.FixtureRequest) -> None:
    """The clock row comes from a data migration; transactional tests flush it away."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None:
        return
    request.getfixturevalue("transactional_db" if marker.kwargs.get("transaction") else "db")
    LeaveClock.objects.get_or_create(pk=1)


@pytest.fixture(autouse=True)
def _fresh_process_state() -> Iterator[None]:
    """Each test starts like a new process: a cold leave cache and empty throttle counters."""
    leave_cache.reset()
    cache.clear()
    yield
    leave_cache.reset()


@pytest.fixture
def api() -> APIClient:
    return APIClient()


@pytest.fixture
def member(db: None) -> Any:
    """An ordinary account; its own user id is its pk."""
    return UserFactory()


@pytest.fixture
def operator(db: None) -> Any:
    """A staff account with the leave model permissions (acts on any user)."""
    return UserFactory(
        is_staff=True,
        perms=["community.view_communityleave", "community.change_communityleave", "community.add_communityleave"],
    )


@pytest.fixture
def superuser(db: None) -> Any:
    return UserFactory(is_staff=True, is_superuser=True)
