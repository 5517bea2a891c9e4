"""The production settings, as ``manage.py`` loads them in a process of its own.

No database is used: ``DATABASE_URL`` points at an SQLite file in a temporary folder that
no command here opens.
"""

from __future__ import annotations

import ast
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.helpers import PROJECT_DIR, PYTHON

pytestmark = pytest.mark.processes

PRODUCTION = "tidalproject.settings.production"
REAL_KEY = secrets.token_urlsafe(48)  # 64 characters


def dev_default_key() -> str:
    """The throwaway key that ``settings/dev.py`` falls back to, read from its source."""
    tree = ast.parse((PROJECT_DIR / "tidalproject" / "settings" / "dev.py").read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "SECRET_KEY" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise AssertionError("no SECRET_KEY string in tidalproject/settings/dev.py")


def manage(tmp_path: Path, *args: str, **env: str | None) -> subprocess.CompletedProcess[str]:
    """``manage.py *args`` under the production settings; ``None`` in ``env`` unsets a variable."""
    child = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG", "DATABASE_URL")}
    child.update(
        DJANGO_SETTINGS_MODULE=PRODUCTION,
        DATABASE_URL=f"sqlite:///{tmp_path / 'unused.sqlite3'}",
        PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_DIR), os.environ.get("PYTHONPATH")])),
    )
    for name, value in env.items():
        if value is None:
            child.pop(name, None)
        else:
            child[name] = value
    return subprocess.run(
        [PYTHON, "manage.py", *args], cwd=PROJECT_DIR, env=child, capture_output=True, text=True, timeout=120
    )


def test_deploy_checks_pass_with_a_real_secret_key(tmp_path: Path) -> None:
    assert len(REAL_KEY) == 64
    done = manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", SECRET_KEY=REAL_KEY)
    assert done.returncode == 0, done.stderr
    assert "no issues" in done.stdout


@pytest.mark.parametrize(
    "key",
    [None, "", "too-short-" + secrets.token_hex(10), dev_default_key()],
    ids=["unset", "empty", "short", "dev default"],
)
def test_check_refuses_a_missing_or_weak_secret_key(tmp_path: Path, key: str | None) -> None:
    dotenv = PROJECT_DIR / ".env"  # the settings read it; it would fill in an unset key
    if key is None and dotenv.is_file() and "SECRET_KEY" in dotenv.read_text():
        pytest.skip("the project's .env sets SECRET_KEY")
    done = manage(tmp_path, "check", SECRET_KEY=key)
    assert done.returncode != 0, done.stdout
    assert "SECRET_KEY" in done.stderr


@pytest.mark.parametrize("debug", ["true", "1", "on"])
def test_debug_is_off_whatever_the_environment_says(tmp_path: Path, debug: str) -> None:
    done = manage(
        tmp_path,
        "shell",
        "-c",
        "from django.conf import settings; print(settings.DEBUG)",
        SECRET_KEY=REAL_KEY,
        DEBUG=debug,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
