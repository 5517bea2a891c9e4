"""Every admin and console page passes axe-core's WCAG 2.2 AA rules, with real data on it.

The admin pages are enumerated from ``admin.site._registry``: each registered model's
changelist (and the same list with a filter applied, and a date drill-down where there is one),
its add page, the change pages of its first rows and the history and delete pages of its
first, and the confirmation page of its bulk delete action, for every account whose
permissions show them. A model registered
later is covered without a change here; the fixture must then give it a row, or the test says
so. The console's pages (dashboard, a user's page in every state, the confirmation pages, bulk
leave and its checks), the log-in and password pages, and the console again in the dark
theme are visited too.

axe-core is injected into the page, which the strict content security policy forbids: the
audit runs in a browser context of its own that bypasses the policy (the CSP tests keep theirs).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone
from playwright.sync_api import Browser, Page

from community.models import Cohort, Community, CommunityLeave, WebhookDelivery
from community.services.groups import group_members_add
from community.services.layer import leave_community_layer, rejoin_community_layer
from community.webhooks.subscriptions import webhook_subscription_create, webhook_subscription_update
from signals_app.erasure import erasure_job_create, erasure_job_run
from signals_app.models import Outcome, Signal
from signals_app.services.ingest import signals_ingest
from signals_app.services.processing import signals_process
from signals_app.validation import SignalIn
from tests.factories import PASSWORD, UserFactory, api_token, service_account
from tests.helpers import log_in

# live_server serves from another thread: the data must be committed for it to see it.
pytestmark = pytest.mark.django_db(transaction=True)

WCAG_22_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa"]
AXE_OPTIONS = {"runOnly": {"type": "tag", "values": WCAG_22_AA}, "resultTypes": ["violations"]}
ROWS_PER_MODEL = 3  # change pages visited per registered model (history and delete: the first)

ACTIVE, LEFT, CORRUPT_USER, NEVER_LEFT, ERASED = 4242, 1001, 1313, 777, 909
CORRUPT = b"\x07" * 9  # not a leave record the codec can read


# --- the audit ---------------------------------------------------------------------------


@dataclass
class Audit:
    """Runs axe on pages and collects every violation, to fail once with all of them."""

    page: Page
    base_url: str
    who: str
    axe: Axe = field(default_factory=Axe)
    visited: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def visit(self, path: str, *, status: int = 200) -> None:
        response = self.page.goto(self.base_url + path)
        assert response is not None, path
        assert response.status == status, f"{path}: HTTP {response.status}"
        self.check()

    def check(self) -> None:
        """Audits the page as it is now (after a visit, a click or a form sent)."""
        self.page.wait_for_load_state("load")
        url = self.page.url.removeprefix(self.base_url)
        self.visited.append(url)
        results = self.axe.run(self.page, options=AXE_OPTIONS).response
        for violation in results["violations"]:
            for node in violation["nodes"]:
                target = " ".join(str(part) for part in node["target"])
                self.problems.append(
                    f"{violation['id']} ({violation['impact']}) on {url} at `{target}`: {violation['help']}"
                )

    def assert_clean(self) -> None:
        assert self.visited, "no page was audited"
        assert not self.problems, (
            f"axe-core found {len(self.problems)} WCAG 2.2 AA violation(s) on {len(self.visited)} pages "
            f"seen by {self.who}:\n" + "\n".join(self.problems)
        )


@pytest.fixture
def axe_page(browser: Browser) -> Iterator[Page]:
    """A page whose context bypasses the content security policy, for axe's injected script."""
    context = browser.new_context(
        viewport={"width": 1280, "height": 900}, locale="en-US", timezone_id="UTC", bypass_csp=True
    )
    context.set_default_timeout(15_000)
    yield context.new_page()
    context.close()


# --- real data on every page -------------------------------------------------------------


@pytest.fixture
def populated(settings: Any, no_broker: list[list[int]]) -> None:
    """Records in each state (a corrupt one too), their history, signals of each outcome,
    aggregates, memberships, webhooks and their log, erasure jobs, service accounts with tokens,
    and log-in attempts."""
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = True
    python = Community.objects.create(slug="python", name="Python")
    Community.objects.create(slug="rust", name="Rust")
    readers = Cohort.objects.create(slug="readers", name="Readers")
    Cohort.objects.create(slug="writers", name="Writers")
    group_members_add(group=python, user_ids=[ACTIVE, ERASED])
    group_members_add(group=readers, user_ids=[ACTIVE])

    leave_community_layer(user_id=ACTIVE, reason="asked by support")
    rejoin_community_layer(user_id=ACTIVE)
    leave_community_layer(user_id=LEFT)
    CommunityLeave.objects.create(user_id=CORRUPT_USER, value=CORRUPT)

    sender = service_account(username="ingest", perms=["signals_app.add_signal"])
    api_token(sender)
    now = timezone.now()

    def send(user_id: int, count: int, kind: str = "view") -> list[int]:
        signal = SignalIn(user_id, 7, kind, 1.0, now - timedelta(minutes=5), None)
        return signals_ingest(sender=sender, signals=[signal] * count).signal_ids

    signals_process(signal_ids=send(ACTIVE, 4) + send(ACTIVE, 2, "like") + send(ERASED, 2))  # attributed
    signals_process(signal_ids=send(555, 2))  # no target
    send(ACTIVE, 2)  # pending
    failed = send(ACTIVE, 1)
    Signal.objects.filter(pk__in=failed).update(outcome=Outcome.FAILED, error="ProgrammingError: boom")
    send(LEFT, 3)  # gated at receipt
    assert set(Signal.objects.values_list("outcome", flat=True)) == set(Outcome)

    done = erasure_job_create(user_ids=[ERASED, 31337], source="api")
    erasure_job_run(job_id=done.pk)
    erasure_job_create(user_ids=[ACTIVE], source="api")  # pending: its task is not run here

    hook = webhook_subscription_create(name="warehouse", url="http://127.0.0.1:9/hooks/tidal")
    paused = webhook_subscription_create(name="crm", url="https://crm.example.com/tidal", actions=["leave"])
    webhook_subscription_update(subscription=paused, is_active=False)
    attempts = ((1, False, None, "ConnectError: refused"), (2, False, 503, ""), (3, True, 200, ""))
    for attempt, ok, code, error in attempts:
        WebhookDelivery.objects.create(
            subscription=hook,
            first_version=1,
            last_version=4,
            changes=4,
            attempt=attempt,
            ok=ok,
            status_code=code,
            error=error,
            started_at=now - timedelta(minutes=10 - attempt),
            duration_ms=12 * attempt,
        )

    # The log-in records (django-axes): failed log-ins, then a good one and its log-out.
    client = Client()
    client.post(reverse("admin:login"), {"username": "intruder", "password": "wrong"})
    client.post(reverse("admin:login"), {"username": "ingest", "password": "wrong"})
    client.post(reverse("admin:login"), {"username": "ingest", "password": PASSWORD})
    client.post(reverse("admin:logout"))


# --- enumerating the admin --------------------------------------------------------------


def _request_as(user: Any) -> Any:
    request = RequestFactory().get("/admin/")
    request.user = user
    return request


def audit_admin(audit: Audit, user: Any) -> None:
    """The index, each app's index, and each registered model's pages that ``user`` may see."""
    request = _request_as(user)
    audit.visit(reverse("admin:index"))
    app_labels: set[str] = set()
    for model, model_admin in admin.site._registry.items():
        if not model_admin.has_view_or_change_permission(request):
            continue
        opts = model._meta
        app_labels.add(opts.app_label)
        name = f"admin:{opts.app_label}_{opts.model_name}"

        changelist = reverse(f"{name}_changelist")
        audit.visit(changelist)
        if model_admin.get_list_filter(request):
            _visit_first_link(audit, "#changelist-filter li:not(.selected) a", opts.label)
        if model_admin.date_hierarchy:
            audit.page.goto(audit.base_url + changelist)
            _visit_first_link(audit, "nav.toplinks a", opts.label)
        if "delete_selected" in model_admin.get_actions(request):
            _bulk_delete_confirmation(audit, changelist)

        if model_admin.has_add_permission(request):
            audit.visit(reverse(f"{name}_add"))

        rows = list(model_admin.get_queryset(request).order_by("pk")[:ROWS_PER_MODEL])
        assert rows, f"no {opts.label} row to show: give the model one in the `populated` fixture"
        for obj in rows:
            audit.visit(reverse(f"{name}_change", args=[quote(obj.pk)]))
        first = rows[0]
        audit.visit(reverse(f"{name}_history", args=[quote(first.pk)]))
        if model_admin.has_delete_permission(request, first):
            audit.visit(reverse(f"{name}_delete", args=[quote(first.pk)]))
    for app_label in sorted(app_labels):
        audit.visit(reverse("admin:app_list", args=[app_label]))


def _visit_first_link(audit: Audit, selector: str, label: str) -> None:
    links = audit.page.locator(selector)
    assert links.count(), f"{label}: no link matches {selector!r} on {audit.page.url}"
    href = links.first.get_attribute("href")
    assert href is not None
    audit.page.goto(audit.page.url.split("?")[0] + href if href.startswith("?") else href)
    audit.check()


def _bulk_delete_confirmation(audit: Audit, changelist: str) -> None:
    """The changelist's bulk delete action, chosen for the first row: its confirmation page."""
    audit.page.goto(audit.base_url + changelist)
    audit.page.locator("#result_list input[name=_selected_action]").first.check()
    audit.page.select_option("select[name=action]", "delete_selected")
    with audit.page.expect_navigation():
        audit.page.click("button[name=index]")
    # "Are you sure?", or what protects the row from deletion: a page either way.
    assert audit.page.locator("body.delete-confirmation").count(), audit.page.url
    audit.check()


# --- the console -------------------------------------------------------------------------


def audit_console(audit: Audit, *, may_change: bool, may_erase: bool) -> None:
    console = reverse("admin:community_console")
    audit.visit(console)
    # A bad id: the dashboard again, with an error message.
    audit.page.fill("#id_user_id", "12x")
    audit.page.click("#find-user input[type=submit]")
    audit.page.wait_for_selector("ul.messagelist")
    audit.check()
    for user_id in (ACTIVE, LEFT, CORRUPT_USER, NEVER_LEFT, ERASED):
        audit.visit(reverse("admin:community_console_user", args=[user_id]))
    if may_change:
        audit.visit(reverse("admin:community_console_user_leave", args=[ACTIVE]))
        audit.visit(reverse("admin:community_console_user_rejoin", args=[LEFT]))
        # Confirming: the user's page with a success message.
        audit.page.click("#confirm-button")
        audit.page.wait_for_selector("ul.messagelist")
        audit.check()
        bulk = reverse("admin:community_console_bulk_leave")
        audit.visit(bulk)
        audit.page.fill("#id_user_ids", "101, 102\n103 oops")
        audit.page.click("#check-button")
        audit.page.wait_for_selector("ul.errorlist")
        audit.check()
        audit.page.fill("#id_user_ids", "101, 102\n103")
        audit.page.click("#check-button")
        audit.page.wait_for_selector("#confirm-button")
        audit.check()
        # The leave records' own action, and its message on the changelist.
        audit.page.goto(audit.base_url + reverse("admin:community_communityleave_changelist"))
        audit.page.check(f"#result_list input[name=_selected_action][value='{ACTIVE}']")
        audit.page.select_option("select[name=action]", "leave_selected")
        audit.page.click("button[name=index]")
        audit.page.wait_for_selector("ul.messagelist")
        audit.check()
    if may_erase:
        audit.visit(reverse("admin:signals_app_erase_user", args=[ACTIVE]))
        add = reverse("admin:signals_app_erasurejob_add")
        audit.page.goto(audit.base_url + add)
        audit.page.fill("#id_user_ids", "12 oops")
        audit.page.check("#id_confirm")
        audit.page.click("#erase-many-button")  # a bad id: the form again, with its errors
        audit.page.wait_for_selector(".errorlist")
        audit.check()


def audit_account_pages(audit: Audit, username: str) -> None:
    """The log-in page (and its error), then the password change pages."""
    audit.visit(reverse("admin:login"))
    audit.page.fill("#id_username", username)
    audit.page.fill("#id_password", "not the password")
    audit.page.click("input[type=submit]")
    audit.page.wait_for_selector(".errornote")
    audit.check()
    log_in(audit.page, audit.base_url, username)
    audit.visit(reverse("admin:password_change"))
    audit.page.fill("#id_old_password", PASSWORD)
    audit.page.fill("#id_new_password1", "another-Long-pass-9")
    audit.page.fill("#id_new_password2", "another-Long-pass-9!")  # not the same: the errors
    audit.page.click("input[type=submit]")
    audit.page.wait_for_selector(".errorlist")
    audit.check()


# --- the tests ---------------------------------------------------------------------------


def test_every_page_a_superuser_sees_passes_wcag_22_aa(live_server, axe_page: Page, populated) -> None:
    UserFactory(username="root", is_staff=True, is_superuser=True)
    audit = Audit(axe_page, live_server.url, "a superuser")
    audit_account_pages(audit, "root")
    audit_admin(audit, _superuser())
    audit_console(audit, may_change=True, may_erase=True)
    audit.assert_clean()
    assert len(audit.visited) > 60  # every registered model, not a few pages


def test_every_page_an_operator_sees_passes_wcag_22_aa(
    live_server, axe_page: Page, populated, browser_operator
) -> None:
    audit = Audit(axe_page, live_server.url, "an operator (leave records, signals)")
    log_in(axe_page, live_server.url, "operator")
    audit_admin(audit, browser_operator)
    audit_console(audit, may_change=True, may_erase=False)
    audit.assert_clean()


def test_every_page_a_read_only_operator_sees_passes_wcag_22_aa(live_server, axe_page: Page, populated) -> None:
    viewer = UserFactory(username="viewer", is_staff=True, perms=["community.view_communityleave"])
    audit = Audit(axe_page, live_server.url, "a read-only operator (leave records only)")
    log_in(axe_page, live_server.url, "viewer")
    audit_admin(audit, viewer)
    audit_console(audit, may_change=False, may_erase=False)
    audit.assert_clean()


def test_the_console_passes_wcag_22_aa_in_the_dark_theme(
    live_server, browser: Browser, populated, browser_operator
) -> None:
    """The console's own colours (the status, the charts' text) in the admin's dark theme."""
    context = browser.new_context(
        viewport={"width": 1280, "height": 900}, color_scheme="dark", bypass_csp=True, locale="en-US"
    )
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        log_in(page, live_server.url, "operator")
        audit = Audit(page, live_server.url, "an operator, dark theme")
        audit.visit(reverse("admin:community_communityleave_changelist"))
        audit_console(audit, may_change=True, may_erase=False)
        audit.assert_clean()
    finally:
        context.close()


def test_the_audit_finds_a_violation(live_server, axe_page: Page, browser_operator) -> None:
    """The harness itself: a page made inaccessible on purpose is reported with its rule,
    impact, selector and address."""
    log_in(axe_page, live_server.url, "operator")
    audit = Audit(axe_page, live_server.url, "the operator")
    axe_page.evaluate(
        """() => {
          const img = document.createElement("img");
          img.id = "no-alt"; img.src = "data:image/gif;base64,R0lGODlhAQABAAAAACw=";
          document.querySelector("#content").append(img);
          const faint = document.createElement("p");
          faint.id = "faint"; faint.textContent = "hard to read"; faint.style.color = "#eeeeee";
          document.querySelector("#content").append(faint);
        }"""
    )
    audit.check()
    assert any(re.match(r"image-alt \(critical\) on /admin/ at `#no-alt`", p) for p in audit.problems), audit.problems
    assert any(p.startswith("color-contrast (serious) on /admin/ at `#faint`") for p in audit.problems)
    with pytest.raises(AssertionError, match="image-alt"):
        audit.assert_clean()


def _superuser() -> Any:
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username="root")
