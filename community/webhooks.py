"""Webhook delivery: every change, to every subscriber, in version order, at least once, signed.

How it works (README, "Webhooks"):

- Each subscriber has a cursor, ``acked_version``: every change up to it was answered with
  a 2xx (or is of an action it does not want).
- A delivery (``webhook_deliver``) claims the subscriber with a lease (a conditional UPDATE,
  so two workers never send to one subscriber at once and order holds, on PostgreSQL and
  SQLite alike), reads up to ``WEBHOOK_BATCH_SIZE`` history rows after the cursor in version
  order, sends the wanted ones as one signed message (Standard Webhooks), and moves the
  cursor past them only on a 2xx. No transaction is held while the HTTP exchange runs, so
  a slow receiver never holds a lock a leave needs. A worker killed mid-send leaves a lease
  that expires (``lease_seconds``) and another worker takes over: the batch is sent again
  (at least once; receivers deduplicate by ``version``).
- A failure sets ``next_attempt_at`` by exponential back-off with jitter; nobody sends
  before it. A subscriber failing with no success for ``WEBHOOK_PAUSE_AFTER_SECONDS`` is
  paused.
- A change's transaction only registers ``kick_webhooks`` on commit; it never raises, so a
  broker that is down never fails a leave. Beat's ``sweep_webhooks`` wakes every lagging
  subscriber, so a lost kick delays a delivery and loses nothing.
- Targets are checked against server-side request forgery at send time, after name
  resolution, and the connection goes to the address that was checked (no second look-up
  that DNS rebinding could answer differently).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import Q
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from tidalproject import metrics

from .models import ChangeAction, LeaveClock, LeaveHistory, WebhookDelivery, WebhookSubscription

logger = logging.getLogger(__name__)

MAX_URL_LENGTH = 2000
EVENT_TYPE = "community_layer.changes"


class UnsafeTarget(ValueError):
    """The URL may not be called: its scheme, or an address its host resolves to."""


# --- SSRF rules ---------------------------------------------------------------------------


def address_allowed(address: str, *, allow_private: bool) -> bool:
    """Whether a resolved address may be called.

    Only globally routable unicast addresses, unless ``allow_private``: then anything but
    multicast and the unspecified address. An IPv4-mapped IPv6 address is judged as IPv4.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_multicast or ip.is_unspecified:
        return False
    return allow_private or ip.is_global


def check_url(url: str, *, allow_private: bool | None = None) -> str:
    """The rules a subscription's URL must meet before it is stored; returns it.

    Raises ``UnsafeTarget`` naming the rule. A host name is resolved only at send time.
    """
    allow = settings.WEBHOOK_ALLOW_PRIVATE_TARGETS if allow_private is None else allow_private
    if len(url) > MAX_URL_LENGTH:
        raise UnsafeTarget(f"At most {MAX_URL_LENGTH} characters.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeTarget(f"Not a valid URL: {exc}.") from None
    if parts.scheme not in ("http", "https"):
        raise UnsafeTarget("The scheme must be http or https.")
    if not parts.hostname:
        raise UnsafeTarget("The URL needs a host.")
    if parts.username is not None or parts.password is not None:
        raise UnsafeTarget("Credentials in the URL are not allowed; use the signature to authenticate.")
    if port == 0:
        raise UnsafeTarget("Port 0 is not allowed.")
    try:
        literal = ipaddress.ip_address(parts.hostname)
    except ValueError:
        return url
    if not address_allowed(str(literal), allow_private=allow):
        raise UnsafeTarget(
            "Loopback, private, link-local and other non-global addresses are not allowed"
            " (WEBHOOK_ALLOW_PRIVATE_TARGETS)."
        )
    return url


def resolve_target(host: str, port: int, *, allow_private: bool) -> str:
    """Resolve ``host`` and return an address to connect to; every address must be allowed.

    Refusing when any answer is disallowed keeps a name with one public and one private
    address from being used to reach the private one.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise UnsafeTarget(f"Cannot resolve {host!r}: {exc}.") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise UnsafeTarget(f"{host!r} has no address.")
    refused = [a for a in addresses if not address_allowed(a, allow_private=allow_private)]
    if refused:
        raise UnsafeTarget(f"{host!r} resolves to a disallowed address ({', '.join(refused)}).")
    return addresses[0]


# --- sending ------------------------------------------------------------------------------

_clients: dict[int, httpx.Client] = {}


def _client() -> httpx.Client:
    """One HTTP client per process (a fork gets its own): no proxies from the environment,
    no redirects followed."""
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        client = httpx.Client(trust_env=False, follow_redirects=False, http2=False)
        _clients.clear()
        _clients[pid] = client
    return client


@dataclass(frozen=True)
class SendResult:
    status_code: int
    body: bytes


def post_signed(url: str, *, body: bytes, headers: dict[str, str]) -> SendResult:
    """POST ``body`` to ``url`` after the SSRF check, reading at most WEBHOOK_MAX_RESPONSE_BYTES.

    Raises ``UnsafeTarget`` or ``httpx.HTTPError`` (including a timeout).
    """
    allow_private = settings.WEBHOOK_ALLOW_PRIVATE_TARGETS
    check_url(url, allow_private=allow_private)
    target = httpx.URL(url)
    port = target.port or (443 if target.scheme == "https" else 80)
    address = resolve_target(target.host, port, allow_private=allow_private)
    limit = settings.WEBHOOK_MAX_RESPONSE_BYTES
    seconds = settings.WEBHOOK_TIMEOUT_SECONDS
    deadline = time.monotonic() + seconds
    host_header = target.netloc.decode("ascii")
    extensions: dict[str, Any] = {"sni_hostname": target.host} if target.scheme == "https" else {}
    request = _client().build_request(
        "POST",
        target.copy_with(host=address),
        content=body,
        headers={**headers, "Host": host_header, "Content-Type": "application/json"},
        timeout=httpx.Timeout(seconds),
        extensions=extensions,
    )
    response = _client().send(request, stream=True)
    try:
        received = bytearray()
        for chunk in response.iter_raw():
            received += chunk[: limit - len(received)]
            if len(received) >= limit:
                break  # the rest is not read
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout("the answer took longer than WEBHOOK_TIMEOUT_SECONDS", request=request)
        return SendResult(response.status_code, bytes(received))
    finally:
        response.close()


def signed_message(
    *, secret: str, msg_id: str, payload: dict[str, Any], now: datetime | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and the Standard Webhooks headers (webhook-id, -timestamp, -signature)."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC)
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    signature = Webhook(secret).sign(msg_id=msg_id, timestamp=stamp, data=body)
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(stamp.timestamp())),
        "webhook-signature": signature,
    }
    return body.encode(), headers


def message_payload(entries: list[LeaveHistory], *, now: datetime) -> dict[str, Any]:
    from .display import change_payload

    return {
        "type": EVENT_TYPE,
        "timestamp": now.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "data": {"changes": [change_payload(entry) for entry in entries]},
    }


# --- delivery -----------------------------------------------------------------------------


def lease_seconds() -> float:
    """How long a claim lasts: longer than the longest exchange (connect, write, read)."""
    return 3 * float(settings.WEBHOOK_TIMEOUT_SECONDS) + 10


def backoff_seconds(failures: int, *, rng: random.Random | None = None) -> float:
    """Exponential back-off with jitter: half of base * 2**(failures-1) (capped) plus a random half."""
    cap = float(settings.WEBHOOK_RETRY_MAX_SECONDS)
    ceiling: float = min(cap, float(settings.WEBHOOK_RETRY_BASE_SECONDS) * 2.0 ** max(0, min(failures - 1, 30)))
    jitter: float = (rng or random).uniform(0, ceiling / 2)
    return float(ceiling / 2 + jitter)


@dataclass(frozen=True)
class DeliveryOutcome:
    """What one call of ``webhook_deliver`` did. ``retry_in``: seconds until the next attempt
    (after a failure); ``more``: changes are waiting past the new cursor."""

    result: str  # idle, busy, waiting, delivered, skipped, failed, paused
    more: bool = False
    retry_in: float | None = None
    sent: int = 0


def _claim(subscription_id: int) -> str | None:
    token = secrets.token_hex(8)
    now = timezone.now()
    claimed = (
        WebhookSubscription.objects.filter(pk=subscription_id, is_active=True)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .update(lease_until=now + timedelta(seconds=lease_seconds()), lease_token=token)
    )
    return token if claimed else None


def _release(subscription_id: int, token: str, **fields: Any) -> int:
    return WebhookSubscription.objects.filter(pk=subscription_id, lease_token=token).update(
        lease_until=None, lease_token="", **fields
    )


def _why_not(subscription_id: int) -> str:
    sub = WebhookSubscription.objects.filter(pk=subscription_id).first()
    if sub is None or not sub.is_active:
        return "paused"
    if sub.next_attempt_at is not None and sub.next_attempt_at > timezone.now():
        return "waiting"
    return "busy"


def webhook_deliver(*, subscription_id: int) -> DeliveryOutcome:
    """Send the next batch of changes to one subscriber, if it is its turn (see the module doc)."""
    token = _claim(subscription_id)
    if token is None:
        return DeliveryOutcome(_why_not(subscription_id))
    try:
        return _deliver_claimed(subscription_id, token)
    except BaseException:
        # Anything unexpected (the database going away, a time limit): free the claim if we
        # still can, so the next attempt need not wait for the lease to expire.
        try:
            _release(subscription_id, token)
        except DatabaseError:
            logger.warning("could not release webhook lease %s", subscription_id, exc_info=True)
        raise


def _deliver_claimed(subscription_id: int, token: str) -> DeliveryOutcome:
    sub = WebhookSubscription.objects.get(pk=subscription_id)
    basis = sub.acked_version
    entries = list(LeaveHistory.objects.filter(version__gt=basis).order_by("version")[: settings.WEBHOOK_BATCH_SIZE])
    if not entries:
        _release(sub.pk, token)
        return DeliveryOutcome("idle")
    last = entries[-1].version
    wanted = [entry for entry in entries if sub.wants(entry.action)]
    if not wanted:
        _release(sub.pk, token, acked_version=last)
        return DeliveryOutcome("skipped", more=_more_after(last))

    started = timezone.now()
    first_attempt = sub.consecutive_failures == 0
    msg_id = f"sub{sub.pk}_v{wanted[0].version}-{wanted[-1].version}"
    body, headers = signed_message(
        secret=sub.secret, msg_id=msg_id, payload=message_payload(wanted, now=started), now=started
    )
    t0 = time.perf_counter()
    status_code: int | None = None
    error = ""
    try:
        answer = post_signed(sub.url, body=body, headers=headers)
        status_code = answer.status_code
        if not 200 <= status_code < 300:
            error = f"HTTP {status_code}"
    except UnsafeTarget as exc:
        error = f"refused: {exc}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    duration = time.perf_counter() - t0
    ok = not error
    if first_attempt:
        metrics.WEBHOOK_FIRST_ATTEMPT_SECONDS.observe(max(0.0, (started - wanted[0].at).total_seconds()))
    metrics.WEBHOOK_ATTEMPTS.labels(result="ok" if ok else "failed").inc()

    now = timezone.now()
    with transaction.atomic():
        WebhookDelivery.objects.create(
            subscription_id=sub.pk,
            first_version=wanted[0].version,
            last_version=wanted[-1].version,
            changes=len(wanted),
            attempt=sub.consecutive_failures + 1,
            ok=ok,
            status_code=status_code,
            error=error[:500],
            started_at=started,
            duration_ms=int(duration * 1000),
        )
        if ok:
            # The cursor moves only from where this batch started: a lease lost to another
            # worker (ours expired) cannot move it twice or backwards.
            moved = (
                WebhookSubscription.objects.filter(pk=sub.pk, lease_token=token, acked_version=basis).update(
                    acked_version=last,
                    consecutive_failures=0,
                    failing_since=None,
                    next_attempt_at=None,
                    last_attempt_at=now,
                    last_success_at=now,
                    last_status_code=status_code,
                    last_error="",
                    lease_until=None,
                    lease_token="",
                )
                > 0
            )
            outcome = DeliveryOutcome("delivered", sent=len(wanted)) if moved else DeliveryOutcome("busy")
        else:
            failing_since = sub.failing_since or started
            failures = sub.consecutive_failures + 1
            pause = now - failing_since >= timedelta(seconds=settings.WEBHOOK_PAUSE_AFTER_SECONDS)
            retry_in = backoff_seconds(failures)
            fields: dict[str, Any] = {
                "consecutive_failures": failures,
                "failing_since": failing_since,
                "next_attempt_at": now + timedelta(seconds=retry_in),
                "last_attempt_at": now,
                "last_status_code": status_code,
                "last_error": error[:500],
            }
            if pause:
                fields.update(
                    is_active=False,
                    paused_reason=f"failing since {failing_since:%Y-%m-%d %H:%M:%S} UTC: {error}"[:200],
                )
            _release(sub.pk, token, **fields)
            outcome = DeliveryOutcome("paused") if pause else DeliveryOutcome("failed", retry_in=retry_in)
    if outcome.result == "paused":
        logger.warning("webhook subscription %s paused: %s", sub.pk, error)
    if outcome.result == "delivered":
        return DeliveryOutcome("delivered", sent=len(wanted), more=_more_after(last))
    return outcome


def _more_after(version: int) -> bool:
    """Whether a change past ``version`` is committed (read after the lease is released, so a
    change whose kick found the subscriber busy is not left waiting for the sweep)."""
    return LeaveHistory.objects.filter(version__gt=version).exists()


# --- waking deliveries --------------------------------------------------------------------


def _enqueue(subscription_ids: Iterable[int], *, countdown: float | None = None) -> int:
    from .tasks import deliver_webhooks

    count = 0
    for pk in subscription_ids:
        if countdown is None:
            deliver_webhooks.apply_async((pk,), retry=False)
        else:
            deliver_webhooks.apply_async((pk,), countdown=countdown, retry=False)
        count += 1
    return count


def kick_webhooks() -> None:
    """After a change commits: wake the delivery of every active subscriber.

    Never raises: the change is committed and a broker or database hiccup here only delays
    delivery until the sweep.
    """
    from kombu.exceptions import OperationalError as BrokerError

    try:
        now = timezone.now()
        # A subscriber being delivered to (lease held) re-checks for new changes after its
        # batch; one backing off has its retry scheduled: neither needs another task.
        ids = list(
            WebhookSubscription.objects.filter(is_active=True)
            .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
            .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
            .values_list("pk", flat=True)
        )
        _enqueue(ids)
    except (BrokerError, DatabaseError, OSError):
        logger.warning("webhook kick failed; the sweep will deliver", exc_info=True)


def schedule_next(subscription_id: int, outcome: DeliveryOutcome) -> None:
    """Chain the next step of a subscriber's delivery: the next batch, or the retry."""
    if outcome.retry_in is not None:
        _enqueue([subscription_id], countdown=outcome.retry_in)
    elif outcome.more:
        _enqueue([subscription_id])


def webhooks_sweep() -> int:
    """Wake every active subscriber whose cursor lags the clock and whose turn it is; remove
    delivery log rows past retention. Returns how many were woken."""
    version = LeaveClock.objects.filter(pk=1).values_list("version", flat=True).first() or 0
    now = timezone.now()
    ids = list(
        WebhookSubscription.objects.filter(is_active=True, acked_version__lt=version)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .values_list("pk", flat=True)
    )
    WebhookDelivery.objects.filter(started_at__lt=now - timedelta(days=settings.WEBHOOK_LOG_RETENTION_DAYS)).delete()
    return _enqueue(ids)


# --- subscriptions ------------------------------------------------------------------------


def check_actions(actions: Iterable[str]) -> list[str]:
    """The actions a subscriber may ask for: ChangeAction's values (data-driven)."""
    chosen = list(dict.fromkeys(actions))
    unknown = [a for a in chosen if a not in ChangeAction.values]
    if unknown:
        names = ", ".join(map(repr, unknown))
        raise ValueError(f"Unknown action(s) {names}; choose from {', '.join(ChangeAction.values)}.")
    return chosen


def webhook_subscription_create(
    *, name: str, url: str, actions: Iterable[str] = (), secret: str | None = None, after: int | None = None
) -> WebhookSubscription:
    """A new subscriber. It receives the changes after ``after`` (default: from now on)."""
    check_url(url)
    start = (
        after if after is not None else (LeaveClock.objects.filter(pk=1).values_list("version", flat=True).first() or 0)
    )
    fields: dict[str, Any] = {"name": name, "url": url, "actions": check_actions(actions), "acked_version": start}
    if secret:
        fields["secret"] = secret
    subscription = WebhookSubscription.objects.create(**fields)
    transaction.on_commit(lambda: _safe_enqueue(subscription.pk))
    return subscription


def webhook_subscription_update(*, subscription: WebhookSubscription, **changes: Any) -> WebhookSubscription:
    """Change url, name, actions or is_active. Resuming clears the failure state and wakes it."""
    if "url" in changes:
        check_url(changes["url"])
    if "actions" in changes:
        changes["actions"] = check_actions(changes["actions"])
    resumed = changes.get("is_active") is True and not subscription.is_active
    for field, value in changes.items():
        setattr(subscription, field, value)
    if resumed:
        subscription.paused_reason = ""
        subscription.failing_since = None
        subscription.consecutive_failures = 0
        subscription.next_attempt_at = None
    elif changes.get("is_active") is False:
        subscription.paused_reason = subscription.paused_reason or "paused by an operator"
    subscription.save()
    if subscription.is_active:
        transaction.on_commit(lambda: _safe_enqueue(subscription.pk))
    return subscription


def _safe_enqueue(subscription_id: int) -> None:
    from kombu.exceptions import OperationalError as BrokerError

    try:
        _enqueue([subscription_id])
    except (BrokerError, OSError):
        logger.warning("could not wake webhook subscription %s; the sweep will", subscription_id, exc_info=True)


@dataclass(frozen=True)
class SubscriptionLag:
    versions: int
    seconds: float


def webhook_lag(subscription: WebhookSubscription, *, clock_version: int | None = None) -> SubscriptionLag:
    """How far a subscriber is behind: changes past its cursor, and the age of the oldest."""
    version = clock_version
    if version is None:
        version = LeaveClock.objects.filter(pk=1).values_list("version", flat=True).first() or 0
    behind = max(0, version - subscription.acked_version)
    if not behind:
        return SubscriptionLag(0, 0.0)
    oldest = (
        LeaveHistory.objects.filter(version__gt=subscription.acked_version)
        .order_by("version")
        .values_list("at", flat=True)
        .first()
    )
    age = (timezone.now() - oldest).total_seconds() if oldest is not None else 0.0
    return SubscriptionLag(behind, max(0.0, age))


def lag_samples() -> list[tuple[WebhookSubscription, SubscriptionLag]]:
    """Every subscriber with its lag (the admin, the API and /metrics)."""
    version = LeaveClock.objects.filter(pk=1).values_list("version", flat=True).first() or 0
    return [(sub, webhook_lag(sub, clock_version=version)) for sub in WebhookSubscription.objects.all()]


def lag_metrics() -> Iterable[Any]:
    """/metrics: each subscriber's acknowledged version and lag (read when scraped)."""
    from prometheus_client.core import GaugeMetricFamily

    acked = GaugeMetricFamily(
        "tidal_webhook_acked_version", "A subscriber's acknowledged version.", labels=["subscription", "active"]
    )
    lag = GaugeMetricFamily("tidal_webhook_lag_versions", "Changes not yet acknowledged.", labels=["subscription"])
    age = GaugeMetricFamily(
        "tidal_webhook_lag_seconds", "Age of the oldest change not yet acknowledged.", labels=["subscription"]
    )
    try:
        samples = lag_samples()
    except DatabaseError:
        logger.warning("webhook lag metrics unavailable", exc_info=True)
        return []
    for sub, behind in samples:
        acked.add_metric([str(sub.pk), "true" if sub.is_active else "false"], sub.acked_version)
        lag.add_metric([str(sub.pk)], behind.versions)
        age.add_metric([str(sub.pk)], behind.seconds)
    return [acked, lag, age]
