"""Celery: the broker, how workers take and acknowledge tasks, and beat's schedule.
Imported by ``base``; the app itself is ``tidalproject.celery``.
"""

from .environment import VAR_DIR, env

# --- Broker ----------------------------------------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    _broker_dir.mkdir(parents=True, exist_ok=True)
    (VAR_DIR / "broker-control").mkdir(exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir),
        "data_folder_out": str(_broker_dir),
        "control_folder": str(VAR_DIR / "broker-control"),
        "store_processed": False,
    }
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # A message whose worker died unacknowledged is redelivered after this long; it must
    # exceed the longest task (time limit 180 s). The sweep re-enqueues sooner anyway.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=600)}
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Keep a worker's database connection across tasks instead of opening one per task (Celery's
# Django fixup closes it after every task unless this is set); the task itself drops one
# that broke, as Django does at the start of a request (close_old_connections).
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=1000)
# Celery keeps the project's logging (JSON in production) instead of installing its own.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# --- Beat ------------------------------------------------------------------------------
# Beat wakes every lagging subscriber this often, so a lost kick loses nothing.
WEBHOOK_SWEEP_EVERY_SECONDS = env.float("WEBHOOK_SWEEP_EVERY_SECONDS", default=10.0)
# The signal sweep re-enqueues pending signals, settles erasures and restarts stalled erasure jobs.
CELERY_BEAT_SCHEDULE = {
    "sweep-pending-signals": {
        "task": "signals_app.tasks.sweep_pending_signals",
        "schedule": env.float("SIGNAL_SWEEP_EVERY_SECONDS", default=60.0),
    },
    "sweep-webhooks": {
        "task": "community.tasks.sweep_webhooks",
        "schedule": WEBHOOK_SWEEP_EVERY_SECONDS,
    },
    "delete-expired-tokens": {
        "task": "accounts.tasks.delete_expired_tokens",
        "schedule": env.float("TOKEN_CLEANUP_EVERY_SECONDS", default=3600.0),
    },
}
