"""Production: DEBUG off, a real SECRET_KEY required, secure cookies and HSTS."""

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F403
from .base import LOGGING, SECRET_KEY
from .environment import env

DEBUG = False
LOG_FORMAT = env.str("LOG_FORMAT", default="json")
LOGGING["handlers"]["console"]["formatter"] = LOG_FORMAT
if len(SECRET_KEY) < 50 or SECRET_KEY.startswith("dev-only"):
    raise ImproperlyConfigured("SECRET_KEY must be set to a random value of at least 50 characters in production")

SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=60 * 60 * 24 * 365)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
# Submitting a domain to the browsers' HSTS preload list is the operator's decision (it is
# hard to undo); set SECURE_HSTS_PRELOAD=true once it is made.
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
