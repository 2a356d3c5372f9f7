"""In headless Chromium (Debian's, driven by Playwright): log in, submit a job with the form, watch it succeed."""

import os
import shutil

import pytest
from django.db import connections

from adaptation.models import AdaptationJob
from tests.harness import wait_for
from tests.conftest import node_online

pytestmark = [pytest.mark.browser, pytest.mark.workers, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def log_in(page, live_server) -> None:
    """Sign in as the member fixture (bob) through the login form."""
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "bob")
    page.fill("#id_password", "a-long-test-password")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")


def screenshot(page, name: str) -> None:
    """With D0_SCREENSHOTS=DIR (docs/screenshots/ in the repo), the page as it looks, for the README."""
    if os.environ.get("D0_SCREENSHOTS"):
        page.screenshot(path=os.path.join(os.environ["D0_SCREENSHOTS"], f"{name}.png"), full_page=True)


@pytest.fixture
def page(monkeypatch):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (scripts/ensure-services.sh installs it)")
    # Playwright's sync API runs an event loop in this thread; the ORM calls of the test itself are safe.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            new_page = browser.new_page()
            # Every page d0 serves works under its Content-Security-Policy: Chromium reports each thing the
            # policy blocked on the console, and any such report fails the test that drove the page.
            blocked = []
            new_page.on("console", lambda message: blocked.append(message.text)
                        if "Content Security Policy" in message.text else None)
            yield new_page
            assert blocked == [], blocked
        finally:
            browser.close()
            # While Playwright's loop runs, Django keeps this thread's connections apart from the usual ones;
            # close those here, or they outlive the test and block dropping the test database.
            connections.close_all()


def test_a_member_logs_in_submits_a_job_and_sees_it_succeed(stack, live_server, cluster, member, page):
    stack.start_node("alpha/h100-pod", "browser-node")
    wait_for(node_online("browser-node"), 60, "node registration")

    page.goto(f"{live_server.url}/jobs/new/")
    assert "/login/" in page.url
    page.fill("#id_username", "bob")
    page.fill("#id_password", "a-long-test-password")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/jobs/new/")

    page.select_option("#id_cluster", str(cluster.pk))
    page.check("input[name=stages][value=env_probe]")
    page.click("form.stacked button[type=submit]")
    page.wait_for_url(f"{live_server.url}/jobs/*/")

    status = page.locator("#job-status")
    status.filter(has_text="Succeeded").wait_for(timeout=60_000)
    assert page.locator("#stage-rows tr td").first.inner_text() == "env_probe"
    assert "succeeded" in page.locator("#job-log").inner_text()
    assert page.locator("#retry-form").is_visible()
    # The outcome line appears once the job has ended, without a reload
    page.locator("#job-outcomes li").filter(has_text="env_probe on browser-node: 1 device(s)").wait_for(timeout=10_000)
    job = AdaptationJob.objects.get()
    assert (job.status, job.submitted_by, job.progress) == ("succeeded", member, 1.0)
    screenshot(page, "job-detail")



def test_the_topology_page_draws_its_graph_and_charts(live_server, cluster, member, node, page):
    from adaptation.models import Link

    device = node.devices.get()
    Link.objects.create(cluster=cluster, kind="loopback", source_device=device, target_device=device,
                        measured_bandwidth_gbps=1.5)
    log_in(page, live_server)
    page.goto(f"{live_server.url}/clusters/{cluster.pk}/topology/")
    for chart in ("#topology-graph", "#bandwidth-chart", "#flops-chart"):
        page.locator(f"{chart} .main-svg").first.wait_for(timeout=20_000)
    graph_text = page.locator("#topology-graph").inner_text()
    assert "gpu-01" in graph_text and "loopback · 1.5 GB/s" in graph_text
    assert page.locator("#device-table tbody tr").count() == 1
    screenshot(page, "topology")


def test_the_job_page_lists_pending_stages_and_says_when_the_connection_is_lost(live_server, cluster, member,
                                                                                model_spec, page):
    """A queued job (no worker takes it) lists every stage as pending; when the progress endpoint stops answering
    (refused like a server that went away) the page says so after three failed polls, and clears once it answers."""
    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, model=model_spec, submitted_by=member,
                                       stages=["env_check", "sweep"])
    log_in(page, live_server)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    rows = page.locator("#stage-rows tr.pending")
    assert rows.count() == 2 and "env_check" in rows.first.inner_text() and "pending" in rows.first.inner_text()
    assert page.locator("#job-connection").is_hidden()
    page.route("**/progress/", lambda route: route.abort("connectionrefused"))
    banner = page.locator("#job-connection")
    banner.filter(has_text="Connection lost").wait_for(timeout=30_000)
    assert "the server has not answered since" in banner.inner_text()
    page.unroute("**/progress/")
    banner.wait_for(state="hidden", timeout=15_000)


def test_a_stages_time_is_rounded_once_so_ten_minutes_never_read_nine_min_sixty(live_server, cluster, member,
                                                                               model_spec, node, page):
    from datetime import timedelta

    from django.utils import timezone

    from adaptation.models import StageRun

    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, model=model_spec, submitted_by=member,
                                       stages=["env_check", "sweep"])
    finished = timezone.now()
    for kind, seconds in (("env_check", 599.6), ("sweep", 59.97)):
        StageRun.objects.create(job=job, kind=kind, node=node, node_name=node.hostname, status="succeeded",
                                started=finished - timedelta(seconds=seconds), finished=finished)
    log_in(page, live_server)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    rows = page.locator("#stage-rows tr")
    rows.filter(has_text="10 min 0 s").wait_for(timeout=15_000)
    text = page.locator("#stage-rows").inner_text()
    assert "9 min 60 s" not in text and "60.0 s" not in text and "1 min 0 s" in text, text


def test_the_job_form_shows_each_chosen_stages_parameters_and_rejects_a_bad_value_with_its_range(
        live_server, cluster, member, model_spec, page):
    log_in(page, live_server)
    page.goto(f"{live_server.url}/jobs/new/")
    sharded = page.locator("fieldset[data-stage=sharded_run]")
    assert sharded.is_hidden()  # only the ticked stages' parameters are shown
    page.check("input[name=stages][value=sharded_run]")
    assert sharded.is_visible() and page.locator("fieldset[data-stage=sweep]").is_hidden()
    tp = page.locator("#id_sharded_run__tp")
    assert tp.get_attribute("placeholder") == "1"  # the default, shown
    assert "Allowed: 1 to 64. Default: 1." in sharded.inner_text()
    page.select_option("#id_model", str(model_spec.pk))
    tp.fill("0")
    page.click("form#job-form button[type=submit]")
    page.wait_for_load_state()
    field = page.locator("fieldset[data-stage=sharded_run] .field.invalid")
    assert "must be at least 1, not 0" in field.inner_text()
    assert page.locator("fieldset[data-stage=sharded_run]").is_visible()  # still ticked, still shown
    assert not AdaptationJob.objects.exists()


def test_cancel_asks_first_and_every_page_has_an_icon(live_server, cluster, member, model_spec, page):
    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, model=model_spec, submitted_by=member,
                                       stages=["env_probe"])
    log_in(page, live_server)
    missing = []
    page.on("response", lambda response: missing.append(response.url) if response.status == 404 else None)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.click("#cancel-form button")
    page.wait_for_timeout(500)
    assert asked == [f"Cancel job {job.pk}? Its running stages are stopped."]
    job.refresh_from_db()
    assert job.status == "queued"  # dismissed: nothing was cancelled
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-form button")
    page.wait_for_url(f"{live_server.url}/jobs/{job.pk}/")
    page.locator("#job-status").filter(has_text="Cancelled").wait_for(timeout=10_000)
    assert missing == []  # no favicon.ico (or anything else) 404s
