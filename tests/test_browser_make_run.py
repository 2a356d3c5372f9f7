"""Acceptance 5 of issue 29, in headless Chromium: on a fresh var/ folder, `make run` (``manage.py up``) prepares the
local node's vLLM with the project's own script, and the catalog's Llama-3.1-8B adapted from the browser ends in the
engine's serve sweep on vLLM. Heavy (an env check, the operator coverage, a sharded run, then vLLM's CPU build
started for each configuration): in the full tier (`make test`) only. scripts/test.sh has made .venv-vllm before
(scripts/vllm-env.sh), so the script finds it made and nothing is downloaded."""

import re

import pytest

from tests.harness import wait_for
from tests.test_browser import page  # noqa: F401 - the same Chromium fixture
from tests.test_zero_setup import call, quietly, sign_in, start_up, stop

pytestmark = [pytest.mark.browser, pytest.mark.workers, pytest.mark.slow]


@pytest.mark.timeout(60 * 60)
def test_make_run_then_llama_adapted_from_the_browser_ends_in_vllm_serving_it(tmp_path, page):  # noqa: F811
    processes, up, base, env = start_up(tmp_path, D0_LOCAL_ENGINE="on")
    var = tmp_path / "var"
    try:
        wait_for(quietly(lambda: call(f"{base}/api/status/") == {"status": "up"}), 120, "the web server")
        username, password = (var / "demo-credentials.txt").read_text().split()
        page.goto(f"{base}/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/")

        # The cluster page says "preparing vLLM" until the local node comes back offering it.
        token = sign_in(base, var)
        cluster = call(f"{base}/api/clusters/", token=token)["results"][0]

        def offered():
            page.goto(f"{base}/clusters/{cluster['id']}/")
            engines = page.locator("td .engine").all_inner_texts()
            return any(text.startswith("vllm 0.32") and "(CPU build)" in text for text in engines)

        wait_for(offered, 30 * 60, "the local node to offer vLLM", interval=5)

        page.goto(f"{base}/models/catalog/?q=Llama-3.1-8B")
        page.locator("tr", has_text="meta-llama/Meta-Llama-3.1-8B").locator("button", has_text="Add").click()
        page.wait_for_url(re.compile(r".*/models/\d+/$"))
        page.select_option("#adapt-cluster", label="local")
        page.click("#adapt-form button[type=submit]")
        page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
        job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

        page.locator("#job-status").filter(has_text=re.compile("Succeeded|Failed|Cancelled")).wait_for(
            timeout=50 * 60 * 1000)
        job = call(f"{base}/api/jobs/{job_id}/", token=token)
        assert job["stages"][-1] == "serve_sweep", job["stages"]
        final = [run for run in job["stage_runs"] if run["kind"] == "serve_sweep"]
        assert final, job["error"] or job["log"]
        engine = final[0]["result"]["engine"] if final[0]["result"] else {}
        assert (engine.get("name"), engine.get("cpu_build")) == ("vllm", True), final[0]
        assert job["status"] == "succeeded", job["error"] + job["log"]
        assert "serve_sweep" in page.locator("#stage-rows").inner_text()
    except BaseException:
        print(processes.log("up"))
        raise
    finally:
        stop(processes, up)
