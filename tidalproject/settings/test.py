"""The test suite: like dev, with a fast password hasher and generous throttles."""

from .dev import *  # noqa: F403
from .dev import REST_FRAMEWORK

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
REST_FRAMEWORK = {
    **REST_FRAMEWORK,
    "DEFAULT_THROTTLE_RATES": {"write": "1000/minute", "service_write": "100000/minute", "login": "1000/minute"},
}
