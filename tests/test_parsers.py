"""The JSON parser reads with orjson, and answers exactly as DRF's own parser does."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pytest
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from tidalproject.parsers import JSONParser

BODIES = [
    b'{"signals": [{"user_id": 1, "item_id": 2, "kind": "view", "weight": 0.5}]}',
    b'{"user_id": 18446744073709551616}',  # past 64 bits: orjson would read a float
    b'{"user_id": 9223372036854775808, "item_id": -9223372036854775809}',
    b'{"ids": [12345678901234567890123, 1]}',
    b'{"weight": 1e400}',  # infinity, as Python's json reads it
    b'{"weight": NaN}',
    b'{"weight": Infinity}',
    b'{"key": "\\ud800"}',  # a lone surrogate escape: orjson refuses it, Python's json keeps it
    b'{"a": 1, "a": 2}',
    b"\xef\xbb\xbf{}",  # a byte order mark
    b'{"kind": "caf\xc3\xa9"}',
    b'{"kind": "caf\xe9"}',  # not UTF-8
    b"[1, 2",
    b"",
]


def parse(parser: Any, body: bytes, encoding: str = "utf-8") -> Any:
    try:
        return ("ok", parser.parse(io.BytesIO(body), "application/json", {"encoding": encoding}))
    except ParseError as exc:
        return ("error", str(exc.detail))


def same(a: Any, b: Any) -> bool:
    """Equal, NaN and infinities included, and of the same types (an int stays an int)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.parametrize("body", BODIES)
def test_every_body_reads_as_drfs_parser_reads_it(body: bytes) -> None:
    ours, drfs = parse(JSONParser(), body), parse(parsers.JSONParser(), body)
    assert same(ours, drfs), (ours, drfs)


def test_a_declared_charset_other_than_utf8_is_read_in_it() -> None:
    body = json.dumps({"kind": "café"}, ensure_ascii=False).encode("latin-1")
    assert parse(JSONParser(), body, "latin-1") == ("ok", {"kind": "café"})


def test_numbers_of_any_size_stay_integers() -> None:
    big = 2**64 + 1
    assert parse(JSONParser(), json.dumps({"ids": [big, -big, 2**63 - 1]}).encode()) == (
        "ok",
        {"ids": [big, -big, 2**63 - 1]},
    )
