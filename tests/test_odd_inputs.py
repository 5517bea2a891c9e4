"""Odd and hostile inputs across the API, the admin, the console and the commands: each gets an
answer that names the problem (or the right answer), never a server error, and nothing is
written by a refused request."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from community.membership import CommunityMembership, MembershipStatus, serialize_membership
from community.models import Community, CommunityLeave, LeaveHistory, WebhookDelivery, WebhookSubscription
from community.services.layer import leave_community_layer
from community.webhooks.delivery import webhook_deliver
from signals_app.models import ErasureJob
from tests.factories import UserFactory
from tests.helpers import as_client, logged_in

pytestmark = pytest.mark.django_db

HOOK = "https://example.com/hook"


def no_raise(client: Any) -> Any:
    client.raise_request_exception = False  # a server error becomes a 500 answer, not a test error
    return client


# --- the API -------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"p=abc", b"o=1&p=1.5", b"p=%00", b"p=99999999999999999999"])
def test_an_edited_cursor_position_is_a_400_naming_the_cursor(operator: Any, raw: bytes) -> None:
    for user_id in (1, 2, 3):
        leave_community_layer(user_id=user_id)
    r = no_raise(as_client(operator)).get("/api/community-layer/", {"cursor": base64.b64encode(raw).decode()})
    assert r.status_code == 400 and "cursor" in r.json(), r.content[:200]


@pytest.mark.parametrize("until", ["0001-01-01T00:00:00Z", "0001-01-01T23:00:00Z"])
def test_trending_until_the_first_day_sums_the_hours_there_are(member: Any, until: str) -> None:
    Community.objects.create(slug="py", name="Py")
    r = no_raise(as_client(member)).get("/api/communities/py/trending/", {"until": until})
    assert (r.status_code, r.json()) == (200, {"results": []})


@pytest.mark.parametrize("url", ["http://a..b/hook", "http://xn--zz.example/hook", "http://\uff41.example/hook"])
def test_a_webhook_host_name_the_sender_cannot_use_is_a_400(superuser: Any, url: str) -> None:
    r = as_client(superuser).post("/api/webhooks/", {"name": "n", "url": url}, format="json")
    assert r.status_code == 400 and "Not a valid host name" in r.json()["url"][0]
    assert not WebhookSubscription.objects.exists()


def test_a_stored_url_the_resolver_cannot_encode_is_a_refused_attempt(settings: Any) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = False
    sub = WebhookSubscription.objects.create(name="old", url="http://a..b/hook", acked_version=0)
    leave_community_layer(user_id=1)
    assert webhook_deliver(subscription_id=sub.pk).result == "failed"
    assert WebhookDelivery.objects.get().error.startswith("refused:")


@pytest.mark.parametrize(
    "host",
    [
        "[::7f00:1]",  # IPv4-compatible 127.0.0.1
        "[::ffff:0:7f00:1]",  # IPv4-translated
        "[64:ff9b::a00:1]",  # NAT64 of 10.0.0.1
        "[2002:7f00:1::]",  # 6to4 of 127.0.0.1
        "[2001:0:4136:e378:8000:63bf:80ff:fffe]",  # Teredo, client 127.0.0.1
        "[fec0::1]",  # site-local
    ],
)
def test_ipv6_forms_of_refused_addresses_are_refused(superuser: Any, settings: Any, host: str) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = False
    r = as_client(superuser).post("/api/webhooks/", {"name": "n", "url": f"https://{host}/hook"}, format="json")
    assert r.status_code == 400 and "url" in r.json(), r.content
    assert not WebhookSubscription.objects.exists()


def test_patching_the_secret_rotates_it_and_after_is_refused(superuser: Any) -> None:
    api = as_client(superuser)
    created = api.post("/api/webhooks/", {"name": "n", "url": HOOK}, format="json").json()
    new = "whsec_" + base64.b64encode(b"k" * 32).decode()
    r = api.patch(f"/api/webhooks/{created['id']}/", {"secret": new}, format="json")
    assert r.status_code == 200 and "secret" not in r.json()
    assert WebhookSubscription.objects.get(pk=created["id"]).secret == new
    r = api.patch(f"/api/webhooks/{created['id']}/", {"after": 0}, format="json")
    assert r.status_code == 400 and r.json() == {"after": ["Set only when the subscription is created."]}


def test_after_past_the_latest_version_is_a_400_naming_it(superuser: Any) -> None:
    leave_community_layer(user_id=1)  # the clock at 1
    api = as_client(superuser)
    r = api.post("/api/webhooks/", {"name": "n", "url": HOOK, "after": 2}, format="json")
    assert r.status_code == 400 and r.json() == {"after": ["Must be at most the latest version, 1."]}
    assert api.post("/api/webhooks/", {"name": "n", "url": HOOK, "after": 1}, format="json").status_code == 201


# --- the admin and the console -------------------------------------------------------------------


def test_the_signing_secret_is_shown_once_after_the_add_never_on_the_change_page(superuser: Any) -> None:
    client = logged_in(superuser)
    added = client.post(
        "/admin/community/webhooksubscription/add/", {"name": "n", "url": HOOK, "actions": "[]", "is_active": "on"}
    )
    sub = WebhookSubscription.objects.get()
    assert added.status_code == 200 and sub.secret in added.content.decode()
    viewer = UserFactory(is_staff=True, perms=["community.view_webhooksubscription"])
    for who in (superuser, viewer):
        page = logged_in(who).get(f"/admin/community/webhooksubscription/{sub.pk}/change/")
        assert page.status_code == 200 and sub.secret not in page.content.decode()


def test_a_nul_in_the_consoles_reason_is_refused_and_nothing_written(superuser: Any) -> None:
    client = no_raise(logged_in(superuser))
    r = client.post("/admin/community/communityleave/console/user/5/leave/", {"reason": "by mail\x00x"})
    assert r.status_code in (200, 302)
    assert not LeaveHistory.objects.filter(user_id=5).exists()
    assert "NUL character" in client.get("/admin/community/communityleave/console/user/5/").content.decode()


def test_erasing_more_selected_users_than_a_job_holds_is_refused_whole(superuser: Any, settings: Any) -> None:
    value = serialize_membership(CommunityMembership(0, MembershipStatus.LEFT, 1))
    CommunityLeave.objects.bulk_create([CommunityLeave(user_id=u, value=value) for u in range(1, 6)])
    form = {"action": "erase_selected_users", "select_across": "1", "index": "0", "_selected_action": ["1"]}
    client = logged_in(superuser)
    settings.ERASURE_JOB_MAX_USERS = 4
    refused = client.post("/admin/community/communityleave/", form, follow=True)
    assert "More than 4 users selected" in refused.content.decode() and not ErasureJob.objects.exists()
    settings.ERASURE_JOB_MAX_USERS = 5
    client.post("/admin/community/communityleave/", form)
    assert ErasureJob.objects.get().total == 5


@pytest.mark.parametrize(
    "url",
    [
        "/admin/community/communityleave/?value=xx",  # a lookup that is not one of the list's filters
        "/admin/community/leavehistory/?actor_label__startswith=a",
        "/admin/community/leavehistory/?source__exact=%00",  # PostgreSQL takes no NUL
        "/admin/signals_app/signal/?kind=%00",
    ],
)
def test_admin_lists_answer_400_to_lookups_and_values_they_do_not_offer(superuser: Any, url: str) -> None:
    leave_community_layer(user_id=5)
    assert no_raise(logged_in(superuser)).get(url).status_code == 400


# --- commands ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["verify_stop_forward", "--since", "0001-01-01T00:00:00+01:00", "--no-progress"],
        ["verify_stop_forward", "--max-named", "-1", "--no-progress"],
        ["requeue_pending_signals", "--older-than", "1e400"],
        ["requeue_pending_signals", "--older-than", "nan"],
        ["requeue_pending_signals", "--older-than", "-1"],
        ["requeue_pending_signals", "--limit", "0"],
    ],
)
def test_commands_refuse_odd_values_naming_the_option(args: list[str]) -> None:
    with pytest.raises(CommandError, match=args[1]):
        call_command(*args, stdout=io.StringIO(), stderr=io.StringIO())
