"""Model intake on the control plane: analysis on upload, refusals with reasons, the model page's sizes and plans."""

import json
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from adaptation.intake import services as intake
from adaptation.models import ModelPlan, ModelSpec


def upload(config: dict, name="config.json"):
    return SimpleUploadedFile(name, json.dumps(config).encode(), content_type="application/json")


@pytest.fixture
def deepseek(team, owner):
    spec, _ = intake.add_from_catalog(team=team, user=owner, slug="deepseek-v3")
    return spec


def test_an_uploaded_config_is_analysed_and_its_counts_kept(member_api, team):
    config = json.load(open("adaptation/intake/catalog/configs/qwen3-0.6b.json"))
    response = member_api.post("/api/models/", {"config_file": upload(config, "qwen3-0.6b.json")}, format="multipart")
    assert response.status_code == 201
    detail = member_api.get(f"/api/models/{response.json()['id']}/").json()
    assert detail["analysis"]["total_params"] == 596049920
    assert detail["analysis"]["mechanisms"]["tied_embeddings"] is True


@pytest.mark.parametrize("config, reason", [
    ({"model_type": "llama", "num_hidden_layers": 32, "vocab_size": 32000}, "hidden"),
    ({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 10**9, "num_attention_heads": 32,
      "vocab_size": 32000}, "num_hidden_layers"),
    ({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
      "vocab_size": 10**12}, "vocab_size"),
    ({"model_type": "llama", "hidden_size": -4096, "num_hidden_layers": 32, "num_attention_heads": 32,
      "vocab_size": 32000}, "hidden_size"),
    ({"model_type": "no-such-architecture", "flux_capacitance": 1.21}, "hidden"),
])
def test_a_config_d0_cannot_read_is_refused_with_its_reason(member_api, team, config, reason):
    response = member_api.post("/api/models/", {"name": "bad", "config": config}, format="json")
    assert response.status_code == 400
    [message] = response.json()["config"]
    assert message.startswith("d0 cannot read this config:") and reason in message
    assert not ModelSpec.objects.exists()


def test_the_upload_form_shows_why_a_config_was_refused(member, team):
    client = Client()
    client.force_login(member)
    response = client.post("/models/new/", {"name": "bad", "config_file": upload({"model_type": "llama"})})
    assert "d0 cannot read this config" in response.content.decode()


def test_the_model_page_says_deepseek_v3_bf16_needs_two_h200_nodes_and_fp8_fits_one(member, deepseek):
    client = Client()
    client.force_login(member)
    page = client.get(f"/models/{deepseek.pk}/", {"devices_per_node": 8, "device_memory_gb": 141, "nodes": 1,
                                                   "device_name": "H200", "precision": "bf16", "concurrency": 32,
                                                   "context_tokens": 8192}).content.decode()
    assert "671 B" in page and "37.6 B" in page
    what_if = page[page.index('id="what-if"'):]
    # A one-node cluster's verdict is the one-node verdict: said once
    assert "Does not fit on 8 × 1 device(s)" in what_if and "One node does not fit" not in what_if
    assert re.search(r"Smallest that fits: (9|1[0-6]) device\(s\) at least, 2 node\(s\)\.", what_if)
    fp8 = client.get(f"/models/{deepseek.pk}/", {"devices_per_node": 8, "device_memory_gb": 141, "nodes": 1,
                                                  "device_name": "H200", "precision": "fp8", "concurrency": 32,
                                                  "context_tokens": 8192}).content.decode()
    assert "Fits on 8 × 1 device(s)." in fp8[fp8.index('id="what-if"'):]


def test_gpt_oss_120b_as_shipped_fits_one_80_gb_gpu_where_bf16_does_not(member, team, owner):
    """OpenAI: gpt-oss-120b "runs efficiently on a single 80 GB GPU" in its MXFP4 release; in bf16 it does not."""
    spec, _ = intake.add_from_catalog(team=team, user=owner, slug="gpt-oss-120b")
    client = Client()
    client.force_login(member)
    one_gpu = {"devices_per_node": 1, "device_memory_gb": 80, "nodes": 1, "device_name": "H100", "concurrency": 1,
               "context_tokens": 8192}
    verdicts = {}
    for precision in ("as_shipped", "bf16"):
        page = client.get(f"/models/{spec.pk}/", {**one_gpu, "precision": precision}).content.decode()
        verdicts[precision] = page[page.index('id="what-if"'):]
    assert "Fits on 1 × 1 device(s)." in verdicts["as_shipped"]
    assert "Does not fit on 1 × 1 device(s)" in verdicts["bf16"]


def test_a_kept_prediction_is_stored_for_later_comparison(member, deepseek):
    client = Client()
    client.force_login(member)
    form = {"devices_per_node": 8, "device_memory_gb": 141, "nodes": 2, "device_name": "H200", "precision": "bf16",
            "concurrency": 32, "context_tokens": 8192}
    response = client.post(f"/models/{deepseek.pk}/", form)
    assert response.status_code == 302
    kept = ModelPlan.objects.get()
    assert (kept.model, kept.created_by, kept.request["precision"], kept.result["fits"]) == (deepseek, member, "bf16",
                                                                                            True)
    assert kept.result["smallest_layouts"][0]["decode_tokens_per_s"] > 0


def test_a_plan_for_an_impossible_cluster_is_a_form_error_not_a_500(member, deepseek):
    client = Client()
    client.force_login(member)
    response = client.get(f"/models/{deepseek.pk}/", {"devices_per_node": 300, "device_memory_gb": 141, "nodes": 1,
                                                       "precision": "bf16", "concurrency": 32, "context_tokens": 8192})
    assert response.status_code == 200
    assert "Ensure this value is less than or equal to 256" in response.content.decode()


def test_the_model_page_plans_on_the_teams_own_clusters(member, deepseek, node):
    client = Client()
    client.force_login(member)
    page = client.get(f"/models/{deepseek.pk}/").content.decode()
    assert "On cluster" in page and "h100-pod" in page
    assert "Does not fit" in page  # one 1 GiB CPU "device"


def test_the_api_plans_a_what_if_cluster_and_keeps_the_prediction(member_api, outsider_api, deepseek):
    response = member_api.post(f"/api/models/{deepseek.pk}/plan/", {
        "devices_per_node": 8, "device_memory_gb": 141, "device_name": "H200", "precision": "fp8"}, format="json")
    assert response.status_code == 201, response.json()
    result = response.json()["result"]
    assert result["fits"] is True and result["one_node"]["fits"] is True
    assert member_api.get("/api/model-plans/").json()["results"][0]["id"] == response.json()["id"]
    assert member_api.post(f"/api/models/{deepseek.pk}/plan/", {"precision": "bf16"}, format="json").json() == {
        "non_field_errors": ["Give a cluster, or devices_per_node and device_memory_gb."]}
    assert outsider_api.post(f"/api/models/{deepseek.pk}/plan/", {}, format="json").status_code == 404
    assert outsider_api.get("/api/model-plans/").json()["count"] == 0


def test_numbers_are_written_as_people_write_them_never_in_exponent_form(member, team, owner):
    from adaptation.templatetags.d0 import billions, grouped

    assert [billions(value) for value in (1.0263e12, 671.03e9, 37.6e9, 5.14e9, 2_101_248, 1536, None)] == [
        "1.03 T", "671 B", "37.6 B", "5.14 B", "2.1 M", "1,536", "—"]
    assert grouped(1525914) == "1,525,914"
    client = Client()
    client.force_login(member)
    pages = {}
    for slug in ("kimi-k2-instruct", "qwen3-0.6b", "gpt-oss-20b"):
        spec = intake.add_from_catalog(team=team, user=owner, slug=slug)[0]
        pages[slug] = page = client.get(f"/models/{spec.pk}/").content.decode()
        # What a person reads: scripts' JSON and verbatim config (pre/code) keep the config's own spelling (1e-06)
        shown = re.sub(r"<(script|pre|code)\b.*?</\1>", "", page, flags=re.DOTALL)
        assert not re.search(r"\d(\.\d+)?e[+-]\d", shown), (slug, re.search(r".{60}\de[+-]\d.{20}", shown))
    assert "1.03 T" in pages["kimi-k2-instruct"]


def test_the_what_if_form_keeps_the_csrf_token_out_of_its_urls(member, deepseek):
    client = Client()
    client.force_login(member)
    query = {"devices_per_node": 8, "device_memory_gb": 141, "nodes": 2, "device_name": "H200", "precision": "bf16",
             "concurrency": 32, "context_tokens": 8192}
    page = client.get(f"/models/{deepseek.pk}/", query).content.decode()
    plan_form = page[page.index('id="plan-form"'):page.index("</form>", page.index('id="plan-form"'))]
    assert "csrfmiddlewaretoken" not in plan_form  # a GET form: its fields become the URL
    keep = page[page.index('id="keep-plan"'):page.index("</form>", page.index('id="keep-plan"'))]
    assert "csrfmiddlewaretoken" in keep and 'name="precision" value="bf16"' in keep
    response = client.post(f"/models/{deepseek.pk}/", {**query, "csrfmiddlewaretoken": "x" * 32})
    assert response.status_code == 302 and "csrfmiddlewaretoken" not in response.url and "nodes=2" in response.url


def test_the_catalog_searches_and_marks_what_the_team_already_added(member, team, owner):
    added = intake.add_from_catalog(team=team, user=owner, slug="qwen3-0.6b")[0]
    client = Client()
    client.force_login(member)
    page = client.get("/models/catalog/", {"q": "qwen3"}).content.decode()
    rows = page[page.index('id="catalog"'):]
    assert "Qwen3-0.6B" in rows and "DeepSeek-V3" not in rows
    assert f'href="/models/{added.pk}/" class="added"' in rows
    assert "No catalog model matches." in client.get("/models/catalog/", {"q": "no-such-model"}).content.decode()
    coverage = client.get("/coverage/").content.decode()
    assert "No coverage report yet: open a model" in coverage and "Run op coverage" in coverage


def test_the_model_list_shows_sizes_how_each_ships_and_its_coverage(member, team, owner, job, node):
    from adaptation.models import CoverageReport

    deepseek = intake.add_from_catalog(team=team, user=owner, slug="deepseek-v3")[0]
    intake.add_from_catalog(team=team, user=owner, slug="qwen3-0.6b")
    CoverageReport.objects.create(model=deepseek, job=job, stage_run=job.stage_runs.get(), backend="cpu",
                                  dtype="bf16", coverage=0.93, report={"operators": []})
    client = Client()
    client.force_login(member)
    page = client.get("/models/").content.decode()
    row = page[page.index(">DeepSeek-V3<"):page.index("</tr>", page.index(">DeepSeek-V3<"))]
    assert "671 B" in row and "37.6 B" in row and "<td>fp8</td>" in row and ">93%<" in row
    qwen = page[page.index(">Qwen3-0.6B<"):page.index("</tr>", page.index(">Qwen3-0.6B<"))]
    assert "<td>bfloat16</td>" in qwen and "<td>—</td>" in qwen


def test_the_model_page_of_a_linear_attention_hybrid_shows_its_own_kv_bytes_and_recurrent_state(member, team, owner):
    # Kimi-Linear: 7 MLA layers cache 7 x (512 + 64) x 2 bytes per token; its 20 KDA layers a fixed state.
    spec, _ = intake.add_from_catalog(team=team, user=owner, slug="kimi-linear-48b-a3b-instruct")
    client = Client()
    client.force_login(member)
    page = client.get(f"/models/{spec.pk}/").content.decode()
    assert "8,064 bytes" in page
    assert "Recurrent state (linear attention, KDA, Gated DeltaNet, Mamba)" in page
    assert f"{20 * (3 * 4096 * 3 * 2 + 32 * 128 * 128 * 4):,} bytes per sequence" in page
