"""The test suite: like dev, with a fast password hasher and generous throttles."""

import os

from .celery import CELERY_BROKER_URL
from .dev import *  # noqa: F403
from .dev import REST_FRAMEWORK
from .environment import VAR_DIR

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
REST_FRAMEWORK = {
    **REST_FRAMEWORK,
    "DEFAULT_THROTTLE_RATES": {"write": "1000/minute", "service_write": "100000/minute", "login": "1000/minute"},
}

# The tests never share a queue with `make run` in the same checkout: its worker would take
# their tasks, and they purge what they find. A queue of their own (one per pytest-xdist
# worker, whose name the worker processes they start inherit), and on the embedded broker a
# folder of their own as well.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
CELERY_TASK_DEFAULT_QUEUE = "tidal-tests" + (f"-{_XDIST_WORKER}" if _XDIST_WORKER else "")
if CELERY_BROKER_URL.startswith("filesystem://"):
    _test_broker = VAR_DIR / "test-broker" / (_XDIST_WORKER or "main")
    (_test_broker / "messages").mkdir(parents=True, exist_ok=True)
    (_test_broker / "control").mkdir(exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_test_broker / "messages"),
        "data_folder_out": str(_test_broker / "messages"),
        "control_folder": str(_test_broker / "control"),
        "store_processed": False,
    }
if _XDIST_WORKER:
    # Every test starts by clearing the cache: parallel workers sharing one Redis would clear
    # each other's throttle counters mid-test. Each worker keeps a process-local cache instead
    # (`make test`, serial, runs on the configured one).
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
