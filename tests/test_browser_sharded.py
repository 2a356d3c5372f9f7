"""In headless Chromium: the sharded run page and the comparison page draw their charts from a real engine report
(two CPU ranks of a shrunk Qwen3 MoE, tensor parallel), stored on a stage run as a node would store it."""


import pytest

from tests.test_browser import page, screenshot  # noqa: F401 - the same Chromium fixture
from tests.test_sharded_jobs import RUN_DEADLINE, catalog_config, finished_run
from workers.engine.sharding import run_sharded

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def moe_report() -> dict:
    return run_sharded(catalog_config("qwen3-30b-a3b"), tp=2, decode_steps=4, timeout_s=RUN_DEADLINE)


def log_in(page, live_server, username: str) -> None:  # noqa: F811
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "a-long-test-password")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")


def test_the_sharded_run_page_draws_the_time_split_and_the_expert_load(live_server, member, model_spec, node,
                                                                       moe_report, page):  # noqa: F811
    run = finished_run(model_spec, node, moe_report)
    log_in(page, live_server, "bob")

    page.goto(f"{live_server.url}/stage-runs/{run.pk}/sharded/")
    for chart in ("#time-split-chart", "#expert-load-chart"):
        page.locator(f"{chart} .main-svg").first.wait_for(timeout=20_000)
    assert page.locator("#verdict .status").inner_text() == "Correct"
    assert page.locator("#rank-table tbody tr").count() == 2
    legend = page.locator("#time-split-chart").inner_text()
    assert "compute" in legend and "collectives" in legend
    assert "expert 3" in page.locator("#expert-load-chart").inner_text()  # the reduced model's last of 4
    assert "random weights" in page.locator("#routing-warning").inner_text()
    screenshot(page, "sharded-run")

    page.click("text=Compare runs of")
    page.locator("#decode-chart .main-svg").first.wait_for(timeout=20_000)
    assert page.locator("#run-table tbody tr").count() == 1
    assert f"#{run.job_id} TP2 fp32" in page.locator("#decode-chart").inner_text()
    screenshot(page, "sharded-compare")
