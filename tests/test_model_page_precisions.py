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
