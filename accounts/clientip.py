"""The client's address, for log-in lockouts and the log-in throttle: one rule for both.

Without ``CLIENT_IP_HEADER`` the address is the TCP peer (``REMOTE_ADDR``): headers sent by a
client are never believed, or an attacker would pick a new address for every guess. Behind a
proxy, ``CLIENT_IP_HEADER`` names the header that the proxy sets. For ``X-Forwarded-For``
the right-most address is taken: the one the trusted proxy appended, not those the client
wrote before it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings


def client_ip(request: Any) -> str:
    meta = request.META
    header = settings.CLIENT_IP_HEADER
    if header:
        value = meta.get("HTTP_" + header.upper().replace("-", "_"), "")
        address = value.split(",")[-1].strip()
        if address:
            return str(address)
    return str(meta.get("REMOTE_ADDR") or "")
