"""Where plans are shown: the model page's what-if plan and the plan API carry the stage sizes, the per-device memory
breakdown and each layout's rank with its reason."""

from django.test import Client
from django.utils.html import escape

from adaptation.intake import services as intake

TWO_H200_NODES = {"devices_per_node": 8, "device_memory_gb": 141, "nodes": 2, "device_name": "H200",
                  "precision": "bf16", "concurrency": 32, "context_tokens": 8192}


def test_the_model_page_shows_stage_sizes_memory_and_reasons(team, owner, member):
    spec, _ = intake.add_from_catalog(team=team, user=owner, slug="deepseek-v3")
    client = Client()
    client.force_login(member)
    page = client.get(f"/models/{spec.pk}/", TWO_H200_NODES).content.decode()
    what_if = page[page.index('id="what-if"'):]
    plan = intake.plan(spec, {"devices_per_node": 8, "nodes": 2, "device_memory_bytes": 141 * 10**9,
                              "device_name": "H200"}, "bf16", {"concurrency": 32, "context_tokens": 8192})
    assert "Fastest predicted" in what_if and "Fewest devices" in what_if
    for layout in plan["layouts"][:5] + plan["smallest_layouts"]:
        assert escape(layout["reason"]) in what_if and escape(layout["placement"]) in what_if
        if layout["pp"] > 1:
            assert f"{layout['pp']} ({', '.join(map(str, layout['stage_layers']))})" in what_if
    assert "Activations + overhead" in what_if and "2.0 GiB" in what_if  # the runtime overhead per device


def test_the_plan_api_returns_the_new_fields(member_api, team, owner):
    spec, _ = intake.add_from_catalog(team=team, user=owner, slug="deepseek-v3")
    response = member_api.post(f"/api/models/{spec.pk}/plan/", {
        "devices_per_node": 8, "nodes": 2, "device_memory_gb": 141, "device_name": "H200", "precision": "bf16"},
        format="json")
    assert response.status_code == 201, response.json()
    first = response.json()["result"]["layouts"][0]
    assert first["rank"] == 1 and first["reason"].startswith("#1 of")
    assert sum(first["stage_layers"]) == 61 and len(first["stages"]) == first["pp"]
    assert {"weights", "kv_cache", "activations", "runtime_overhead", "total", "usable"} <= set(
        first["per_device_bytes"])
