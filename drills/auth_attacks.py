"""Attacks on the doors (log-in lockout and API tokens) over HTTP: password spraying over many
accounts and client addresses at the token endpoint and the admin's form; brute force on one
operator from one address, the right password last; a revoked token, an expired one and every
value of the token table as a dump would give it. The deployment believes X-Real-IP as the
client address (as behind a proxy that sets it), so that one machine can play many attackers."""

from __future__ import annotations

import json
import re
import secrets
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from drills.deployment import Deployment
from drills.hostile_input.common import exchange

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

    def __init__(self, url: str, address: str) -> None:
        self.url, self.address = url, address
        # Kept by hand: production cookies are Secure, and the drill speaks plain HTTP on loopback.
        self.cookies: dict[str, str] = {}

    def send(self, method: str, path: str, fields: dict[str, str] | None = None, **headers: str) -> tuple[int, bytes]:
        """One request on a new connection (redirects are answers here, not followed)."""
        headers["X-Real-IP"] = self.address
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if fields is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        body = None if fields is None else urllib.parse.urlencode(fields).encode()
        answer = exchange(self.url, method, path, headers=headers, body=body, timeout=60)
        for name, value in re.findall(rb"^set-cookie: *([^=]+)=([^;\r\n]*)", answer.head, re.MULTILINE | re.I):
            self.cookies[name.decode().strip()] = value.decode().strip()
        return answer.status, answer.body

    def log_in(self, door: str, username: str, password: str) -> int:
        """Try ``door`` ("token" or "admin"); the status of the answer."""
        if door == "token":
            return self.send("POST", "/api/auth/token/", {"username": username, "password": password})[0]
        _, form = self.send("GET", "/admin/login/")
        found = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        fields = {"csrfmiddlewaretoken": found.group(1).decode() if found else "", "username": username}
        fields["password"] = password
        return self.send("POST", "/admin/login/?next=/admin/", fields, Referer=self.url + "/admin/login/")[0]


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    addresses = accounts = 12 if full else 6
    passwords = COMMON_PASSWORDS[: 3 if full else 2]
    password = secrets.token_urlsafe(18)
    printed = dep.manage("shell", "-c", SETUP % {"operator": OPERATOR, "password": password, "accounts": accounts})
    made = json.loads(printed.strip().splitlines()[-1])
    answers: Counter[tuple[str, str, int]] = Counter()  # (attack, door, status) -> attempts

    # 1. Spraying: every address tries a few common passwords on every account, both doors.
    targets = [*(f"sprayed-{n}" for n in range(accounts)), OPERATOR]

    def spray(n: int) -> list[tuple[str, str, int]]:
        door = Door(dep.url, f"203.0.113.{n + 1}")
        tried = []
        for guess in passwords:
            for i, username in enumerate(targets):
                which = "admin" if (i + n) % 3 == 0 else "token"
                tried.append(("spraying", which, door.log_in(which, username, guess)))
        return tried

    with ThreadPoolExecutor(max_workers=4) as pool:
        for tried in pool.map(spray, range(addresses)):
            answers.update(tried)

    # 2. Brute force on the operator from one address; the right password comes last.
    attacker = Door(dep.url, "198.51.100.66")
    guesses = [f"guess-{n}" for n in range(119 if full else 29)] + [password]
    for n, guess in enumerate(guesses):
        which = "admin" if n % 2 else "token"
        status = attacker.log_in(which, OPERATOR, guess)
        answers["brute_force", which, status] += 1
    right_password_refused = status == 429

    # 3. Tokens: revoked, expired, and every value of the token table (a dump).
    dump = [str(v) for row in dep.sql("SELECT * FROM knox_authtoken") for v in row]
    for token in [made["revoked"], made["expired"], *dump]:
        status, _ = dep.client(token).request("GET", f"/api/community-layer/{made['holder']}/")
        answers["token_replay", "api", status] += 1
    query = "SELECT count(*) FROM axes_accessattempt WHERE failures_since_start >= %s"
    lockouts = dep.sql(query, [FAILURE_LIMIT])[0][0]

    # 4. The right people are unaffected: the operator from their own address, the service's token.
    operator = Door(dep.url, "192.0.2.10")
    logged_in = operator.log_in("admin", OPERATOR, password) == 302
    operator_after = logged_in and operator.send("GET", "/admin/")[0] == 200
    service_after = dep.client().request("GET", "/api/community-layer/1/")[0] == 200

    # Each answer as its door means it: the attacker let in, refused, or neither (unexpected).
    let_in = sum(n for (_, door, status), n in answers.items() if status in DOORS[door][0])
    refused = sum(n for (_, door, status), n in answers.items() if status in DOORS[door][1])
    unexpected = [f"{a} {door} {status}" for a, door, status in answers if status not in set.union(*DOORS[door])]
    passed = (
        answers.total() > 0
        and refused == answers.total()  # the token replays among them
        and let_in == 0
        and lockouts > 0
        and right_password_refused
        and operator_after
        and service_after
        and not unexpected
    )
    return {
        "attempts": answers.total(),
        "refused": refused,
        "attacker_log_ins": let_in,
        "lockouts": lockouts,
        "right_password_refused_when_locked": right_password_refused,
        "operator_log_in_after": operator_after,
        "service_token_after": service_after,
        "answers": {f"{attack} {door} {status}": n for (attack, door, status), n in answers.items()},
        "unexpected": unexpected,
        "passed": passed,
    }
