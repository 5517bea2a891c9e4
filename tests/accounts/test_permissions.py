"""The model backend's permissions, own and through groups, read in one query: Django's answers;
whether an account is a service account, read once a request."""

from __future__ import annotations

import pytest
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import AnonymousUser, Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.backends import OneQueryModelBackend
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

OWN = "community.change_communityleave"
BY_GROUP = "signals_app.view_signal"
BOTH = "community.view_communityleave"


def permission(label: str) -> Permission:
    app_label, codename = label.split(".")
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)


@pytest.fixture
def user():
    user = UserFactory(perms=[OWN, BOTH])
    group = Group.objects.create(name="readers")
    group.permissions.add(permission(BY_GROUP), permission(BOTH))
    user.groups.add(group)
    return user


def fresh(user):
    """The same account as a new request loads it: nothing cached on the object."""
    return type(user).objects.get(pk=user.pk)


def test_own_and_group_permissions_are_djangos_in_one_query(user) -> None:
    account = fresh(user)
    with CaptureQueriesContext(connection) as queries:
        perms = OneQueryModelBackend().get_all_permissions(account)
    assert perms == {OWN, BY_GROUP, BOTH} == ModelBackend().get_all_permissions(fresh(user))
    assert len(queries) == 1


def test_the_account_asks_once_a_request(user) -> None:
    account = fresh(user)
    with CaptureQueriesContext(connection) as queries:
        assert account.has_perm(OWN) and account.has_perm(BY_GROUP)
        assert not account.has_perm("community.erase_communityleave")
        assert account.has_module_perms("signals_app")
    assert len(queries) == 1


def test_superusers_have_every_permission_inactive_and_anonymous_accounts_none(user) -> None:
    backend = OneQueryModelBackend()
    boss = UserFactory(is_superuser=True)
    assert backend.get_all_permissions(boss) == ModelBackend().get_all_permissions(fresh(boss))
    assert len(backend.get_all_permissions(boss)) == Permission.objects.count()
    user.is_active = False
    assert backend.get_all_permissions(user) == set()
    assert backend.get_all_permissions(AnonymousUser()) == set()
    assert backend.get_all_permissions(fresh(user), obj=user) == set()  # no per-object permissions


def test_a_user_without_permissions_has_none(db) -> None:
    assert OneQueryModelBackend().get_all_permissions(UserFactory()) == set()


def test_a_service_account_is_known_as_one_with_one_query_a_request(db) -> None:
    from tests.factories import service_account
    from tidalproject.roles import is_service_account

    for account, expected in ((fresh(service_account()), True), (fresh(UserFactory()), False)):
        with CaptureQueriesContext(connection) as queries:
            assert is_service_account(account) is expected  # the throttle asks,
            assert is_service_account(account) is expected  # then the ingest's key rule
        assert len(queries) == 1
    assert is_service_account(AnonymousUser()) is False
