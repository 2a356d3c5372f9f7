"""The web tier never imports torch or transformers: ~2 s and ~200 MiB per gunicorn worker.

A fresh Python process (nothing imported yet) sets Django up, imports the URLconf and drives real requests through
Django's test client, signed in: every page, API list and admin page that takes no argument, the detail pages of a
model, a job and a cluster, a config upload through the API and through the form (each analysed, for real, by the
analysis process), a catalog add and plans (the model page's cluster plan and what-if, the API's plan). Then it
reports which of torch and transformers it holds.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.utils import timezone

from adaptation.models import Device

from .conftest import database_url

ROOT = Path(__file__).resolve().parent.parent

DRIVER = textwrap.dedent("""
    import json, sys
    import django
    django.setup()
    from django.test.utils import setup_test_environment
    setup_test_environment()
    import d0web.urls  # noqa: F401
    from django.contrib.auth import get_user_model
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.test import Client
    from django.urls import URLPattern, URLResolver, get_resolver
    from rest_framework.test import APIClient

    ids = json.loads(sys.argv[1])
    config = json.loads(open(ids["config_path"]).read())
    user = get_user_model().objects.get(pk=ids["user"])

    def routes(patterns, prefix=""):
        for pattern in patterns:
            route = prefix + str(pattern.pattern).lstrip("^").rstrip("$").replace("\\\\", "")
            if isinstance(pattern, URLResolver):
                yield from routes(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and "<" not in route and "(" not in route and "logout" not in route:
                yield "/" + route

    client = Client()
    client.force_login(user)
    api = APIClient()
    api.force_authenticate(user)
    statuses = {}

    def get(path):
        statuses["GET " + path] = (api if path.startswith("/api/") else client).get(path).status_code

    for path in sorted(set(routes(get_resolver().url_patterns))):
        get(path)
    model, job, cluster = ids["model"], ids["job"], ids["cluster"]
    for path in (f"/models/{model}/", f"/models/{model}/?devices_per_node=8&device_memory_gb=141&nodes=1",
                 f"/models/{model}/coverage/", f"/models/{model}/sharded-runs/", f"/jobs/{job}/",
                 f"/jobs/{job}/progress/", f"/clusters/{cluster}/", f"/clusters/{cluster}/topology/",
                 f"/api/models/{model}/", f"/api/jobs/{job}/", f"/api/clusters/{cluster}/",
                 f"/admin/adaptation/modelspec/{model}/change/"):
        get(path)

    def upload(name):
        return SimpleUploadedFile(name + ".json", json.dumps(config).encode(), content_type="application/json")

    response = api.post("/api/models/", {"team": ids["slug"], "name": "by-api", "config_file": upload("api")},
                        format="multipart")
    statuses["POST /api/models/"] = response.status_code
    refusals = {"POST /api/models/": response.content.decode()[:2000]}
    response = client.post("/models/new/", {"team": ids["team"], "name": "by-form", "config_file": upload("form")})
    statuses["POST /models/new/"] = response.status_code
    refusals["POST /models/new/"] = response.content.decode()[:2000] if response.status_code != 302 else ""
    statuses["POST /models/catalog/llama-3.1-8b/add/"] = client.post(
        "/models/catalog/llama-3.1-8b/add/", {"team": ids["slug"]}).status_code
    statuses["POST /api/models/plan/"] = api.post(f"/api/models/{model}/plan/", {
        "devices_per_node": 8, "nodes": 1, "device_memory_gb": 141, "precision": "bf16"}, format="json").status_code

    from adaptation.models import ModelSpec

    methods = dict(ModelSpec.objects.values_list("name", "analysis__method"))
    print(json.dumps({"statuses": statuses, "methods": methods, "refusals": refusals,
                      "imported": [name for name in ("torch", "transformers") if name in sys.modules]}))
""")


@pytest.mark.django_db(transaction=True)
def test_no_page_or_api_request_imports_torch_or_transformers(owner, team, model_spec, job, node, tmp_path):
    owner.is_staff = owner.is_superuser = True
    owner.save()
    Device.objects.create(node=node, index=1, kind="cuda", name="NVIDIA H200", memory_bytes=141 * 10**9)
    node.last_heartbeat = timezone.now()
    node.save()
    ids = {"user": owner.pk, "team": team.pk, "slug": team.slug, "model": model_spec.pk, "job": job.pk,
           "cluster": node.cluster_id,
           "config_path": str(ROOT / "adaptation/intake/catalog/configs/qwen3-0.6b.json")}
    environment = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "d0web.settings",
                   "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(ids)], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    statuses = outcome["statuses"]
    assert not {request: status for request, status in statuses.items() if status >= 500}
    # What was driven, so that a route left out (a failed resolve, a redirect to the login page) shows.
    assert statuses["GET /"] == statuses["GET /jobs/"] == statuses["GET /api/jobs/"] == 200
    assert statuses["GET /admin/"] == statuses[f"GET /admin/adaptation/modelspec/{model_spec.pk}/change/"] == 200
    assert statuses[f"GET /models/{model_spec.pk}/"] == 200
    assert len(statuses) > 40
    assert statuses["POST /api/models/"] == 201 and statuses["POST /models/new/"] == 302, outcome["refusals"]
    assert statuses["POST /models/catalog/llama-3.1-8b/add/"] == 302 and statuses["POST /api/models/plan/"] == 201
    # Analysed for real, by the analysis process: transformers built each model on the meta device.
    assert outcome["methods"] == {"by-api": "exact", "by-form": "exact", "Llama-3.1-8B": "exact",
                                  model_spec.name: "exact"}
    assert outcome["imported"] == []
