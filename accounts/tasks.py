from __future__ import annotations

from tidalproject.celery import sweep_task

from .services import tokens_delete_expired


@sweep_task
def delete_expired_tokens() -> int:
    """Beat's: delete every expired API token (requests check only the token they present)."""
    return tokens_delete_expired()
