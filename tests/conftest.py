"""Fixtures: an owner (team admin), a member of the same team and an outsider from another team
(healthchecks' hc/test.py), with their API clients and a little data of the owner's team."""

import json
import os
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from adaptation.choices import TeamRole
from adaptation.models import AdaptationJob, Cluster, Device, Membership, ModelSpec, Node, StageRun, Team
from tests.engine.conftest import demo_checkpoint, vllm_python  # noqa: F401 (the fixtures, defined once for both trees)
from tests.harness import WorkerStack
from workers import protocol

# The real release configs d0 ships as its catalog; tests read them from there.
CONFIGS = Path(__file__).parent.parent / "adaptation" / "intake" / "catalog" / "configs"


def load_config(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Marks a test whose call failed (``item.d0_failed``): pytest does not raise a test's failure into its
    fixtures, so a fixture that prints worker logs for a failure must ask in its teardown."""
    report = yield
    if report.when == "call" and report.failed:
        item.d0_failed = True
    return report


def failed(request) -> bool:
    return getattr(request.node, "d0_failed", False)


def _user(username: str, team: Team, role: str):
    user = get_user_model().objects.create_user(username, password="a-long-test-password")
    Membership.objects.create(team=team, user=user, role=role)
    return user


@pytest.fixture
def team(db):
    return Team.objects.create(name="Alpha", slug="alpha")


@pytest.fixture
def other_team(db):
    return Team.objects.create(name="Beta", slug="beta")


@pytest.fixture
def owner(team):
    return _user("alice", team, TeamRole.ADMIN)


@pytest.fixture
def member(team):
    return _user("bob", team, TeamRole.MEMBER)


@pytest.fixture
def outsider(other_team):
    return _user("eve", other_team, TeamRole.ADMIN)


def _client(user=None):
    """An API client signed in as automation signs in, with the user's token: each request reads its user afresh,
    as in production (DRF's force_authenticate hands every request the same user object, on which what a request
    keeps, such as the user's team ids, would outlive the request)."""
    if user is None:
        return APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    return APIClient(HTTP_AUTHORIZATION=f"Token {token.key}")


@pytest.fixture
def anon_api():
    return _client()


@pytest.fixture
def owner_api(owner):
    return _client(owner)


@pytest.fixture
def member_api(member):
    return _client(member)


@pytest.fixture
def outsider_api(outsider):
    return _client(outsider)


@pytest.fixture
def cluster(team):
    return Cluster.objects.create(team=team, name="h100-pod", expected_devices_per_node=8)


@pytest.fixture
def node(cluster):
    from django.utils import timezone

    node = Node.objects.create(cluster=cluster, hostname="gpu-01", queue_name="d0.node.alpha.h100-pod.gpu-01",
                               last_heartbeat=timezone.now())
    Device.objects.create(node=node, index=0, kind="cpu", name="EPYC", memory_bytes=2**30)
    return node


@pytest.fixture
def model_spec(team, owner):
    return ModelSpec.objects.create(team=team, name="qwen3-0.6b", config=load_config("qwen3-0.6b.json"),
                                    created_by=owner)


@pytest.fixture
def job(cluster, owner, model_spec, node):
    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, model=model_spec, stages=["env_probe"],
                                       submitted_by=owner)
    StageRun.objects.create(job=job, kind="env_probe", node=node, node_name=node.hostname)
    return job


class SentTasks:
    """Records what the control plane would send to the broker: the one edge unit tests replace."""

    def __init__(self):
        self.sent = []
        self.revoked = []
        self.control = self

    def send_task(self, name, args=None, queue=None, task_id=None, **options):
        """``signed``: what a control-plane message's payload says (its ``args``: stage run id, kind, parameters)."""
        signed = json.loads(args[0]) if name == protocol.RUN_STAGE else None
        self.sent.append({"name": name, "args": args, "queue": queue, "task_id": task_id, "signed": signed})

    def broadcast(self, command, destination=None, arguments=None, **options):
        if command == "revoke":
            self.revoked.append((list(arguments["task_id"]), arguments["terminate"]))

    def names(self):
        return [task["name"] for task in self.sent]


@pytest.fixture
def broker(monkeypatch):
    from adaptation.jobs import services

    recorder = SentTasks()
    monkeypatch.setattr(services, "celery_app", lambda: recorder)
    return recorder


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # PBKDF2's deliberate slowness is a cost per user made; the tests make hundreds.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# --- real workers ---------------------------------------------------------------------------------------


def database_url() -> str:
    """The test database, as the worker processes must reach it."""
    db = connection.settings_dict
    credentials = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgresql://{credentials}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture
def stack(tmp_path, monkeypatch, settings, request):
    if connection.vendor != "postgresql" or not os.environ.get("REDIS_URL"):
        pytest.skip("needs DATABASE_URL (PostgreSQL) and REDIS_URL, as scripts/test.sh sets")
    stack = WorkerStack(tmp_path, database_url(), os.environ["REDIS_URL"],
                        D0_NODE_TIMEOUT=4, D0_LIVENESS_INTERVAL=1)
    # This process enqueues jobs too: it must use the stack's queue names.
    monkeypatch.setenv("D0_CONTROL_QUEUE", stack.control_queue)
    stack.start_control()
    try:
        yield stack
    finally:
        if failed(request):
            print(stack.logs())
        stack.stop_all()


def node_online(hostname):
    return lambda: Node.objects.filter(hostname=hostname, status="online").first()


def job_status(job_id, *statuses):
    return lambda: AdaptationJob.objects.filter(pk=job_id, status__in=statuses).first()


@pytest.fixture
def node_in_process(tmp_path, monkeypatch):
    """The node worker's ``run_stage`` run in this process: a node key and a control key it trusts, its reports
    collected as (task, signed payload) in ``sent`` instead of sent. Set ``node.run_engine_stage`` to the stage."""
    from types import SimpleNamespace

    from workers import control_trust, node, outbox, signing

    sent = []
    node_key, control_key = signing.NodeKey.generate(), signing.ControlKey.generate()
    monkeypatch.setattr(node, "identity", node.Identity(key=node_key, outbox=outbox.Outbox(tmp_path / "outbox")))
    monkeypatch.setattr(control_trust, "trust", control_trust.ControlTrust(control_key.public_key, node_key.key_id))
    monkeypatch.setattr(node, "_sender", lambda *args, **kwargs: lambda task, message: sent.append(
        (task, json.loads(message[1]))))
    return SimpleNamespace(node=node, sent=sent, node_key=node_key, control_key=control_key)
