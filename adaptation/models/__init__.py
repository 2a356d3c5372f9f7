from .clusters import Cluster, Device, Link, Node
from .jobs import AdaptationJob, StageRun
from .specs import ModelSpec
from .teams import Membership, Team

__all__ = [
    "AdaptationJob",
    "Cluster",
    "Device",
    "Link",
    "Membership",
    "ModelSpec",
    "Node",
    "StageRun",
    "Team",
]
