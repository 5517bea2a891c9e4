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

import json
import re
import secrets
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psycopg

from drills.deployment import Deployment
from support.client import LOOPBACK, Client

COMMON_PASSWORDS = ["123456", "password", "admin", "qwerty", "letmein", "welcome1", "changeme"]
OPERATOR = "drill-operator"
# The limit of the deployment (LOGIN_FAILURE_LIMIT's default).
FAILURE_LIMIT = 5

SETUP = """
import json
from datetime import timedelta
from django.contrib.auth import get_user_model
from accounts.services import token_issue, tokens_revoke
from knox.models import AuthToken
U = get_user_model()
out = {"accounts": []}
U.objects.create_superuser(%(operator)r, password=%(password)r)
for n in range(%(accounts)d):
    U.objects.create_user(f"sprayed-{n}", password=%(password)r + str(n))
    out["accounts"].append(f"sprayed-{n}")
holder = U.objects.create_user("token-holder", password=%(password)r)
row, revoked = token_issue(user=holder)
tokens_revoke(tokens=AuthToken.objects.filter(pk=row.pk))
_, expired = token_issue(user=holder, ttl=timedelta(seconds=-1))
out.update(holder=holder.pk, revoked=revoked, expired=expired)
print(json.dumps(out))
"""


@dataclass
class AuthAttacksResult:
    attempts: int = 0
    refused: int = 0
    attacker_log_ins: int = 0
    lockouts: int = 0
    spraying_attempts: int = 0
    spraying_addresses: int = 0
    spraying_accounts: int = 0
    brute_force_attempts: int = 0
    brute_force_refused_by_lockout: int = 0
    right_password_refused_when_locked: bool = False
    token_replays: int = 0
    token_replays_refused: int = 0
    operator_log_in_after: bool = False
    service_token_after: bool = False
    answers: dict[str, int] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (
            self.attempts > 0
            and self.refused == self.attempts
            and self.attacker_log_ins == 0
            and self.lockouts > 0
            and self.right_password_refused_when_locked
            and self.token_replays_refused == self.token_replays
            and self.operator_log_in_after
            and self.service_token_after
            and not self.unexpected
        )


class Door:
    """One client at one address: the token endpoint and the admin's form (with its CSRF token)."""

    def __init__(self, base: str, address: str) -> None:
        if urlsplit(base).hostname not in LOOPBACK:
            raise ValueError(f"drills only target loopback addresses, not {base}")
        self.base = base
        self.address = address
        self.opener = urllib.request.build_opener(NoRedirect)
        # Kept by hand: production cookies are Secure, and the drill speaks plain HTTP on loopback.
        self.cookies: dict[str, str] = {}

    def send(self, method: str, path: str, fields: dict[str, str] | None = None, **headers: str) -> tuple[int, bytes]:
        data = None if fields is None else urllib.parse.urlencode(fields).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("X-Real-IP", self.address)
        if self.cookies:
            req.add_header("Cookie", "; ".join(f"{k}={v}" for k, v in self.cookies.items()))
        for name, value in headers.items():
            req.add_header(name, value)
        try:
            with self.opener.open(req, timeout=60) as response:  # loopback only, checked above
                self.keep(response.headers)
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            self.keep(error.headers)
            return error.code, error.read()

    def keep(self, headers: Any) -> None:
        for cookie in headers.get_all("Set-Cookie") or []:
            name, _, value = cookie.split(";", 1)[0].partition("=")
            self.cookies[name.strip()] = value.strip()

    def token(self, username: str, password: str) -> int:
        return self.send("POST", "/api/auth/token/", {"username": username, "password": password})[0]

    def admin(self, username: str, password: str) -> int:
        _, form = self.send("GET", "/admin/login/")
        found = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        fields = {"csrfmiddlewaretoken": found.group(1).decode() if found else "", "username": username}
        fields["password"] = password
        return self.send("POST", "/admin/login/?next=/admin/", fields, Referer=self.base + "/admin/login/")[0]


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def logged_in(status: int, door: str) -> bool:
    return status == (302 if door == "admin" else 200)


def drill(dep: Deployment, *, full: bool) -> AuthAttacksResult:
    addresses = 12 if full else 6
    accounts = 12 if full else 6
    passwords = COMMON_PASSWORDS[: 3 if full else 2]
    brute = 120 if full else 30
    password = secrets.token_urlsafe(18)
    printed = dep.manage("shell", "-c", SETUP % {"operator": OPERATOR, "password": password, "accounts": accounts})
    made = json.loads(printed.strip().splitlines()[-1])
    result = AuthAttacksResult(spraying_addresses=addresses, spraying_accounts=accounts + 1)

    def attempt(kind: str, status: int, door: str) -> None:
        result.attempts += 1
        key = f"{kind} {door} {status}"
        result.answers[key] = result.answers.get(key, 0) + 1
        if logged_in(status, door):
            result.attacker_log_ins += 1
        elif status in (400, 429) or (door == "admin" and status == 200):
            result.refused += 1
        else:
            result.unexpected.append(key)

    # 1. Spraying: every address tries a few common passwords on every account, both doors.
    targets = [*made["accounts"], OPERATOR]

    def spray(n: int) -> list[tuple[int, str]]:
        door = Door(dep.url, f"203.0.113.{n + 1}")
        answers = []
        for guess in passwords:
            for i, username in enumerate(targets):
                which = "admin" if (i + n) % 3 == 0 else "token"
                answers.append(
                    (door.admin(username, guess) if which == "admin" else door.token(username, guess), which)
                )
        return answers

    with ThreadPoolExecutor(max_workers=4) as pool:
        for answers in pool.map(spray, range(addresses)):
            for status, which in answers:
                attempt("spray", status, which)
                result.spraying_attempts += 1

    # 2. Brute force on the operator from one address; the right password comes last.
    attacker = Door(dep.url, "198.51.100.66")
    guesses = [f"guess-{n}" for n in range(brute - 1)] + [password]
    for n, guess in enumerate(guesses):
        which = "admin" if n % 2 else "token"
        status = attacker.admin(OPERATOR, guess) if which == "admin" else attacker.token(OPERATOR, guess)
        attempt("brute", status, which)
        result.brute_force_attempts += 1
        if status == 429:
            result.brute_force_refused_by_lockout += 1
    result.right_password_refused_when_locked = status == 429

    # 3. Tokens: revoked, expired, and every value of the token table (a dump).
    with psycopg.connect(dep.database_url) as conn:
        dump = [str(v) for row in conn.execute("SELECT * FROM knox_authtoken").fetchall() for v in row]
    replays = [made["revoked"], made["expired"], *dump]
    for token in replays:
        status, _ = Client(dep.url, token).request("GET", f"/api/community-layer/{made['holder']}/")
        result.token_replays += 1
        result.attempts += 1
        if status == 401:
            result.token_replays_refused += 1
            result.refused += 1
        elif status in (200, 403):
            result.attacker_log_ins += 1
        else:
            result.unexpected.append(f"token {status}")

    with psycopg.connect(dep.database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM axes_accessattempt WHERE failures_since_start >= %s", [FAILURE_LIMIT]
        ).fetchone()
    result.lockouts = int(row[0]) if row else 0

    # 4. The right people are unaffected: the operator from their own address, the service's token.
    operator = Door(dep.url, "192.0.2.10")
    result.operator_log_in_after = (
        operator.admin(OPERATOR, password) == 302 and operator.send("GET", "/admin/")[0] == 200
    )
    result.service_token_after = Client(dep.url, dep.token).request("GET", "/api/community-layer/1/")[0] == 200
    print(
        f"   {result.attempts} attempts, {result.refused} refused, {result.lockouts} lockouts, "
        f"{result.attacker_log_ins} attacker log-ins",
        flush=True,
    )
    return result
