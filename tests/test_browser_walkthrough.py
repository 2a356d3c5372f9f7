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
