"""The UI as an operator uses it: Debian's Chromium (headless, driven by Playwright) against a real server.

Set PANTHEON_UI_SCREENSHOTS to a folder to save a screenshot of each page there (docs/ui/ holds the committed ones).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from batches.models import Batch, BatchStatus, FilePurpose
from inference.models import CatalogModel
from pantheon_site.models import AccessToken, AuditEvent
from pantheon_site.tokens import do_create_token
from tests.inference.serving import operator_client, wait_for
from tests.ui.batch_data import make_batch, stored_file
from tests.ui.conftest import STAFF_PASSWORD
from tests.weights.weights_calls import Holder, new_token
from tests.weights.weights_calls import status as weights_status
from weights.models import Checkpoint

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOTS = os.environ.get("PANTHEON_UI_SCREENSHOTS", "")
# A load (an attachable one copies its weights into shared memory) may take seconds on a loaded machine.
expect.set_options(timeout=60_000)


# A trainer that stops sending heartbeats goes stale this soon, so the weights test sees a stale attachment.
HEARTBEAT_TIMEOUT_S = 1.0
# The dashboard's charts get a point this often, so a few requests show within seconds.
CHART_INTERVAL_S = 0.5


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(
        WEIGHTS_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_TIMEOUT_S),
        WEIGHTS_HEARTBEAT_INTERVAL_HINT_S=str(HEARTBEAT_TIMEOUT_S / 4),
        PANTHEON_METRICS_HISTORY_INTERVAL_S=str(CHART_INTERVAL_S),
    )


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


def test_sign_in_shows_the_dashboard_which_follows_a_load_without_a_reload(page: Page, server, stories_gguf_path):
    expect(page).to_have_url(re.compile(r"/ui/$"))
    expect(page.locator("#health")).to_contain_text("ok")
    expect(page.locator("#devices")).to_contain_text("cpu")
    expect(page.locator("#instances")).to_contain_text("No model is served")
    with operator_client(server, new_token("operator", "ops")) as api:  # a load made elsewhere, by the API
        assert api.post("/admin/models/load", json={"path": str(stories_gguf_path), "name": "tiny"}).is_success
        row = page.locator("#instances tr[data-model='tiny']")
        expect(row.locator(".instance-state")).to_have_text("ready")
        expect(row).to_contain_text("512 / 512")  # the context window, served / configured
        expect(page.locator("#devices")).to_contain_text("tiny")
        shot(page, "dashboard")


def test_the_dashboard_charts_each_served_model_live_from_its_metrics(page: Page, server, stories_gguf_path: Path):
    load_from_catalogue(page, stories_gguf_path, "stories")
    page.goto("/ui/")
    charts = page.locator("#charts section.model-charts[data-model='stories']")
    # one drawn chart each: tokens/s, TTFT p50/p99, queue depth, KV blocks in use, refusals/s
    expect(charts.locator("figure.chart canvas")).to_have_count(5)
    body = {"model": "stories", "messages": [{"role": "user", "content": "Once"}], "max_tokens": 32}
    for _ in range(3):  # while the page is open: it shows them without a reload
        assert httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    page.wait_for_function("() => window.pantheonCharts.get('stories').plots.tokens.data[1].some((v) => v > 0)")
    assert page.evaluate("() => window.pantheonCharts.get('stories').plots.ttft.data[2].some((v) => v > 0)")  # p99
    expect(charts.locator("[data-chart=tokens] .now")).to_contain_text(re.compile(r"now \d"))
    shot(page, "dashboard-charts")


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
    page.fill("#pg-max-tokens", "128")
    # Watch the answer: each delta the page applies is one change to .pg-content (however the network batched the
    # events), and the lengths it had when the browser got to show it prove it grew while the stream ran.
    page.evaluate(
        """() => { window.pgUpdates = 0; window.pgShown = [];
        new MutationObserver((records) => {
          window.pgUpdates += records.filter((r) => r.target.classList?.contains('pg-content')).length;
          const content = [...document.querySelectorAll('.pg-turn.assistant .pg-content')].pop();
          if (content) window.pgShown.push(content.textContent.length);
        }).observe(document.querySelector('#pg-transcript'), {subtree: true, childList: true, characterData: true});
        }"""
    )
    page.fill("#pg-message", "Once upon a time")
    page.click("#pg-send")
    answer = page.locator(".pg-turn.assistant").last
    expect(answer.locator(".pg-finish")).to_contain_text("length")
    final = len(answer.locator(".pg-content").text_content())
    assert final > 0
    assert page.evaluate("window.pgUpdates") > 10
    assert any(0 < shown < final for shown in page.evaluate("window.pgShown"))  # seen part-way, before the end
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


def test_export_release_and_restore_a_session(page: Page, server, stories_gguf_path: Path):
    load_from_catalogue(page, stories_gguf_path, "stories")
    body = {"model": "stories", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "session_id": "s-1"}
    assert httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    page.goto("/ui/sessions/")
    row = page.locator("tr[data-session='s-1']")
    expect(row).to_be_visible()
    tokens = int(row.locator("td").nth(2).inner_text())
    shot(page, "sessions")
    with page.expect_download() as download:
        row.get_by_role("button", name="Export").click()
    exported = json.loads(Path(download.value.path()).read_text())
    assert exported["session_id"] == "s-1" and exported["n_tok"] == tokens

    row.locator("button.release").click()
    expect(page.locator("main .notice.ok")).to_contain_text("Released session s-1")
    expect(page.locator("tr[data-session='s-1']")).to_have_count(0)

    restore = page.locator("section[data-model='stories'] form[enctype='multipart/form-data']")
    restore.locator("input[type=file]").set_input_files(download.value.path())
    restore.locator("input[name=session_id]").fill("s-2")
    restore.get_by_role("button", name="Restore", exact=True).click()
    expect(page.locator("main .notice.ok")).to_contain_text(f"Restored session s-2 ({tokens} tokens)")
    expect(page.locator("tr[data-session='s-2']")).to_be_visible()
    operations = set(AuditEvent.objects.filter(actor_label="olga").values_list("operation", flat=True))
    assert {"session_export", "session_release", "session_restore"} <= operations


def test_the_weights_panel_shows_a_stale_trainer_the_operator_clears_and_the_lineage(
    page: Page, server, stories_hf_dir: Path
):
    trainer = new_token("trainer", "trainer-1")
    load_from_catalogue(page, stories_hf_dir, "stories")  # attachable: a trainer token exists
    holder = Holder(server, trainer)
    holder.attach()
    holder.ok("quiesce")
    holder.ok("commit-begin")
    holder.ok("commit-end")
    holder.ok("resume")
    saved = holder.ok("save", {"run_id": "ui"})
    page.goto("/ui/weights/")
    panel = page.locator("#attachment")
    expect(panel).to_contain_text("trainer · trainer-1")
    lineage = page.locator("ul.tree")
    expect(lineage).to_contain_text(saved["name"])
    expect(lineage).to_contain_text(Checkpoint.objects.get(name=saved["name"]).weights_sha256)
    expect(lineage).to_contain_text("by trainer-1")
    row = page.locator("#served-weights tr[data-model='stories']")
    expect(row).to_contain_text(saved["name"])  # the weights it serves, as the save named them
    expect(row.locator("td").nth(2)).to_have_text("yes")
    # no heartbeats: the attachment goes stale, and only then is there anything to clear
    wait_for(lambda: weights_status(server)["attachment"]["state"] == "stale", timeout=HEARTBEAT_TIMEOUT_S * 20)
    page.reload()
    expect(panel.locator(".state-stale")).to_be_visible()
    shot(page, "weights")
    panel.get_by_role("button", name="Clear the stale attachment").click()
    expect(page.locator("main .notice.ok")).to_contain_text("Cleared the stale attachment")
    expect(page.locator("#attachment dd").first).to_have_text("no")
    assert weights_status(server)["attached"] is False
    event = AuditEvent.objects.get(operation="weights_clear_stale")
    assert (event.outcome, event.actor_kind, event.actor_label) == ("accepted", "user", "olga")


def test_the_batches_page_shows_progress_and_cancels_a_running_batch(page: Page):
    running = make_batch(BatchStatus.IN_PROGRESS, total=200, completed=57, failed=3, age_s=60)
    done = make_batch(BatchStatus.COMPLETED, total=4, completed=4, output_file=stored_file(FilePurpose.BATCH_OUTPUT),
                      age_s=30)  # fmt: skip
    waiting = make_batch(BatchStatus.IN_PROGRESS, total=10, completed=2, waiting_reason="weights_torn")
    page.goto("/ui/")
    page.get_by_role("link", name="Batches").click()
    expect(page).to_have_url(re.compile(r"/ui/batches/$"))
    row = page.locator(f"#batches tr[data-batch='{running.id}']")
    expect(row.locator(".batch-status")).to_have_text("in_progress")
    expect(row.locator(".batch-counts")).to_have_text("57 / 3 / 200")
    expect(row.get_by_role("progressbar")).to_have_attribute("aria-valuenow", "30")
    finished = page.locator(f"#batches tr[data-batch='{done.id}']")
    expect(finished.locator(".batch-status")).to_have_text("completed")
    expect(finished.get_by_role("progressbar")).to_have_attribute("aria-valuenow", "100")
    expect(finished.locator("a.output-file")).to_have_attribute("href", f"/ui/batches/files/{done.output_file_id}/")
    expect(finished.get_by_role("button", name="Cancel")).to_have_count(0)
    expect(page.locator(f"#batches tr[data-batch='{waiting.id}'] .batch-waiting")).to_have_text("waiting: weights_torn")
    shot(page, "batches")

    # A line recorded meanwhile shows without a reload: the list polls while a batch is at work.
    Batch.objects.filter(pk=running.pk).update(completed_count=97)
    expect(row.get_by_role("progressbar")).to_have_attribute("aria-valuenow", "50")

    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Cancel").click()
    expect(page.locator("main .notice.ok")).to_contain_text(f"Batch {running.id} is cancelling")
    expect(row.locator(".batch-status")).to_have_text("cancelling")
    expect(row.get_by_role("button", name="Cancel")).to_have_count(0)
    assert Batch.objects.get(pk=running.pk).status == BatchStatus.CANCELLING
    assert Batch.objects.get(pk=waiting.pk).status == BatchStatus.IN_PROGRESS
    event = AuditEvent.objects.get(operation="batch_cancel")
    assert (event.outcome, event.actor_kind, event.actor_label) == ("accepted", "user", "olga")
    assert event.details["batch_id"] == running.id
