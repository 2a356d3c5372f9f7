from .clusters import Cluster, Device, Link, Node
from .jobs import AdaptationJob, StageRun
from .plans import ModelPlan
from .reports import EnvReport
from .specs import ModelSpec
from .teams import Membership, Team

__all__ = [
    "AdaptationJob",
    "Cluster",
    "Device",
    "EnvReport",
    "Link",
    "Membership",
    "ModelPlan",
    "ModelSpec",
    "Node",
    "StageRun",
    "Team",
]
