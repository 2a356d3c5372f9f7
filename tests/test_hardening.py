"""Web hardening: sign-in lockout, a health endpoint that tells strangers nothing and broadcasts nothing, a body cap,
team-scoped filters, CSV cells that cannot run as formulas, deep JSON refused, the team-admin rule, and production
refusing to run on the zero-setup secret."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from django.test import Client

from adaptation.choices import TeamRole
from adaptation.models import AdaptationJob, Cluster, Membership, ModelSpec, Team, VirtualBackend
from adaptation.sweeps.services import trials_csv
from tests.conftest import _user

ROOT = Path(__file__).resolve().parent.parent


def test_wrong_passwords_lock_the_sign_in_even_for_the_right_one(member, settings):
    assert settings.AXES_FAILURE_LIMIT == 5
    client = Client()
    for _ in range(4):
        response = client.post("/login/", {"username": "bob", "password": "wrong"})
        assert response.status_code == 200  # the form again, with its error
    assert client.post("/login/", {"username": "bob", "password": "wrong"}).status_code == 429  # the fifth
    locked = client.post("/login/", {"username": "bob", "password": "a-long-test-password"})
    assert locked.status_code == 429 and locked["Retry-After"] == str(15 * 60)
    token = client.post("/api/token/", {"username": "bob", "password": "a-long-test-password"})
    assert token.status_code == 429 and "token" not in token.json() and token["Retry-After"] == str(15 * 60)
    # Another user from the same address is not locked out by bob's failures.
    _user("carol", member.memberships.get().team, TeamRole.MEMBER)
    assert client.post("/login/", {"username": "carol", "password": "a-long-test-password"}).status_code == 302


def test_wrong_passwords_on_the_token_endpoint_lock_it_with_a_429_and_retry_after(member):
    client = Client()
    for _ in range(4):
        assert client.post("/api/token/", {"username": "bob", "password": "wrong"}).status_code == 400
    fifth = client.post("/api/token/", {"username": "bob", "password": "wrong"})
    assert fifth.status_code == 429 and fifth["Retry-After"] == str(15 * 60)
    locked = client.post("/api/token/", {"username": "bob", "password": "a-long-test-password"})
    assert locked.status_code == 429 and "token" not in locked.json() and "locked" in locked.json()["detail"]
    assert client.post("/login/", {"username": "bob", "password": "a-long-test-password"}).status_code == 429
    # A right password for another user from the same address still gets a token
    _user("carol", member.memberships.get().team, TeamRole.MEMBER)
    assert "token" in client.post("/api/token/", {"username": "carol", "password": "a-long-test-password"}).json()


def test_health_needs_no_broadcast_and_tells_strangers_only_up(anon_api, member_api, node, monkeypatch):
    from adaptation.jobs import services

    def refuse(*args, **kwargs):
        raise AssertionError("the health endpoint broadcast to the workers")

    monkeypatch.setattr(services.celery_app().control, "ping", refuse)
    monkeypatch.setattr(services.celery_app().control, "broadcast", refuse)
    started = time.perf_counter()
    response = anon_api.get("/api/status/")
    assert (response.status_code, response.json()) == (200, {"status": "up"})
    assert time.perf_counter() - started < 0.5
    assert member_api.get("/api/status/").json()["workers"] == {"control": 0, "node": 1}


def test_health_asks_the_broker_once_per_interval_and_sees_it_go_down_and_come_back(anon_api, member_api, monkeypatch):
    """Through a real broker (the embedded Valkey server): the requests within one check interval open one broker
    connection between them, a stopped broker is reported down, and a restarted one up at the next check."""
    import redis

    from adaptation.jobs import health
    from adaptation.jobs import services
    from d0web import embedded_broker

    var = Path(tempfile.mkdtemp(prefix="d0-health-"))  # short: a unix socket's path is at most 107 bytes
    monkeypatch.setattr(services.celery_app().conf, "broker_url", embedded_broker.broker_url(var))
    health.broker_check.forget()
    server = embedded_broker.start(var)
    try:
        stats = redis.Redis(unix_socket_path=str(embedded_broker.socket_path(var)))
        opened = stats.info("stats")["total_connections_received"]
        for _ in range(5):
            assert anon_api.get("/api/status/").json() == {"status": "up"}
        assert member_api.get("/api/status/").json()["broker"] == "ok"
        assert stats.info("stats")["total_connections_received"] - opened == 1  # INFO reuses its connection
        stats.close()

        server.terminate()
        server.wait(timeout=10)
        # Within the interval, the last answer stands; at the next check the broker is down.
        assert anon_api.get("/api/status/").status_code == 200
        health.broker_check.forget()
        down = member_api.get("/api/status/")
        assert down.status_code == 503 and down.json()["status"] == "down"
        assert down.json()["broker"].startswith("error:") and down.json()["database"] == "ok"
        assert anon_api.get("/api/status/").json() == {"status": "down"}

        server = embedded_broker.start(var)
        health.broker_check.forget()
        assert anon_api.get("/api/status/").json() == {"status": "up"}
    finally:
        server.terminate()
        server.wait(timeout=10)
        health.broker_check.forget()
        shutil.rmtree(var, ignore_errors=True)


def test_a_body_over_the_cap_is_refused_before_it_is_read(member_api, member, settings):
    settings.D0_MAX_REQUEST_BYTES = 64 * 1024
    body = b"x" * (settings.D0_MAX_REQUEST_BYTES + 1)
    response = member_api.generic("POST", "/api/models/", body, content_type="multipart/form-data; boundary=b")
    assert response.status_code == 413
    assert response.json() == {"detail": "The request body is 0.1 MiB; the limit is 0.1 MiB."}
    client = Client()
    client.force_login(member)
    page = client.generic("POST", "/models/new/", body, content_type="multipart/form-data; boundary=b")
    assert page.status_code == 413 and b"the limit is" in page.content
    assert not ModelSpec.objects.exists()


def test_filters_name_only_rows_of_your_teams(member_api, cluster, other_team, job):
    theirs = Cluster.objects.create(team=other_team, name="theirs")
    for url in (f"/api/jobs/?cluster={theirs.pk}", f"/api/nodes/?cluster={theirs.pk}",
                f"/api/stage-runs/?job={job.pk + 1000}"):
        assert member_api.get(url).status_code == 400, url
    missing = member_api.get("/api/jobs/?cluster=999999")
    foreign = member_api.get(f"/api/jobs/?cluster={theirs.pk}")
    # Another team's id reads exactly like one that does not exist: no oracle for what other teams have.
    assert foreign.json()["cluster"][0].replace(str(theirs.pk), "N") == \
        missing.json()["cluster"][0].replace("999999", "N")
    assert len(member_api.get(f"/api/jobs/?cluster={cluster.pk}").json()["results"]) == 1
    # The filters viewsets declare as plain field lists are scoped the same way.
    their_job = AdaptationJob.objects.create(team=other_team, cluster=theirs, stages=["env_probe"])
    assert member_api.get(f"/api/coverage-reports/?job={job.pk}").status_code == 200
    assert member_api.get(f"/api/coverage-reports/?job={their_job.pk}").status_code == 400
    assert member_api.get(f"/api/sweep-reports/?job={their_job.pk}").status_code == 400


def test_csv_cells_that_look_like_formulas_are_kept_as_text():
    result = {"trials": [{"id": 1, "status": "failed", "reason": '=HYPERLINK("http://evil","x")',
                          "params": {"precision": "+bf16"}, "metrics": {"output_tokens_per_s": -1.5}}]}
    rows = trials_csv(result).splitlines()
    assert "'=HYPERLINK" in rows[1] and ",'+bf16," in rows[1]
    assert ",-1.5," in rows[1]  # numbers stay numbers


def test_deeply_nested_json_is_a_400_not_a_500(member_api, member, team):
    deep = "[" * 200_000 + "]" * 200_000
    response = member_api.generic("POST", "/api/models/", '{"name": "deep", "config": ' + deep + "}",
                                  content_type="application/json")
    assert response.status_code == 400 and "nests too deeply" in response.json()["detail"]
    nested = {"model_type": "llama"}
    for _ in range(40):
        nested = {"inner": nested}
    response = member_api.post("/api/models/", {"name": "nested", "config": nested}, format="json")
    assert response.status_code == 400 and "nests deeper than 32 levels" in response.json()["config"][0]
    client = Client()
    client.force_login(member)
    from django.core.files.uploadedfile import SimpleUploadedFile

    page = client.post("/models/new/", {"team": team.pk, "config_file": SimpleUploadedFile("c.json", deep.encode())})
    assert page.status_code == 200 and "nests deeper than 32 levels" in page.content.decode()
    assert not ModelSpec.objects.exists()


def test_only_team_admins_may_add_clusters_and_two_admins_are_no_500(member, owner, team):
    member_client, owner_client = Client(), Client()
    member_client.force_login(member)
    owner_client.force_login(owner)
    assert member_client.get("/clusters/new/").status_code == 403
    assert member_client.post("/clusters/new/", {"team": team.pk, "name": "sneaky",
                                                 "expected_devices_per_node": 1}).status_code == 403
    _user("dave", team, TeamRole.ADMIN)  # a second admin joins the two memberships per team
    assert owner_client.get("/clusters/new/").status_code == 200
    created = owner_client.post("/clusters/new/", {"team": team.pk, "name": "pod", "expected_devices_per_node": 1,
                                                   "interconnect": "nvlink"})
    assert created.status_code == 302 and Cluster.objects.filter(name="pod").exists()
    assert not Cluster.objects.filter(name="sneaky").exists()
    # A member of a team with admins is no admin of it.
    other = Team.objects.create(name="Gamma", slug="gamma")
    Membership.objects.create(team=other, user=member, role=TeamRole.ADMIN)
    form = member_client.get("/clusters/new/").content.decode()
    assert f'value="{other.pk}"' in form and f'value="{team.pk}"' not in form


def test_a_virtual_backend_is_deleted_only_by_its_uploader_or_a_team_admin(member_api, owner_api, owner, team):
    backend = VirtualBackend.objects.create(team=team, name="vx", operators=["aten::mm"], created_by=owner)
    assert member_api.delete(f"/api/virtual-backends/{backend.pk}/").status_code == 403
    assert owner_api.delete(f"/api/virtual-backends/{backend.pk}/").status_code == 204


def test_pages_carry_a_content_security_policy_and_the_token_page_is_not_cached(member):
    client = Client()
    client.force_login(member)
    policy = client.get("/")["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "object-src 'none'" in policy and "unsafe-eval" not in policy
    assert "no-store" in client.get("/account/token/")["Cache-Control"]


def compose_environment(service: str) -> dict:
    """The service's environment as docker compose would give it with nothing set: ``${X:-default}`` is the
    default, ``${X:?message}`` (compose refuses to start without X) and ``${X}`` are left out."""
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"][service]
    environment = {}
    for key, value in (spec.get("environment") or {}).items():
        value = str(value)
        if re.search(r"\$\{\w+(:\?[^}]*)?\}", value):
            continue  # required (compose refuses to start without it) or unset: not in the environment
        default = re.fullmatch(r"\$\{\w+:-(.*)\}", value)
        environment[key] = default.group(1) if default else value
    return environment


def test_check_deploy_with_the_compose_defaults_fails_until_a_secret_key_is_set(tmp_path):
    compose = compose_environment("web")
    assert "D0_SECRET_KEY" not in compose  # compose itself refuses to start without it
    env = {key: value for key, value in os.environ.items() if not key.startswith(("D0_", "DATABASE_URL",
                                                                                    "REDIS_URL"))}
    env.update(compose, D0_VAR_DIR=str(tmp_path), DATABASE_URL="")
    check = [sys.executable, "manage.py", "check", "--deploy"]
    refused = subprocess.run(check, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "d0.E001" in refused.stderr, refused.stdout + refused.stderr
    placeholder = subprocess.run(check, env={**env, "D0_SECRET_KEY": "change-me-to-a-long-random-string-please-xx"},
                                 cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert placeholder.returncode != 0 and "d0.E002" in placeholder.stderr
    accepted = subprocess.run(check, env={**env, "D0_SECRET_KEY": "Zq8" * 20}, cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr


def test_the_compose_migrate_step_makes_no_demo_user_unless_asked():
    migrate = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["migrate"]["command"][-1]
    assert "bootstrap_demo" in migrate and '"$$D0_DEMO" = 1' in migrate
    assert compose_environment("migrate")["D0_DEMO"] == "0"


def test_hsts_preload_is_only_sent_when_asked_for(tmp_path):
    code = "from django.conf import settings; print(settings.SECURE_HSTS_PRELOAD, settings.SECURE_HSTS_SECONDS)"
    env = {**os.environ, "D0_VAR_DIR": str(tmp_path), "D0_HSTS_SECONDS": "31536000", "DJANGO_SETTINGS_MODULE":
           "d0web.settings"}
    shell = [sys.executable, "-c", f"import django; django.setup(); {code}"]
    assert subprocess.run(shell, env=env, cwd=ROOT, capture_output=True, text=True).stdout.split() == [
        "False", "31536000"]
    asked = subprocess.run(shell, env={**env, "D0_HSTS_PRELOAD": "true"}, cwd=ROOT, capture_output=True, text=True)
    assert asked.stdout.split() == ["True", "31536000"]


def test_an_analysis_too_large_to_run_in_a_request_is_a_400_quickly(member_api, team):
    config = json.loads((ROOT / "adaptation/intake/catalog/configs/deepseek-v3.json").read_text())
    started = time.perf_counter()
    response = member_api.post("/api/models/", {"name": "huge", "config": {**config, "num_hidden_layers": 512,
                                                                           "n_routed_experts": 10_000}},
                               format="json")
    assert response.status_code == 400 and "expert MLPs; d0 analyses up to 262,144" in response.json()["config"][0]
    assert time.perf_counter() - started < 2


def test_two_instances_on_one_host_keep_their_own_gunicorn_control_socket():
    """Two real gunicorns with the production config and two var/ folders: each control socket lies under its own
    folder, and stopping one leaves the other's in place (with one shared default path, the second took it over and
    the first removed it on its way out)."""
    import signal

    from tests.harness import wait_for

    folders = [Path(tempfile.mkdtemp(prefix="d0-gu-")) for _ in range(2)]  # short: a socket path is <= 107 bytes
    servers = []
    try:
        for folder in folders:
            env = {**os.environ, "D0_VAR_DIR": str(folder), "XDG_RUNTIME_DIR": str(folders[0].parent)}
            servers.append(subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "d0web.wsgi", "--config", "d0web/gunicorn.conf.py", "--bind",
                 "127.0.0.1:0", "--workers", "1"], cwd=ROOT, env=env, start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=open(folder / "gunicorn.log", "wb")))
        sockets = [folder / "gunicorn.ctl" for folder in folders]
        wait_for(lambda: all(path.is_socket() for path in sockets), 60, "both control sockets")
        servers[0].send_signal(signal.SIGTERM)
        servers[0].wait(timeout=30)
        assert not sockets[0].exists() and sockets[1].is_socket()
    finally:
        for server in servers:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
