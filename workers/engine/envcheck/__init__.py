"""Environment checks of a node: what it is (host, software stack, devices, topology) and what it measures
(copy and host-to-device bandwidth, matmul FLOP/s per dtype, collective bus bandwidth), judged by checks.

``env_probe`` is the instant probe (host facts and the devices torch sees; the node worker registers with it);
``env_check`` is the full check (``report``); both are node stages (``stage``). Modules: ``probe`` (host and devices),
``software`` (packages and variables), ``topology`` (vendor tools' link matrices), ``measure`` (bandwidth and
FLOP/s), ``collectives`` + ``busbw`` (torch.distributed bus bandwidth), ``peaks`` (published device figures),
``checks`` (pass/warn/fail). Importing it does not import torch.
"""

from .stage import PARAMETERS, env_check, env_probe

__all__ = ["PARAMETERS", "env_check", "env_probe"]
