"""Where the project is and what the environment says: the one place settings read it from.

Every settings module reads its variables through ``env`` (django-environ), which reads a
``.env`` file in the project folder first when there is one.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()
if (BASE_DIR / ".env").is_file():
    environ.Env.read_env(BASE_DIR / ".env")
