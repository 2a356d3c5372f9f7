"""The job tables (dashboard, job list, a cluster's page; a model's page shows the same) and the job list's filter
form: what they show, escaped."""

from datetime import datetime, timezone

import pytest
from django.test import Client

from adaptation.models import AdaptationJob, Cluster, ModelSpec


@pytest.fixture
def signed_in(member):
    client = Client()
    client.force_login(member)
    return client


@pytest.fixture
def odd_rows(team, owner):
    """A cluster and a model whose names need escaping, a job on both and a job without model or submitter."""
    cluster = Cluster.objects.create(team=team, name="<i>pod</i>")
    model = ModelSpec.objects.create(team=team, name='m"<b>', config={"model_type": "llama"}, created_by=owner)
    with_model = AdaptationJob.objects.create(team=team, cluster=cluster, model=model, submitted_by=owner,
                                              stages=["env_check", "op_coverage"], status="failed", progress=0.25)
    bare = AdaptationJob.objects.create(team=team, cluster=cluster, stages=["env_probe"], status="running")
    created = datetime(2025, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
    AdaptationJob.objects.filter(pk=with_model.pk).update(created=created)
    return cluster, model, with_model, bare


def row_of(html: str, job) -> str:
    start = html.index(f'<tr><td><a href="/jobs/{job.pk}/">#{job.pk}</a></td>')
    return html[start:html.index("</tr>", start) + len("</tr>")]


@pytest.mark.parametrize("page", ["/", "/jobs/", "cluster"])
def test_a_job_row_shows_the_job_escaped(page, signed_in, odd_rows):
    cluster, model, with_model, bare = odd_rows
    url = f"/clusters/{cluster.pk}/" if page == "cluster" else page
    html = signed_in.get(url).content.decode()
    assert row_of(html, with_model) == (
        f'<tr><td><a href="/jobs/{with_model.pk}/">#{with_model.pk}</a></td><td>env_check, op_coverage</td>'
        "<td>&lt;i&gt;pod&lt;/i&gt;</td><td>m&quot;&lt;b&gt;</td>"
        '<td><span class="status status-failed">Failed</span></td><td><progress max="1" value="0.25"></progress></td>'
        "<td>2025-03-04 05:06:07 UTC</td><td>alice</td></tr>")
    assert row_of(html, bare) == (
        f'<tr><td><a href="/jobs/{bare.pk}/">#{bare.pk}</a></td><td>env_probe</td><td>&lt;i&gt;pod&lt;/i&gt;</td>'
        '<td>—</td><td><span class="status status-running">Running</span></td>'
        f'<td><progress max="1" value="0.0"></progress></td><td>{bare.created:%Y-%m-%d %H:%M:%S} UTC</td>'
        "<td>—</td></tr>")
    assert "<i>pod</i>" not in html and 'm"<b>' not in html


def test_an_empty_table_says_so(signed_in):
    html = signed_in.get("/").content.decode()
    assert '<tr><td colspan="8" class="empty">Nothing running.</td></tr>' in html
    assert '<tr><td colspan="8" class="empty">No finished jobs yet.</td></tr>' in html
    assert '<tr><td colspan="8" class="empty">No jobs.</td></tr>' in signed_in.get("/jobs/").content.decode()


def test_the_filter_form_lists_the_teams_rows_escaped_with_the_chosen_one_selected(signed_in, odd_rows, outsider,
                                                                                    other_team):
    cluster, model, _, _ = odd_rows
    theirs = ModelSpec.objects.create(team=other_team, name="theirs", config={"model_type": "llama"})
    html = signed_in.get(f"/jobs/?model={model.pk}").content.decode()
    assert (f'<select name="model" id="id_model"><option value="">---------</option>'
            f'<option value="{model.pk}" selected>m&quot;&lt;b&gt;</option></select>') in html
    assert (f'<select name="cluster" id="id_cluster"><option value="" selected>---------</option>'
            f'<option value="{cluster.pk}">&lt;i&gt;pod&lt;/i&gt;</option></select>') in html
    assert "theirs" not in html
    # Another team's model is not a choice: the form says so and the list is not filtered by it.
    html = signed_in.get(f"/jobs/?model={theirs.pk}").content.decode()
    assert "Select a valid choice" in html


def test_the_filter_form_shows_each_requests_own_rows_and_choice(signed_in, odd_rows, outsider, other_team):
    """The options are each request's own: a renamed model shows its new name, the choice is this request's, and
    another team's user, in the same process, sees their rows only."""
    cluster, model, _, _ = odd_rows
    signed_in.get(f"/jobs/?model={model.pk}")
    ModelSpec.objects.filter(pk=model.pk).update(name="renamed")
    html = signed_in.get("/jobs/").content.decode()
    assert f'<option value="{model.pk}">renamed</option>' in html and "selected>renamed" not in html
    theirs = ModelSpec.objects.create(team=other_team, name="theirs", config={"model_type": "llama"})
    client = Client()
    client.force_login(outsider)
    html = client.get(f"/jobs/?model={theirs.pk}").content.decode()
    assert f'<option value="{theirs.pk}" selected>theirs</option>' in html
    assert "renamed" not in html and "pod" not in html
    assert "theirs" not in signed_in.get("/jobs/").content.decode()


def test_the_filter_forms_selects_keep_their_models_order(signed_in, team, owner, other_team):
    """The selects' rows come in each model's order: clusters by name, models newest first; only the user's teams'
    rows."""
    for name in ("b-pod", "c-pod", "a-pod"):
        Cluster.objects.create(team=team, name=name)
    Cluster.objects.create(team=other_team, name="0-theirs")
    for name in ("older", "newer"):
        ModelSpec.objects.create(team=team, name=name, config={"model_type": "llama"}, created_by=owner)
    html = signed_in.get("/jobs/").content.decode()
    assert html.index(">a-pod<") < html.index(">b-pod<") < html.index(">c-pod<")
    assert html.index(">newer<") < html.index(">older<")
    assert "0-theirs" not in html


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata"])
def test_the_tables_timestamp_reads_as_djangos_date_filter(zone):
    """``stamp`` replaces ``date:"Y-m-d H:i:s T"`` in the job table for speed: the same text in every time zone,
    summer and winter."""
    from django.template import Context, Template
    from django.utils import timezone as django_timezone

    ours, djangos = Template("{% load d0 %}{{ moment|stamp }}"), Template('{{ moment|date:"Y-m-d H:i:s T" }}')
    with django_timezone.override(zone):
        for moment in (datetime(2026, 1, 15, 23, 59, 58, tzinfo=timezone.utc),
                       datetime(2026, 7, 1, 0, 0, 1, tzinfo=timezone.utc), None):
            context = Context({"moment": moment})
            assert ours.render(context) == djangos.render(context)
