from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The operators' console in the admin: it reads both the leave records and the signals,
    so it sits above both apps (listed after them in INSTALLED_APPS)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "console"
