"""Hostile input, parts 2 and 3: the authorization sweep (four identities on every operation)
and the bad bodies and path parameters; nothing written by a refused or bad request."""

from __future__ import annotations

import json
import re
import secrets
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from drills.deployment import Deployment
from drills.hostile_input.common import Answer, exchange

# Pages outside the schema (drf-spectacular leaves itself out) that anyone may read.
PUBLIC_PAGES = [("GET", "/api/schema/"), ("GET", "/api/docs/")]
TOKEN_LOGIN = ("POST", "/api/auth/token/")

# What a plain account may use besides its own user id (everything else is refused).
PLAIN_ALLOWED = {
    ("GET", "/api/communities/"),
    ("GET", "/api/communities/{slug}/"),
    ("GET", "/api/communities/{slug}/trending/"),
}
DENIED = {400, 403, 404, 405}

# Tables a refused or malformed request must not change.
WATCHED = {
    "signals": "SELECT count(*) FROM signals_app_signal",
    "leave records": "SELECT count(*) FROM community_communityleave WHERE user_id <> %(own)s",
    "leave history": "SELECT count(*) FROM community_leavehistory WHERE user_id <> %(own)s",
    "communities": "SELECT count(*) FROM community_community",
    "cohorts": "SELECT count(*) FROM community_cohort",
    "community members": "SELECT count(*) FROM community_communitymember",
    "cohort members": "SELECT count(*) FROM community_cohortmember",
}
NEVER_LEFT = 7_700_000_001  # a user id with no leave record: rejoining it changes nothing
FRESH = 7_800_000_000  # user ids above this are used once each, so that any write shows

PARAMETER = re.compile(r"\{[^}]+\}")  # a path parameter in a schema's path: {user_id}, {slug}
# Path parameters as they appear in the URL, percent-encoded.
BAD_PATH_VALUES = {
    "NUL byte": "a%00b",
    "invalid UTF-8": "%FF%FE",
    "encoded slashes": "..%2F..%2Fx",
    "control characters": "%01%1B%7F",
    "3,000 characters": "x" * 3000,
}

MAKE_ACCOUNTS = """
from django.contrib.auth import get_user_model
from accounts.services import token_issue
plain, _ = get_user_model().objects.get_or_create(username="hostile-plain")
other, _ = get_user_model().objects.get_or_create(username="hostile-other")
print(plain.pk, token_issue(user=plain)[1], other.pk)
"""


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # the template, as in the schema
    has_body: bool


class Fixture:
    """What the sweeps act on: the public pages and every operation of the schema, the identities, and, made
    through the API, two plain accounts (the second the first's victim: left, a member of a community and a
    cohort, with a signal), that community and that cohort."""

    def __init__(self, dep: Deployment) -> None:
        status, schema = dep.client("").request("GET", "/api/schema/?format=json")  # as anyone sees it
        if status != 200:
            raise RuntimeError(f"GET /api/schema/ answered {status}: {schema}")
        self.ops = [Operation(method, path, False) for method, path in PUBLIC_PAGES]
        for path, item in schema["paths"].items():
            for method in (m for m in ("get", "post", "put", "patch", "delete") if m in item):
                # DELETE .../members/ takes the body POST does, which the schema cannot show:
                # drf-spectacular documents request bodies for POST, PUT and PATCH only.
                has_body = "requestBody" in item[method] or method == "post"
                has_body = has_body or (method == "delete" and path.endswith("/members/"))
                self.ops.append(Operation(method.upper(), path, has_body))
        plain_id, self.plain_token, other_id = dep.manage("shell", "-c", MAKE_ACCOUNTS).split()[-3:]
        self.plain_id, self.other_id = int(plain_id), int(other_id)
        suffix = secrets.token_hex(3)
        self.community, self.cohort = f"hostile-community-{suffix}", f"hostile-cohort-{suffix}"
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        signal = {"user_id": self.other_id, "item_id": 1, "kind": "like", "occurred_at": now}
        for path, body in [
            ("/api/communities/", {"slug": self.community, "name": self.community}),
            ("/api/cohorts/", {"slug": self.cohort, "name": self.cohort}),
            (f"/api/communities/{self.community}/members/", {"user_ids": [self.other_id]}),
            (f"/api/cohorts/{self.cohort}/members/", {"user_ids": [self.other_id]}),
            ("/api/signals/", {"signals": [signal]}),
            (f"/api/community-layer/{self.other_id}/leave/", None),
        ]:
            status, answer = dep.client().request("POST", path, body)
            if status not in (200, 201, 202):
                raise RuntimeError(f"set-up POST {path} answered {status}: {answer}")
        self.fresh = iter(range(FRESH + secrets.randbelow(10**9), 2**63))
        self.identities = {
            "anonymous": {},
            "unknown token": {"Authorization": f"Token {secrets.token_hex(20)}"},
            "plain user": {"Authorization": f"Token {self.plain_token}"},
            "service account": {"Authorization": f"Token {dep.token}"},
        }

    def fill(self, template: str, *, user_id: int) -> str:
        path = template.replace("{user_id}", str(user_id))
        path = path.replace("{slug}", self.cohort if template.startswith("/api/cohorts/") else self.community)
        return PARAMETER.sub("1", path)

    def body(self, op: Operation, tag: str) -> bytes | None:
        """A JSON body the operation would accept, acting on ids no other request uses (None if it takes none)."""
        if not op.has_body:
            return None
        body: dict[str, Any] = {}
        if op.method == "DELETE" and op.path.endswith("/members/"):
            body = {"user_ids": [self.other_id]}  # a member: a removal would show
        elif op.path.endswith("/members/") or op.path.endswith("/bulk-leave/"):
            body = {"user_ids": [next(self.fresh)]}
        elif op.path == "/api/signals/":
            key = f"hostile-{tag}-{secrets.token_hex(6)}"
            body = {"signals": [{"user_id": next(self.fresh), "item_id": 1, "kind": "like", "idempotency_key": key}]}
        elif op.path in ("/api/communities/", "/api/cohorts/"):
            slug = f"hostile-{tag}-{secrets.token_hex(4)}"
            body = {"slug": slug, "name": slug}
        elif (op.method, op.path) == TOKEN_LOGIN:
            body = {"username": "hostile-nobody", "password": secrets.token_hex(8)}
        return json.dumps(body).encode()


def watched_counts(dep: Deployment, *, own: int) -> dict[str, int]:
    query = "SELECT " + ", ".join(f"({sql})" for sql in WATCHED.values())
    return dict(zip(WATCHED, dep.sql(query, {"own": own})[0], strict=True))


def changed(before: dict[str, int], after: dict[str, int]) -> str:
    """The watched counts that differ ("" if none)."""
    return ", ".join(f"{name} {before[name]}->{after[name]}" for name in before if before[name] != after[name])


class Sweep:
    """Answers counted by status for each case (an identity, or a kind of bad request), and one line
    for each wrong answer."""

    def __init__(self) -> None:
        self.statuses: dict[str, Counter[int]] = defaultdict(Counter)
        self.violations: list[str] = []

    def record(self, case: str, method: str, path: str, answer: Answer, problem: str) -> None:
        self.statuses[case][answer.status] += 1
        if problem:
            said = f": {answer.body[:120].decode(errors='replace')!r}" if 0 < answer.status < 500 else ""
            self.violations.append(f"{case}: {method} {path} -> {problem}{said}")

    def figures(self, group: str) -> dict[str, Any]:
        return {
            f"{group}_requests": sum(counts.total() for counts in self.statuses.values()),
            f"{group}_statuses": {case: dict(sorted(counts.items())) for case, counts in self.statuses.items()},
            f"{group}_violations": self.violations,
        }


def authorization_sweep(dep: Deployment, fx: Fixture) -> Sweep:
    sweep = Sweep()
    for identity, auth in fx.identities.items():
        # Refused calls by these identities must write nothing (the plain user's own id aside).
        before = watched_counts(dep, own=fx.plain_id)
        for op in fx.ops:
            own = [fx.plain_id] if identity == "plain user" and "{user_id}" in op.path else []
            for user_id in [*own, fx.other_id]:
                body = fx.body(op, identity.replace(" ", "-"))
                path = fx.fill(op.path, user_id=user_id)
                answer = exchange(dep.url, op.method, path, headers=auth, body=body)
                sweep.record(identity, op.method, path, answer, judge(identity, op, user_id == fx.plain_id, answer))
        wrote = changed(before, watched_counts(dep, own=fx.plain_id))
        if identity != "service account" and wrote:
            sweep.violations.append(f"{identity}: refused calls wrote rows: {wrote}")
    return sweep


def judge(identity: str, op: Operation, own: bool, answer: Answer) -> str:
    """Why this answer is wrong for this identity, or "" if it is right."""
    key, status = (op.method, op.path), answer.status
    if answer.problem() or identity == "service account":
        return answer.problem()
    if key in PUBLIC_PAGES:
        if identity == "anonymous" and status != 200:
            return f"public page answered {status}, expected 200"
        return "" if status in (200, 401) else f"public page answered {status}"
    if key == TOKEN_LOGIN:
        return "" if status in (400, 401, 429) else f"log-in with a wrong password answered {status}"
    if identity in ("anonymous", "unknown token"):
        return "" if status == 401 else f"expected 401, got {status}"
    # The plain user.
    if own:
        return "" if 200 <= status < 300 else f"own user id refused with {status}"
    if key in PLAIN_ALLOWED:
        return "" if status == 200 else f"expected 200, got {status}"
    if 200 <= status < 300:
        what = "another user's id" if "{user_id}" in op.path else "an operators' endpoint"
        return f"{status} on {what}: must be refused"
    return "" if status in DENIED else f"expected 403 (or 400/404), got {status}"


def bad_request_sweeps(dep: Deployment, fx: Fixture) -> dict[str, Sweep]:
    """As the service account: bad bodies for every operation that takes one, and hostile values for
    every path parameter (with a valid body). A 5xx, no answer or a write is wrong (the watched row
    counts are compared around each request)."""
    sweeps = {"bad_body": Sweep(), "bad_path": Sweep()}

    def send(group: str, case: str, op: Operation, path: str, body: bytes | None, extra: dict[str, str]) -> None:
        before = watched_counts(dep, own=-1)
        answer = exchange(dep.url, op.method, path, headers=fx.identities["service account"] | extra, body=body)
        wrote = changed(before, watched_counts(dep, own=-1))
        wrote = wrote and f"wrote rows ({wrote}) with answer {answer.status}"
        sweeps[group].record(case, op.method, path, answer, "; ".join(p for p in (answer.problem(), wrote) if p))

    for op in fx.ops:
        if op.has_body:
            # Leave and rejoin take no body: aim them at users for whom they change nothing
            # (the victim has left; NEVER_LEFT is active), so that any write shows.
            path = fx.fill(op.path, user_id=NEVER_LEFT if op.path.endswith("/rejoin/") else fx.other_id)
            valid = fx.body(op, "bad")
            bodies = [
                ("3 MB", valid[:-1] + b" " * (3 * 1024 * 1024) + valid[-1:], {}),  # valid JSON
                ("not JSON", b"\xff\xfe{not: json,,", {}),
                ("JSON array", b"[1, 2, 3]", {}),
                ("nested 10,000 deep", b"[" * 10_000 + b"]" * 10_000, {}),
                ("100 MB Content-Length", fx.body(op, "lie"), {"Content-Length": str(100 * 2**20)}),
                ("JSON as text/plain", fx.body(op, "plain"), {"Content-Type": "text/plain"}),
            ]
            for case, body, extra in bodies:
                send("bad_body", case, op, path, body, extra)
        if "{" in op.path:
            for case, value in BAD_PATH_VALUES.items():
                send("bad_path", case, op, PARAMETER.sub(value, op.path), fx.body(op, "path"), {})
    return sweeps
