"""Bulk erasure (API, admin upload, the admin action, the console's Erase button) and the
Celery task that runs it: per-user results, resumable, restarted by the sweep."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from community.cache import leave_gate
from community.models import LeaveHistory
from community.services.layer import leave_community_layer
from signals_app.erasure import erasure_job_create, erasure_job_run, stalled_erasure_jobs_restart, user_erase
from signals_app.models import CommunityAggregate, ErasureJob, Signal
from signals_app.services.processing import signals_process
from signals_app.verification import verify_stop_forward
from tests.factories import UserFactory
from tests.helpers import ingest, join, logged_in, sig
from tests.processes import Worker, wait_for
from tidalproject.celery import app as celery_app

pytestmark = pytest.mark.django_db

ERASE = "community.erase_communityleave"


@pytest.fixture
def eraser() -> Any:
    return UserFactory(is_staff=True, perms=[ERASE, "community.view_communityleave", "community.change_communityleave"])


@pytest.fixture
def three_users(sender, community) -> list[int]:
    users = [401, 402, 403]
    for user in users:
        join(user, community)
    ids = ingest(sender, *[sig(u, item_id=u) for u in users], sig(401, item_id=9), sig(404, item_id=9))
    join(404, community)
    signals_process(signal_ids=ids)
    return users


def test_a_job_erases_each_user_and_records_each_receipt(three_users) -> None:
    job = erasure_job_create(user_ids=[401, 402, 401, 999], source="api")
    assert job.total == 3  # repeats once
    job = erasure_job_run(job_id=job.pk)
    assert job.state == ErasureJob.State.DONE and job.finished_at is not None
    results = list(job.users.order_by("position").values_list("user_id", "state", "signals_removed"))
    assert results == [(401, "done", 2), (402, "done", 1), (999, "done", 0)]
    assert not Signal.objects.filter(user_id__in=[401, 402]).exists()
    assert Signal.objects.filter(user_id=403).exists()
    assert verify_stop_forward(progress=False).passed


def test_a_job_run_again_after_a_worker_died_resumes_where_it_stopped(three_users, monkeypatch) -> None:
    from django.db import OperationalError

    from signals_app import erasure

    job = erasure_job_create(user_ids=[401, 402, 403], source="api")
    take_back = erasure.take_back_signals

    def dies_at_402(user_id: int, before: int) -> tuple[int, int]:
        if user_id == 402:
            raise OperationalError("the connection died")  # 402's erasure rolls back whole
        return take_back(user_id, before)

    monkeypatch.setattr(erasure, "take_back_signals", dies_at_402)
    with pytest.raises(OperationalError):
        erasure_job_run(job_id=job.pk)
    assert job.users.get(user_id=401).state == "done" and job.users.get(user_id=402).state == "pending"
    monkeypatch.setattr(erasure, "take_back_signals", take_back)
    history = LeaveHistory.objects.count()
    job = erasure_job_run(job_id=job.pk)
    assert LeaveHistory.objects.count() == history + 2  # 402 and 403; 401 was done
    entry = job.users.get(user_id=402)
    assert (entry.state, entry.signals_removed, entry.already_erased) == ("done", 1, False)  # this job's erasure
    assert job.users.get(user_id=401).signals_removed == 2
    assert erasure_job_run(job_id=job.pk).state == "done"  # delivered once more: nothing to do


def test_a_user_erased_by_someone_else_after_the_job_was_made_is_reported_as_already_erased(three_users) -> None:
    job = erasure_job_create(user_ids=[401], source="api")
    assert user_erase(user_id=401).signals_removed == 2
    entry = erasure_job_run(job_id=job.pk).users.get()
    assert (entry.already_erased, entry.signals_removed) == (True, 2)  # that erasure's receipt, not the job's


def test_a_user_erased_before_the_job_is_reported_as_already_erased(three_users) -> None:
    user_erase(user_id=402)
    job = erasure_job_create(user_ids=[402], source="api")
    entry = erasure_job_run(job_id=job.pk).users.get()
    assert entry.already_erased is True and entry.signals_removed == 1


def test_the_sweep_restarts_a_job_not_heard_of(three_users, monkeypatch) -> None:
    from signals_app import tasks

    sent: list[int] = []
    monkeypatch.setattr(tasks.run_erasure_job, "delay", sent.append)
    job = erasure_job_create(user_ids=[401], source="api")
    assert stalled_erasure_jobs_restart(older_than=timedelta(minutes=5)) == 0
    ErasureJob.objects.filter(pk=job.pk).update(kicked_at=timezone.now() - timedelta(minutes=6))
    assert stalled_erasure_jobs_restart(older_than=timedelta(minutes=5)) == 1
    assert sent == [job.pk]
    erasure_job_run(job_id=job.pk)
    ErasureJob.objects.filter(pk=job.pk).update(kicked_at=timezone.now() - timedelta(hours=1))
    assert stalled_erasure_jobs_restart(older_than=timedelta(minutes=5)) == 0  # done: left alone


# --- API ----------------------------------------------------------------------------------------


def test_the_api_creates_a_job_and_shows_progress_and_results(api, eraser, three_users) -> None:
    api.force_authenticate(eraser)
    answer = api.post("/api/erasures/", {"user_ids": [401, 403]}, format="json")
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert (body["state"], body["total"], body["done"], body["pending"]) == ("pending", 2, 0, 2)
    erasure_job_run(job_id=body["id"])
    progress = api.get(f"/api/erasures/{body['id']}/").json()
    assert (progress["state"], progress["done"], progress["failed"], progress["pending"]) == ("done", 2, 0, 0)
    results = api.get(f"/api/erasures/{body['id']}/results/").json()["results"]
    assert [(r["user_id"], r["state"], r["signals_removed"]) for r in results] == [(401, "done", 2), (403, "done", 1)]
    assert api.get("/api/erasures/999999/").status_code == 404


def test_bulk_erasure_needs_the_erase_permission(api, operator) -> None:
    api.force_authenticate(operator)
    answer = api.post("/api/erasures/", {"user_ids": [1]}, format="json")
    assert answer.status_code == 403 and ERASE in answer.json()["detail"]
    assert not ErasureJob.objects.exists()


@pytest.mark.parametrize(
    ("body", "field_error"),
    [
        ({"user_ids": []}, "user_ids"),
        ({"user_ids": [1, "x"]}, "1"),
        ({"user_ids": [-1]}, "0"),
        ({}, "user_ids"),
    ],
)
def test_a_bad_bulk_body_is_a_400_naming_the_field(api, eraser, body, field_error) -> None:
    api.force_authenticate(eraser)
    answer = api.post("/api/erasures/", body, format="json")
    assert answer.status_code == 400
    errors = answer.json()["user_ids"]
    assert field_error == "user_ids" or field_error in errors
    assert not ErasureJob.objects.exists()


def test_more_than_the_limit_is_a_400(api, eraser, settings) -> None:
    api.force_authenticate(eraser)
    answer = api.post("/api/erasures/", {"user_ids": list(range(10_001))}, format="json")
    assert answer.status_code == 400 and "10000" in str(answer.json()["user_ids"])


# --- admin --------------------------------------------------------------------------------------


def test_the_console_erase_button_confirms_then_erases(eraser, three_users) -> None:
    client = logged_in(eraser)
    page = client.get("/admin/community/communityleave/console/user/401/")
    assert b'id="erase-button"' in page.content
    confirm = client.get("/admin/signals_app/erasurejob/erase-user/401/")
    assert confirm.status_code == 200 and b'id="erase-signal-count">2<' in confirm.content
    assert Signal.objects.filter(user_id=401).count() == 2  # nothing written by the GET
    done = client.post("/admin/signals_app/erasurejob/erase-user/401/", follow=True)
    assert b"User 401 erased" in done.content and b"2 signal(s) removed" in done.content
    assert not Signal.objects.filter(user_id=401).exists()
    assert LeaveHistory.objects.filter(user_id=401, action="erase", source="admin").exists()


def test_staff_without_the_erase_permission_sees_no_button_and_gets_403(three_users) -> None:
    viewer = UserFactory(is_staff=True, perms=["community.view_communityleave", "community.change_communityleave"])
    client = logged_in(viewer)
    assert b"erase-button" not in client.get("/admin/community/communityleave/console/user/401/").content
    assert client.post("/admin/signals_app/erasurejob/erase-user/401/").status_code == 403
    assert client.post("/admin/signals_app/erasurejob/add/", {"user_ids": "401", "confirm": "on"}).status_code == 403
    assert Signal.objects.filter(user_id=401).exists()


def test_the_admin_upload_starts_a_job_and_names_bad_ids(eraser, three_users) -> None:
    client = logged_in(eraser)
    bad = client.post("/admin/signals_app/erasurejob/add/", {"user_ids": "401 x", "confirm": "on"})
    assert bad.status_code == 200 and b"Not a user id" in bad.content
    unconfirmed = client.post("/admin/signals_app/erasurejob/add/", {"user_ids": "401"})
    assert unconfirmed.status_code == 200 and not ErasureJob.objects.exists()
    created = client.post("/admin/signals_app/erasurejob/add/", {"user_ids": "401, 402", "confirm": "on"})
    assert created.status_code == 302
    job = ErasureJob.objects.get()
    assert (job.total, job.source) == (2, "admin")
    assert client.get(f"/admin/signals_app/erasurejob/{job.pk}/change/").status_code == 200


def test_the_admin_upload_holds_to_erasure_job_max_users_not_the_bulk_leave_limit(eraser, settings) -> None:
    client = logged_in(eraser)
    settings.ERASURE_JOB_MAX_USERS = 3
    refused = client.post("/admin/signals_app/erasurejob/add/", {"user_ids": "1 2 3 4", "confirm": "on"})
    assert b"4 distinct ids: at most 3 a job." in refused.content and not ErasureJob.objects.exists()
    settings.ERASURE_JOB_MAX_USERS = 12_000  # above the bulk leave form's 10,000
    ids = " ".join(str(n) for n in range(10_500))
    created = client.post("/admin/signals_app/erasurejob/add/", {"user_ids": ids, "confirm": "on"})
    assert created.status_code == 302
    assert ErasureJob.objects.get().total == 10_500


def test_the_leave_records_admin_action_starts_a_job(eraser, three_users) -> None:
    leave_community_layer(user_id=402)
    client = logged_in(eraser)
    answer = client.post(
        "/admin/community/communityleave/",
        {"action": "erase_selected_users", "_selected_action": [402]},
    )
    assert answer.status_code == 302
    assert list(ErasureJob.objects.get().users.values_list("user_id", flat=True)) == [402]


# --- a real worker ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.processes
def test_a_worker_runs_a_job_sent_on_commit(sender, community) -> None:
    join(501, community)
    signals_process(signal_ids=ingest(sender, sig(501), sig(501, item_id=2)))
    celery_app.control.purge()
    worker = Worker()
    try:
        job = erasure_job_create(user_ids=[501, 502], source="api")
        wait_for(lambda: ErasureJob.objects.get(pk=job.pk).state == "done", what="the erasure job", timeout=60)
    finally:
        worker.stop()
    assert not Signal.objects.filter(user_id=501).exists() and not CommunityAggregate.objects.exists()
    assert leave_gate().is_erased(501)
    assert Permission.objects.filter(codename="erase_communityleave").exists()
