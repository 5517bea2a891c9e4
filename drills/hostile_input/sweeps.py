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
from drills.hostile_input.common import Answer, Operation, exchange, traceback_for, traceback_summary

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


MAKE_ACCOUNTS = """
import json
from django.contrib.auth import get_user_model
from accounts.services import token_issue
accounts = {}
for name in ("hostile-plain", "hostile-other"):
    user, _ = get_user_model().objects.get_or_create(username=name)
    accounts[name] = [user.pk, token_issue(user=user)[1]]
print(json.dumps(accounts))
"""


class Fixture:
    """What the sweeps act on, made through the API: two plain accounts (the second the first's victim:
    left, a member of a community and a cohort, with a signal), that community and that cohort."""

    def __init__(self, dep: Deployment) -> None:
        accounts = json.loads(dep.manage("shell", "-c", MAKE_ACCOUNTS).strip().splitlines()[-1])
        (self.plain_id, self.plain_token), (self.other_id, _) = accounts["hostile-plain"], accounts["hostile-other"]
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

    def fill(self, template: str, *, user_id: int) -> str:
        path = template.replace("{user_id}", str(user_id))
        path = path.replace("{slug}", self.cohort if template.startswith("/api/cohorts/") else self.community)
        return re.sub(r"\{[^}]+\}", "1", path)

    def valid_body(self, op: Operation, tag: str) -> dict[str, Any]:
        """A body the operation would accept, acting on ids no other request uses."""
        if op.method == "DELETE" and op.path.endswith("/members/"):
            return {"user_ids": [self.other_id]}  # a member: a removal would show
        if op.path.endswith("/members/") or op.path.endswith("/bulk-leave/"):
            return {"user_ids": [next(self.fresh)]}
        if op.path == "/api/signals/":
            key = f"hostile-{tag}-{secrets.token_hex(6)}"
            return {"signals": [{"user_id": next(self.fresh), "item_id": 1, "kind": "like", "idempotency_key": key}]}
        if op.path in ("/api/communities/", "/api/cohorts/"):
            slug = f"hostile-{tag}-{secrets.token_hex(4)}"
            return {"slug": slug, "name": slug}
        if (op.method, op.path) == TOKEN_LOGIN:
            return {"username": "hostile-nobody", "password": secrets.token_hex(8)}
        return {}


def watched_counts(dep: Deployment, *, own: int) -> dict[str, int]:
    query = "SELECT " + ", ".join(f"({sql})" for sql in WATCHED.values())
    row = dep.sql(query, {"own": own})[0]
    return dict(zip(WATCHED, row, strict=True))


def changed(before: dict[str, int], after: dict[str, int]) -> str:
    return ", ".join(f"{name} {before[name]}->{after[name]}" for name in before if before[name] != after[name])


@dataclass
class Probe:
    case: str  # who sent it (the sweep) or which bad request
    method: str
    path: str
    answer: Answer
    problem: str = ""


def authorization_sweep(dep: Deployment, ops: list[Operation], fx: Fixture) -> list[Probe]:
    identities = {
        "anonymous": {},
        "unknown token": {"Authorization": f"Token {secrets.token_hex(20)}"},
        "plain user": {"Authorization": f"Token {fx.plain_token}"},
        "service account": {"Authorization": f"Token {dep.token}"},
    }
    public = [Operation(m, p, False) for m, p in PUBLIC_PAGES]
    probes: list[Probe] = []
    for identity, auth in identities.items():
        # Refused calls by these identities must write nothing (the plain user's own id aside).
        before = watched_counts(dep, own=fx.plain_id)
        for op in [*public, *ops]:
            targets = [fx.other_id]
            if identity == "plain user" and "{user_id}" in op.path:
                targets = [fx.plain_id, fx.other_id]
            for user_id in targets:
                headers = dict(auth)
                body = None
                if op.has_body:
                    headers["Content-Type"] = "application/json"
                    body = json.dumps(fx.valid_body(op, identity.replace(" ", "-"))).encode()
                path = fx.fill(op.path, user_id=user_id)
                answer = exchange(dep.url, op.method, path, headers=headers, body=body)
                probes.append(
                    Probe(identity, op.method, path, answer, judge(identity, op, user_id == fx.plain_id, answer))
                )
        after = watched_counts(dep, own=fx.plain_id)
        if identity != "service account" and after != before:
            wrote = f"refused calls wrote rows: {changed(before, after)}"
            probes.append(Probe(identity, "-", "-", Answer(0, b"", 0.0), wrote))
    return probes


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


# Path parameters ({user_id}, {slug}) as they appear in the URL, percent-encoded.
BAD_PATH_VALUES = {
    "NUL byte": "a%00b",
    "invalid UTF-8": "%FF%FE",
    "encoded slashes": "..%2F..%2Fx",
    "control characters": "%01%1B%7F",
    "3,000 characters": "x" * 3000,
}


def bad_request_sweeps(dep: Deployment, ops: list[Operation], fx: Fixture) -> dict[str, list[Probe]]:
    """As the service account: bad bodies for every operation that takes one, and hostile values for
    every path parameter (with a valid body)."""
    groups: dict[str, list[Probe]] = {"bad_body": [], "bad_path": []}
    for op in ops:
        if op.has_body:
            # Leave and rejoin take no body: aim them at users for whom they change nothing
            # (the victim has left; NEVER_LEFT is active), so that any write shows.
            path = fx.fill(op.path, user_id=NEVER_LEFT if op.path.endswith("/rejoin/") else fx.other_id)
            valid = json.dumps(fx.valid_body(op, "bad")).encode()
            bodies = {
                "3 MB": valid[:-1] + b" " * (3 * 1024 * 1024) + valid[-1:],  # valid JSON
                "not JSON": b"\xff\xfe{not: json,,",
                "JSON array": b"[1, 2, 3]",
                "nested 10,000 deep": b"[" * 10_000 + b"]" * 10_000,
            }
            found = [malformed(dep, name, op, path, body) for name, body in bodies.items()]
            lie = json.dumps(fx.valid_body(op, "lie")).encode()
            found.append(malformed(dep, "100 MB Content-Length", op, path, lie, claimed=100 * 2**20))
            plain = json.dumps(fx.valid_body(op, "plain")).encode()
            found.append(malformed(dep, "JSON as text/plain", op, path, plain, content_type="text/plain"))
            groups["bad_body"] += found
        if "{" in op.path:
            for name, value in BAD_PATH_VALUES.items():
                body = json.dumps(fx.valid_body(op, "path")).encode() if op.has_body else None
                groups["bad_path"].append(malformed(dep, name, op, re.sub(r"\{[^}]+\}", value, op.path), body))
    return groups


def malformed(
    dep: Deployment,
    case: str,
    op: Operation,
    path: str,
    body: bytes | None,
    *,
    content_type: str = "application/json",
    claimed: int | None = None,
) -> Probe:
    """One malformed request as the service account (``claimed``: a Content-Length to claim instead of
    the real one), and what is wrong with its answer: a 5xx, no answer, a write (the watched row
    counts are compared around it)."""
    headers = {"Authorization": f"Token {dep.token}", **({"Content-Type": content_type} if body is not None else {})}
    before = watched_counts(dep, own=-1)
    answer = exchange(dep.url, op.method, path, headers=headers, body=body, content_length=claimed)
    after = watched_counts(dep, own=-1)
    found = [answer.problem()] if answer.problem() else []
    if after != before:
        found.append(f"wrote rows ({changed(before, after)}) with answer {answer.status}")
    return Probe(case, op.method, path, answer, "; ".join(found))


def summarise(groups: dict[str, list[Probe]], tracebacks: dict[str, list[str]]) -> dict[str, Any]:
    """For each group of probes: requests sent, answers counted by status for each identity (or kind
    of bad request), and one line for each wrong answer."""
    result: dict[str, Any] = {}
    for group, probes in groups.items():
        counts: dict[str, Counter[int]] = defaultdict(Counter)
        for probe in probes:
            if probe.method != "-":
                counts[probe.case][probe.answer.status] += 1
        result[f"{group}_requests"] = sum(1 for p in probes if p.method != "-")
        result[f"{group}_statuses"] = {name: dict(sorted(c.items())) for name, c in counts.items()}
        result[f"{group}_violations"] = []
        for probe in (p for p in probes if p.problem):
            line = f"{probe.case}: {probe.method} {probe.path} -> {probe.problem}"
            if probe.answer.status >= 500:
                line += f": {traceback_summary(traceback_for(tracebacks, probe.path))}"
            elif probe.method != "-" and probe.answer.status:
                line += f": {probe.answer.snippet(120)!r}"
            result[f"{group}_violations"].append(line)
    result["throttled"] = sum(p.answer.status == 429 for probes in groups.values() for p in probes)
    return result
