"""The reports index (issue 31, item 4): one page, linked from the navigation, lists a team's sweeps, engine
reports, sharded runs and coverage reports, newest first, a page at a time, and nothing of another team's."""

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from adaptation.models import AdaptationJob, StageRun


def report(job, node, kind, status="succeeded", result=None):
    return StageRun.objects.create(job=job, kind=kind, node=node, node_name=node.hostname, status=status,
                                   result=result if result is not None else {"trials": []})


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_index_lists_each_kind_of_report_newest_first_and_links_each(member, job, node):
    sweep = report(job, node, "sweep")
    engine = report(job, node, "serve_sweep", result={"role": "leader"})
    report(job, node, "serve_sweep", result={"role": "follower"})  # the leader's report is the run's
    sharded = report(job, node, "sharded_run", status="failed", result=None)  # its page says what broke
    coverage = report(job, node, "op_coverage")
    report(job, node, "sweep", status="running")  # no report yet
    page = signed_in(member).get("/reports/").content.decode()
    assert 'href="/reports/">Reports</a>' in page  # in the navigation
    links = [f'href="/models/{job.model_id}/coverage/">Coverage report #{coverage.pk}',
             f'href="/stage-runs/{sharded.pk}/sharded/">Sharded run #{sharded.pk}',
             f'href="/engines/{engine.pk}/">Engine report #{engine.pk}',
             f'href="/sweeps/{sweep.pk}/">Sweep #{sweep.pk}']
    assert [page.index(link) for link in links] == sorted(page.index(link) for link in links)  # newest first
    assert page.count("<tr><td><a href=") == 4


def test_the_index_filters_by_kind_and_pages_in_a_fixed_number_of_queries(member, job, node, settings):
    settings.D0_PAGE_SIZE = 3
    sweeps = [report(job, node, "sweep") for _ in range(5)]
    report(job, node, "sharded_run")
    client = signed_in(member)
    first = client.get("/reports/?kind=sweep").content.decode()
    assert [f"Sweep #{run.pk}<" in first for run in sweeps] == [False, False, True, True, True]
    assert "Sharded run #" not in first and "?kind=sweep&page=2" in first
    second = client.get("/reports/?kind=sweep&page=2").content.decode()
    assert [f"Sweep #{run.pk}<" in second for run in sweeps] == [True, True, False, False, False]
    # The session and its user, the user's team ids, COUNT(*) for the pager, the page's rows with their job,
    # model and cluster joined: the same for 3 rows as for 1.
    with CaptureQueriesContext(connection) as full_page:
        client.get("/reports/?kind=sweep")
    with CaptureQueriesContext(connection) as short_page:
        client.get("/reports/?kind=sweep&page=2")
    assert len(full_page) == len(short_page) <= 5, [query["sql"] for query in full_page]


def test_another_teams_reports_are_not_listed(outsider, job, node):
    run = report(job, node, "sweep")
    page = signed_in(outsider).get("/reports/").content.decode()
    assert f"Sweep #{run.pk}" not in page and "No reports yet" in page
    assert AdaptationJob.objects.count() == 1
