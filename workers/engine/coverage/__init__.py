"""Operator coverage: what a new model needs that a node's backend lacks, checked on the node's own device.

``run_coverage(config)`` reduces the model to a tiny one with every layer kind, traces prefill and decode on the
device, and reports each aten operator as native / composite / decomposable / missing / failed (see
``classify``), with a smoke test per operator, attention/grouped-GEMM/float8 mechanisms and torch.compile
readiness. ``op_coverage`` is the same as a node stage. Plain Python + torch + transformers: no Django.
"""

from . import report
from .report import op_coverage, run_coverage

__all__ = ["op_coverage", "report", "run_coverage"]
