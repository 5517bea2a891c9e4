"""The content security policy and the other security headers, on every kind of page, over HTTP."""

from __future__ import annotations

import re

import pytest

from tests.accounts.web import Browser
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

PAGES = [
    "/admin/login/",
    "/admin/",
    "/admin/community/communityleave/",
    "/admin/community/communityleave/console/",
    "/admin/community/communityleave/console/user/42/",
    "/admin/community/communityleave/console/bulk-leave/",
    "/api/docs/",
    "/api/docs/?script=",
    "/api/schema/",
    "/api/community-layer/42/",
    "/health/",
]


def fetch(live_server, path: str):
    """As an operator sees the page; the log-in page as someone not yet logged in."""
    UserFactory(username="root", is_staff=True, is_superuser=True)
    web = Browser(live_server.url)
    if path != "/admin/login/":
        assert web.admin_log_in("root", "pw-for-tests").status == 302
    return web.request("GET", path)


def directives(header: str) -> dict[str, list[str]]:
    parts = [part.split() for part in header.split(";") if part.strip()]
    return {part[0]: part[1:] for part in parts}


@pytest.mark.parametrize("path", PAGES)
def test_every_page_carries_the_policy_and_headers(live_server, path) -> None:
    r = fetch(live_server, path)
    assert r.status == 200, (path, r.status)
    policy = directives(r.headers["Content-Security-Policy"])
    assert policy["script-src"] == ["'self'"]
    assert policy["style-src"] == ["'self'"]
    assert policy["default-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    assert not any("unsafe" in value for values in policy.values() for value in values)
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["X-Frame-Options"] == "DENY"
    assert r.headers["Referrer-Policy"] == "same-origin"
    assert r.headers["Cross-Origin-Opener-Policy"] == "same-origin"
    assert "camera=()" in r.headers["Permissions-Policy"]


@pytest.mark.parametrize("path", ["/admin/login/", "/admin/", "/admin/community/communityleave/console/", "/api/docs/"])
def test_no_page_has_an_inline_script(live_server, path) -> None:
    html = fetch(live_server, path).body.decode()
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, flags=re.S)
    assert scripts or path == "/admin/login/", path
    for attributes, body in scripts:
        # Either a file of the service, or a JSON data block (which never runs).
        assert "src=" in attributes or 'type="application/json"' in attributes, (path, attributes)
        assert "src=" not in attributes or not body.strip()
    assert not re.search(r"\son[a-z]+\s*=", html), path  # no inline event handlers
