"""The Django admin manages every model; the API docs page works offline (its assets are vendored)."""

import re

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

from adaptation.models import (AdaptationJob, Cluster, ControlWorker, Device, EnvReport, JoinToken, Link, Membership,
                               ModelPlan, ModelSpec, Node, RejectedNodeMessage, StageRun, Team)


@pytest.fixture
def superuser_client(django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", password="x" * 16))
    return client


@pytest.mark.parametrize("model",
                         [Team, Membership, Cluster, Node, Device, Link, ModelSpec, AdaptationJob, StageRun,
                          EnvReport, ModelPlan])
def test_every_model_has_an_admin_list_and_add_page(model, superuser_client, job):
    base = f"/admin/adaptation/{model._meta.model_name}/"
    assert superuser_client.get(base).status_code == 200
    assert superuser_client.get(f"{base}add/").status_code == 200


@pytest.mark.parametrize("model", [JoinToken, RejectedNodeMessage, ControlWorker])
def test_rows_the_control_plane_makes_are_listed_but_not_added_by_hand(model, superuser_client, job):
    base = f"/admin/adaptation/{model._meta.model_name}/"
    assert superuser_client.get(base).status_code == 200
    assert superuser_client.get(f"{base}add/").status_code == 403


def test_the_admin_can_drain_a_node(superuser_client, node):
    response = superuser_client.post("/admin/adaptation/node/",
                                     {"action": "drain_nodes", "_selected_action": [node.pk]})
    assert response.status_code == 302
    node.refresh_from_db()
    assert node.status == "draining"


def test_the_api_docs_page_uses_only_local_assets(member):
    client = Client()
    client.force_login(member)
    body = client.get("/api/docs/").content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', body)
    assert sources and all(not source.startswith(("http://", "https://", "//")) for source in sources), sources
    assets = [source for source in sources if source.startswith("/static/")]
    assert assets and all(finders.find(asset.removeprefix("/static/")) for asset in assets)
