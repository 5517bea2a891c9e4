from __future__ import annotations

from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

PASSWORD = "pw-for-tests"  # every account's, for the tests that log in through a form
# A console operator: reads and changes leave records, reads signals.
OPERATOR_PERMS = [
    "community.view_communityleave",
    "community.change_communityleave",
    "community.add_communityleave",
    "signals_app.view_signal",
]


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def perms(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        """``UserFactory(perms=["community.change_communityleave"])``."""
        if create and extracted:
            for label in extracted:
                app_label, codename = label.split(".")
                self.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        self.save()


def service_account(**kwargs: Any) -> Any:
    from django.conf import settings

    user = UserFactory(**kwargs)
    group, _ = Group.objects.get_or_create(name=settings.SERVICE_ACCOUNT_GROUP)
    user.groups.add(group)
    return user


def api_token(user: Any) -> str:
    """A new API token for ``user``, as the log-in endpoint or a command would issue it."""
    from accounts.services import token_issue

    return token_issue(user=user)[1]
