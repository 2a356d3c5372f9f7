from .clusters import Cluster, Device, Link, Node
from .coverage import CoverageReport, OperatorRecord, VirtualBackend
from .jobs import AdaptationJob, StageRun
from .plans import ModelPlan
from .reports import EnvReport
from .specs import ModelSpec
from .teams import Membership, Team

__all__ = [
    "AdaptationJob",
    "Cluster",
    "CoverageReport",
    "Device",
    "EnvReport",
    "Link",
    "Membership",
    "ModelPlan",
    "ModelSpec",
    "Node",
    "OperatorRecord",
    "StageRun",
    "Team",
    "VirtualBackend",
]
