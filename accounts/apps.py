from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Access"

    def ready(self) -> None:
        # No query here; connecting with a dispatch_uid keeps ready() idempotent.
        from axes.signals import user_locked_out
        from django.contrib.auth.signals import user_login_failed

        from .receivers import count_lockout, count_login_failure

        user_login_failed.connect(count_login_failure, dispatch_uid="accounts.count_login_failure")
        user_locked_out.connect(count_lockout, dispatch_uid="accounts.count_lockout")
