"""Node trust against real workers on Redis: an attacker with nothing but the broker URL (a plain Celery client
calling ``send_task`` with the names in workers/protocol.py) replays each attack, and each fails: it is dropped,
counted on the cluster and never applied. The legitimate flow (join with a token, restart, run a job, cancel it)
still works."""

import os
import time

import pytest
from celery import Celery
from django.utils import timezone

from adaptation.clusters import trust
from adaptation.models import AdaptationJob, JoinToken, Node, RejectedNodeMessage, StageRun
from tests.harness import join_token, wait_for
from tests.conftest import job_status, node_online
from workers import protocol, signing

pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]


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
        proof = signing.token_proof(signing.token_key(secret), payload)
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
