"""The content security policy in a real browser: the pages work under it, nothing they do is
refused, and an injected inline script is refused and reported."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from community.services.layer import leave_community_layer
from tests.helpers import log_in

pytestmark = pytest.mark.django_db(transaction=True)

# Runs before any script of the page (through the browser's debugging protocol, so the policy
# does not apply to it) and records every violation the browser reports.
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__violations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""
PAGES = [
    "/admin/",
    "/admin/community/communityleave/",
    "/admin/community/communityleave/add/",
    "/admin/community/communityleave/console/",
    "/admin/signals_app/signal/",
    "/admin/community/communityleave/console/user/42/",
    "/admin/community/communityleave/console/bulk-leave/",
    "/admin/knox/authtoken/",
    "/admin/axes/accessattempt/",
]


def violations(page: Page) -> Any:
    return page.evaluate("window.__violations")


@pytest.fixture
def watched(page: Page) -> tuple[Page, list[str]]:
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text))
    page.add_init_script(RECORD_VIOLATIONS)
    return page, console


def test_admin_and_console_pages_run_under_the_policy_without_a_violation(
    live_server, browser_operator, watched
) -> None:
    page, console = watched
    browser_operator.is_superuser = True
    browser_operator.save()
    log_in(page, live_server.url, "operator")
    for path in PAGES:
        response = page.goto(live_server.url + path)
        assert response is not None and response.status == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"]
        page.wait_for_load_state("load")
        assert violations(page) == [], path
    assert not [line for line in console if "Content Security Policy" in line]


def test_the_admin_scripts_still_work(live_server, browser_operator, watched) -> None:
    page, _ = watched
    leave_community_layer(user_id=42)
    log_in(page, live_server.url, "operator")
    page.goto(live_server.url + "/admin/community/communityleave/")
    # The changelist's select-all box is driven by the admin's actions.js.
    page.click("#action-toggle")
    expect(page.locator(".action-counter")).to_be_visible()
    assert violations(page) == []


def test_the_api_docs_render_under_the_policy(live_server, watched) -> None:
    page, console = watched
    page.goto(live_server.url + "/api/docs/")
    expect(page.locator(".swagger-ui .opblock").first).to_be_visible()
    assert violations(page) == []
    assert not [line for line in console if "Content Security Policy" in line]


def test_an_injected_inline_script_is_refused_and_reported(live_server, watched) -> None:
    page, _ = watched
    page.goto(live_server.url + "/admin/login/")
    page.evaluate(
        """() => {
          const script = document.createElement("script");
          script.textContent = "window.__injected = true;";
          document.body.appendChild(script);
          const div = document.createElement("div");
          div.innerHTML = '<img src="x:" onerror="window.__handler = true">';
          document.body.appendChild(div);
        }"""
    )
    page.wait_for_function("window.__violations.length >= 2")
    assert page.evaluate("window.__injected === undefined && window.__handler === undefined")
    reported = violations(page)
    assert any(v.startswith("script-src-elem inline") for v in reported), reported
    assert any(v.startswith("script-src-attr inline") for v in reported), reported
