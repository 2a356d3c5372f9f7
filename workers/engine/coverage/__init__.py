"""Operator coverage: what a new model needs that a node's backend lacks, checked on the node's own device.

``run_coverage(config)`` reduces the model to a tiny one with every layer kind, traces prefill and decode on the
device, and reports each aten operator as native / composite / decomposable / missing / failed (see
``classify``), with a smoke test per operator, attention/grouped-GEMM/float8 mechanisms and torch.compile
readiness. ``op_coverage`` is the same as a node stage (``stage``). Plain Python + torch + transformers: no Django.
Importing the package imports neither: ``run_coverage`` (``report``) is loaded on first use, so the stage's
declaration can be read by the web tier.
"""

from .stage import PARAMETERS, op_coverage

__all__ = ["PARAMETERS", "op_coverage", "run_coverage"]


def __getattr__(name: str):
    if name == "run_coverage":
        from .report import run_coverage

        return run_coverage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
