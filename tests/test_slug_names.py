"""Names that take letters, digits, - and _ only (a cluster's, a virtual backend's, an endpoint's, a team's slug)
say so next to the field, and a name that breaks the rule is refused naming the rule, on the page and in the API
(issue 31, item 4)."""

import pytest
from django.test import Client

from adaptation.models import Cluster, ServingEndpoint, Team, VirtualBackend

RULE = "letters, digits, - and _ only"


@pytest.mark.parametrize("model, field", [(Cluster, "name"), (VirtualBackend, "name"), (ServingEndpoint, "name"),
                                          (Team, "slug")])
def test_each_slug_only_name_says_its_rule_in_its_help_text(model, field):
    assert model._meta.get_field(field).help_text.lower().startswith(RULE)


def test_the_cluster_form_shows_the_rule_and_refuses_a_name_with_a_space_saying_why(owner, team):
    client = Client()
    client.force_login(owner)
    assert "Letters, digits, - and _ only. Nodes join as &lt;team&gt;/&lt;name&gt;." in client.get(
        "/clusters/new/").content.decode()
    response = client.post("/clusters/new/", {"team": team.pk, "name": "h100 pod", "expected_devices_per_node": 8,
                                              "interconnect": "unknown"})
    assert response.status_code == 200
    assert ("“h100 pod” cannot be used: a name here takes letters, digits, - and _ only (no spaces, dots, slashes "
            "or accents)") in response.content.decode()
    assert not Cluster.objects.exists()


@pytest.mark.parametrize("name", ["h100.pod", "pod/2", "pöd", "two words"])
def test_the_api_refuses_a_cluster_name_outside_the_rule_with_a_400_naming_it(owner_api, name):
    response = owner_api.post("/api/clusters/", {"name": name, "team": "alpha"}, format="json")
    assert response.status_code == 400
    assert response.json()["name"] == [f"“{name}” cannot be used: a name here takes letters, digits, - and _ only "
                                       "(no spaces, dots, slashes or accents), e.g. h100-pod_2."]
    assert owner_api.post("/api/clusters/", {"name": "h100-pod_2", "team": "alpha"},
                          format="json").status_code == 201
