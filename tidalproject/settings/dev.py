"""Local development and the embedded first run: DEBUG on, a throwaway secret key."""

from .base import *  # noqa: F403
from .base import SECRET_KEY
from .environment import env

DEBUG = env.bool("DEBUG", default=True)
if not SECRET_KEY:
    SECRET_KEY = "dev-only-insecure-key-never-use-in-production"  # noqa: S105
