"""Settings shared by every environment, read from the environment with django-environ.

With nothing set, the service runs embedded: SQLite in the project folder and a Celery
broker on the filesystem (kombu's filesystem transport), so a first run needs no server.
Production sets DATABASE_URL (PostgreSQL) and CELERY_BROKER_URL (Redis or RabbitMQ).

Groups of settings live in modules of their own, imported here: ``environment`` (the project
folder and ``env``, the one reader of the environment), ``security`` (log-in lockout, API
tokens, content security policy and headers) and ``celery`` (broker, workers, beat).
"""

from pathlib import Path
from typing import Any

import django_stubs_ext

from .celery import *  # noqa: F403
from .environment import *  # noqa: F403
from .environment import BASE_DIR, env
from .security import *  # noqa: F403

# Lets the typed generics (ModelAdmin[Model], Serializer[T]) be subscripted at run time.
django_stubs_ext.monkeypatch()

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str("SECRET_KEY", default="")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.forms",  # the form templates, for FORM_RENDERER below
    "rest_framework",
    "knox",
    "axes",
    "csp",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "health_check",
    "accounts",
    "community",
    "signals_app",
    # Above both: the operators' console reads leave records and signals.
    "console",
]

MIDDLEWARE = [
    "tidalproject.logs.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "tidalproject.security.PermissionsPolicyMiddleware",
    # Last: turns a log-in refused by a lockout into the lockout answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "tidalproject.urls"
WSGI_APPLICATION = "tidalproject.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Before the apps' folders (django.contrib.admin's included): admin/base_site.html.
        "DIRS": [BASE_DIR / "tidalproject" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Widgets render through TEMPLATES, so that tidalproject/templates can override one of the
# admin's (admin/widgets/split_datetime.html: labelled date and time inputs).
FORM_RENDERER = "django.forms.renderers.TemplatesSetting"

# --- Database ---------------------------------------------------------------------------
DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes the write lock when a transaction starts, so two processes that
    # read-then-write (leave, rejoin) queue up instead of failing with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {}).update({"transaction_mode": "IMMEDIATE", "timeout": 20})
    # A file, not memory, so that other processes in the tests can open the test database.
    _db_name = Path(DATABASES["default"]["NAME"])
    DATABASES["default"]["TEST"] = {"NAME": str(_db_name.with_name(f"{_db_name.stem}_test.sqlite3"))}
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
    DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
    # A database that does not answer makes a request or a task fail fast (and retry), instead
    # of hanging a web worker past its timeout or a Celery child past its start-up limit.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
        "connect_timeout", env.int("DATABASE_CONNECT_TIMEOUT", default=5)
    )
    # Behind PgBouncer in transaction mode: no server-side cursors (they need the session).
    # No statement is ever prepared (Django's default prepare_threshold of None), which such a
    # pooler also needs.
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = env.bool(
        "DATABASE_DISABLE_SERVER_SIDE_CURSORS", default=False
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Cache (throttling counters) --------------------------------------------------------
# Several web processes must share throttle counters: point CACHE_URL at Redis in production.
CACHES = {"default": env.cache_url("CACHE_URL", default="locmemcache://")}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env.path("STATIC_ROOT", default=str(BASE_DIR / "staticfiles"))
STATICFILES_DIRS = [BASE_DIR / "tidalproject" / "static"]  # the admin's site-wide stylesheet and script

# --- REST framework ---------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "tidalproject.api.Pagination",
    "DEFAULT_PARSER_CLASSES": [
        "tidalproject.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_RATES": {
        # Writes by ordinary accounts, per account.
        "write": env.str("THROTTLE_WRITE_RATE", default="60/minute"),
        # Writes by service accounts (members of SERVICE_ACCOUNT_GROUP), per account.
        "service_write": env.str("THROTTLE_SERVICE_WRITE_RATE", default="6000/minute"),
        # Token log-ins, per client address.
        "login": env.str("THROTTLE_LOGIN_RATE", default="10/minute"),
    },
    "EXCEPTION_HANDLER": "tidalproject.api.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Tidal community layer",
    "DESCRIPTION": (
        "Leave, rejoin and read the status of a user's membership of the community layer. "
        "Once a leave has returned, none of the user's new signals is attributed to a "
        "cohort or forwarded to a community."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema describes the API, not anyone's data: readable without an account.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    # The docs page's assets are served by the project itself, not a CDN.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "tidalproject.schema.add_error_responses",
    ],
    # One name for the change actions wherever they appear (history, webhook subscriptions).
    "ENUM_NAME_OVERRIDES": {"ChangeActionEnum": "community.models.ChangeAction"},
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
}

# Accounts in this group are service accounts: their writes use the service_write rate.
SERVICE_ACCOUNT_GROUP = env.str("SERVICE_ACCOUNT_GROUP", default="service-accounts")
# Exactly once over an unreliable network needs idempotency keys: a client that lost the
# answer to a 202 cannot tell whether its batch was stored. Require them of service accounts.
SIGNAL_REQUIRE_IDEMPOTENCY_KEYS = env.bool("SIGNAL_REQUIRE_IDEMPOTENCY_KEYS", default=False)

# --- Community layer --------------------------------------------------------------------
# When a process is this many changes behind, it re-warms from the records instead of
# replaying the change feed one row at a time.
LEAVE_CACHE_REWARM_AFTER = env.int("LEAVE_CACHE_REWARM_AFTER", default=50_000)

# --- Downstream: the change feed and webhooks -------------------------------------------
# The longest a change-feed read may wait for the next change (?wait=); it holds a web worker.
FEED_MAX_WAIT_SECONDS = env.int("FEED_MAX_WAIT_SECONDS", default=20)
# Webhook targets on loopback, private, link-local or other non-global addresses are refused
# at send time (after name resolution) unless this is set (tests, drills, private networks).
WEBHOOK_ALLOW_PRIVATE_TARGETS = env.bool("WEBHOOK_ALLOW_PRIVATE_TARGETS", default=False)
# Connect, write and read timeouts, and the deadline of one whole exchange.
WEBHOOK_TIMEOUT_SECONDS = env.float("WEBHOOK_TIMEOUT_SECONDS", default=10.0)
# At most this much of a receiver's answer is read (the rest is dropped).
WEBHOOK_MAX_RESPONSE_BYTES = env.int("WEBHOOK_MAX_RESPONSE_BYTES", default=64 * 1024)
# Changes per webhook message (one signed message carries an ordered batch).
WEBHOOK_BATCH_SIZE = env.int("WEBHOOK_BATCH_SIZE", default=100)
# Back-off after a failed delivery: base * 2**(failures-1), capped, with jitter (half random).
WEBHOOK_RETRY_BASE_SECONDS = env.float("WEBHOOK_RETRY_BASE_SECONDS", default=1.0)
# Keep below CELERY_VISIBILITY_TIMEOUT: Redis holds a delayed retry as an unacknowledged message.
WEBHOOK_RETRY_MAX_SECONDS = env.float("WEBHOOK_RETRY_MAX_SECONDS", default=300.0)
# A subscriber failing without a success for this long is paused (an operator resumes it).
WEBHOOK_PAUSE_AFTER_SECONDS = env.int("WEBHOOK_PAUSE_AFTER_SECONDS", default=24 * 3600)
# Delivery log rows older than this are removed by the sweep.
WEBHOOK_LOG_RETENTION_DAYS = env.int("WEBHOOK_LOG_RETENTION_DAYS", default=14)

LOG_FORMAT = env.str("LOG_FORMAT", default="plain")  # "json" in production
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "tidalproject.logs.ContextFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [req=%(request_id)s task=%(task_id)s] %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s %(task_id)s %(process)d",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["context"]},
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    # httpx logs every webhook request at INFO; the delivery log keeps them instead.
    "loggers": {"httpx": {"level": "WARNING"}},
}

# --- Signals ----------------------------------------------------------------------------
# How far in the future an occurred_at may be (clients' clocks drift).
SIGNAL_MAX_CLOCK_SKEW_SECONDS = env.int("SIGNAL_MAX_CLOCK_SKEW_SECONDS", default=300)
# Signals per processing task.
SIGNAL_BATCH_SIZE = env.int("SIGNAL_BATCH_SIZE", default=500)
# The sweep re-enqueues signals still pending this long after they were received.
SIGNAL_SWEEP_AFTER_SECONDS = env.int("SIGNAL_SWEEP_AFTER_SECONDS", default=120)
# Bulk erasure: users a job (API or admin upload), and when the sweep restarts a job whose
# task has not been heard of (a worker killed; the task's heartbeat is one erased user).
ERASURE_JOB_MAX_USERS = env.int("ERASURE_JOB_MAX_USERS", default=10_000)
ERASURE_JOB_RESTART_AFTER_SECONDS = env.int("ERASURE_JOB_RESTART_AFTER_SECONDS", default=300)
