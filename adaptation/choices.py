"""Choice sets, each value with the colour the pages show it in (NetBox's ChoiceSet idea, kept small)."""

from django.db import models


class TeamRole(models.TextChoices):
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"


class InterconnectKind(models.TextChoices):
    NVLINK = "nvlink", "NVLink"
    PCIE = "pcie", "PCIe"
    XGMI = "xgmi", "Infinity Fabric (XGMI)"
    RDMA = "rdma", "RDMA (InfiniBand/RoCE)"
    ETHERNET = "ethernet", "Ethernet"
    LOOPBACK = "loopback", "Loopback"
    UNKNOWN = "unknown", "Unknown"


class NodeStatus(models.TextChoices):
    ONLINE = "online", "Online"
    OFFLINE = "offline", "Offline"
    DRAINING = "draining", "Draining"


class DeviceKind(models.TextChoices):
    CUDA = "cuda", "CUDA"
    ROCM = "rocm", "ROCm"
    XPU = "xpu", "XPU"
    NPU = "npu", "NPU"
    MPS = "mps", "MPS"
    CPU = "cpu", "CPU"


class JobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class CheckVerdict(models.TextChoices):
    PASS = "pass", "Pass"
    WARN = "warn", "Warn"
    FAIL = "fail", "Fail"


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
ACTIVE_STATUSES = frozenset({JobStatus.QUEUED, JobStatus.RUNNING})

STATUS_COLOURS = {
    JobStatus.QUEUED: "grey",
    JobStatus.RUNNING: "blue",
    JobStatus.SUCCEEDED: "green",
    JobStatus.FAILED: "red",
    JobStatus.CANCELLED: "orange",
    NodeStatus.ONLINE: "green",
    NodeStatus.OFFLINE: "red",
    NodeStatus.DRAINING: "orange",
    CheckVerdict.PASS: "green",
    CheckVerdict.WARN: "orange",
    CheckVerdict.FAIL: "red",
}
