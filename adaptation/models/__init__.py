from .clusters import Cluster, Device, JoinToken, Link, Node, RejectedNodeMessage, RetiredNodeKey
from .coverage import CoverageReport, OperatorRecord, VirtualBackend
from .health import ControlWorker
from .jobs import AdaptationJob, StageRun
from .plans import ModelPlan
from .reports import EnvReport
from .serving import ServingEndpoint
from .specs import ModelSpec
from .teams import Membership, Team

__all__ = [
    "AdaptationJob",
    "Cluster",
    "ControlWorker",
    "CoverageReport",
    "Device",
    "EnvReport",
    "JoinToken",
    "Link",
    "Membership",
    "ModelPlan",
    "ModelSpec",
    "Node",
    "OperatorRecord",
    "RejectedNodeMessage",
    "RetiredNodeKey",
    "ServingEndpoint",
    "StageRun",
    "Team",
    "VirtualBackend",
]
