"""Log-in lockout (django-axes) in the admin and at the token endpoint, over real HTTP."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command
from django.utils import timezone
from prometheus_client import REGISTRY

from tests.accounts.web import Browser
from tests.factories import PASSWORD, UserFactory

# live_server answers from another thread: what a test writes must be committed.
pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 5  # LOGIN_FAILURE_LIMIT's default


@pytest.fixture
def admin_user() -> object:
    return UserFactory(username="root", is_staff=True, is_superuser=True)


@pytest.fixture
def behind_proxy(settings: pytest.FixtureRequest) -> None:
    """As behind a proxy that sets X-Real-IP: each test client may then have its own address."""
    settings.CLIENT_IP_HEADER = "X-Real-IP"  # type: ignore[attr-defined]


def test_admin_refuses_the_right_password_after_the_failure_limit(live_server, admin_user) -> None:
    web = Browser(live_server.url)
    for _ in range(LIMIT - 1):
        r = web.admin_log_in("root", "wrong")
        assert r.status == 200 and b"Please enter the correct username and password" in r.body
    r = web.admin_log_in("root", "wrong")
    assert r.status == 429 and b"Too many failed log-ins" in r.body
    assert int(r.headers["Retry-After"]) == 15 * 60

    r = web.admin_log_in("root", PASSWORD)
    assert r.status == 429
    assert not web.logged_in()
    attempt = AccessAttempt.objects.get(username="root")
    assert attempt.ip_address == "127.0.0.1" and attempt.failures_since_start == LIMIT


def test_token_endpoint_refuses_the_right_password_after_the_failure_limit(live_server, admin_user) -> None:
    web = Browser(live_server.url)
    for _ in range(LIMIT - 1):
        r = web.token_log_in("root", "wrong")
        assert r.status == 400 and r.json() == {"non_field_errors": ["Unable to log in with provided credentials."]}
    r = web.token_log_in("root", "wrong")
    assert r.status == 429 and "Too many failed log-ins" in r.json()["detail"]
    r = web.token_log_in("root", PASSWORD)
    assert r.status == 429 and set(r.json()) == {"detail"}
    assert r.headers["Retry-After"] == str(15 * 60)


def test_a_lockout_shuts_both_doors(live_server, admin_user) -> None:
    web = Browser(live_server.url)
    for _ in range(LIMIT):
        web.token_log_in("root", "wrong")
    assert web.admin_log_in("root", PASSWORD).status == 429
    assert not web.logged_in()


def test_lockout_is_per_account_and_address(live_server, admin_user, behind_proxy) -> None:
    other = UserFactory(username="other")
    attacker = Browser(live_server.url, {"X-Real-IP": "203.0.113.9"})
    for _ in range(LIMIT):
        attacker.admin_log_in("root", "wrong")
    assert attacker.admin_log_in("root", PASSWORD).status == 429

    # The operator, from their own address, is not locked out by the attacker's guesses.
    operator = Browser(live_server.url, {"X-Real-IP": "198.51.100.7"})
    assert operator.admin_log_in("root", PASSWORD).status == 302
    assert operator.logged_in()
    # Nor is another account from the attacker's address.
    assert Browser(live_server.url, {"X-Real-IP": "203.0.113.9"}).token_log_in(other.username, PASSWORD).status == 200


def test_a_forwarded_for_header_sent_by_the_client_is_not_believed(live_server, admin_user) -> None:
    """Without CLIENT_IP_HEADER the address is the TCP peer's: a new X-Forwarded-For per guess changes nothing."""
    for n in range(LIMIT):
        Browser(live_server.url, {"X-Forwarded-For": f"192.0.2.{n}", "X-Real-IP": f"192.0.2.{n}"}).token_log_in(
            "root", "wrong"
        )
    r = Browser(live_server.url, {"X-Forwarded-For": "192.0.2.200"}).token_log_in("root", PASSWORD)
    assert r.status == 429
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == ["127.0.0.1"]


def test_behind_a_proxy_the_right_most_forwarded_address_counts(live_server, admin_user, settings) -> None:
    settings.CLIENT_IP_HEADER = "X-Forwarded-For"
    # The client writes addresses of its own choosing; the proxy appends the real one.
    for n in range(LIMIT):
        Browser(live_server.url, {"X-Forwarded-For": f"192.0.2.{n}, 203.0.113.9"}).token_log_in("root", "wrong")
    assert Browser(live_server.url, {"X-Forwarded-For": "203.0.113.9"}).token_log_in("root", PASSWORD).status == 429
    assert Browser(live_server.url, {"X-Forwarded-For": "203.0.113.10"}).token_log_in("root", PASSWORD).status == 200


def test_the_lockout_ends_when_the_window_has_passed(live_server, admin_user) -> None:
    web = Browser(live_server.url)
    for _ in range(LIMIT):
        web.token_log_in("root", "wrong")
    assert web.token_log_in("root", PASSWORD).status == 429
    # Move the failures back past the window rather than wait for it.
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=15, seconds=1))
    assert web.token_log_in("root", PASSWORD).status == 200


def test_an_operator_unlocks_an_account(live_server, admin_user) -> None:
    web = Browser(live_server.url)
    for _ in range(LIMIT):
        web.admin_log_in("root", "wrong")
    assert web.admin_log_in("root", PASSWORD).status == 429
    call_command("axes_reset_username", "root")
    assert web.admin_log_in("root", PASSWORD).status == 302
    assert web.logged_in()


def test_lockouts_are_visible_in_the_admin_and_unlocked_there(live_server, admin_user) -> None:
    victim = UserFactory(username="victim")
    for _ in range(LIMIT):
        Browser(live_server.url).token_log_in(victim.username, "wrong")
    operator = Browser(live_server.url, {"X-Real-IP": "198.51.100.7"})
    # Same address as the attacker (no proxy here), but another account: not locked out.
    assert operator.admin_log_in("root", PASSWORD).status == 302
    page = operator.request("GET", "/admin/axes/accessattempt/")
    assert page.status == 200 and b"victim" in page.body and b"127.0.0.1" in page.body
    assert operator.request("GET", "/admin/axes/accessfailurelog/").status == 200

    # Deleting the attempt is the admin's unlock.
    attempt = AccessAttempt.objects.get(username="victim")
    confirm = operator.request("GET", f"/admin/axes/accessattempt/{attempt.pk}/delete/")
    csrf = next(c.value for c in operator.cookies if c.name == "csrftoken")
    r = operator.request(
        "POST",
        f"/admin/axes/accessattempt/{attempt.pk}/delete/",
        {"csrfmiddlewaretoken": csrf, "post": "yes"},
        Referer=live_server.url + f"/admin/axes/accessattempt/{attempt.pk}/delete/",
    )
    assert confirm.status == 200 and r.status == 302
    assert Browser(live_server.url).token_log_in("victim", PASSWORD).status == 200


def test_a_success_clears_the_failures_before_it(live_server, admin_user) -> None:
    web = Browser(live_server.url)
    for _ in range(LIMIT - 1):
        web.token_log_in("root", "wrong")
    assert web.token_log_in("root", PASSWORD).status == 200
    for _ in range(LIMIT - 1):
        web.token_log_in("root", "wrong")
    assert web.token_log_in("root", PASSWORD).status == 200


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_failures_and_lockouts_are_counted_and_logged(live_server, admin_user, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="accounts.receivers")
    names = {
        "wrong": ("tidal_login_failures_total", {"entry": "api", "reason": "credentials"}),
        "refused": ("tidal_login_failures_total", {"entry": "api", "reason": "locked"}),
        "admin refused": ("tidal_login_failures_total", {"entry": "admin", "reason": "locked"}),
        "lockouts": ("tidal_login_lockouts_total", {"entry": "api"}),
    }
    before = {key: sample(name, **labels) for key, (name, labels) in names.items()}
    web = Browser(live_server.url)
    for _ in range(LIMIT + 2):
        web.token_log_in("root", "wrong")
    web.admin_log_in("root", PASSWORD)
    after = {key: sample(name, **labels) - before[key] for key, (name, labels) in names.items()}

    assert after == {"wrong": LIMIT, "refused": 2, "admin refused": 1, "lockouts": 1}
    failed = [r for r in caplog.records if r.getMessage() == "log-in failed"]
    locked = [r for r in caplog.records if r.getMessage() == "log-in locked out"]
    assert len(failed) == LIMIT + 3 and {r.username for r in failed} == {"root"}  # type: ignore[attr-defined]
    assert len(locked) == 1 and locked[0].client_ip == "127.0.0.1"  # type: ignore[attr-defined]
    assert all("wrong" not in r.getMessage() and "wrong" not in str(r.__dict__) for r in caplog.records)
