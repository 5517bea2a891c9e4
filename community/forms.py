"""The bulk id list: pasted or uploaded ids, every bad one named (the console's bulk leave,
and signals_app's bulk erasure, which adds its own limit and a confirmation box)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django import forms

from .ids import parse_user_id

BULK_MAX_IDS = 10_000
BULK_MAX_FILE_BYTES = 1024 * 1024
BAD_TOKENS_SHOWN = 20

_SEPARATORS = re.compile(r"[\s,;]+")


@dataclass(frozen=True)
class BadToken:
    source: str
    position: int
    token: str
    problem: str

    def __str__(self) -> str:
        shown = self.token if len(self.token) <= 40 else f"{self.token[:40]}…"
        return f"{shown!r} ({self.source}, item {self.position}): {self.problem}"


def parse_id_list(text: str, *, source: str) -> tuple[list[int], list[BadToken]]:
    """Ids separated by whitespace, commas or semicolons, by the API's id rule.

    Surrounding double quotes are dropped (spreadsheet CSV) and a first item ``user_id``
    is taken for a CSV header. Duplicates count once.
    """
    tokens = [token.strip('"') for token in _SEPARATORS.split(text) if token]
    if tokens and tokens[0].lower() == "user_id":
        tokens = tokens[1:]
    ids: dict[int, None] = {}
    bad: list[BadToken] = []
    for position, token in enumerate(tokens, start=1):
        try:
            ids[parse_user_id(token)] = None
        except ValueError as exc:
            bad.append(BadToken(source, position, token, str(exc)))
    return list(ids), bad


class BulkLeaveForm(forms.Form):
    user_ids = forms.CharField(
        label="User ids",
        required=False,
        strip=False,
        max_length=2 * BULK_MAX_FILE_BYTES,
        widget=forms.Textarea(attrs={"rows": 12, "cols": 60, "placeholder": "12, 13, 14 …"}),
        help_text="Separated by spaces, commas or new lines.",
    )
    file = forms.FileField(
        label="or a file",
        required=False,
        help_text=f"Plain text or CSV (UTF-8), at most {BULK_MAX_FILE_BYTES // 1024} KiB; a header user_id is skipped.",
    )

    def clean_file(self) -> str:
        upload = self.cleaned_data.get("file")
        if not upload:
            return ""
        if upload.size is not None and upload.size > BULK_MAX_FILE_BYTES:
            raise forms.ValidationError(f"The file is larger than {BULK_MAX_FILE_BYTES // 1024} KiB.")
        try:
            return str(upload.read().decode("utf-8-sig"))
        except UnicodeDecodeError:
            raise forms.ValidationError("The file is not UTF-8 text.") from None

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors:
            return cleaned
        ids: dict[int, None] = {}
        bad: list[BadToken] = []
        for source, text in (("pasted", cleaned.get("user_ids", "")), ("file", cleaned.get("file", ""))):
            source_ids, source_bad = parse_id_list(text, source=source)
            ids.update(dict.fromkeys(source_ids))
            bad.extend(source_bad)
        if bad:
            errors = [f"Not a user id: {token}" for token in bad[:BAD_TOKENS_SHOWN]]
            if len(bad) > BAD_TOKENS_SHOWN:
                errors.append(f"… and {len(bad) - BAD_TOKENS_SHOWN} more bad items.")
            raise forms.ValidationError(errors)
        if not ids:
            raise forms.ValidationError("Paste or upload at least one user id.")
        if len(ids) > self.max_ids():
            raise forms.ValidationError(
                f"{len(ids):,} distinct ids: at most {self.max_ids():,} {self.limit_unit}. "
                "Split the list and submit it in parts."
            )
        cleaned["ids"] = list(ids)
        return cleaned

    limit_unit = "at a time"

    def max_ids(self) -> int:
        """How many distinct ids one submission may hold."""
        return BULK_MAX_IDS
