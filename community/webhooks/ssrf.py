"""Which webhook targets may be called: the rules on a URL, and on every address its host
resolves to (server-side request forgery)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

import httpx
from django.conf import settings

MAX_URL_LENGTH = 2000


class UnsafeTarget(ValueError):
    """The URL may not be called: its scheme, or an address its host resolves to."""


NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _as_ipv4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo's client, NAT64), or itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip.teredo is not None:
            return ip.teredo[1]
        if ip in NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def address_allowed(address: str, *, allow_private: bool) -> bool:
    """Whether a resolved address may be called.

    Only globally routable unicast addresses that are not reserved, unless ``allow_private``:
    then anything but multicast and the unspecified address. An IPv6 address that carries an
    IPv4 one (mapped, 6to4, Teredo, NAT64) is judged by the IPv4 address.
    """
    ip = _as_ipv4(ipaddress.ip_address(address.split("%", 1)[0]))
    if ip.is_multicast or ip.is_unspecified:
        return False
    return allow_private or (ip.is_global and not ip.is_reserved and not getattr(ip, "is_site_local", False))


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
        host = httpx.URL(url).host  # as the sender will read it (IDNA 2008 host names)
        parts.hostname.encode("idna")  # as the resolver will encode it
    except (httpx.InvalidURL, UnicodeError) as exc:
        raise UnsafeTarget(f"Not a valid host name: {exc}.") from None
    if not host:
        raise UnsafeTarget("The URL needs a host.")
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
    except (OSError, UnicodeError) as exc:
        raise UnsafeTarget(f"Cannot resolve {host!r}: {exc}.") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise UnsafeTarget(f"{host!r} has no address.")
    refused = [a for a in addresses if not address_allowed(a, allow_private=allow_private)]
    if refused:
        raise UnsafeTarget(f"{host!r} resolves to a disallowed address ({', '.join(refused)}).")
    return addresses[0]
