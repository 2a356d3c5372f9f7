"""In headless Chromium: the coverage heatmap and gap pages, a sweep report both on its page and as the downloaded
self-contained HTML file opened offline (file://), with every chart drawn, and an engine report's quality chart."""

import re

import pytest
from django.test import Client

from adaptation.intake import services as intake
from adaptation.jobs import services as jobs
from adaptation.coverage.services import store_op_coverage
from adaptation.models import CoverageReport, StageRun
from tests.test_browser import log_in, page, screenshot  # noqa: F401 - the Chromium page fixture
from tests.test_sweep_reports import stored_sweep, sweep_result  # noqa: F401 - a real sweep, module-scoped
from workers.engine.coverage import op_coverage

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
CHARTS = ("throughput", "latency", "cdf", "pareto", "roofline", "predicted")


def test_the_coverage_heatmap_and_gap_pages_render(live_server, cluster, owner, member, node, page):  # noqa: F811
    spec = intake.add_from_catalog(team=cluster.team, user=owner, slug="mixtral-8x7b-v0.1")[0]
    result = op_coverage({"config": spec.config, "dtypes": ["fp32"], "compile": False, "decode_steps": 1,
                          "virtual_backend_lists": [{"name": "vendorx", "operators": ["aten::mm", "aten::embedding"]}]},
                         lambda *_: None)
    job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, model=spec, stages=["op_coverage"])
    run = StageRun.objects.create(job=job, kind="op_coverage", node=node, node_name=node.hostname, result=result)
    store_op_coverage(run)
    assert CoverageReport.objects.count() == 2
    log_in(page, live_server)
    page.goto(f"{live_server.url}/coverage/")
    page.locator("#coverage-heatmap .main-svg").first.wait_for(timeout=20_000)
    assert "virtual:vendorx" in page.locator("#coverage-heatmap").inner_text()
    page.goto(f"{live_server.url}/models/{spec.pk}/coverage/")
    assert page.locator("table.gaps tbody tr").count() > 5  # the vendor list lacks most operators


def test_a_sweep_report_draws_its_charts_on_the_page_and_offline(live_server, cluster, owner, member, node, page,  # noqa: F811
                                                                 sweep_result, tmp_path):  # noqa: F811
    run = stored_sweep(cluster, owner, node, sweep_result)
    log_in(page, live_server)
    page.goto(f"{live_server.url}/sweeps/{run.pk}/")
    for chart in CHARTS:
        page.locator(f"#sweep-charts-{run.pk}-{chart} .main-svg").first.wait_for(timeout=20_000)
    screenshot(page, "sweep-report")
    client = Client()
    client.force_login(member)
    saved = tmp_path / "report.html"
    saved.write_bytes(client.get(f"/sweeps/{run.pk}/report.html").content)
    page.goto(saved.as_uri())  # offline: no server behind this page
    for chart in CHARTS:
        page.locator(f"#sweep-charts-{run.pk}-{chart} .main-svg").first.wait_for(timeout=20_000)
    assert page.locator("table.trials tbody tr").count() == len(sweep_result["trials"])


def test_the_sweep_compare_page_draws_each_report_with_its_own_data(live_server, cluster, owner, member, node,  # noqa: F811
                                                                    page, sweep_result):  # noqa: F811
    """Two different reports side by side: each side's charts are drawn from its own trials (not the other's)."""
    import copy

    from adaptation.sweeps.charts import judged_throughput
    from workers.engine.sweep.result import SweepResult

    def tripled(runs):
        return [3 * value for value in runs] if isinstance(runs, list) else runs

    # A report of its own, told apart by its figures: every throughput in it (first pass, repeats, re-measured) x3
    other = copy.deepcopy(sweep_result)
    for trial in other["trials"]:
        if trial["metrics"]:
            trial["metrics"]["output_tokens_per_s"] *= 3
        if trial.get("repeats"):
            trial["repeats"]["output_tokens_per_s"] = tripled(trial["repeats"].get("output_tokens_per_s"))
    for row in (other.get("confirmation") or {}).get("candidates") or []:
        for key in ("first_pass", "remeasured"):
            if isinstance(row.get(key), int | float):
                row[key] *= 3
        if row.get("repeats"):
            row["repeats"]["output_tokens_per_s"] = tripled(row["repeats"].get("output_tokens_per_s"))
    runs = [stored_sweep(cluster, owner, node, result) for result in (sweep_result, other)]
    log_in(page, live_server)
    page.goto(f"{live_server.url}/sweeps/compare/?a={runs[0].pk}&b={runs[1].pk}")
    drawn = {}
    for run, result in zip(runs, (sweep_result, other), strict=True):
        for chart in CHARTS:
            page.locator(f"#sweep-charts-{run.pk}-{chart} .main-svg").first.wait_for(timeout=20_000)
        # plotly keeps the figure it drew on the element: the throughput chart's points are this report's
        drawn[run.pk] = page.evaluate(
            f"() => document.getElementById('sweep-charts-{run.pk}-throughput').data.flatMap((trace) => trace.y)")
        # drawn as the verdict judges it: each batch size's median (of the re-measured runs for a finalist)
        read = SweepResult.from_dict(result)
        expected = sorted(judged_throughput(read, trial)["median"] for trial in read.trials if trial.metrics)
        assert sorted(drawn[run.pk]) == pytest.approx(expected)
    assert sorted(drawn[runs[1].pk]) == pytest.approx([3 * value for value in sorted(drawn[runs[0].pk])])
    # Each picker shows the report it compares; each side lists its own job's stages; the page fits its width
    assert page.locator("select[name=a]").input_value() == str(runs[0].pk)
    assert page.locator("select[name=b]").input_value() == str(runs[1].pk)
    assert page.locator(".side table.pipeline tbody tr").count() == 2
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    screenshot(page, "sweep-compare")
    assert page.locator("[id]").evaluate_all("(elements) => elements.length") == len(set(
        page.locator("[id]").evaluate_all("(elements) => elements.map((element) => element.id)")))


def test_pages_fit_a_390_px_phone_without_sideways_scrolling(live_server, cluster, owner, member, node, page,  # noqa: F811
                                                             sweep_result, job):  # noqa: F811
    # Kimi-K2: a trillion parameters, where a 3-significant-digit format once wrote "1.03e+03 B"
    run = stored_sweep(cluster, owner, node, sweep_result, slug="kimi-k2-instruct")
    spec = run.job.model
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_server)
    wide = {}
    for url in ("/", "/jobs/", f"/jobs/{job.pk}/", "/models/", f"/models/{spec.pk}/", f"/sweeps/{run.pk}/",
                f"/clusters/{cluster.pk}/"):
        page.goto(f"{live_server.url}{url}")
        page.wait_for_load_state("networkidle")
        width = page.evaluate("() => document.documentElement.scrollWidth")
        # No number d0 writes is in exponent form (1.03e+03 B): the visible text, charts included; verbatim
        # config.json and command lines (pre, code) keep their own spelling (rms_norm_eps 1e-06)
        shown = page.evaluate("() => { const copy = document.body.cloneNode(true);"
                              " copy.querySelectorAll('pre, code, script').forEach((e) => e.remove());"
                              " document.body.appendChild(copy); const text = copy.innerText; copy.remove();"
                              " return text; }")
        exponent = re.search(r".{0,40}\d(\.\d+)?e[+-]\d+.{0,20}", shown)
        assert exponent is None, (url, exponent.group(0))
        if url == "/jobs/":
            screenshot(page, "phone-jobs")
        if width > 390:
            wide[url] = (width, page.evaluate(
                "() => [...document.querySelectorAll('body *')].filter((e) => e.getBoundingClientRect().right > 391)"
                ".filter((e) => ![...e.children].some((c) => c.getBoundingClientRect().right > 391))"
                ".slice(0, 4).map((e) => e.tagName + '.' + e.className + '#' + e.id)"))
    assert wide == {}
    page.set_viewport_size({"width": 1280, "height": 900})
    for url, name in (("/", "dashboard"), (f"/models/{spec.pk}/", "model")):
        page.goto(f"{live_server.url}{url}")
        page.wait_for_load_state("networkidle")
        screenshot(page, name)


def test_an_engine_report_on_real_weights_draws_its_quality_chart_and_fits_a_phone(live_server, job, node, member,  # noqa: F811
                                                                                   page):  # noqa: F811
    from tests.test_serving_quality_report import real_weights_result

    run = StageRun.objects.create(job=job, kind="serve_sweep", node=node, node_name=node.hostname,
                                  status="succeeded", result=real_weights_result())
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_server)
    page.goto(f"{live_server.url}/engines/{run.pk}/")
    chart = page.locator(f"#engine-quality-{run.pk}-quality-against-speed")
    chart.locator(".main-svg").first.wait_for(timeout=20_000)
    assert chart.locator(".scatterlayer .point").count() >= 3
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    page.set_viewport_size({"width": 1280, "height": 900})
    page.locator("#validated").scroll_into_view_if_needed()
    screenshot(page, "engine-report-validated")
