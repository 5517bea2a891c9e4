"""Webhook delivery against real HTTP receivers on loopback: signatures, order, the cursor,
back-off, pause, leases and the SSRF rules."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from community.models import WebhookDelivery, WebhookSubscription
from community.services.layer import leave_community_layer, rejoin_community_layer
from community.webhooks.delivery import backoff_seconds, webhook_deliver
from community.webhooks.lag import lag_samples
from community.webhooks.sending import post_signed, signed_message
from community.webhooks.ssrf import UnsafeTarget, address_allowed, check_url, resolve_target
from community.webhooks.subscriptions import webhook_subscription_create, webhook_subscription_update
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@dataclass
class Receiver:
    """A real HTTP server on 127.0.0.1 that records what it receives."""

    answer: Callable[[int], tuple[int, bytes]] = lambda n: (200, b"ok")
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""

    def serve(self) -> ThreadingHTTPServer:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status, reply = receiver.answer(len(receiver.received))
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = True
    settings.WEBHOOK_TIMEOUT_SECONDS = 2
    r = Receiver()
    server = r.serve()
    yield r
    server.shutdown()
    server.server_close()


def _subscribe(receiver: Receiver, **kwargs: Any) -> WebhookSubscription:
    return webhook_subscription_create(name="warehouse", url=receiver.url, **kwargs)


def _versions(receiver: Receiver, secret: str) -> list[int]:
    out = []
    for headers, body in receiver.received:
        payload = Webhook(secret).verify(body, headers)
        out += [c["version"] for c in payload["data"]["changes"]]
    return out


# --- signing -----------------------------------------------------------------------------


def test_messages_are_signed_as_standard_webhooks_says() -> None:
    secret = WebhookSubscription().secret
    assert secret.startswith("whsec_")
    body, headers = signed_message(secret=secret, msg_id="sub1_v1-2", payload={"type": "t", "data": {"a": 1}})
    assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert headers["webhook-signature"].startswith("v1,")
    assert Webhook(secret).verify(body, headers) == {"type": "t", "data": {"a": 1}}
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace(b"1", b"2"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(WebhookSubscription().secret).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body, {**headers, "webhook-id": "other"})


# --- delivery ----------------------------------------------------------------------------


def test_changes_arrive_in_order_signed_and_the_cursor_moves(receiver: Receiver, settings: Any) -> None:
    settings.WEBHOOK_BATCH_SIZE = 3
    sub = _subscribe(receiver, after=0)
    for uid in range(5):
        leave_community_layer(user_id=uid, reason=f"r{uid}")
    rejoin_community_layer(user_id=2)
    first = webhook_deliver(subscription_id=sub.pk)
    assert (first.result, first.sent, first.more) == ("delivered", 3, True)
    second = webhook_deliver(subscription_id=sub.pk)
    assert (second.result, second.sent, second.more) == ("delivered", 3, False)
    assert webhook_deliver(subscription_id=sub.pk).result == "idle"
    assert _versions(receiver, sub.secret) == [1, 2, 3, 4, 5, 6]
    headers, body = receiver.received[1]
    payload = json.loads(body)
    assert payload["type"] == "community_layer.changes"
    assert payload["data"]["changes"][-1] | {"at": None} == {
        "version": 6,
        "user_id": 2,
        "action": "rejoin",
        "status": "active",
        "left_at": payload["data"]["changes"][-1]["left_at"],
        "left_at_ns": payload["data"]["changes"][-1]["left_at_ns"],
        "at": None,
        "actor": None,
        "source": "api",
        "reason": "",
    }
    assert headers["webhook-id"] == f"sub{sub.pk}_v4-6"
    sub.refresh_from_db()
    assert sub.acked_version == 6 and sub.last_status_code == 200
    assert WebhookDelivery.objects.filter(subscription=sub, ok=True).count() == 2


def test_a_new_subscription_starts_from_now(receiver: Receiver) -> None:
    leave_community_layer(user_id=1)
    sub = _subscribe(receiver)
    assert sub.acked_version == 1
    leave_community_layer(user_id=2)
    webhook_deliver(subscription_id=sub.pk)
    assert _versions(receiver, sub.secret) == [2]


def test_a_failure_keeps_the_cursor_backs_off_and_the_same_batch_is_sent_again(
    receiver: Receiver, settings: Any
) -> None:
    settings.WEBHOOK_RETRY_BASE_SECONDS = 60
    receiver.answer = lambda n: (500, b"boom") if n == 1 else (204, b"")
    sub = _subscribe(receiver, after=0)
    leave_community_layer(user_id=1)
    leave_community_layer(user_id=2)
    failed = webhook_deliver(subscription_id=sub.pk)
    assert failed.result == "failed" and failed.retry_in is not None and 30 <= failed.retry_in <= 60
    sub.refresh_from_db()
    assert sub.acked_version == 0 and sub.consecutive_failures == 1 and sub.last_status_code == 500
    assert sub.failing_since is not None and sub.next_attempt_at is not None
    # Not before its time: a kick or the sweep finds it waiting.
    assert webhook_deliver(subscription_id=sub.pk).result == "waiting"
    WebhookSubscription.objects.filter(pk=sub.pk).update(next_attempt_at=timezone.now())
    assert webhook_deliver(subscription_id=sub.pk).result == "delivered"
    assert _versions(receiver, sub.secret) == [1, 2, 1, 2]
    log = list(
        WebhookDelivery.objects.filter(subscription=sub).order_by("pk").values_list("attempt", "ok", "status_code")
    )
    assert log == [(1, False, 500), (2, True, 204)]
    sub.refresh_from_db()
    assert (sub.acked_version, sub.consecutive_failures, sub.failing_since) == (2, 0, None)


def test_backoff_grows_exponentially_with_jitter_and_is_capped(settings: Any) -> None:
    settings.WEBHOOK_RETRY_BASE_SECONDS = 1
    settings.WEBHOOK_RETRY_MAX_SECONDS = 30
    rng = random.Random(7)
    for failures, ceiling in [(1, 1), (2, 2), (3, 4), (5, 16), (6, 30), (40, 30)]:
        samples = [backoff_seconds(failures, rng=rng) for _ in range(50)]
        assert all(ceiling / 2 <= s <= ceiling for s in samples)
        assert len(set(samples)) > 1  # jittered


def test_a_subscriber_failing_too_long_is_paused(receiver: Receiver, settings: Any) -> None:
    settings.WEBHOOK_PAUSE_AFTER_SECONDS = 60
    receiver.answer = lambda n: (503, b"")
    sub = _subscribe(receiver, after=0)
    leave_community_layer(user_id=1)
    assert webhook_deliver(subscription_id=sub.pk).result == "failed"
    WebhookSubscription.objects.filter(pk=sub.pk).update(
        failing_since=timezone.now() - timedelta(seconds=61), next_attempt_at=None
    )
    assert webhook_deliver(subscription_id=sub.pk).result == "paused"
    sub.refresh_from_db()
    assert not sub.is_active and "failing since" in sub.paused_reason
    assert webhook_deliver(subscription_id=sub.pk).result == "paused"
    receiver.answer = lambda n: (200, b"")
    webhook_subscription_update(subscription=sub, is_active=True)
    sub.refresh_from_db()
    assert sub.is_active and sub.consecutive_failures == 0 and sub.paused_reason == ""
    assert webhook_deliver(subscription_id=sub.pk).result == "delivered"


def test_a_held_lease_keeps_a_second_worker_out(receiver: Receiver) -> None:
    sub = _subscribe(receiver, after=0)
    leave_community_layer(user_id=1)
    WebhookSubscription.objects.filter(pk=sub.pk).update(
        lease_until=timezone.now() + timedelta(seconds=30), lease_token="other"
    )
    assert webhook_deliver(subscription_id=sub.pk).result == "busy"
    assert receiver.received == []
    # A lease left by a killed worker expires and delivery resumes.
    WebhookSubscription.objects.filter(pk=sub.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert webhook_deliver(subscription_id=sub.pk).result == "delivered"


def test_unwanted_actions_are_skipped_without_a_request(receiver: Receiver) -> None:
    sub = _subscribe(receiver, after=0, actions=["rejoin"])
    leave_community_layer(user_id=1)
    assert webhook_deliver(subscription_id=sub.pk).result == "skipped"
    assert receiver.received == []
    rejoin_community_layer(user_id=1)
    assert webhook_deliver(subscription_id=sub.pk).result == "delivered"
    assert _versions(receiver, sub.secret) == [2]
    with pytest.raises(ValueError, match="Unknown action"):
        _subscribe(receiver, actions=["explode"])


def test_only_so_much_of_an_answer_is_read_and_a_slow_one_times_out(receiver: Receiver, settings: Any) -> None:
    settings.WEBHOOK_MAX_RESPONSE_BYTES = 1000
    receiver.answer = lambda n: (200, b"x" * 5_000_000)
    answer = post_signed(receiver.url, body=b"{}", headers={})
    assert answer.status_code == 200 and len(answer.body) == 1000

    settings.WEBHOOK_TIMEOUT_SECONDS = 0.5
    never = threading.Event()

    def slow(n: int) -> tuple[int, bytes]:
        never.wait(3)
        return 200, b""

    receiver.answer = slow
    sub = _subscribe(receiver, after=0)
    leave_community_layer(user_id=1)
    outcome = webhook_deliver(subscription_id=sub.pk)
    never.set()
    assert outcome.result == "failed"
    assert "Timeout" in WebhookDelivery.objects.get(subscription=sub).error


# --- SSRF ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("::1", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        ("224.0.0.1", False),
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("::ffff:8.8.8.8", True),
    ],
)
def test_only_global_addresses_are_allowed_by_default(address: str, public: bool) -> None:
    assert address_allowed(address, allow_private=False) is public
    if address not in ("0.0.0.0", "224.0.0.1"):
        assert address_allowed(address, allow_private=True)
    else:
        assert not address_allowed(address, allow_private=True)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/",
        "file:///etc/passwd",
        "http://",
        "https://user:pw@example.com/",
        "http://127.0.0.1:8000/",
        "http://[::1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://example.com:0/",
        "http://example.com:99999/",
        "https://example.com/" + "a" * 2000,
    ],
)
def test_urls_that_break_the_rules_are_refused(url: str, settings: Any) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = False
    with pytest.raises(UnsafeTarget):
        check_url(url)


def test_a_name_is_checked_after_resolution_at_send_time(receiver: Receiver, settings: Any) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = False
    assert check_url("http://localhost:1/") == "http://localhost:1/"  # a name passes the syntax check
    with pytest.raises(UnsafeTarget, match="disallowed address"):
        resolve_target("localhost", 80, allow_private=False)
    with pytest.raises(UnsafeTarget):
        post_signed(receiver.url.replace("127.0.0.1", "localhost"), body=b"{}", headers={})
    # A subscription stored while allowed, then refused at send time: logged, cursor kept.
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = True
    sub = webhook_subscription_create(name="n", url=receiver.url.replace("127.0.0.1", "localhost"), after=0)
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = False
    leave_community_layer(user_id=1)
    assert webhook_deliver(subscription_id=sub.pk).result == "failed"
    assert receiver.received == []
    entry = WebhookDelivery.objects.get(subscription=sub)
    assert entry.error.startswith("refused:") and entry.status_code is None
    sub.refresh_from_db()
    assert sub.acked_version == 0


def test_redirects_are_not_followed(receiver: Receiver) -> None:
    receiver.answer = lambda n: (302, b"")
    sub = _subscribe(receiver, after=0)
    leave_community_layer(user_id=1)
    assert webhook_deliver(subscription_id=sub.pk).result == "failed"
    assert len(receiver.received) == 1


# --- API, admin, metrics ----------------------------------------------------------------------


def test_the_api_creates_lists_pauses_and_shows_lag(receiver: Receiver, settings: Any) -> None:
    admin = UserFactory(is_superuser=True, is_staff=True)
    api = APIClient()
    api.force_authenticate(admin)
    r = api.post(
        "/api/webhooks/", {"name": "mail", "url": receiver.url, "actions": ["leave"], "after": 0}, format="json"
    )
    assert r.status_code == 201, r.content
    created = r.json()
    assert created["secret"].startswith("whsec_") and created["acked_version"] == 0
    leave_community_layer(user_id=1)
    leave_community_layer(user_id=2)
    listed = api.get("/api/webhooks/").json()["results"][0]
    assert "secret" not in listed and listed["lag_versions"] == 2 and listed["lag_seconds"] >= 0
    webhook_deliver(subscription_id=created["id"])
    detail = api.get(f"/api/webhooks/{created['id']}/").json()
    assert detail["acked_version"] == 2 and detail["lag_versions"] == 0
    log = api.get(f"/api/webhooks/{created['id']}/deliveries/").json()["results"]
    assert [(e["first_version"], e["last_version"], e["status_code"], e["ok"]) for e in log] == [(1, 2, 200, True)]
    r = api.patch(f"/api/webhooks/{created['id']}/", {"is_active": False}, format="json")
    assert r.status_code == 200 and r.json()["is_active"] is False and r.json()["paused_reason"]
    body = api.get("/metrics").content.decode()
    assert f'tidal_webhook_lag_versions{{subscription="{created["id"]}"}} 0.0' in body
    assert "tidal_webhook_attempts_total" in body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "url": "http://10.0.0.1/"}, "url"),
        ({"name": "x", "url": "gopher://example.com/"}, "url"),
        ({"name": "x", "url": "https://example.com/", "actions": ["explode"]}, "actions"),
        ({"name": "x", "url": "https://example.com/", "secret": "whsec_notbase64!"}, "secret"),
        ({"name": "x", "url": "https://example.com/", "after": -1}, "after"),
        ({"url": "https://example.com/"}, "name"),
    ],
)
def test_bad_subscriptions_are_a_400_naming_the_field(body: dict[str, Any], field: str, settings: Any) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = False
    api = APIClient()
    api.force_authenticate(UserFactory(is_superuser=True, is_staff=True))
    r = api.post("/api/webhooks/", body, format="json")
    assert r.status_code == 400 and field in r.json(), r.content
    assert not WebhookSubscription.objects.exists()


def test_the_api_needs_the_model_permissions(member: Any) -> None:
    api = APIClient()
    assert api.get("/api/webhooks/").status_code == 401
    api.force_authenticate(member)
    assert api.get("/api/webhooks/").status_code == 403
    assert api.post("/api/webhooks/", {"name": "x", "url": "https://example.com/"}, format="json").status_code == 403


def test_the_admin_shows_subscribers_and_the_delivery_log(
    receiver: Receiver, client: Any, superuser: Any, settings: Any
) -> None:
    sub = _subscribe(receiver, after=0)
    leave_community_layer(user_id=1)
    webhook_deliver(subscription_id=sub.pk)
    client.force_login(superuser)
    page = client.get("/admin/community/webhooksubscription/").content.decode()
    assert "warehouse" in page and receiver.url in page
    log = client.get("/admin/community/webhookdelivery/").content.decode()
    assert "200" in log
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = False
    r = client.post(
        "/admin/community/webhooksubscription/add/",
        {"name": "bad", "url": "http://10.0.0.1/", "actions": "[]", "is_active": "on"},
    )
    assert r.status_code == 200 and "not allowed" in r.content.decode()
    assert [s.name for s, _ in lag_samples()] == ["warehouse"]
