"""The load balancer's health check and the leave cache report."""

import pytest

from community.models import CommunityLeave
from community.services.layer import leave_community_layer
from community.tasks import report_leave_cache

pytestmark = pytest.mark.django_db


def test_health_is_200_with_every_check_listed(client) -> None:
    response = client.get("/health/?format=json")
    assert response.status_code == 200, response.content
    assert set(response.json()) == {"Database(alias='default')", "LeaveFence()", "Broker()"}
    assert set(response.json().values()) == {"OK"}


@pytest.mark.django_db(transaction=True)  # the checks run in threads with connections of their own
def test_health_is_503_when_the_leave_fence_cannot_be_read(client) -> None:
    from community.models import LeaveClock

    LeaveClock.objects.all().delete()
    response = client.get("/health/?format=json")
    assert response.status_code == 503
    assert response.json()["LeaveFence()"] != "OK"


def test_leave_cache_report_compares_with_the_records(api, operator) -> None:
    leave_community_layer(user_id=1)
    CommunityLeave.objects.create(user_id=2, value=b"bad")
    api.force_authenticate(operator)
    body = api.get("/api/leave-cache/?compare=1").json()
    assert body["size"] == 2 and body["matches_database"] is True
    assert (body["only_in_cache"], body["only_in_database"]) == (0, 0)
    assert "matches_database" not in api.get("/api/leave-cache/").json()


def test_leave_cache_report_sees_a_cache_that_missed_a_write(api, operator) -> None:
    api.force_authenticate(operator)
    api.get("/api/leave-cache/")  # warm
    CommunityLeave.objects.create(user_id=5, value=b"\x01" + bytes(8))  # behind the fence's back
    body = api.get("/api/leave-cache/?compare=1").json()
    assert body["matches_database"] is False and body["only_in_database"] == 1


@pytest.mark.parametrize("who, status", [("anonymous", 401), ("member", 403)])
def test_leave_cache_report_needs_the_read_permission(api, member, who, status) -> None:
    if who == "member":
        api.force_authenticate(member)
    assert api.get("/api/leave-cache/").status_code == status


def test_the_worker_task_reports_its_cache(caplog) -> None:
    leave_community_layer(user_id=3)
    state = report_leave_cache()
    assert state["matches_database"] is True and state["size"] == 1
    assert "leave cache report:" in caplog.text


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_worker_health_is_503_without_workers_and_200_with_one(client, settings) -> None:
    from tests.processes import Worker
    from tidalproject.celery import app as celery_app

    # kombu's filesystem transport (the embedded default) has no broadcast, so a ping cannot
    # reach a worker there: the check says so (503) rather than guess. Redis and RabbitMQ can.
    with_a_worker = 503 if settings.CELERY_BROKER_URL.startswith("filesystem://") else 200

    celery_app.control.purge()
    assert client.get("/health/workers/?format=json").status_code == 503
    worker = Worker(concurrency=1)
    try:
        response = client.get("/health/workers/?format=json")
    finally:
        worker.stop()
    assert response.status_code == with_a_worker, response.content
