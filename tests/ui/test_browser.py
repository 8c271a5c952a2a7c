"""The UI as an operator uses it: Debian's Chromium (headless, driven by Playwright) against a real server.

Set PANTHEON_UI_SCREENSHOTS to a folder to save a screenshot of each page there (docs/ui/ holds the committed ones).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from inference.models import CatalogModel
from pantheon_site.models import AccessToken
from pantheon_site.tokens import do_create_token
from tests.inference.serving import operator_client
from tests.ui.conftest import STAFF_PASSWORD

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOTS = os.environ.get("PANTHEON_UI_SCREENSHOTS", "")


@pytest.fixture(scope="module")
def server(start_server):
    return start_server()


@pytest.fixture(scope="module")
def browser():
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("Debian's chromium is not installed (.ci/run installs it: apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module", autouse=True)
def orm_beside_playwright(server, browser):
    """Playwright's sync API keeps an event loop in this thread; the ORM calls the tests make in between are their
    own, so Django is told not to refuse them. Set once the server runs, so that its environment stays strict."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture
def page(browser, server, staff_user) -> Page:
    """A signed-in operator's page."""
    context = browser.new_context(base_url=server.url, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto("/ui/login/")
    page.fill("input[name=username]", staff_user.username)
    page.fill("input[name=password]", STAFF_PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("nav.top")).to_contain_text(staff_user.username)
    yield page
    context.close()
    with operator_client(server, do_create_token("operator", "cleanup")[1]):
        pass  # leaving it unloads what the test loaded


def shot(page: Page, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


def load_from_catalogue(page: Page, path: Path, name: str) -> None:
    page.goto("/ui/models/")
    form = page.locator("#load-form")
    form.locator("input[name=path]").fill(str(path))
    form.locator("input[name=name]").fill(name)
    form.get_by_role("button", name="Register only").click()
    row = page.locator(f"#catalogue tr[data-model='{name}']")
    expect(row).to_be_visible()
    row.locator("button.load").click()
    expect(page.locator(f"#instances tr[data-model='{name}'] .instance-state")).to_have_text("ready")


def test_sign_in_shows_the_dashboard(page: Page):
    expect(page).to_have_url(re.compile(r"/ui/$"))
    expect(page.locator("#health")).to_contain_text("ok")
    expect(page.locator("#devices")).to_contain_text("cpu")
    shot(page, "dashboard")


def test_load_a_model_from_the_catalogue_and_see_it_ready(page: Page, stories_gguf_path: Path):
    load_from_catalogue(page, stories_gguf_path, "stories")
    assert CatalogModel.objects.get(name="stories").path == str(stories_gguf_path)
    expect(page.locator("main .notice.ok")).to_contain_text("Loaded stories")
    shot(page, "models")
    page.goto("/ui/")
    expect(page.locator("#instances tr[data-model='stories']")).to_contain_text("ready")


def test_a_failed_load_is_shown_in_words(page: Page, tmp_path: Path):
    page.goto("/ui/models/")
    form = page.locator("#load-form")
    form.locator("input[name=path]").fill(str(tmp_path / "missing.gguf"))
    form.get_by_role("button", name="Load", exact=True).click()
    expect(page.locator("main .notice.error")).to_contain_text("The load failed")


def test_chat_in_the_playground_streams_tokens(page: Page, stories_gguf_path: Path):
    load_from_catalogue(page, stories_gguf_path, "stories")
    page.goto("/ui/playground/")
    page.select_option("#pg-model", "stories")
    page.fill("#pg-max-tokens", "48")
    # Count the updates the answer gets: a streamed answer grows chunk by chunk, a whole one arrives at once.
    page.evaluate(
        """() => { window.pgUpdates = 0;
        new MutationObserver(() => { window.pgUpdates += 1; }).observe(
          document.querySelector('#pg-transcript'), {subtree: true, childList: true, characterData: true}); }"""
    )
    page.fill("#pg-message", "Once upon a time")
    page.click("#pg-send")
    answer = page.locator(".pg-turn.assistant").last
    expect(answer.locator(".pg-finish")).to_contain_text("length")
    assert len(answer.locator(".pg-content").inner_text().strip()) > 0
    assert page.evaluate("window.pgUpdates") > 10
    shot(page, "playground")


def test_a_token_secret_is_shown_once_then_revoked(page: Page):
    page.goto("/ui/tokens/")
    page.fill("#token-label", "ci-bot")
    page.select_option("#token-role", "client")
    page.click("#token-create")
    secret = page.locator("#token-secret").inner_text().strip()
    assert secret.startswith("pth_") and AccessToken.objects.get(label="ci-bot").prefix == secret[:8]
    shot(page, "tokens")
    page.reload()
    expect(page.locator("#tokens tr[data-label='ci-bot']")).to_be_visible()
    assert page.locator("#token-secret").count() == 0 and secret not in page.content()
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#tokens tr[data-label='ci-bot'] button.danger").click()
    expect(page.locator("#tokens tr[data-label='ci-bot']")).to_contain_text("revoked")
    assert AccessToken.objects.get(label="ci-bot").state() == "revoked"


def test_filter_the_audit_log_to_a_revocation_and_export_it(page: Page, staff_user):
    page.goto("/ui/tokens/")
    for label in ("keep-me", "drop-me"):
        page.fill("#token-label", label)
        page.click("#token-create")
        expect(page.locator("#token-secret")).to_be_visible()
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#tokens tr[data-label='drop-me'] button.danger").click()
    expect(page.locator("#tokens tr[data-label='drop-me']")).to_contain_text("revoked")

    page.goto("/ui/audit/")
    filters = page.locator("#audit-filters")
    filters.locator("input[name=operation]").fill("token_revoke")
    filters.locator("input[name=actor]").fill(staff_user.username)
    filters.locator("button[type=submit]").click()
    rows = page.locator("#audit-events tbody tr[data-id]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("token_revoke")
    expect(page.locator("#audit-verify")).to_contain_text("intact")
    shot(page, "audit")
    with page.expect_download() as download:
        page.click("#export-csv")
    lines = Path(download.value.path()).read_text().strip().splitlines()
    assert len(lines) == 2 and "token_revoke" in lines[1] and "drop-me" in lines[1]


def test_release_a_session(page: Page, server, stories_gguf_path: Path):
    load_from_catalogue(page, stories_gguf_path, "stories")
    body = {"model": "stories", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "session_id": "s-1"}
    assert httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    page.goto("/ui/sessions/")
    row = page.locator("tr[data-session='s-1']")
    expect(row).to_be_visible()
    shot(page, "sessions")
    row.locator("button.release").click()
    expect(page.locator("main .notice.ok")).to_contain_text("Released session s-1")
    expect(page.locator("tr[data-session='s-1']")).to_have_count(0)


def test_the_weights_page_shows_the_barrier(page: Page):
    page.goto("/ui/weights/")
    expect(page.locator("#attachment")).to_contain_text("serving")
    shot(page, "weights")
