"""The virtual backends d0 ships (torch's own CUDA, MPS and CPU kernel lists) on the coverage page: shown, added to a
team in one step, and sent to the node like any team's list."""

from django.test import Client

from adaptation.jobs import placement
from adaptation.jobs import services as jobs
from adaptation.models import VirtualBackend
from workers.engine.coverage.shipped_backends import shipped_backends


def shipped_names() -> list[str]:
    return [backend["name"] for backend in shipped_backends()]


def test_the_coverage_page_offers_the_shipped_backends_and_adds_them_to_a_team(member, team, cluster, owner,
                                                                                  model_spec, broker):
    client = Client()
    client.force_login(member)
    page = client.get("/coverage/").content.decode()
    cuda = next(backend for backend in shipped_backends() if backend["dispatch_key"] == "CUDA")
    assert f"virtual:{cuda['name']}" in page and str(len(cuda["operators"])) in page
    response = client.post("/coverage/", {"add_shipped": "1", "team": team.pk, "backends": shipped_names()})
    assert response.status_code == 302
    rows = {row.name: row for row in VirtualBackend.objects.filter(team=team)}
    assert set(rows) == set(shipped_names())
    assert rows[cuda["name"]].operators == cuda["operators"] and rows[cuda["name"]].created_by == member
    # Added again (a regenerated list), the rows are refreshed, not duplicated.
    client.post("/coverage/", {"add_shipped": "1", "team": team.pk, "backends": [cuda["name"]]})
    assert VirtualBackend.objects.filter(team=team).count() == len(shipped_names())
    assert team.name in client.get("/coverage/").content.decode()

    job = jobs.submit_job(team=team, user=owner, cluster=cluster, model=model_spec, stages=["op_coverage"],
                          parameters={"op_coverage": {"virtual_backends": [rows[cuda["name"]].pk]}})
    sent = placement.stage_parameters(job, "op_coverage", [])["virtual_backend_lists"]
    assert sent == [{"name": cuda["name"], "operators": cuda["operators"]}]


def test_shipped_backends_cannot_be_added_to_another_users_team(member, other_team):
    client = Client()
    client.force_login(member)
    response = client.post("/coverage/", {"add_shipped": "1", "team": other_team.pk, "backends": shipped_names()})
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not VirtualBackend.objects.filter(team=other_team).exists()


def test_an_unknown_shipped_backend_is_refused(member, team):
    client = Client()
    client.force_login(member)
    response = client.post("/coverage/", {"add_shipped": "1", "team": team.pk, "backends": ["torch-0-1-tpu"]})
    assert response.status_code == 200 and not VirtualBackend.objects.filter(team=team).exists()
