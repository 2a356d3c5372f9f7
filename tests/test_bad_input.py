"""Bad input gets a 400 (or 409) with a message per field, never a 500."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from adaptation.models import AdaptationJob, ModelSpec


def upload(content: bytes, name="config.json"):
    return SimpleUploadedFile(name, content, content_type="application/json")


def test_an_uploaded_config_json_becomes_a_model(member_api, team):
    config = open("adaptation/intake/catalog/configs/deepseek-v3.json", "rb").read()
    response = member_api.post("/api/models/", {"config_file": upload(config, "deepseek-v3.json")},
                               format="multipart")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["name"], body["architecture"], body["team"]) == ("deepseek-v3", "DeepseekV3ForCausalLM", "alpha")
    assert ModelSpec.objects.get(pk=body["id"]).config["n_routed_experts"] == 256


def test_a_config_can_also_be_posted_as_json(member_api, team):
    config = json.load(open("adaptation/intake/catalog/configs/llama-3.2-1b.json"))
    response = member_api.post("/api/models/", {"name": "tiny", "config": config}, format="json")
    assert response.status_code == 201
    assert response.json()["architecture"] == "LlamaForCausalLM"
    assert response.json()["analysis"]["total_params"] == 1235814400


@pytest.mark.parametrize("content, message", [
    (b'{"hidden_size": 4096,', "Not valid JSON"),
    (b"[1, 2, 3]", "must be a JSON object"),
    (b"\xff\xfe\x00", "not UTF-8"),
])
def test_a_malformed_config_file_is_a_field_error(member_api, team, content, message):
    response = member_api.post("/api/models/", {"name": "m", "config_file": upload(content)}, format="multipart")
    assert response.status_code == 400
    assert message in response.json()["config_file"][0]


def test_a_config_over_the_upload_limit_is_refused_with_its_size(member_api, team):
    padding = "x" * (3 * 2**20)
    response = member_api.post("/api/models/", {"name": "big", "config_file": upload(
        json.dumps({"model_type": "llama", "padding": padding}).encode())}, format="multipart")
    assert response.status_code == 400
    assert response.json()["config_file"] == ["The file is 3.0 MiB; the limit for a config.json is 2.0 MiB."]
    assert not ModelSpec.objects.exists()


def test_a_json_body_over_the_limit_is_a_400(member_api, team):
    response = member_api.post("/api/models/", {"name": "big", "config": {"padding": "x" * (3 * 2**20)}},
                               format="json")
    assert response.status_code == 400
    assert "limit" in response.json()["detail"]


def test_a_non_object_config_in_json_is_a_field_error(member_api, team):
    response = member_api.post("/api/models/", {"name": "m", "config": [1, 2]}, format="json")
    assert response.status_code == 400
    assert "must be a JSON object" in response.json()["config"][0]


def test_a_model_needs_a_config(member_api, team):
    response = member_api.post("/api/models/", {"name": "m"}, format="json")
    assert response.status_code == 400
    assert "config_file" in response.json()["config"][0]


def test_a_duplicate_model_name_in_the_team_is_a_400(member_api, model_spec):
    response = member_api.post("/api/models/", {"name": model_spec.name, "config": model_spec.config},
                               format="json")
    assert response.status_code == 400
    assert "already exists" in response.json()["non_field_errors"][0]


def test_an_unknown_cluster_is_a_field_error(member_api, team):
    response = member_api.post("/api/jobs/", {"cluster": 999999, "stages": ["env_probe"]}, format="json")
    assert response.status_code == 400
    assert response.json()["cluster"] == ['Invalid pk "999999" - object does not exist.']


@pytest.mark.parametrize("payload, field", [
    ({"stages": ["teleport"]}, "stages"),
    ({"stages": []}, "stages"),
    ({"stages": ["env_probe"], "parameters": [1]}, "parameters"),
    ({"stages": ["env_probe", "env_probe"]}, "stages"),
])
def test_bad_job_fields_are_field_errors(member_api, cluster, payload, field):
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, **payload}, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not AdaptationJob.objects.exists()


def test_malformed_json_is_a_400(member_api, team):
    response = member_api.generic("POST", "/api/jobs/", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert "JSON parse error" in response.json()["detail"]


def test_cancelling_a_finished_job_is_a_409(member_api, job):
    job.start()
    job.finish()
    response = member_api.post(f"/api/jobs/{job.pk}/cancel/")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"Job {job.pk} is already succeeded; only a queued or running job can be cancelled.")


def test_retrying_a_running_job_is_a_409(member_api, job):
    job.start()
    assert member_api.post(f"/api/jobs/{job.pk}/retry/").status_code == 409


def test_deleting_a_model_that_jobs_used_is_a_409(owner_api, job):
    response = owner_api.delete(f"/api/models/{job.model_id}/")
    assert response.status_code == 409
    assert "kept as their history" in response.json()["detail"]


def test_the_upload_page_shows_field_errors(member):
    client = Client()
    client.force_login(member)
    response = client.post("/models/new/", {"name": "m", "config_file": upload(b"[]")})
    assert response.status_code == 200
    assert "must be a JSON object" in response.content.decode()
    too_big = client.post("/models/new/", {"name": "m", "config_file": upload(b" " * (2 * 2**20 + 1))})
    assert "the limit for a config.json is 2.0 MiB" in too_big.content.decode()


def test_the_job_form_rejects_bad_parameters(member, cluster):
    client = Client()
    client.force_login(member)
    response = client.post("/jobs/new/", {"cluster": cluster.pk, "stages": ["env_probe"], "parameters": "[1]"})
    assert response.status_code == 200
    assert "Parameters must be a JSON object" in response.content.decode()
    assert not AdaptationJob.objects.exists()


def test_the_job_form_submits_a_job(member, cluster, node, broker, django_capture_on_commit_callbacks):
    client = Client()
    client.force_login(member)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/jobs/new/", {"cluster": cluster.pk, "stages": ["env_probe"]})
    job = AdaptationJob.objects.get()
    assert response["Location"] == f"/jobs/{job.pk}/"
    assert broker.names() == ["d0.node.run_stage"]


def test_cancelling_a_finished_job_from_its_page_says_why(member, job):
    job.start()
    job.finish()
    client = Client()
    client.force_login(member)
    response = client.post(f"/jobs/{job.pk}/cancel/", follow=True)
    assert "only a queued or running job can be cancelled" in response.content.decode()


def test_retry_from_the_job_page_opens_the_new_job(member, job, broker, django_capture_on_commit_callbacks):
    job.start()
    job.fail("node lost")
    client = Client()
    client.force_login(member)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/jobs/{job.pk}/retry/")
    again = AdaptationJob.objects.get(retry_of=job)
    assert response["Location"] == f"/jobs/{again.pk}/"
    assert broker.names() == ["d0.node.run_stage"]


def test_the_job_form_preselects_the_cluster_it_was_opened_from(member, cluster):
    client = Client()
    client.force_login(member)
    body = client.get(f"/jobs/new/?cluster={cluster.pk}").content.decode()
    assert f'<option value="{cluster.pk}" selected>' in body


def test_an_unknown_api_url_is_a_json_404(member_api):
    response = member_api.get("/api/no-such-thing/")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}


def test_a_config_with_a_bare_infinity_is_kept_with_infinity_as_text(member_api, team):
    config = open("adaptation/intake/catalog/configs/nemotron-h-56b-base-8k.json", "rb").read()
    assert b"Infinity" in config
    response = member_api.post("/api/models/", {"config_file": upload(config, "nemotron-h.json")}, format="multipart")
    assert response.status_code == 201, response.json()
    stored = ModelSpec.objects.get(pk=response.json()["id"]).config
    assert stored["time_step_limit"] == [0.0, "Infinity"]


def test_a_catalog_model_is_added_once_per_team(member, team):
    client = Client()
    client.force_login(member)
    page = client.get("/models/catalog/").content.decode()
    assert "DeepSeek-V3" in page and "671 B" in page and "5.1 B" in page
    response = client.post("/models/catalog/deepseek-v3/add/", {"team": "alpha"})
    spec = ModelSpec.objects.get(team=team, catalog_slug="deepseek-v3")
    assert response["Location"] == f"/models/{spec.pk}/"
    assert spec.config["n_routed_experts"] == 256 and spec.architecture == "DeepseekV3ForCausalLM"
    assert client.post("/models/catalog/deepseek-v3/add/", {"team": "alpha"})["Location"] == f"/models/{spec.pk}/"
    assert ModelSpec.objects.count() == 1
    assert client.post("/models/catalog/no-such-model/add/", {"team": "alpha"}).status_code == 404
    assert client.post("/models/catalog/deepseek-v3/add/", {"team": "beta"}).status_code == 404


def test_the_api_lists_the_catalog_and_adds_from_it(member_api, anon_api, team):
    listed = member_api.get("/api/catalog/").json()
    kimi = next(entry for entry in listed if entry["slug"] == "kimi-k2-instruct")
    assert (kimi["published_total"], kimi["published_active"]) == (1e12, 32e9)
    assert anon_api.get("/api/catalog/").status_code == 401
    response = member_api.post("/api/models/", {"catalog": "kimi-k2-instruct"}, format="json")
    assert response.status_code == 201, response.json()
    assert (response.json()["name"], response.json()["catalog_slug"]) == ("Kimi-K2-Instruct", "kimi-k2-instruct")
    assert member_api.post("/api/models/", {"catalog": "nope"}, format="json").json()["catalog"] == [
        '"nope" is not a valid choice.']


@pytest.mark.parametrize("body, message", [
    ('{"name": "m\\u0000", "config": {"model_type": "llama"}}', "NUL"),
    ('{"name": "m", "team": "al\\u0000pha", "config": {"model_type": "llama"}}', "NUL"),
    ('{"name": "m", "config": {"model_type": "llama", "hidden_size": 8, "k\\u0000": 1}}', "NUL"),
    ('{"name": "m", "config": {"model_type": "llama", "x": 1e400}}', "finite"),
    ('{"name": "m", "config": {"model_type": "llama", "x": NaN}}', "Out of range"),
])
def test_what_postgresql_cannot_store_is_a_400_naming_it(member_api, body, message):
    response = member_api.generic("POST", "/api/models/", body, content_type="application/json")
    assert response.status_code == 400 and message in response.json()["detail"]


def test_a_nul_in_a_query_string_or_a_cluster_name_is_a_400(member_api, owner_api):
    assert member_api.get("/api/jobs/?status=run%00ning").status_code == 400
    response = owner_api.generic("POST", "/api/clusters/", '{"name": "c\\u0000", "team": "al\\u0000pha"}',
                                 content_type="application/json")
    assert response.status_code == 400


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/api/devices/?cluster=0.5", "/api/env-reports/?cluster=1e3",
                                 "/api/links/?p2p_ok=-58800", "/api/links/?p2p_ok=maybe"])
def test_a_filter_value_of_the_wrong_type_is_a_400_not_every_row(member_api, url):
    """Found by schemathesis: a decimal id matched nothing and a boolean that was no boolean matched everything,
    both with a 200 that looked like an answer."""
    response = member_api.get(url)
    assert response.status_code == 400, response.content
    assert set(response.json()) & {"cluster", "p2p_ok"}


@pytest.mark.django_db
def test_boolean_and_id_filters_still_filter(member_api, cluster, node):
    from adaptation.models import Link

    Link.objects.create(cluster=cluster, source_node=node, target_node=node, kind="nvlink", p2p_ok=False)
    assert member_api.get("/api/links/?p2p_ok=false").json()["count"] == 1
    assert member_api.get("/api/links/?p2p_ok=true").json()["count"] == 0
    assert member_api.get(f"/api/devices/?cluster={cluster.pk}").json()["count"] == 1
