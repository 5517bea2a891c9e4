"""Evidence on every signal, the deterministic while-queued rule, and the edges of issue 8:
a kind that reads as NULL, a poison signal, a broker that fails after commit, the sweep
during a backlog, and the verifier that proves it all from stored data."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from community.cache import leave_cache
from community.models import Community, CommunityLeave, LeaveClock
from community.services.layer import leave_community_layer, rejoin_community_layer
from signals_app.models import CommunityAggregate, GatedReason, Outcome, Signal
from signals_app.services.processing import signals_process, signals_process_isolating_failures
from signals_app.services.sweep import pending_signals_requeue
from tests.helpers import backdate, ingest, join, run_command, sig

pytestmark = pytest.mark.django_db

USER = 301


def evidence(signal_id: int) -> tuple[Any, ...]:
    s = Signal.objects.get(pk=signal_id)
    reason = GatedReason(s.gated_reason).label if s.gated_reason else None
    return Outcome(s.outcome).label, reason, s.fence_at_receipt, s.fence_at_processing


def verify(*args: str) -> str:
    return run_command("verify_stop_forward", "--no-progress", *args, stderr=True)


def counterexamples() -> str:
    """What the verifier says when it fails (it must)."""
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("verify_stop_forward", "--no-progress", stdout=out, stderr=out)
    return out.getvalue()


# --- evidence and the rule ------------------------------------------------------------------------


def test_every_signal_carries_its_fences_and_where_it_was_credited(sender, community, cohort) -> None:
    join(USER, community, cohort)
    leave_community_layer(user_id=1)  # version 1
    (signal_id,) = ingest(sender, sig(USER))
    leave_community_layer(user_id=2)  # version 2
    signals_process(signal_ids=[signal_id])
    assert evidence(signal_id) == ("attributed", None, 1, 2)
    signal = Signal.objects.get(pk=signal_id)
    assert (signal.credited_communities, signal.credited_cohorts) == ([community.pk], [cohort.pk])


def test_left_at_receipt_is_stored_gated_with_its_reason(sender, community) -> None:
    join(USER, community)
    leave_community_layer(user_id=USER)
    (signal_id,) = ingest(sender, sig(USER))
    assert evidence(signal_id) == ("gated", "left_at_receipt", 1, None)


def test_left_at_processing(sender, community) -> None:
    join(USER, community)
    (signal_id,) = ingest(sender, sig(USER))
    leave_community_layer(user_id=USER)
    signals_process(signal_ids=[signal_id])
    assert evidence(signal_id) == ("gated", "left_at_processing", 0, 1)


def test_a_leave_and_a_rejoin_while_queued_gate_it_whatever_the_worker_speed(sender, community) -> None:
    # Issue 8, failure 3: received active, queued through a leave and a rejoin, processed
    # after the rejoin. Today's gate alone would attribute it; the design says gated.
    join(USER, community)
    (signal_id,) = ingest(sender, sig(USER))
    leave_community_layer(user_id=USER)
    rejoin_community_layer(user_id=USER)
    signals_process(signal_ids=[signal_id])
    assert evidence(signal_id) == ("gated", "left_while_queued", 0, 2)
    assert not CommunityAggregate.objects.exists()


def test_the_while_queued_check_reads_the_history_a_fresh_process_has_not_seen(sender, community) -> None:
    join(USER, community)
    (signal_id,) = ingest(sender, sig(USER))
    leave_community_layer(user_id=USER)
    rejoin_community_layer(user_id=USER)
    leave_cache.reset()  # a worker started after all that
    signals_process(signal_ids=[signal_id])
    assert evidence(signal_id) == ("gated", "left_while_queued", 0, 2)


def test_a_corrupt_record_is_the_reason(sender, community) -> None:
    join(USER, community)
    CommunityLeave.objects.create(user_id=USER, value=b"\x07")
    (at_receipt,) = ingest(sender, sig(USER))
    assert evidence(at_receipt)[:2] == ("gated", "corrupt_record")


def test_the_users_signals_api_shows_the_evidence(api, sender, community) -> None:
    join(USER, community)
    queued = ingest(sender, sig(USER))
    leave_community_layer(user_id=USER)
    signals_process(signal_ids=queued)
    ingest(sender, sig(USER))
    api.force_authenticate(sender)
    sender.user_permissions.add(*_perm("view_signal"))
    body = api.get(f"/api/community-layer/{USER}/signals/").json()
    assert [
        (r["outcome"], r["gated_reason"], r["fence_at_receipt"], r["fence_at_processing"]) for r in body["results"]
    ] == [
        ("gated", "left_at_receipt", 1, None),
        ("gated", "left_at_processing", 0, 1),
    ]


def _perm(codename: str) -> Any:
    from django.contrib.auth.models import Permission

    return Permission.objects.filter(codename=codename)


# --- no valid input stalls the pipeline ----------------------------------------------------------


def test_the_kind_null_is_processed_like_any_other(sender, community) -> None:
    # Issue 8, failure 2: written unquoted into an array literal, PostgreSQL read it as NULL
    # and the whole batch rolled back, for ever.
    join(USER, community)
    ids = ingest(sender, sig(USER, kind="null"), sig(USER, kind="like"), sig(USER, kind="true"))
    report = signals_process(signal_ids=ids)
    assert report.attributed == 3
    assert sorted(CommunityAggregate.objects.values_list("kind", flat=True)) == ["like", "null", "true"]


@pytest.fixture
def poison_item() -> Any:
    """A real, non-transient database error for one item: a trigger that refuses its aggregate."""
    item = 666
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION refuse_item() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.item_id = 666 THEN RAISE EXCEPTION 'item 666 refused'; END IF; RETURN NEW; END $$"
            )
            cursor.execute(
                "CREATE TRIGGER refuse_item BEFORE INSERT ON signals_app_communityaggregate "
                "FOR EACH ROW EXECUTE FUNCTION refuse_item()"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER refuse_item BEFORE INSERT ON signals_app_communityaggregate "
                "WHEN NEW.item_id = 666 BEGIN SELECT RAISE(ABORT, 'item 666 refused'); END"
            )
    yield item
    _drop_poison()


def _drop_poison() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("DROP TRIGGER IF EXISTS refuse_item ON signals_app_communityaggregate")
            cursor.execute("DROP FUNCTION IF EXISTS refuse_item()")
        else:
            cursor.execute("DROP TRIGGER IF EXISTS refuse_item")


def test_a_poison_signal_is_isolated_and_failed_and_the_rest_go_through(sender, community, poison_item) -> None:
    join(USER, community)
    ids = ingest(sender, *(sig(USER, item_id=i) for i in range(1, 8)), sig(USER, item_id=poison_item))
    report = signals_process_isolating_failures(signal_ids=ids)
    assert (report.attributed, report.failed) == (7, 1)
    failed = Signal.objects.get(outcome=Outcome.FAILED)
    assert failed.item_id == poison_item and "item 666 refused" in failed.error
    assert CommunityAggregate.objects.count() == 7
    assert pending_signals_requeue(older_than=timedelta(0)).enqueued == 0  # out of the sweep's way


def test_failed_signals_are_retried_once_fixed(
    sender, community, poison_item, enqueued, django_capture_on_commit_callbacks
) -> None:
    join(USER, community)
    ids = ingest(sender, sig(USER, item_id=poison_item))
    signals_process_isolating_failures(signal_ids=ids)
    assert Signal.objects.get().outcome == Outcome.FAILED
    _drop_poison()  # the cause is fixed
    with django_capture_on_commit_callbacks(execute=True):
        out = run_command("retry_failed_signals")
    assert out.strip() == "enqueued 1 failed signal(s) again"
    assert enqueued == [ids]
    assert signals_process(signal_ids=ids).attributed == 1


# --- 202 means stored, and no sweep storm --------------------------------------------------------


def test_any_enqueue_failure_after_commit_still_answers_202(
    api, sender, monkeypatch, django_capture_on_commit_callbacks
) -> None:
    from signals_app.tasks import process_signal_batch

    def disk_full(*_: Any, **__: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(process_signal_batch, "apply_async", disk_full)
    api.force_authenticate(sender)
    body = {"signals": [{"user_id": USER, "item_id": 1, "kind": "view"}]}
    with django_capture_on_commit_callbacks(execute=True):
        r = api.post("/api/signals/", body, format="json")
    assert r.status_code == 202 and r.json() == {"accepted": 1, "duplicates": 0, "suppressed": 0}
    signal = Signal.objects.get()
    assert signal.outcome == Outcome.PENDING and signal.enqueued_at is None  # the sweep's first


def test_never_sent_signals_are_swept_at_once(sender, enqueued) -> None:
    ids = ingest(sender, sig(USER))
    Signal.objects.update(enqueued_at=None)
    backdate_received_only(ids)
    assert pending_signals_requeue(older_than=timedelta(minutes=1)).enqueued == 1


def backdate_received_only(ids: list[int]) -> None:
    from django.utils import timezone

    Signal.objects.filter(pk__in=ids).update(received_at=timezone.now() - timedelta(minutes=5))


def test_the_sweep_does_not_send_again_while_a_backlog_may_still_hold_the_task(sender, empty_queue) -> None:
    from signals_app.services.ingest import signals_enqueue

    ids = ingest(sender, sig(USER), sig(USER + 1))
    signals_enqueue(ids)  # a real task in the real queue, and no worker: a backlog
    backdate(ids, timedelta(minutes=10))
    report = pending_signals_requeue(older_than=timedelta(minutes=2))
    assert (report.enqueued, report.deferred) == (0, 2) and report.queued_tasks == 1
    from tidalproject.celery import app

    app.control.purge()  # the queue drained and the signals are still pending: lost, send again
    report = pending_signals_requeue(older_than=timedelta(minutes=2))
    assert (report.enqueued, report.deferred, report.queued_tasks) == (2, 0, 0)
    again = pending_signals_requeue(older_than=timedelta(minutes=2))
    assert again.enqueued == 0  # just sent: not again before the threshold passes once more


# --- the verifier --------------------------------------------------------------------------------


def _processed_world(sender: Any, community: Any, cohort: Any) -> list[int]:
    join(USER, community, cohort)
    join(USER + 1, community)
    ids = ingest(sender, sig(USER, item_id=1, weight=2.0), sig(USER + 1, item_id=1), sig(USER + 1, item_id=2))
    leave_community_layer(user_id=USER + 1)
    ids += ingest(sender, sig(USER + 1, item_id=3))
    signals_process(signal_ids=ids)
    return ids


def test_the_verifier_passes_on_what_the_pipeline_wrote(sender, community, cohort) -> None:
    _processed_world(sender, community, cohort)
    out = verify()
    assert "counterexamples: 0" in out and "attributed 1, gated 3" in out


def test_the_verifier_names_an_aggregate_altered_by_hand(sender, community, cohort) -> None:
    _processed_world(sender, community, cohort)
    CommunityAggregate.objects.filter(item_id=1).update(count=5)
    with pytest.raises(CommandError, match="1 counterexample"):
        verify()
    out = counterexamples()
    assert f"aggregate community {community.pk} item 1 kind 'view'" in out
    assert "stored count 5" in out


def test_the_verifier_passes_after_a_credited_group_is_deleted_with_its_aggregates(sender, community, cohort) -> None:
    _processed_world(sender, community, cohort)
    assert CommunityAggregate.objects.filter(community=community).exists()
    deleted = community.pk
    community.delete()  # its aggregate rows go with it; the signals keep their evidence
    assert any(deleted in (s.credited_communities or ()) for s in Signal.objects.all())
    assert "counterexamples: 0" in verify()
    Community.objects.create(slug="again", name="Again")  # another id: the old credits stay unexpected
    assert "counterexamples: 0" in verify()


def test_the_verifier_names_an_outcome_altered_by_hand(sender, community, cohort) -> None:
    ids = _processed_world(sender, community, cohort)
    gated = Signal.objects.get(pk=ids[1])
    assert gated.gated_reason == GatedReason.LEFT_AT_PROCESSING
    Signal.objects.filter(pk=gated.pk).update(
        outcome=Outcome.ATTRIBUTED, gated_reason=None, credited_communities=[community.pk], credited_cohorts=[]
    )
    out = counterexamples()
    assert f"signal {gated.pk} of user {USER + 1}: attributed, fences 0..1; history: active at receipt, left at" in (
        out
    )


def test_the_verifier_names_a_reason_that_disagrees_with_the_history(sender, community, cohort) -> None:
    ids = _processed_world(sender, community, cohort)
    Signal.objects.filter(pk=ids[-1]).update(gated_reason=GatedReason.LEFT_WHILE_QUEUED)
    out = counterexamples()
    assert f"signal {ids[-1]} of user {USER + 1}: gated (left_while_queued)" in out


def test_the_verifier_since_checks_only_recent_work(sender, community, cohort) -> None:
    from django.utils import timezone

    _processed_world(sender, community, cohort)
    assert "signals checked: 0" in verify("--since", (timezone.now() + timedelta(hours=1)).isoformat())
    with pytest.raises(CommandError, match="offset"):
        verify("--since", "2026-01-01T00:00:00")


def test_the_clock_row_is_read_by_the_verifier_only_through_the_history(sender, community, cohort) -> None:
    # The proof uses signals, history and aggregates alone: a clock row put back at 0 (as a
    # restore might) changes nothing in it.
    _processed_world(sender, community, cohort)
    LeaveClock.objects.update(version=0)
    assert "counterexamples: 0" in verify()


def test_a_setting_requires_idempotency_keys_of_service_accounts(api, settings) -> None:
    from community.services.service_accounts import service_account_create

    settings.SIGNAL_REQUIRE_IDEMPOTENCY_KEYS = True
    service_account_create(username="svc", perms=["signals_app.add_signal"])
    from django.contrib.auth import get_user_model

    api.force_authenticate(get_user_model().objects.get(username="svc"))
    keyed = {"user_id": USER, "item_id": 1, "kind": "view", "idempotency_key": "k1"}
    bare = {"user_id": USER, "item_id": 1, "kind": "view"}
    r = api.post("/api/signals/", {"signals": [keyed, bare]}, format="json")
    assert r.status_code == 400
    assert list(r.json()["signals"]) == ["1"] and "idempotency_key" in r.json()["signals"]["1"]
    assert not Signal.objects.exists()
    assert api.post("/api/signals/", {"signals": [keyed]}, format="json").status_code == 202
