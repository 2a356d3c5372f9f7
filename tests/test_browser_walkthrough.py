"""In headless Chromium, the walkthrough's defects (issue 31, item 4): the job page's headline follows a running
job without a reload, the reports index is reached from the navigation, and a slow form says it is working."""

import pytest

from adaptation.models import AdaptationJob, StageRun
from tests.test_browser import log_in, page  # noqa: F401 - the Chromium page fixture

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_job_pages_headline_follows_the_running_stage_without_a_reload(live_server, cluster, member,
                                                                            model_spec, node, page):  # noqa: F811
    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, model=model_spec, submitted_by=member,
                                       stages=["env_probe", "sweep"], status="running")
    probe = StageRun.objects.create(job=job, kind="env_probe", node=node, node_name=node.hostname)
    probe.start()
    StageRun.objects.filter(pk=probe.pk).update(progress=0.5, message="probing devices")
    log_in(page, live_server)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    headline = page.locator("#job-headline")
    headline.filter(has_text="Running env_probe on gpu-01: 50% (probing devices)").wait_for(timeout=10_000)

    # The node moves on: env_probe ends, the sweep runs; the page follows on its next polls, with no reload.
    page.evaluate("window.notReloaded = true")
    probe.finish(result={"devices": [{"kind": "cpu", "name": "EPYC"}]})
    sweep = StageRun.objects.create(job=job, kind="sweep", node=node, node_name=node.hostname)
    sweep.start()
    StageRun.objects.filter(pk=sweep.pk).update(progress=0.77, message="trial 7 of 9")
    headline.filter(has_text="Running sweep on gpu-01: 77% (trial 7 of 9)").wait_for(timeout=10_000)
    outcomes = page.locator("#job-outcomes li")
    outcomes.filter(has_text="env_probe on gpu-01: 1 device(s): EPYC").wait_for(timeout=10_000)
    assert "env_probe" not in headline.inner_text()
    assert page.evaluate("window.notReloaded") is True


def held_posts(browser_page, pattern: str) -> list:
    """The POSTs to ``pattern`` held back (a slow server: they are answered when the test lets each go on)."""
    held = []
    browser_page.route(pattern, lambda route: held.append(route) if route.request.method == "POST"
                       else route.continue_())
    return held


BUSY_STATE = """button => new Promise(done => {
  button.click();
  window.setTimeout(() => {
    const state = {disabled: button.disabled, text: button.textContent, busy: button.getAttribute("aria-busy"),
                   form_busy: button.form.getAttribute("aria-busy")};
    button.form.requestSubmit();
    done(state);
  }, 50);
})"""


def submitted_twice(button) -> dict:
    """Click ``button``, read its state 50 ms later, then submit its form again: all in the page."""
    return button.evaluate(BUSY_STATE)


def test_a_catalog_add_says_it_is_working_and_is_not_sent_twice(live_server, cluster, member, page):  # noqa: F811
    from adaptation.models import ModelSpec

    log_in(page, live_server)
    page.goto(f"{live_server.url}/models/catalog/?q=llama-3.1-8b")
    form = page.locator("form[action$='/models/catalog/llama-3.1-8b/add/']")
    button = form.locator("button")
    assert button.inner_text() == "Add" and button.is_enabled()
    held = held_posts(page, "**/models/catalog/llama-3.1-8b/add/")
    # Clicked, then read and sent again, from inside the page: while its navigation is pending Playwright's own
    # locators wait for the next document.
    assert submitted_twice(button) == {"disabled": True, "text": "Adding…", "busy": "true", "form_busy": "true"}
    page.wait_for_timeout(500)
    assert len(held) == 1  # the second submit (Enter, a script, a click that beat the disabling) was dropped
    held[0].continue_()
    page.wait_for_url(f"{live_server.url}/models/*/", timeout=120_000)  # an add analyses the config: 16 s here
    assert ModelSpec.objects.filter(team=cluster.team).count() == 1


def test_a_config_upload_says_it_is_working(live_server, cluster, member, page, tmp_path):  # noqa: F811
    import json

    from tests.conftest import load_config

    config = tmp_path / "qwen3.json"
    config.write_text(json.dumps(load_config("qwen3-0.6b.json")))
    log_in(page, live_server)
    page.goto(f"{live_server.url}/models/new/")
    page.fill("#id_name", "uploaded-qwen3")
    page.set_input_files("#id_config_file", str(config))
    held = held_posts(page, "**/models/new/")
    button = page.locator("form.stacked button[type=submit]")
    assert submitted_twice(button) == {"disabled": True, "text": "Uploading and analysing…", "busy": "true",
                                       "form_busy": "true"}
    page.wait_for_timeout(500)
    assert len(held) == 1
    held[0].continue_()
    page.wait_for_url(f"{live_server.url}/models/*/", timeout=120_000)  # an add analyses the config: 16 s here
    assert "uploaded-qwen3" in page.locator("h1").inner_text()


def test_the_reports_index_is_reached_from_the_navigation(live_server, cluster, member, model_spec, node,
                                                          page):  # noqa: F811
    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, model=model_spec, submitted_by=member,
                                       stages=["sweep", "sharded_run"], status="succeeded")
    sweep = StageRun.objects.create(job=job, kind="sweep", node=node, node_name=node.hostname, status="succeeded",
                                    result={"trials": []})
    sharded = StageRun.objects.create(job=job, kind="sharded_run", node=node, node_name=node.hostname,
                                      status="succeeded", result={"ranks": []})
    log_in(page, live_server)
    page.click("header nav a:text-is('Reports')")
    page.wait_for_url(f"{live_server.url}/reports/")
    rows = page.locator("table.reports tbody tr")
    assert rows.count() == 2
    assert rows.nth(0).locator("a").first.inner_text() == f"Sharded run #{sharded.pk}"  # newest first
    assert rows.nth(1).locator("a").first.inner_text() == f"Sweep #{sweep.pk}"
    page.select_option("#report-kind", "sweep")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(f"{live_server.url}/reports/?kind=sweep")
    assert rows.count() == 1
    rows.nth(0).locator("a").first.click()
    page.wait_for_url(f"{live_server.url}/sweeps/{sweep.pk}/")


def test_the_api_docs_try_it_out_gets_a_token_with_the_form_body(live_server, member, page):  # noqa: F811
    """As a user does it: signed in, the token operation's "Try it out" with the form body it offers first. It once
    sent nothing (the schema asked for the read-only token too) and, sent, met the session's CSRF check."""
    from rest_framework.authtoken.models import Token

    log_in(page, live_server)
    page.goto(f"{live_server.url}/api/docs/")
    block = page.locator("#operations-token-token_create")
    block.locator(".opblock-summary").first.click()
    block.locator("button.try-out__btn").click()
    assert block.locator("select.content-type").first.input_value() == "application/x-www-form-urlencoded"
    block.locator("input[placeholder=username]").fill("bob")
    block.locator("input[placeholder=password]").fill("a-long-test-password")
    with page.expect_response("**/api/token/") as answer:
        block.locator("button.execute").click()
    assert answer.value.status == 200
    token = Token.objects.get(user=member).key
    block.locator(".live-responses-table").filter(has_text=token).wait_for(timeout=10_000)
