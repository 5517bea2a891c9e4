"""Real HTTP against pytest-django's live server: the admin's log-in form and the token endpoint."""

from __future__ import annotations

import http.cookiejar
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    status: int
    headers: Any
    body: bytes
    url: str

    def json(self) -> Any:
        return json.loads(self.body)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Browser:
    """Cookies kept, redirects not followed, every header given sent on every request."""

    def __init__(self, base: str, headers: dict[str, str] | None = None) -> None:
        self.base = base
        self.headers = headers or {}
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies), NoRedirect)

    def request(self, method: str, path: str, data: dict[str, str] | None = None, **headers: str) -> Answer:
        body = None if data is None else urllib.parse.urlencode(data).encode()
        request = urllib.request.Request(self.base + path, data=body, method=method)
        for name, value in {**self.headers, **headers}.items():
            request.add_header(name, value)
        if body is not None:
            request.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with self.opener.open(request, timeout=30) as response:
                return Answer(response.status, response.headers, response.read(), response.url)
        except urllib.error.HTTPError as error:
            return Answer(error.code, error.headers, error.read(), error.url)

    def admin_log_in(self, username: str, password: str) -> Answer:
        """The admin's log-in form, as a browser submits it (with its CSRF token)."""
        form = self.request("GET", "/admin/login/?next=/admin/")
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', form.body)
        assert token is not None, form.body[:500]
        fields = {"csrfmiddlewaretoken": token.group(1).decode(), "username": username, "password": password}
        return self.request("POST", "/admin/login/?next=/admin/", fields, Referer=self.base + "/admin/login/")

    def logged_in(self) -> bool:
        return self.request("GET", "/admin/").status == 200

    def token_log_in(self, username: str, password: str) -> Answer:
        return self.request("POST", "/api/auth/token/", {"username": username, "password": password})
