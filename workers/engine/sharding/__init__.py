"""Sharded validation runs: a model of a real architecture split the way a plan says, on real torch.distributed,
checked against a single-process reference with the same weights and inputs.

``run_sharded(config, tp=.., pp=.., ep=..)`` starts the ranks (gloo on CPU processes, nccl on GPUs), each builds the
same model (seeded random weights, or a local safetensors checkpoint), keeps its shard and decodes greedily; the
report says whether the sharded model computes what the reference computes, and what each rank measured.
Plain data in, plain data out; no Django.
"""

from .launcher import ShardedRunError
from .runner import run_sharded
from .stage import PARAMETERS, shard_stage

__all__ = ["PARAMETERS", "ShardedRunError", "run_sharded", "shard_stage"]
