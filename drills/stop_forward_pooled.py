"""Drill: the stop-forward race with web and workers connected through a real PgBouncer in
transaction mode (the README recommends one past a few hundred processes). The same race and
checks as drills/stop_forward.py; only the connection path differs."""

from __future__ import annotations

from drills.deployment import Deployment
from drills.stop_forward import RaceResult, run

DEPLOYMENT = {"pooled": True}


def drill(dep: Deployment, *, full: bool) -> RaceResult:
    """Short: 10 seconds. Full: 90 seconds."""
    return run(dep, seconds=90 if full else 10)
