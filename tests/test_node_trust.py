"""Node trust against real workers on Redis: an attacker with nothing but the broker URL (a plain Celery client
calling ``send_task`` with the names in workers/protocol.py) replays each attack, and each fails: it is dropped,
counted on the cluster and never applied. The legitimate flow (join with a token, restart, run a job, cancel it)
still works."""

import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from celery import Celery
from django.test import Client
from django.utils import timezone

from adaptation import control_messages
from adaptation.clusters import trust
from adaptation.models import AdaptationJob, JoinToken, Node, RejectedNodeMessage, StageRun
from tests.harness import join_token, wait_for
from tests.conftest import job_status, node_online
from workers import broker_credentials, protocol, signing
from workers.engine.sharding.launcher import free_port

pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def rogue(stack):
    """A plain Celery client on the same broker, sending to the stack's control queue."""
    app = Celery("rogue", broker=os.environ["REDIS_URL"], fixups=[])
    app.conf.update(task_serializer="json", accept_content=["json"])

    def send(task, args):
        app.send_task(task, args=args, queue=stack.control_queue)

    send.app = app
    yield send
    app.close()


def registration(key, cluster_ref, hostname, token="", ts=None):
    """What a node worker sends to join (workers/node.py), made by hand."""
    payload = signing.encode_payload({"task": protocol.REGISTER_NODE, "ts": ts or time.time(), "cluster": cluster_ref,
                                      "hostname": hostname, "public_key": key.public_key,
                                      "host_facts": {"cpu_model": "rogue"}, "devices": [{"kind": "cpu", "index": 0}]})
    token_id = proof = ""
    if token:
        token_id, secret = signing.split_join_token(token)
        proof = signing.token_proof(token_id, secret, payload)
    return [payload, key.sign(payload), token_id, proof]


def rejected(reason, **filters):
    return lambda: RejectedNodeMessage.objects.filter(reason=reason, **filters).first()


def joined_rogue(rogue, cluster_ref="alpha/h100-pod", hostname="rogue-b"):
    """A node the attacker joined legitimately (a machine of the team that was compromised): its key is real."""
    key = signing.NodeKey.generate()
    rogue(protocol.REGISTER_NODE, registration(key, cluster_ref, hostname, join_token(cluster_ref)))
    wait_for(node_online(hostname), 30, "the rogue's own node to register")
    return key


def test_a_node_without_a_join_token_cannot_join(stack, cluster, rogue):
    rogue(protocol.REGISTER_NODE, registration(signing.NodeKey.generate(), "alpha/h100-pod", "intruder"))
    row = wait_for(rejected("new node without a join token"), 30, "the registration to be dropped")
    assert row.cluster == cluster and "intruder" in row.detail
    assert not Node.objects.filter(hostname="intruder").exists()
    # The old, unsigned registration (cluster, hostname, queue, facts, devices) is dropped too.
    rogue(protocol.REGISTER_NODE, ["alpha/h100-pod", "intruder", "d0.node.x", {}, []])
    wait_for(rejected("not a signed registration (an old or foreign node worker?)"), 30, "the old form to be dropped")
    assert not Node.objects.filter(hostname="intruder").exists()


def test_a_token_of_one_cluster_does_not_join_another_teams_cluster(stack, cluster, other_team, rogue):
    theirs = other_team.clusters.create(name="mi300-pod")
    rogue(protocol.REGISTER_NODE, registration(signing.NodeKey.generate(), "beta/mi300-pod", "intruder",
                                               join_token("alpha/h100-pod")))
    row = wait_for(rejected("join token of another cluster"), 30, "the registration to be dropped")
    assert row.cluster == theirs
    # A made-up token, and a revoked one of the right cluster, fare no better.
    rogue(protocol.REGISTER_NODE, registration(signing.NodeKey.generate(), "beta/mi300-pod", "intruder",
                                               "abcd1234." + "0" * 32))
    wait_for(rejected("join token unknown or its proof is wrong"), 30, "the made-up token to be refused")
    revoked = join_token("beta/mi300-pod")
    trust.revoke_join_token(JoinToken.objects.get(token_id=revoked.split(".")[0]))
    rogue(protocol.REGISTER_NODE, registration(signing.NodeKey.generate(), "beta/mi300-pod", "intruder", revoked))
    wait_for(rejected("join token revoked or expired"), 30, "the revoked token to be refused")
    assert not theirs.nodes.exists()


def test_a_registered_hostname_cannot_be_taken_over_even_with_a_valid_token(stack, cluster, rogue):
    stack.start_node("alpha/h100-pod", "worker-a")
    node = wait_for(node_online("worker-a"), 60, "the node to join")
    rogue(protocol.REGISTER_NODE, registration(signing.NodeKey.generate(), "alpha/h100-pod", "worker-a",
                                               join_token("alpha/h100-pod")))
    wait_for(rejected("hostname already registered with another key"), 30, "the takeover to be dropped")
    after = Node.objects.get(pk=node.pk)
    assert (after.key_id, after.queue_name, after.host_facts) == (node.key_id, node.queue_name, node.host_facts)
    assert after.host_facts.get("cpu_model") != "rogue"


def test_stage_reports_are_applied_only_from_the_node_the_stage_was_assigned_to(stack, cluster, owner, rogue):
    # No worker runs for the victim; its heartbeat is set ahead so the liveness sweep leaves its stage alone.
    victim = Node.objects.create(cluster=cluster, hostname="victim", queue_name=f"{stack.prefix}.victim",
                                 last_heartbeat=timezone.now() + timezone.timedelta(hours=1))
    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, stages=["env_check"], submitted_by=owner,
                                       status="running", started=timezone.now())
    run = StageRun.objects.create(job=job, kind="env_check", node=victim, node_name="victim", status="running",
                                  started=timezone.now())
    # Unsigned, in the old form.
    rogue(protocol.STAGE_FINISHED, [run.pk, False, None, "forged failure", ""])
    wait_for(rejected("not a signed message (an old or foreign node worker?)"), 30, "the unsigned report to drop")
    # Signed by a key no node has.
    stranger = signing.NodeKey.generate()
    rogue(protocol.STAGE_FINISHED, stranger.message(protocol.STAGE_FINISHED, [run.pk, False, None, "forged", ""]))
    wait_for(rejected("signed by a key no node is registered with"), 30, "the stranger's report to drop")
    # Signed by a real node of the same cluster, about a stage run of another node.
    key = joined_rogue(rogue)
    forged_result = {"verdict": "pass", "measurements": {"per_device": []}, "links": []}
    rogue(protocol.STAGE_STARTED, key.message(protocol.STAGE_STARTED, [run.pk]))
    rogue(protocol.STAGE_PROGRESS, key.message(protocol.STAGE_PROGRESS, [run.pk, 0.99, "forged"]))
    rogue(protocol.STAGE_FINISHED, key.message(protocol.STAGE_FINISHED, [run.pk, True, forged_result, "", ""]))
    row = wait_for(lambda: RejectedNodeMessage.objects.filter(reason="stage run not assigned to the sender",
                                                              task=protocol.STAGE_FINISHED).first(),
                   30, "the forged reports to drop")
    assert row.cluster == cluster and "rogue-b" in row.detail
    for task in (protocol.STAGE_STARTED, protocol.STAGE_PROGRESS):
        assert RejectedNodeMessage.objects.filter(reason="stage run not assigned to the sender", task=task).exists()
    # A real node's signature over one payload does not carry over to another.
    key_id, payload, signature = key.message(protocol.STAGE_FINISHED, [run.pk, False, None, "x", ""])
    rogue(protocol.STAGE_FINISHED, [key_id, payload.replace('"x"', '"forged"'), signature])
    wait_for(rejected("bad signature"), 30, "the tampered report to drop")
    run.refresh_from_db()
    job.refresh_from_db()
    assert (run.status, run.progress, run.error, job.status) == ("running", 0.0, "", "running")
    assert not job.env_reports.exists()


def test_forged_heartbeats_and_leaves_are_not_applied(stack, cluster, rogue):
    stack.start_node("alpha/h100-pod", "worker-a", heartbeat=0.5)
    node = wait_for(node_online("worker-a"), 60, "the node to join")
    rogue(protocol.NODE_LEAVING, [node.queue_name])  # the old form: any queue name
    wait_for(rejected("not a signed message (an old or foreign node worker?)", task=protocol.NODE_LEAVING), 30,
             "the forged leave to drop")
    assert Node.objects.get(pk=node.pk).status == "online"

    # A node the attacker controls can keep only itself alive, and a replayed heartbeat keeps nothing alive.
    key = joined_rogue(rogue)
    rogue_node = Node.objects.get(hostname="rogue-b")
    heartbeat = key.message(protocol.NODE_HEARTBEAT, [])
    Node.objects.filter(pk=rogue_node.pk).update(status="offline")
    rogue(protocol.NODE_HEARTBEAT, heartbeat)  # accepted once
    wait_for(node_online("rogue-b"), 30, "the rogue's own heartbeat")
    beat = Node.objects.get(pk=rogue_node.pk).last_heartbeat
    Node.objects.filter(pk=rogue_node.pk).update(status="offline")
    rogue(protocol.NODE_HEARTBEAT, heartbeat)  # replayed
    hour_old = signing.encode_payload({"task": protocol.NODE_HEARTBEAT, "ts": time.time() - 3600, "args": []})
    rogue(protocol.NODE_HEARTBEAT, [key.key_id, hour_old, key.sign(hour_old)])
    wait_for(rejected("replayed (older than the newest message accepted)"), 30, "the hour-old heartbeat to drop")
    time.sleep(1)  # the replay, sent first, has been handled by now
    assert Node.objects.get(pk=rogue_node.pk).last_heartbeat == beat
    assert Node.objects.get(pk=node.pk).status == "online"


def test_a_node_worker_ignores_remote_shutdown_and_inspection(stack, cluster, member_api, rogue):
    stack.start_node("alpha/h100-pod", "worker-a")
    node = wait_for(node_online("worker-a"), 60, "the node to join")
    worker_name = f"{node.queue_name}@worker-a"
    rogue.app.control.broadcast("shutdown", destination=[worker_name])
    rogue.app.control.broadcast("shutdown")
    replies = rogue.app.control.ping(timeout=1.0) or []
    inspected = rogue.app.control.inspect(timeout=1.0).active_queues() or {}
    assert not [name for reply in replies for name in reply if name.startswith("d0.node.")]
    assert not [name for name in inspected if name.startswith("d0.node.")]
    time.sleep(2)
    assert stack.running["node-worker-a"].poll() is None, "the node worker obeyed a remote shutdown"
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"]}, format="json")
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 60, "a job on the node")
    assert job.status == "succeeded", job.error


def test_the_legitimate_flow_joins_once_restarts_without_a_token_and_cancel_stops_running_work(
        stack, cluster, member_api):
    token = join_token("alpha/h100-pod")
    stack.start_node("alpha/h100-pod", "worker-a", token=token)
    node = wait_for(node_online("worker-a"), 60, "the node to join")
    assert node.key_id and JoinToken.objects.get(token_id=token.split(".")[0]).uses == 1
    stack.kill("node-worker-a")
    Node.objects.filter(pk=node.pk).update(status="offline")
    stack.start_node("alpha/h100-pod", "worker-a", token="")  # its key is its credential now
    wait_for(node_online("worker-a"), 60, "the node to come back without a token")
    assert Node.objects.get(pk=node.pk).key_id == node.key_id

    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_check"],
                                              "parameters": {"env_check": {"measure_seconds": 20}}}, format="json")
    assert response.status_code == 201, response.json()
    long_job = response.json()["id"]
    wait_for(lambda: StageRun.objects.filter(job_id=long_job, status="running").first(), 60, "the stage to run")
    cancelled = member_api.post(f"/api/jobs/{long_job}/cancel/")
    assert cancelled.json()["status"] == "cancelled"
    # The revoke reached the node (its mailbox answers revoke) and freed its only slot for the next job.
    started = time.monotonic()
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"]}, format="json")
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 60, "the next job on the node")
    assert job.status == "succeeded", job.error
    assert time.monotonic() - started < 30
    assert not list(RejectedNodeMessage.objects.values("task", "reason", "detail"))


def compose_redis_acl(control_password: str) -> list[str]:
    """The Redis users docker-compose.yml starts Redis with, the control plane's password filled in."""
    import yaml

    command = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["redis"]["command"]
    arguments = command[command.index("--user"):]
    return [argument.replace("${D0_REDIS_CONTROL_PASSWORD:?set D0_REDIS_CONTROL_PASSWORD}", control_password)
            for argument in arguments]


@pytest.fixture
def acl_broker(tmp_path, settings, monkeypatch):
    """A Redis of this test's own, started with docker-compose.yml's users (no anonymous access, the control plane's
    user may do anything): ACL users are server-wide, so the shared test Redis would mix them with other runs'.
    This process (the web tier) makes join tokens and sends stage messages through it, as the control user."""
    import shutil

    import redis
    from celery import Celery as CeleryApp

    from adaptation.jobs import services as job_services
    from d0web import embedded_broker
    from tests.harness import Processes

    port, data = free_port(), tmp_path / "redis-data"
    data.mkdir()
    server = Processes(tmp_path)
    # The append-only file on, each write fsynced: what a broker keeps on disk is scanned too.
    server.start("redis", [shutil.which("redis-server") or str(embedded_broker.server_binary()), "--port", str(port),
                           "--bind", "127.0.0.1", "--save", "", "--dir", str(data), "--appendonly", "yes",
                           "--appendfsync", "always", *compose_redis_acl("control-secret")], dict(os.environ))
    control = redis.Redis(port=port, username="control", password="control-secret")
    wait_for(lambda: _answers(control), 30, "redis to start")
    control_url = f"redis://control:control-secret@127.0.0.1:{port}/0"
    settings.D0_BROKER_URL = settings.CELERY_BROKER_URL = control_url
    web = CeleryApp("web", fixups=[])
    web.config_from_object("django.conf:settings", namespace="CELERY")
    monkeypatch.setattr(job_services, "celery_app", lambda: web)

    def as_user(user, password):
        return redis.Redis(port=port, username=user, password=password)

    try:
        yield SimpleNamespace(port=port, control=control, control_url=control_url, as_user=as_user, data=data,
                              url=f"redis://127.0.0.1:{port}/0")  # what a node is given: no user, no password
    finally:
        web.close()
        server.stop_all()


def _answers(client) -> bool:
    try:
        return client.ping()
    except Exception:  # noqa: BLE001 - starting
        return False


@pytest.fixture
def acl_stack(acl_broker, tmp_path, monkeypatch, request):
    """The control worker (as the compose file's control user) and nodes given only the broker's address."""
    from tests.conftest import database_url, failed
    from tests.harness import WorkerStack

    folder = tmp_path / "stack"
    folder.mkdir()
    stack = WorkerStack(folder, database_url(), acl_broker.control_url, acl_broker.url, D0_NODE_TIMEOUT=4,
                        D0_LIVENESS_INTERVAL=1, D0_BROKER_USERS_SYNC_INTERVAL=1)
    monkeypatch.setenv("D0_CONTROL_QUEUE", stack.control_queue)
    stack.start_control()
    try:
        yield stack
    finally:
        if failed(request):
            print(stack.logs())
        stack.stop_all()


def broker_users_of(acl_broker) -> set[str]:
    return {name.decode() for name in acl_broker.control.execute_command("ACL", "USERS")}


def node_broker_login(stack, node) -> tuple[str, str]:
    """The broker user and password a node worker made for itself (its state folder)."""
    password = (stack.log_dir / "node-keys" / f"{node.queue_name}.broker-password").read_text()
    return broker_credentials.node_user(node.key_id), password


def refusals(acl_broker) -> list[dict]:
    """What the broker refused a node or join user (ACL LOG), other than a login before the user was made."""
    prefixes = (broker_credentials.NODE_USER_PREFIX, broker_credentials.JOIN_USER_PREFIX)
    return [{key: _text(value) for key, value in entry.items()} for entry in acl_broker.control.acl_log()
            if _text(entry["reason"]) != "auth" and _text(entry["username"]).startswith(prefixes)]


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def test_with_per_node_broker_users_a_node_joins_runs_and_is_cancelled_and_is_never_refused(
        acl_broker, acl_stack, cluster, member_api):
    token = join_token("alpha/h100-pod")
    token_id = token.split(".")[0]
    assert broker_credentials.join_user(token_id) in broker_users_of(acl_broker)
    acl_stack.start_node("alpha/h100-pod", "worker-a", token=token)
    node = wait_for(node_online("worker-a"), 60, "the node to join through its token's broker user")
    user, password = node_broker_login(acl_stack, node)
    # The user is made once the registration commits (broker_users.node_registered, on commit), just after the row
    # reads online: a loaded machine can look in between.
    wait_for(lambda: user in broker_users_of(acl_broker), 10, "the node's broker user")
    assert (acl_stack.log_dir / "node-keys" / f"{node.queue_name}.broker-password").stat().st_mode & 0o777 == 0o600
    assert broker_credentials.password_sha256(password) == Node.objects.get(pk=node.pk).broker_password_sha256
    # The broker keeps only the hash of the node's password.
    assert password.encode() not in b"".join(acl_broker.control.execute_command("ACL", "LIST"))

    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_check"],
                                              "parameters": {"env_check": {"measure_seconds": 20}}}, format="json")
    long_job = response.json()["id"]
    wait_for(lambda: StageRun.objects.filter(job_id=long_job, status="running").first(), 60, "the stage to run")
    assert member_api.post(f"/api/jobs/{long_job}/cancel/").json()["status"] == "cancelled"
    started = time.monotonic()  # the revoke reached the node (it listens on remote control) and freed its slot
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"]}, format="json")
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 60, "the next job on the node")
    assert job.status == "succeeded", job.error
    assert time.monotonic() - started < 30

    # A restart needs no token: the node's own user is its way in.
    acl_stack.kill("node-worker-a")
    Node.objects.filter(pk=node.pk).update(status="offline")
    acl_stack.start_node("alpha/h100-pod", "worker-a", token="")
    wait_for(node_online("worker-a"), 60, "the node to come back as its own broker user")
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"]}, format="json")
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 60, "a job after the restart")
    assert job.status == "succeeded", job.error
    # Nothing the node worker (kombu, Celery) did in all that was refused by its rules.
    assert refusals(acl_broker) == []
    assert not list(RejectedNodeMessage.objects.values("task", "reason", "detail"))

    # The users go with what they belong to: a revoked token, a deleted node.
    trust.revoke_join_token(JoinToken.objects.get(token_id=token_id))
    Node.objects.get(pk=node.pk).delete()
    assert not {broker_credentials.join_user(token_id), user} & broker_users_of(acl_broker)


def test_a_node_broker_user_reaches_its_own_queue_and_nothing_of_the_control_plane_or_another_team(
        acl_broker, acl_stack, cluster, other_team, member_api):
    from redis.exceptions import NoPermissionError

    other_team.clusters.create(name="mi300-pod")
    acl_stack.start_node("alpha/h100-pod", "worker-a")
    acl_stack.start_node("beta/mi300-pod", "worker-b")
    victim = wait_for(node_online("worker-a"), 60, "team alpha's node")
    attacker = wait_for(node_online("worker-b"), 60, "team beta's node")
    mallory = acl_broker.as_user(*node_broker_login(acl_stack, attacker))
    assert mallory.llen(attacker.queue_name) == 0  # its own queue: its login works

    # The victim runs a stage: its message waits in the victim's own unacked hash while it runs.
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_check"],
                                              "parameters": {"env_check": {"measure_seconds": 20}}}, format="json")
    job = response.json()["id"]
    wait_for(lambda: StageRun.objects.filter(job_id=job, status="running").first(), 60, "the victim's stage to run")
    unacked = broker_credentials.unacked_keys(victim.queue_name)
    assert acl_broker.control.hlen(unacked["unacked_key"]) == 1

    control, heartbeat = acl_stack.control_queue, f"{acl_stack.control_queue}.heartbeat"
    forbidden = {
        "read the control queue": lambda: mallory.lrange(control, 0, -1),
        "pop the control queue": lambda: mallory.rpop(control),
        "pop the heartbeat queue": lambda: mallory.brpop([heartbeat], timeout=1),
        "read the heartbeat queue": lambda: mallory.lrange(heartbeat, 0, -1),
        "read another team's queue": lambda: mallory.lrange(victim.queue_name, 0, -1),
        "pop another team's queue": lambda: mallory.brpop([victim.queue_name], timeout=1),
        "push onto another team's queue": lambda: mallory.lpush(victim.queue_name, "{}"),
        "read another node's unacked messages": lambda: mallory.hgetall(unacked["unacked_key"]),
        "list another node's unacked tags": lambda: mallory.zrange(unacked["unacked_index_key"], 0, -1),
        "read the control plane's unacked messages": lambda: mallory.hgetall(f"{control}.unacked"),
        "scan the broker": lambda: mallory.scan(0),
        "list the keys": lambda: mallory.keys("*"),
        "publish a remote-control command": lambda: mallory.publish("/0.celery.pidbox", "{}"),
        "bind another queue to the control exchange": lambda: mallory.sadd(f"_kombu.binding.{control}", "x"),
        "read who listens on remote control": lambda: mallory.smembers("_kombu.binding.celery.pidbox"),
        "run a script of its own": lambda: mallory.eval("return 1", 0),
        "load a script": lambda: mallory.script_load("return 1"),
        "wipe the broker": lambda: mallory.flushall(),
        "read the configuration": lambda: mallory.config_get("*"),
        "list the users": lambda: mallory.execute_command("ACL", "LIST"),
    }
    allowed = []
    for what, attempt in forbidden.items():
        try:
            attempt()
        except NoPermissionError:
            continue
        allowed.append(what)
    assert allowed == []
    # A rogue run_stage through Celery, as the attacker's user, is refused by the broker, not delivered.
    rogue = Celery("rogue", broker=acl_broker.url.replace("redis://", "redis://{}:{}@".format(
        *node_broker_login(acl_stack, attacker))), fixups=[])
    rogue.conf.broker_transport_options = {"max_retries": 0}
    with pytest.raises(Exception, match="(?i)no permissions|NOPERM"):
        rogue.send_task(protocol.RUN_STAGE, args=[1, "env_probe", {}], queue=victim.queue_name, declare=[],
                        retry=False)
    rogue.close()
    assert acl_broker.control.llen(victim.queue_name) == 0
    assert acl_broker.control.hlen(unacked["unacked_key"]) == 1  # the victim's message is still its own

    # A join token's user may push the registration, and read nothing.
    token = join_token("beta/mi300-pod")
    joiner = acl_broker.as_user(broker_credentials.join_user(token.split(".")[0]), token.split(".")[1])
    assert joiner.lpush(control, "{}") >= 1
    acl_broker.control.lpop(control)
    for attempt in (lambda: joiner.lrange(control, 0, -1), lambda: joiner.rpop(control),
                    lambda: joiner.lpush(victim.queue_name, "{}"), lambda: joiner.scan(0)):
        with pytest.raises(NoPermissionError):
            attempt()
    member_api.post(f"/api/jobs/{job}/cancel/")


def test_the_control_plane_makes_again_the_broker_users_the_broker_lost_and_ends_expired_tokens(
        acl_broker, acl_stack, cluster, member_api):
    acl_stack.start_node("alpha/h100-pod", "worker-a")
    node = wait_for(node_online("worker-a"), 60, "the node to join")
    user, _ = node_broker_login(acl_stack, node)
    expiring = join_token("alpha/h100-pod").split(".")[0]
    # A broker restart forgets users made with ACL SETUSER, and its scripts.
    acl_broker.control.execute_command("ACL", "DELUSER", user)
    acl_broker.control.script_flush()
    JoinToken.objects.filter(token_id=expiring).update(expires=timezone.now())
    wait_for(lambda: user in broker_users_of(acl_broker), 30, "the node's user to be made again")
    wait_for(lambda: broker_credentials.join_user(expiring) not in broker_users_of(acl_broker), 30,
             "the expired token's user to go")
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"]}, format="json")
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 60, "a job on the node")
    assert job.status == "succeeded", job.error


def test_per_node_broker_users_stay_off_on_a_broker_open_to_anyone(settings):
    from adaptation.clusters import broker_users

    if not os.environ.get("REDIS_URL"):
        pytest.skip("needs REDIS_URL")
    settings.D0_BROKER_URL = settings.CELERY_BROKER_URL = os.environ["REDIS_URL"]  # the test Redis: no password
    settings.D0_BROKER_NODE_USERS = "auto"
    assert broker_users.enabled() is False
    settings.D0_BROKER_NODE_USERS = "off"
    assert broker_users.enabled() is False


def test_a_team_admin_makes_a_join_token_on_the_cluster_page_and_sees_the_command_once(owner, member, cluster):
    client = Client()
    client.force_login(owner)
    page = client.post(f"/clusters/{cluster.pk}/join-tokens/", {"hours": 2, "description": "rack 4"})
    assert page.status_code == 200 and page["Cache-Control"] == "no-store"
    token = JoinToken.objects.get()
    command = re.search(r'<pre class="command" id="join-command">D0_JOIN_TOKEN=(\S+) \\', page.content.decode())
    whole = command.group(1)
    assert whole.startswith(f"{token.token_id}.")
    assert token.verify_key == signing.token_verify_key(token.token_id, whole.split(".")[1])
    assert f"--control-key {control_messages.public_key()}" in page.content.decode()
    assert "--cluster alpha/h100-pod" in page.content.decode()
    again = client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert token.token_id in again and whole not in again  # listed, never shown again
    assert client.post(f"/clusters/{cluster.pk}/join-tokens/{token.pk}/revoke/").status_code == 302
    assert JoinToken.objects.get().revoked is not None
    plain = Client()
    plain.force_login(member)
    assert plain.post(f"/clusters/{cluster.pk}/join-tokens/", {"hours": 2}).status_code == 403
    assert "A team admin makes join tokens" in plain.get(f"/clusters/{cluster.pk}/").content.decode()


def test_join_tokens_through_the_api(owner_api, member_api, outsider_api, cluster):
    made = owner_api.post("/api/join-tokens/", {"cluster": cluster.pk, "hours": 1}, format="json")
    assert made.status_code == 201 and made["Cache-Control"] == "no-store"
    body = made.json()
    assert body["token"].startswith(body["token_id"] + ".") and "--cluster alpha/h100-pod" in body["join_command"]
    listed = member_api.get("/api/join-tokens/").json()["results"]
    assert [row["token_id"] for row in listed] == [body["token_id"]] and listed[0].get("token") is None
    assert member_api.post("/api/join-tokens/", {"cluster": cluster.pk}, format="json").status_code == 403
    assert member_api.post(f"/api/join-tokens/{body['id']}/revoke/").status_code == 403
    assert outsider_api.post(f"/api/join-tokens/{body['id']}/revoke/").status_code == 404
    assert outsider_api.post("/api/join-tokens/", {"cluster": cluster.pk}, format="json").status_code == 400
    revoked = owner_api.post(f"/api/join-tokens/{body['id']}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["revoked"]


# --- control -> node: stage messages and cancels signed by the control plane, secrets sealed to the node ---------


def queued_run(cluster, owner, node, kind="env_probe"):
    """A stage run assigned to ``node`` whose message the control plane has not sent."""
    import uuid

    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, stages=[kind], submitted_by=owner,
                                       status="running", started=timezone.now())
    return StageRun.objects.create(job=job, kind=kind, node=node, node_name=node.hostname, status="queued",
                                   celery_task_id=str(uuid.uuid4()))


def test_a_stage_message_the_control_plane_did_not_sign_for_the_node_is_not_run_nor_reported(stack, cluster, owner,
                                                                                              member_api, rogue):
    """A broker-only client pushes run_stage messages straight into a node's queue: the old unsigned form, one
    signed by a (real) node's key, a real control-plane message for another node, and a real one for this node
    copied under another task id. None runs, nothing is reported; the node goes on with real work."""
    stack.start_node("alpha/h100-pod", "worker-a")
    node = wait_for(node_online("worker-a"), 60, "the node to join")
    other = Node(cluster=cluster, hostname="worker-b", queue_name="d0.node.alpha.h100-pod.worker-b",
                 key_id=signing.NodeKey.generate().key_id)
    run = queued_run(cluster, owner, node)
    node_key = joined_rogue(rogue)
    real_for_other = control_messages.stage_message(run.pk, "env_probe", {}, other, run.celery_task_id)
    real_for_node = control_messages.stage_message(run.pk, "env_probe", {}, node, run.celery_task_id)
    forged_payload = signing.encode_payload({"task": protocol.RUN_STAGE, "node": node.key_id, "ts": time.time(),
                                             "expires": time.time() + 600, "id": "rogue-2",
                                             "args": [run.pk, "env_probe", {}]})
    pushed = {"rogue-1": [run.pk, "env_probe", {}],  # the old, unsigned form
              "rogue-2": [forged_payload, node_key.sign(forged_payload)],  # signed by a node's key
              run.celery_task_id: real_for_other,  # the control plane's, for another node
              "rogue-4": real_for_node}  # the control plane's, for this node, under another task id
    for task_id, args in pushed.items():
        rogue.app.send_task(protocol.RUN_STAGE, args=args, queue=node.queue_name, task_id=task_id)
    log = lambda: stack.log("node-worker-a")  # noqa: E731
    wait_for(lambda: log().count("refused a stage message") == 4, 30, "the node to refuse all four")
    assert "signed for another node" in log() and "bad signature" in log()
    assert "delivered as task rogue-4" in log()
    time.sleep(1)  # a report would have reached the control worker by now
    run.refresh_from_db()
    assert (run.status, run.progress, run.started) == ("queued", 0.0, None)
    assert not RejectedNodeMessage.objects.filter(task__startswith="d0.control.stage").exists()
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"],
                                              "parameters": {"nodes": ["worker-a"]}}, format="json")
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 60, "a real job on the node")
    assert job.status == "succeeded", job.error


def test_a_forged_revoke_does_not_stop_a_running_stage_and_the_control_planes_cancel_does(stack, cluster,
                                                                                        member_api, rogue):
    stack.start_node("alpha/h100-pod", "worker-a")
    node = wait_for(node_online("worker-a"), 60, "the node to join")
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_check"],
                                              "parameters": {"env_check": {"measure_seconds": 20}}}, format="json")
    long_job = response.json()["id"]
    run = wait_for(lambda: StageRun.objects.filter(job_id=long_job, status="running").first(), 60, "the stage")
    task_id, worker = run.celery_task_id, protocol.node_worker_name(node.queue_name, node.hostname)
    other = Node(cluster=cluster, hostname="worker-b", queue_name="d0.node.alpha.h100-pod.worker-b",
                 key_id=signing.NodeKey.generate().key_id)
    node_key = joined_rogue(rogue)
    forged = signing.encode_payload({"task": protocol.CANCEL_STAGE, "node": node.key_id, "ts": time.time(),
                                     "expires": time.time() + 600, "args": [[task_id], True, "SIGTERM"]})
    for_another_node = control_messages.revoke(other, [task_id])["arguments"]
    for_another_task = control_messages.revoke(node, ["some-other-task"])["arguments"]
    rogue.app.control.revoke(task_id, terminate=True)  # Celery's own, unsigned, to every worker
    for arguments in ({"terminate": True, "signal": "SIGTERM",
                       protocol.SIGNED_ARGUMENT: [forged, node_key.sign(forged)]},
                      for_another_node, {**for_another_task, "task_id": [task_id]}):
        rogue.app.control.broadcast("revoke", destination=[worker],
                                    arguments={**arguments, "task_id": [task_id]})
    log = lambda: stack.log("node-worker-a")  # noqa: E731
    wait_for(lambda: log().count("refused a revoke") == 4, 30, "the node to refuse all four revokes")
    assert "Terminating" not in log()
    assert StageRun.objects.get(pk=run.pk).status == "running"

    assert member_api.post(f"/api/jobs/{long_job}/cancel/").json()["status"] == "cancelled"
    wait_for(lambda: f"Terminating {task_id}" in log(), 30, "the control plane's cancel to stop the stage")
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"],
                                              "parameters": {"nodes": ["worker-a"]}}, format="json")
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 30, "the next job on the freed slot")
    assert job.status == "succeeded", job.error


class FakeEndpoint:
    """An OpenAI-compatible streaming completions server (just enough for d0's load client) that wants one bearer
    key and remembers the Authorization headers it was sent."""

    def __init__(self, key: str):
        import http.server
        import json
        import threading

        seen = self.authorizations = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") != f"Bearer {key}":
                    self.send_response(401)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                tokens = body["max_tokens"]
                for _ in range(tokens):
                    self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
                usage = {"choices": [], "usage": {"completion_tokens": tokens}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def everything_in(redis_url: str) -> bytes:
    """Every value the broker holds: each key's name and contents, whatever its type (the node queues, Celery's
    unacked hash and index, the bindings)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    held = []
    for name in client.scan_iter(count=1000):
        kind = client.type(name).decode()
        held.append(name)
        if kind == "string":
            held.append(client.get(name) or b"")
        elif kind == "list":
            held.extend(client.lrange(name, 0, -1))
        elif kind == "hash":
            for field, value in client.hgetall(name).items():
                held.extend((field, value))
        elif kind == "set":
            held.extend(client.smembers(name))
        elif kind == "zset":
            held.extend(client.zrange(name, 0, -1))
    client.close()
    return b"\n".join(held)


def message_bodies(raw: bytes) -> list[bytes]:
    """Every Celery message body in ``raw``, decoded: kombu's Redis transport keeps bodies in base64 (the headers,
    argsrepr among them, are plain JSON)."""
    import base64
    import re

    return [base64.b64decode(body) for body in re.findall(rb'"body": ?"([A-Za-z0-9+/=]+)"', raw)]


def test_an_endpoint_benchmark_leaves_its_key_nowhere_on_the_broker(acl_broker, acl_stack, cluster, member_api,
                                                                     model_spec):
    """On a Redis with the compose file's users and its append-only file on (every write, fsynced): the benchmark
    runs through real workers, the node as its own broker user, with the endpoint's stored key, which reaches the
    endpoint; the queues, the unacked data, every other key and the append-only file hold no trace of it, nor do
    the workers' logs."""
    secret = "sk-d0-sealed-9d41c7e0b2"
    endpoint = FakeEndpoint(secret)
    try:
        # The fake endpoint listens on loopback, which a node reaches only when its operator lists it.
        acl_stack.start_node("alpha/h100-pod", "bench-node", extra=("--endpoint-allow", "127.0.0.1"))
        wait_for(node_online("bench-node"), 60, "the node to join")
        created = member_api.post("/api/serving-endpoints/", {"name": "theirs", "base_url": endpoint.base_url,
                                                              "served_model": "d0", "api_key": secret}, format="json")
        assert created.status_code == 201, created.json()
        response = member_api.post("/api/jobs/", {
            "cluster": cluster.pk, "model": model_spec.pk, "stages": ["endpoint_bench"],
            "parameters": {"endpoint_bench": {"endpoint": created.json()["id"], "concurrency": [1],
                                              "workload": {"requests": 2, "prompt_len": 4, "output_len": 4}}}},
            format="json")
        assert response.status_code == 201, response.json()
        job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 120, "the benchmark")
        assert job.status == "succeeded", job.error
        assert endpoint.authorizations and set(endpoint.authorizations) == {f"Bearer {secret}"}
        held = everything_in(acl_broker.control_url)
        assert b"bench-node" in held  # the scan sees the node's queue and bindings
        assert secret.encode() not in held and not [body for body in message_bodies(held) if secret.encode() in body]
        appended = b"".join(path.read_bytes() for path in acl_broker.data.rglob("*") if path.is_file())
        bodies = message_bodies(appended)
        assert [body for body in bodies if b"d0.node.run_stage" in body and b"sealed" in body]  # the stage's message
        assert secret.encode() not in appended and not [body for body in bodies if secret.encode() in body]
        assert secret not in acl_stack.logs()
        assert refusals(acl_broker) == []
    finally:
        endpoint.close()


# --- registrations: too old, a deleted node's, a proof from what the control plane stores ------------------------


def test_a_registration_sent_long_ago_is_refused_even_with_a_valid_token(stack, cluster, rogue, settings):
    sent = time.time() - 2 * settings.D0_NODE_MESSAGE_MAX_AGE
    rogue(protocol.REGISTER_NODE, registration(signing.NodeKey.generate(), "alpha/h100-pod", "old-capture",
                                               join_token("alpha/h100-pod"), ts=sent))
    wait_for(rejected("registration older than D0_NODE_MESSAGE_MAX_AGE"), 30, "the old registration to be refused")
    assert not Node.objects.filter(hostname="old-capture").exists()


def test_a_deleted_nodes_registration_replayed_does_not_bring_it_back(stack, cluster, rogue):
    key, token = signing.NodeKey.generate(), join_token("alpha/h100-pod")
    captured = registration(key, "alpha/h100-pod", "gone", token)
    rogue(protocol.REGISTER_NODE, captured)
    node = wait_for(node_online("gone"), 30, "the node to join")
    node.delete()  # as a team admin deletes it in the admin
    rogue(protocol.REGISTER_NODE, captured)  # the same bytes again, within their age and the token's life
    rogue(protocol.REGISTER_NODE, registration(key, "alpha/h100-pod", "gone", token))  # or signed afresh
    row = wait_for(rejected("signed by the key of a deleted node"), 30, "the replay to be refused")
    wait_for(lambda: RejectedNodeMessage.objects.get(pk=row.pk).count == 2, 30, "both to be refused")
    assert not Node.objects.filter(hostname="gone").exists()


def test_what_the_control_plane_stores_of_a_join_token_cannot_join_a_node(stack, cluster, rogue):
    """A reader of the join-token table (a database dump, the admin) has the token's id and its verifying key; with
    it, neither the old HMAC proof nor a signature by a key made from it passes."""
    import hashlib
    import hmac

    token = JoinToken.objects.get(token_id=join_token("alpha/h100-pod").split(".")[0])
    key = signing.NodeKey.generate()
    payload, signature, _, _ = registration(key, "alpha/h100-pod", "from-a-dump")
    as_hmac = hmac.new(base64_bytes(token.verify_key), payload.encode(), hashlib.sha256).hexdigest()
    as_secret = signing.token_proof(token.token_id, token.verify_key, payload)  # the verifier taken for the secret
    for proof in (as_hmac, as_secret, token.verify_key):
        rogue(protocol.REGISTER_NODE, [payload, signature, token.token_id, proof])
    # Summed: two control processes refusing at once may each start the reason's row (and a message delivered
    # twice, acked late, is refused twice).
    wait_for(lambda: sum(RejectedNodeMessage.objects.filter(reason="join token unknown or its proof is wrong")
                         .values_list("count", flat=True)) >= 3, 30, "the three proofs to be refused")
    assert not Node.objects.filter(hostname="from-a-dump").exists()
    assert JoinToken.objects.get(pk=token.pk).uses == 0


def base64_bytes(text: str) -> bytes:
    import base64

    return base64.b64decode(text)


# --- the node's side, without workers ------------------------------------------------------------------------


def test_a_node_pins_the_control_key_it_joined_with_and_refuses_to_start_with_another(tmp_path):
    import subprocess
    import sys

    from workers import control_trust

    first, second = signing.ControlKey.generate().public_key, signing.ControlKey.generate().public_key
    with pytest.raises(control_trust.ControlKeyError, match="no control-plane key"):
        control_trust.pinned_control_key(tmp_path, "")
    assert control_trust.pinned_control_key(tmp_path, first) == first
    assert control_trust.pinned_control_key(tmp_path, "") == first  # a restart needs it no more
    assert oct((tmp_path / control_trust.PIN_FILE).stat().st_mode & 0o777) == "0o600"
    with pytest.raises(control_trust.ControlKeyError, match="differs from the one this node pinned"):
        control_trust.pinned_control_key(tmp_path, second)
    with pytest.raises(control_trust.ControlKeyError, match="is not a control-plane key"):
        control_trust.pinned_control_key(tmp_path, "not-a-key")
    # The worker itself stops before it reaches the broker.
    state = tmp_path / "state"
    started = [sys.executable, "-m", "workers.node", "--broker", "redis://127.0.0.1:1/0", "--cluster", "alpha/pod",
               "--hostname", "pinned", "--state-dir", str(state)]
    env = {**os.environ, "D0_CONTROL_KEY": ""}
    (state / protocol.node_queue("alpha/pod", "pinned")).mkdir(parents=True)
    (state / protocol.node_queue("alpha/pod", "pinned") / control_trust.PIN_FILE).write_text(first)
    refused = subprocess.run([*started, "--control-key", second], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "differs from the one this node pinned" in refused.stderr


def test_a_sealed_parameter_opens_only_on_its_node_for_its_stage_run(tmp_path):
    from workers import sealing

    mine = sealing.SealingKey.load_or_create(tmp_path / "mine.seal")
    theirs = sealing.SealingKey.load_or_create(tmp_path / "theirs.seal")
    box = sealing.seal(mine.public_key, "sk-secret", sealing.context(7, "node-a", "api_key"))
    assert "sk-secret" not in str(box) and sealing.is_sealed(box)
    assert mine.open(box, sealing.context(7, "node-a", "api_key")) == "sk-secret"
    for key, context in ((theirs, sealing.context(7, "node-a", "api_key")),  # another node's key
                         (mine, sealing.context(8, "node-a", "api_key")),  # another stage run
                         (mine, sealing.context(7, "node-b", "api_key"))):  # addressed to another node
        with pytest.raises(sealing.SealError):
            key.open(box, context)
    assert sealing.SealingKey.load_or_create(tmp_path / "mine.seal").public_key == mine.public_key


def test_a_node_reports_nothing_for_a_message_it_cannot_trust_and_fails_an_authentic_one_past_its_expiry(
        node_in_process, monkeypatch):
    node, sent = node_in_process.node, node_in_process.sent
    node_key, control_key = node_in_process.node_key, node_in_process.control_key
    monkeypatch.setattr(node, "run_engine_stage", lambda *args, **kwargs: pytest.fail("a stage ran"))
    stranger = signing.ControlKey.generate()  # another d0's control plane, or a rogue's key
    for message, task_id in ((stranger.message(protocol.RUN_STAGE, node_key.key_id, [7, "env_probe", {}],
                                               max_age=60, id="t1"), "t1"),
                             ([7, "env_probe", {}], "t2")):
        node.run_stage.apply(args=message, task_id=task_id)
    assert sent == []
    expired = control_key.message(protocol.RUN_STAGE, node_key.key_id, [8, "env_probe", {}], max_age=-1, id="t3")
    node.run_stage.apply(args=expired, task_id="t3")
    [(task, report)] = sent
    assert task == protocol.STAGE_FINISHED and report["args"][:2] == [8, False]
    assert "waited in the node's queue past its expiry" in report["args"][3]
