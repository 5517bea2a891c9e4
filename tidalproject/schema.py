"""drf-spectacular post-processing: declare the error answers every operation can give.

The views answer 400 (a field and its rule), 401, 403, 404, 413, 415, 429 and 503 in DRF's
shapes; declaring them here once keeps the schema true for clients and for schemathesis.
"""

from __future__ import annotations

import copy
from typing import Any

PUBLIC = {"/api/auth/token/"}
WRITES = {"post", "put", "patch", "delete"}

ERROR = {
    "type": "object",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
    "description": "What went wrong, in words.",
}
VALIDATION = {
    "type": "object",
    "additionalProperties": True,
    "description": (
        'Each bad field with its messages, e.g. {"user_id": ["Must be at least 0."]}; inside a list, '
        'by index: {"signals": {"3": {"kind": ["Must match [a-z0-9_]{1,32}."]}}}.'
    ),
}


def _answer(description: str, schema: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }


def add_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("Error", ERROR)
    schemas.setdefault("ValidationError", VALIDATION)
    for path, operations in result.get("paths", {}).items():
        members = path.endswith("/members/")
        if members and "delete" in operations and "post" in operations:
            # DRF takes a body on DELETE here; drf-spectacular documents bodies on POST/PUT/PATCH only.
            operations["delete"]["requestBody"] = copy.deepcopy(operations["post"]["requestBody"])
            operations["delete"]["responses"] = copy.deepcopy(operations["post"]["responses"])
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            wanted: dict[str, dict[str, Any]] = {}
            if operation.get("parameters") or operation.get("requestBody"):
                wanted["400"] = _answer("A bad parameter or body: each field named with its rule.", "ValidationError")
            # Even a public operation answers 401 to a credential it does not know.
            wanted["401"] = _answer("No or an unknown credential.", "Error")
            if path not in PUBLIC:
                wanted["403"] = _answer("The account may not do this.", "Error")
            if "{" in path:
                wanted["404"] = _answer("No such object.", "Error")
            if method in WRITES:
                wanted["429"] = _answer("Too many writes; see Retry-After.", "Error")
            if operation.get("requestBody"):
                wanted["413"] = _answer("The body is larger than the service accepts.", "Error")
                wanted["415"] = _answer("The body's media type is not accepted.", "Error")
            wanted["503"] = _answer("The database is unavailable; nothing was changed. Retry later.", "Error")
            for status, answer in wanted.items():
                responses.setdefault(status, answer)
    return result
