from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from ..choices import DeviceKind, InterconnectKind, NodeStatus
from .names import slug_name_field
from .teams import Team, TeamOwnedQuerySet


class ClusterQuerySet(TeamOwnedQuerySet):
    def with_node_counts(self):
        """Each cluster with how many nodes it has (``node_count``) and how many are online (``nodes_online``)."""
        return self.annotate(
            node_count=models.Count("nodes", distinct=True),
            nodes_online=models.Count("nodes", filter=models.Q(nodes__status=NodeStatus.ONLINE), distinct=True),
        )


class Cluster(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="clusters")
    name = slug_name_field(63, "Nodes join as <team>/<name>.")
    description = models.TextField(blank=True)
    expected_devices_per_node = models.PositiveIntegerField(default=1)
    interconnect = models.CharField(max_length=16, choices=InterconnectKind.choices, default=InterconnectKind.UNKNOWN)
    created = models.DateTimeField(auto_now_add=True)

    objects = ClusterQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="cluster_name_unique_in_team")]

    def __str__(self):
        return self.name

    @property
    def join_name(self) -> str:
        return f"{self.team.slug}/{self.name}"


class NodeQuerySet(TeamOwnedQuerySet):
    team_path = "cluster__team"

    # A node's status changes with its heartbeats, each a conditional UPDATE returning how many rows moved.
    def go_offline(self) -> int:
        return self.update(status=NodeStatus.OFFLINE)

    def come_back(self) -> int:
        """An offline node heard from again is online (a draining one stays draining)."""
        return self.filter(status=NodeStatus.OFFLINE).update(status=NodeStatus.ONLINE)


class Node(models.Model):
    """A machine that runs a node worker. Rows are created by the worker's registration, not by hand."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    hostname = models.CharField(max_length=255)
    queue_name = models.CharField(max_length=255, unique=True)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.ONLINE)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    registered = models.DateTimeField(auto_now_add=True)
    host_facts = models.JSONField(default=dict, blank=True)
    # The node's Ed25519 public key, bound at its first registration (with a join token); every message the node
    # sends is signed with the private half, which never leaves the node (workers/signing.py).
    public_key = models.CharField(max_length=64, blank=True, editable=False)
    key_id = models.CharField(max_length=32, null=True, blank=True, unique=True, editable=False)
    # The node's X25519 public key, sent in its registration: a stage's secret parameters are sealed to it, so
    # they cross the broker as ciphertext only this node opens (workers/sealing.py).
    sealing_key = models.CharField(max_length=64, blank=True, editable=False)
    # Send time (the node's clock) of the newest registration, heartbeat or leave accepted: an older one is a
    # replay and is not applied.
    last_signed_ts = models.FloatField(default=0.0, editable=False)
    # SHA-256 of the node's broker password (made on the node, sent in its registration): the control plane makes
    # the node's broker user from it, and makes it again when the broker lost it (clusters/broker_users.py).
    broker_password_sha256 = models.CharField(max_length=64, blank=True, default="", editable=False)

    objects = NodeQuerySet.as_manager()

    class Meta:
        ordering = ["cluster__name", "hostname"]
        constraints = [models.UniqueConstraint(fields=["cluster", "hostname"], name="node_hostname_unique_in_cluster")]

    def __str__(self):
        return f"{self.hostname} ({self.cluster})"


class DeviceQuerySet(TeamOwnedQuerySet):
    team_path = "node__cluster__team"


class Device(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=DeviceKind.choices)
    name = models.CharField(max_length=255)
    memory_bytes = models.BigIntegerField(default=0)
    properties = models.JSONField(default=dict, blank=True)
    measured = models.JSONField(default=dict, blank=True,
                                help_text="Latest env-check figures: bandwidths in bytes/s, matmul FLOP/s by dtype.")

    objects = DeviceQuerySet.as_manager()

    class Meta:
        ordering = ["node__hostname", "kind", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "kind", "index"], name="device_unique_on_node")]

    def __str__(self):
        return f"{self.node.hostname}:{self.kind}:{self.index} {self.name}"


class LinkQuerySet(TeamOwnedQuerySet):
    team_path = "cluster__team"


class Link(models.Model):
    """An interconnect between two devices (NVLink, PCIe, XGMI, loopback) or two nodes (RDMA, Ethernet)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="links")
    kind = models.CharField(max_length=16, choices=InterconnectKind.choices)
    source_device = models.ForeignKey(Device, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    target_device = models.ForeignKey(Device, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    source_node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    target_node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    code = models.CharField(max_length=16, blank=True, help_text="The vendor tool's code, e.g. NV18, PIX, SYS.")
    measured_bandwidth_gbps = models.FloatField(null=True, blank=True, help_text="Measured, in GB/s.")
    p2p_ok = models.BooleanField(null=True, blank=True, help_text="Peer access works (unknown when empty).")
    updated = models.DateTimeField(auto_now=True)

    objects = LinkQuerySet.as_manager()

    class Meta:
        ordering = ["cluster__name", "id"]

    def clean(self):
        ends = [self.source_device_id, self.target_device_id, self.source_node_id, self.target_node_id]
        device_pair = self.source_device_id is not None and self.target_device_id is not None
        node_pair = self.source_node_id is not None and self.target_node_id is not None
        if sum(end is not None for end in ends) != 2 or not (device_pair or node_pair):
            raise ValidationError("A link joins either two devices or two nodes.")

    def __str__(self):
        source, target = (self.source_device, self.target_device) if self.source_device_id else (
            self.source_node, self.target_node)
        return f"{self.get_kind_display()}: {source} ↔ {target}"


class JoinTokenQuerySet(TeamOwnedQuerySet):
    team_path = "cluster__team"

    def usable(self):
        return self.filter(revoked__isnull=True, expires__gt=timezone.now())


class JoinToken(models.Model):
    """A cluster's bootstrap token (kubeadm's idea): a node presents it once, at its first registration, and is
    bound to its own key from then on. Only the token's id and the public half of a key derived from its secret are
    kept (which checks a node's proof and cannot make one); the whole token is shown once, when a team admin makes
    it. A token made before d0 kept that key has none and joins nothing: make a new one. ``broker_password_sha256``
    is what a broker with per-node users keeps of the token's broker user's password (the secret): kept so that a
    user a broker restart forgot is made again; it joins nothing (Redis wants the password itself, d0 a signature by
    the key derived from the secret)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="join_tokens")
    token_id = models.CharField(max_length=16, unique=True)
    verify_key = models.CharField(max_length=64, blank=True, editable=False)
    broker_password_sha256 = models.CharField(max_length=64, blank=True, default="", editable=False)
    description = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField()
    revoked = models.DateTimeField(null=True, blank=True)
    uses = models.PositiveIntegerField(default=0, help_text="Nodes that joined with it.")
    last_used = models.DateTimeField(null=True, blank=True)

    objects = JoinTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]

    def __str__(self):
        return f"{self.token_id} ({self.cluster})"

    @property
    def usable(self) -> bool:
        return self.revoked is None and self.expires > timezone.now()


class RejectedNodeMessageQuerySet(TeamOwnedQuerySet):
    team_path = "cluster__team"


class RejectedNodeMessage(models.Model):
    """Node messages the control plane dropped (unsigned, forged, from the wrong node, replayed), counted per
    cluster, message kind and reason. ``cluster`` is empty when the message named no cluster d0 knows."""

    cluster = models.ForeignKey(Cluster, null=True, blank=True, on_delete=models.CASCADE,
                                related_name="rejected_messages")
    task = models.CharField(max_length=100)
    reason = models.CharField(max_length=200)
    count = models.PositiveIntegerField(default=0)
    first_seen = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(default=timezone.now)
    detail = models.CharField(max_length=255, blank=True, help_text="What the latest one claimed to be.")

    objects = RejectedNodeMessageQuerySet.as_manager()

    class Meta:
        ordering = ["-last_seen"]
        indexes = [models.Index(fields=["cluster", "task", "reason"])]

    def __str__(self):
        return f"{self.task}: {self.reason} ×{self.count}"


class RetiredNodeKey(models.Model):
    """The key of a node that was deleted: a registration signed with it is refused, so a captured registration
    replayed (even with a join token still valid) cannot bring the node back. The machine joins again with a new
    key (its key file removed) and a new token."""

    key_id = models.CharField(max_length=32, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    retired = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"{self.key_id} ({self.hostname})"


@receiver(post_delete, sender=Node)
def _retire_key(sender, instance: Node, **kwargs) -> None:
    """However a node goes (the admin, its cluster deleted), its key is remembered."""
    if instance.key_id:
        RetiredNodeKey.objects.get_or_create(key_id=instance.key_id, defaults={"hostname": instance.hostname})
