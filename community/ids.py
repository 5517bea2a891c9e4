"""The user-id rule, shared by the API, the admin, the console, commands and tools.

Pure Python, no Django import, like ``community.membership`` beside it.
"""

from __future__ import annotations

from typing import Any

from .membership import MAX_USER_ID

USER_ID_RULE = "Must be an integer from 0 to 9223372036854775807."


def parse_user_id(data: Any) -> int:
    """An id from 0 to 2**63-1, given as a JSON integer or a string of ASCII digits.

    Stricter than DRF's IntegerField, which also takes ``true``, ``1.0`` and ``" 1 "``.
    Raises ``ValueError`` with the message to show.
    """
    if isinstance(data, str) and data.isascii() and data.isdigit() and len(data) <= 20:
        data = int(data)
    if isinstance(data, bool) or not isinstance(data, int):
        raise ValueError(USER_ID_RULE)
    if data < 0:
        raise ValueError("Must be at least 0.")
    if data > MAX_USER_ID:
        raise ValueError("Must be at most 9223372036854775807 (2**63-1).")
    return data
