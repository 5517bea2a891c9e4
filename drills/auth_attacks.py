"""Attacks on the doors: log-in lockout and API tokens, against a real deployment over HTTP.

- password spraying: a few common passwords over many accounts, from many client addresses,
  at the token endpoint and the admin's log-in form;
- brute force on one operator account from one address, the right password last;
- tokens: a revoked token replayed, an expired token, and every value of the token table as a
  database dump would give it.

Every attempt must be refused; the operator logging in from their own address and the service
account's token must be unaffected. The deployment believes X-Real-IP as its client address
(as behind a proxy that sets it), so that one machine can play many attackers.
"""

from __future__ import annotations

import http.client
import json
import re
import secrets
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from drills.deployment import Deployment
from support.client import LOOPBACK, Client

COMMON_PASSWORDS = ["123456", "password", "admin", "qwerty", "letmein", "welcome1", "changeme"]
OPERATOR = "drill-operator"
# The limit of the deployment (LOGIN_FAILURE_LIMIT's default).
FAILURE_LIMIT = 5
# door -> (the statuses that let the attacker in, those that refuse); the admin's form refuses by showing itself again.
DOORS = {"token": ({200}, {400, 429}), "admin": ({302}, {200, 400, 429}), "api": ({200, 403}, {401})}

SETUP = """
import json
from datetime import timedelta
from django.contrib.auth import get_user_model
from accounts.services import token_issue, tokens_revoke
from knox.models import AuthToken
U = get_user_model()
U.objects.create_superuser(%(operator)r, password=%(password)r)
for n in range(%(accounts)d):
    U.objects.create_user(f"sprayed-{n}", password=%(password)r + str(n))
holder = U.objects.create_user("token-holder", password=%(password)r)
row, revoked = token_issue(user=holder)
tokens_revoke(tokens=AuthToken.objects.filter(pk=row.pk))
_, expired = token_issue(user=holder, ttl=timedelta(seconds=-1))
print(json.dumps({"holder": holder.pk, "revoked": revoked, "expired": expired}))
"""


class Door:
    """One client at one address: the token endpoint and the admin's form (with its CSRF token)."""

    def __init__(self, base: str, address: str) -> None:
        self.base, self.address, self.server = base, address, urlsplit(base)
        if self.server.hostname not in LOOPBACK:
            raise ValueError(f"drills only target loopback addresses, not {base}")
        # Kept by hand: production cookies are Secure, and the drill speaks plain HTTP on loopback.
        self.cookies: dict[str, str] = {}

    def send(self, method: str, path: str, fields: dict[str, str] | None = None, **headers: str) -> tuple[int, bytes]:
        """One request on a new connection (redirects are answers here, not followed)."""
        headers["X-Real-IP"] = self.address
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if fields is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        body = None if fields is None else urllib.parse.urlencode(fields)
        connection = http.client.HTTPConnection(self.server.hostname or "", self.server.port, timeout=60)
        try:
            connection.request(method, path, body, headers)
            response = connection.getresponse()
            for cookie in response.headers.get_all("Set-Cookie") or []:
                name, _, value = cookie.split(";", 1)[0].partition("=")
                self.cookies[name.strip()] = value.strip()
            return response.status, response.read()
        finally:
            connection.close()

    def log_in(self, door: str, username: str, password: str) -> int:
        """Try ``door`` ("token" or "admin"); the status of the answer."""
        if door == "token":
            return self.send("POST", "/api/auth/token/", {"username": username, "password": password})[0]
        _, form = self.send("GET", "/admin/login/")
        found = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        fields = {"csrfmiddlewaretoken": found.group(1).decode() if found else "", "username": username}
        fields["password"] = password
        return self.send("POST", "/admin/login/?next=/admin/", fields, Referer=self.base + "/admin/login/")[0]


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    addresses = 12 if full else 6
    accounts = 12 if full else 6
    passwords = COMMON_PASSWORDS[: 3 if full else 2]
    brute = 120 if full else 30
    password = secrets.token_urlsafe(18)
    printed = dep.manage("shell", "-c", SETUP % {"operator": OPERATOR, "password": password, "accounts": accounts})
    made = json.loads(printed.strip().splitlines()[-1])
    result: Counter[str] = Counter(attempts=0, refused=0, attacker_log_ins=0, token_replay_attempts=0)
    result.update(spraying_addresses=addresses, spraying_accounts=accounts + 1, brute_force_refused_by_lockout=0)
    answers: Counter[str] = Counter()
    unexpected: list[str] = []

    def attempt(kind: str, status: int, door: str) -> None:
        result["attempts"] += 1
        result[f"{kind}_attempts"] += 1
        key = f"{kind} {door} {status}"
        answers[key] += 1
        let_in, refusing = DOORS[door]
        if status in let_in:
            result["attacker_log_ins"] += 1
        elif status in refusing:
            result["refused"] += 1
        else:
            unexpected.append(key)

    # 1. Spraying: every address tries a few common passwords on every account, both doors.
    targets = [*(f"sprayed-{n}" for n in range(accounts)), OPERATOR]

    def spray(n: int) -> list[tuple[int, str]]:
        door = Door(dep.url, f"203.0.113.{n + 1}")
        tried = []
        for guess in passwords:
            for i, username in enumerate(targets):
                which = "admin" if (i + n) % 3 == 0 else "token"
                tried.append((door.log_in(which, username, guess), which))
        return tried

    with ThreadPoolExecutor(max_workers=4) as pool:
        for tried in pool.map(spray, range(addresses)):
            for status, which in tried:
                attempt("spraying", status, which)

    # 2. Brute force on the operator from one address; the right password comes last.
    attacker = Door(dep.url, "198.51.100.66")
    guesses = [f"guess-{n}" for n in range(brute - 1)] + [password]
    for n, guess in enumerate(guesses):
        which = "admin" if n % 2 else "token"
        status = attacker.log_in(which, OPERATOR, guess)
        attempt("brute_force", status, which)
        result["brute_force_refused_by_lockout"] += status == 429
    result["right_password_refused_when_locked"] = status == 429

    # 3. Tokens: revoked, expired, and every value of the token table (a dump).
    dump = [str(v) for row in dep.sql("SELECT * FROM knox_authtoken") for v in row]
    for token in [made["revoked"], made["expired"], *dump]:
        status, _ = Client(dep.url, token).request("GET", f"/api/community-layer/{made['holder']}/")
        attempt("token_replay", status, "api")
    query = "SELECT count(*) FROM axes_accessattempt WHERE failures_since_start >= %s"
    result["lockouts"] = dep.sql(query, [FAILURE_LIMIT])[0][0]

    # 4. The right people are unaffected: the operator from their own address, the service's token.
    operator = Door(dep.url, "192.0.2.10")
    logged_in = operator.log_in("admin", OPERATOR, password) == 302
    result["operator_log_in_after"] = logged_in and operator.send("GET", "/admin/")[0] == 200
    result["service_token_after"] = Client(dep.url, dep.token).request("GET", "/api/community-layer/1/")[0] == 200
    passed = (
        result["attempts"] > 0
        and result["refused"] == result["attempts"]  # the token replays among them
        and result["attacker_log_ins"] == 0
        and result["lockouts"] > 0
        and result["right_password_refused_when_locked"]
        and result["operator_log_in_after"]
        and result["service_token_after"]
        and not unexpected
    )
    return {**result, "answers": dict(answers), "unexpected": unexpected, "passed": passed}
