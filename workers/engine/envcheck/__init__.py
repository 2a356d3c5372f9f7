"""Environment checks of a node: what it is (host, software stack, devices, topology) and what it measures
(copy and host-to-device bandwidth, matmul FLOP/s per dtype, collective bus bandwidth), judged by checks.

``env_probe`` is the instant probe (host facts and the devices torch sees; the node worker registers with it);
``env_check`` is the full check as a node stage (``report``). Modules: ``probe`` (host and devices),
``software`` (packages and variables), ``topology`` (vendor tools' link matrices), ``measure`` (bandwidth and
FLOP/s), ``collectives`` + ``busbw`` (torch.distributed bus bandwidth), ``peaks`` (published device figures),
``checks`` (pass/warn/fail). Importing it does not import torch.
"""

import importlib

__all__ = ["env_check", "env_probe"]

# Resolved on first use: the analyze verb reads published device figures (``peaks``) and must not pay for the
# probe's and the report's imports (psutil, the checks, the software survey) on its way there.
_LAZY = {"env_probe": ".probe", "env_check": ".report"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
