"""A webhook message: its Standard Webhooks signature, and the HTTP exchange that posts it to
the address the SSRF check allowed."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from django.conf import settings
from standardwebhooks.webhooks import Webhook

from ..models import LeaveHistory
from .ssrf import check_url, resolve_target

EVENT_TYPE = "community_layer.changes"


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
    from ..display import change_payload

    return {
        "type": EVENT_TYPE,
        "timestamp": now.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "data": {"changes": [change_payload(entry) for entry in entries]},
    }
