"""API tokens: shown once, stored only as a hash, expiring, revoked, rotated; over real HTTP."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.apps import apps
from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from knox.models import AuthToken

from accounts.services import token_issue
from accounts.tasks import delete_expired_tokens
from tests.accounts.web import Browser
from tests.factories import PASSWORD, UserFactory, service_account
from tests.helpers import run_command

pytestmark = pytest.mark.django_db(transaction=True)

STATUS = "/api/community-layer/{}/"


def status_with(live_server, token: str, user_id: int) -> int:
    return Browser(live_server.url, {"Authorization": f"Token {token}"}).request("GET", STATUS.format(user_id)).status


def test_the_token_endpoint_issues_an_expiring_token_stored_only_hashed(live_server) -> None:
    member = UserFactory()
    r = Browser(live_server.url).token_log_in(member.username, PASSWORD)
    assert r.status == 200 and set(r.json()) == {"token", "expiry"}
    token = r.json()["token"]
    expiry = parse_datetime(r.json()["expiry"])
    assert len(token) == 64
    assert expiry is not None and timedelta(hours=23) < expiry - timezone.now() <= timedelta(hours=24)
    assert status_with(live_server, token, member.pk) == 200

    row = AuthToken.objects.get(user=member)
    assert row.digest == hashlib.sha512(token.encode()).hexdigest()
    assert token not in {row.digest, row.token_key} and row.token_key == token[:15]
    # Nowhere in the database as sent.
    with connection.cursor() as cursor:
        cursor.execute("SELECT digest, token_key FROM knox_authtoken")
        assert all(token not in value for row_values in cursor.fetchall() for value in row_values)
    assert row.expiry == expiry


def test_service_accounts_get_longer_lived_tokens(live_server, settings) -> None:
    settings.SERVICE_TOKEN_TTL_DAYS = 30
    service = service_account()
    r = Browser(live_server.url).token_log_in(service.username, PASSWORD)
    expiry = parse_datetime(r.json()["expiry"])
    assert expiry is not None and timedelta(days=29) < expiry - timezone.now() <= timedelta(days=30)


def test_each_log_in_issues_a_new_token_and_the_old_ones_keep_working(live_server) -> None:
    member = UserFactory()
    first = Browser(live_server.url).token_log_in(member.username, PASSWORD).json()["token"]
    second = Browser(live_server.url).token_log_in(member.username, PASSWORD).json()["token"]
    assert first != second
    assert status_with(live_server, first, member.pk) == 200 and status_with(live_server, second, member.pk) == 200


def test_an_expired_token_is_refused(live_server) -> None:
    member = UserFactory()
    row, token = token_issue(user=member)
    assert status_with(live_server, token, member.pk) == 200
    AuthToken.objects.filter(pk=row.pk).update(expiry=timezone.now() - timedelta(seconds=1))
    r = Browser(live_server.url, {"Authorization": f"Token {token}"}).request("GET", STATUS.format(member.pk))
    assert r.status == 401 and r.headers["WWW-Authenticate"] == "Token"


def test_a_request_reads_only_its_own_token_and_the_sweep_deletes_the_expired_ones(live_server) -> None:
    member, other = UserFactory(), UserFactory()
    _, token = token_issue(user=member)
    stale, _ = token_issue(user=member)
    others_stale, _ = token_issue(user=other)
    _, others_valid = token_issue(user=other)
    AuthToken.objects.filter(pk__in=[stale.pk, others_stale.pk]).update(expiry=timezone.now() - timedelta(seconds=1))
    assert status_with(live_server, token, member.pk) == 200
    # knox's own class reads all of the user's tokens on each request and deletes this one.
    assert AuthToken.objects.filter(pk=stale.pk).exists()

    assert delete_expired_tokens.apply().get() == 2
    assert set(AuthToken.objects.values_list("user_id", flat=True)) == {member.pk, other.pk}
    assert not AuthToken.objects.filter(pk__in=[stale.pk, others_stale.pk]).exists()
    assert status_with(live_server, others_valid, other.pk) == 200


def test_a_token_from_a_database_dump_does_not_authenticate(live_server) -> None:
    member = UserFactory()
    _, token = token_issue(user=member)
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM knox_authtoken")
        dumped = [str(value) for row in cursor.fetchall() for value in row]
    assert token not in dumped
    for value in dumped:
        assert status_with(live_server, value, member.pk) == 401, value
    assert status_with(live_server, token, member.pk) == 200


def test_an_operator_lists_and_revokes_tokens_in_the_admin(live_server) -> None:
    member = UserFactory(username="holder")
    row, token = token_issue(user=member)
    UserFactory(username="root", is_staff=True, is_superuser=True)
    operator = Browser(live_server.url)
    assert operator.admin_log_in("root", PASSWORD).status == 302
    listing = operator.request("GET", "/admin/knox/authtoken/")
    assert listing.status == 200 and b"holder" in listing.body and row.token_key.encode() in listing.body
    # The digest is the row's key, in the page's links; only the token itself must not be there.
    assert token.encode() not in listing.body
    assert operator.request("GET", "/admin/knox/authtoken/add/").status == 403

    csrf = next(c.value for c in operator.cookies if c.name == "csrftoken")
    r = operator.request(
        "POST",
        "/admin/knox/authtoken/",
        {"csrfmiddlewaretoken": csrf, "action": "revoke", "_selected_action": row.pk},
        Referer=live_server.url + "/admin/knox/authtoken/",
    )
    assert r.status == 302
    assert not AuthToken.objects.filter(user=member).exists()
    assert status_with(live_server, token, member.pk) == 401


def test_rotation_issues_a_new_token_and_the_old_one_works_for_the_overlap(live_server) -> None:
    service = service_account(username="svc")
    _, old = token_issue(user=service)
    new = run_command("rotate_token", "svc", "--overlap-hours", "2").strip().splitlines()[-1]
    assert new != old
    assert status_with(live_server, old, service.pk) == 200 and status_with(live_server, new, service.pk) == 200

    old_row = AuthToken.objects.get(token_key=old[:15])
    new_row = AuthToken.objects.get(token_key=new[:15])
    assert timedelta(hours=1) < old_row.expiry - timezone.now() <= timedelta(hours=2)
    assert new_row.expiry - timezone.now() > timedelta(days=80)
    # When the overlap has passed, only the new token works.
    AuthToken.objects.filter(pk=old_row.pk).update(expiry=timezone.now() - timedelta(seconds=1))
    assert status_with(live_server, old, service.pk) == 401 and status_with(live_server, new, service.pk) == 200


def test_rotation_with_no_overlap_retires_the_old_token_at_once(live_server) -> None:
    member = UserFactory(username="m")
    _, old = token_issue(user=member)
    new = run_command("rotate_token", "m", "--overlap-hours", "0").strip().splitlines()[-1]
    assert status_with(live_server, old, member.pk) == 401
    assert status_with(live_server, new, member.pk) == 200


def test_create_service_account_prints_a_working_token_on_its_last_line(live_server) -> None:
    token = run_command("create_service_account", "drill-like").strip().splitlines()[-1]
    service = AuthToken.objects.get().user
    assert service.username == "drill-like"
    assert status_with(live_server, token, service.pk) == 200


def test_legacy_drf_tokens_are_hashed_and_keep_working(live_server) -> None:
    """The data migration: an authtoken key as clients hold it authenticates; its plaintext is gone."""
    hash_legacy_tokens = __import__(
        "accounts.migrations.0001_hash_legacy_drf_tokens", fromlist=["hash_legacy_tokens"]
    ).hash_legacy_tokens
    member = UserFactory()
    key = "0123456789abcdef0123456789abcdef01234567"  # 40 hex digits, as DRF makes them
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamp, user_id bigint)")
        try:
            cursor.execute("INSERT INTO authtoken_token VALUES (%s, %s, %s)", [key, timezone.now(), member.pk])
            with connection.schema_editor() as editor:
                hash_legacy_tokens(apps, editor)
            cursor.execute("SELECT count(*) FROM authtoken_token")
            assert cursor.fetchone() == (0,)
        finally:
            cursor.execute("DROP TABLE authtoken_token")
    assert status_with(live_server, key, member.pk) == 200
    row = AuthToken.objects.get(user=member)
    assert row.expiry - timezone.now() > timedelta(days=80)
    assert status_with(live_server, key[:-1] + "8", member.pk) == 401
