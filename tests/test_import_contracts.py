"""The import contracts (pyproject.toml, `make lint`) hold, and they catch a new import against
the arrows: community importing signals_app fails the lint."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import PROJECT_DIR

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ["tidalproject", "accounts", "community", "signals_app", "console", "support"]


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _copy_project(tmp_path: Path) -> None:
    shutil.copy(PROJECT_DIR / "pyproject.toml", tmp_path)
    for package in PACKAGES:
        shutil.copytree(PROJECT_DIR / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))


def test_the_contracts_are_kept() -> None:
    result = _lint_imports(PROJECT_DIR)
    assert result.returncode == 0, result.stdout + result.stderr


def test_community_importing_signals_app_breaks_the_layers(tmp_path: Path) -> None:
    _copy_project(tmp_path)
    selectors = tmp_path / "community" / "selectors.py"
    selectors.write_text(selectors.read_text() + "\nfrom signals_app.models import Signal  # noqa\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "community.selectors -> signals_app.models" in result.stdout


def test_the_models_importing_the_leave_cache_breaks_its_contract(tmp_path: Path) -> None:
    _copy_project(tmp_path)
    models = tmp_path / "community" / "models.py"
    models.write_text(models.read_text() + "\nfrom community.cache import leave_cache  # noqa\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "community.models -> community.cache" in result.stdout


def test_any_community_services_module_importing_drf_breaks_its_contract(tmp_path: Path) -> None:
    # community.services is a package: the contract covers every module in it.
    _copy_project(tmp_path)
    groups = tmp_path / "community" / "services" / "groups.py"
    groups.write_text(groups.read_text() + "\nimport rest_framework  # noqa\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "community.services.groups -> rest_framework" in result.stdout
