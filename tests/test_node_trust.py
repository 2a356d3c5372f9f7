"""Node trust against real workers on Redis: an attacker with nothing but the broker URL (a plain Celery client
calling ``send_task`` with the names in workers/protocol.py) replays each attack, and each fails: it is dropped,
counted on the cluster and never applied. The legitimate flow (join with a token, restart, run a job, cancel it)
still works."""

import os
import re
import time
from pathlib import Path

import pytest
from celery import Celery
from django.test import Client
from django.utils import timezone

from adaptation import control_messages
from adaptation.clusters import trust
from adaptation.jobs import services as jobs
from adaptation.models import AdaptationJob, JoinToken, Node, RejectedNodeMessage, StageRun
from tests.harness import join_token, wait_for
from tests.conftest import job_status, node_online
from workers import protocol, signing
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


def registration(key, cluster_ref, hostname, token=""):
    """What a node worker sends to join (workers/node.py), made by hand."""
    payload = signing.encode_payload({"task": protocol.REGISTER_NODE, "ts": time.time(), "cluster": cluster_ref,
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


def compose_redis_acl(control_password: str, node_password: str) -> list[str]:
    """The Redis users docker-compose.yml starts Redis with, passwords filled in."""
    import yaml

    command = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["redis"]["command"]
    arguments = command[command.index("--user"):]
    return [argument.replace("${D0_REDIS_CONTROL_PASSWORD:?set D0_REDIS_CONTROL_PASSWORD}", control_password)
            .replace("${D0_REDIS_NODE_PASSWORD:?set D0_REDIS_NODE_PASSWORD}", node_password) for argument in arguments]


def test_the_compose_redis_users_let_each_role_do_its_work_and_a_node_nothing_more(tmp_path, cluster, owner,
                                                                                   broker, settings):
    """A real Redis started with the compose file's ACL: the control plane as "control", a node as "node"; the node
    joins, runs a job, and its user cannot reconfigure or wipe the broker."""
    import shutil
    import subprocess

    from tests.conftest import database_url
    from tests.harness import Processes, WorkerStack

    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server")
    port = free_port()
    redis = Processes(tmp_path)
    redis.start("redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", *compose_redis_acl("control-secret", "node-secret")], dict(os.environ))
    control_url = f"redis://control:control-secret@127.0.0.1:{port}/0"
    stack = WorkerStack(tmp_path, database_url(), control_url, f"redis://node:node-secret@127.0.0.1:{port}/0",
                        D0_NODE_TIMEOUT=4, D0_LIVENESS_INTERVAL=1)
    try:
        wait_for(lambda: subprocess.run(["redis-cli", "-p", str(port), "--user", "control", "--pass", "control-secret",
                                         "ping"], capture_output=True, text=True).stdout.strip() == "PONG", 30,
                 "redis to start")
        stack.start_control()
        stack.start_node("alpha/h100-pod", "acl-node")
        node = wait_for(node_online("acl-node"), 60, "the node to join through its own Redis user")
        job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=["env_probe"])
        dispatcher = Celery("dispatcher", broker=control_url, fixups=[])
        for task in broker.sent:  # the submit's message to the node, sent as the control plane's Redis user
            dispatcher.send_task(task["name"], args=task["args"], queue=task["queue"], task_id=task["task_id"])
        done = wait_for(job_status(job.pk, "succeeded", "failed"), 60, "the job on the node")
        assert done.status == "succeeded", done.error
        assert done.stage_runs.get().node == node
        for forbidden in (["FLUSHALL"], ["CONFIG", "GET", "*"], ["KEYS", "*"], ["ACL", "LIST"], ["SHUTDOWN"]):
            answer = subprocess.run(["redis-cli", "-p", str(port), "--user", "node", "--pass", "node-secret",
                                     *forbidden], capture_output=True, text=True).stdout
            assert "NOPERM" in answer, (forbidden, answer)
        anonymous = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout
        assert "NOAUTH" in anonymous or "NOPERM" in anonymous, anonymous
        assert "NOPERM" not in stack.log("node-acl-node") and "NOPERM" not in stack.log("control")
        dispatcher.close()
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop_all()
        redis.stop_all()


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
