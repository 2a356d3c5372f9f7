"""The model page shows what model intake reads of a release's precisions: the format it ships in and the dtypes of
its recurrent state (the figures themselves: tests/engine/test_precisions.py)."""


def test_the_model_page_shows_the_format_as_shipped_and_the_state_dtypes(member, team, owner):
    from django.test import Client

    from adaptation.intake import services as intake

    client = Client()
    client.force_login(member)
    pages = {}
    for slug in ("gpt-oss-20b", "nemotron-h-56b-base-8k"):
        spec = intake.add_from_catalog(team=team, user=owner, slug=slug)[0]
        pages[slug] = client.get(f"/models/{spec.pk}/").content.decode()
    assert "As shipped: mxfp4</b> (quantization_config mxfp4), 12.8 GiB" in pages["gpt-oss-20b"]
    assert "not converted: model.layers.*.self_attn" in pages["gpt-oss-20b"]
    assert "state: 912,605,184 bytes per sequence (" in pages["nemotron-h-56b-base-8k"]
    assert "mamba ssm in fp32: vLLM&#x27;s default for Nemotron-H" in pages["nemotron-h-56b-base-8k"]


def test_does_it_fit_starts_at_the_precision_the_release_ships_in(member, team, owner, cluster, node):
    from django.test import Client

    from adaptation.intake import services as intake

    client = Client()
    client.force_login(member)
    deepseek = intake.add_from_catalog(team=team, user=owner, slug="deepseek-v3")[0]
    page = client.get(f"/models/{deepseek.pk}/").content.decode()
    # The what-if form's precision is preselected as shipped (FP8 blocks), and the cluster's plan is made at it.
    assert '<option value="as_shipped" selected>as_shipped</option>' in page
    assert f"{cluster.name}</a> (as shipped (fp8))</h3>" in page
    # A submitted form keeps what was asked.
    asked = client.get(f"/models/{deepseek.pk}/", {"devices_per_node": 8, "device_memory_gb": 141, "nodes": 2,
                                                   "device_name": "H200", "precision": "bf16", "concurrency": 32,
                                                   "context_tokens": 8192}).content.decode()
    assert '<option value="bf16" selected>bf16</option>' in asked


def test_the_mechanisms_read_as_text_with_the_json_behind_a_toggle(member, team, owner):
    import re

    from django.test import Client

    from adaptation.intake import services as intake

    client = Client()
    client.force_login(member)
    spec = intake.add_from_catalog(team=team, user=owner, slug="deepseek-v3")[0]
    page = client.get(f"/models/{spec.pk}/").content.decode()
    shown = re.search(r'<dl class="facts" id="mechanisms">(.*?)</dl>', page, re.S).group(1)
    assert "<dt>attention</dt><dd>" in shown and "kind: mla" in shown and "heads: 128" in shown
    assert "mla: " in shown and "kv lora rank 512" in shown and "q lora rank 1536" in shown
    assert "experts: 256" in shown and "experts per token: 8" in shown
    assert "{" not in shown and "null" not in shown  # no raw JSON, nothing unset
    assert 'id="mechanisms-json"' in page
