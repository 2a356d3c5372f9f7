"""What each traced operator needs on a backend.

Statuses, from best to worst:

- ``native``: the backend has a kernel for the operator. On a real device that is a kernel registered for its
  dispatch key (``CPU``, ``CUDA``, ``XPU``, ``PrivateUse1``...) or a CompositeExplicitAutograd kernel, which the
  dispatcher uses for every backend (``kernel`` says which); on a virtual backend it is an operator in its list.
- ``composite``: CompositeImplicitAutograd — the operator decomposes into other operators before it reaches any
  backend, so nothing has to be written for it. ``basic_operators`` lists what it becomes.
- ``decomposable``: no kernel, but a decomposition exists (``torch._decomp.decomposition_table``, or for a virtual
  backend a CompositeExplicitAutograd kernel, which such a backend would inherit) and every basic operator it
  dispatches is covered here. Eager mode does not apply Python decompositions by itself: the backend registers the
  decomposition as its kernel, or torch.compile applies it. ``basic_operators`` lists the operators with theirs.
- ``missing``: nothing above; the backend needs a kernel written for it (or for one of its basic operators).
- ``failed``: the operator raised on this device during the trace (no kernel for the key, or not for that dtype).
  ``kernel_status`` still says what the kernel table alone would say.

Coverage is the share of distinct operator overloads that are native, composite or decomposable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch._decomp import decomposition_table

from .tracing import OperatorRecorder, first_line, materialize_example, operator_name
from .virtual_backend import Backend

STATUSES = ("native", "composite", "decomposable", "missing", "failed")
COVERED = ("native", "composite", "decomposable")
# Basic operators are classified recursively to this depth; deeper chains are rare and count as not covered.
MAX_DEPTH = 2


def has_kernel(operator, dispatch_key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(operator.name(), dispatch_key)


@dataclass
class Classification:
    status: str
    kernel: str | None
    basic_operators: list[dict] | None = None
    decomposition: str | None = None
    note: str | None = None

    def as_dict(self) -> dict:
        return {"kernel_status": self.status, "kernel": self.kernel, "decomposition": self.decomposition,
                "basic_operators": self.basic_operators, "note": self.note}


class Classifier:
    """Classifies operators for one backend; results are cached by operator name."""

    def __init__(self, backend: Backend, seed: int = 0):
        self.backend = backend
        self.generator = torch.Generator().manual_seed(seed)
        self.cache: dict[tuple[str, int], Classification] = {}

    def kernel(self, operator) -> str | None:
        if self.backend.virtual:
            return "listed" if self.backend.lists(operator_name(operator)) else None
        if has_kernel(operator, self.backend.dispatch_key):
            return self.backend.dispatch_key
        if has_kernel(operator, "CompositeExplicitAutograd"):
            return "CompositeExplicitAutograd"
        return None

    def classify(self, operator, example: tuple | None, depth: int = MAX_DEPTH) -> Classification:
        key = (operator_name(operator), depth)
        if key not in self.cache:
            self.cache[key] = self._classify(operator, example, depth)
        return self.cache[key]

    def _classify(self, operator, example, depth) -> Classification:
        kernel = self.kernel(operator)
        if kernel is not None:
            return Classification("native", kernel)
        if has_kernel(operator, "CompositeImplicitAutograd"):
            basic = self._basic_operators(operator, example, depth, operator.decompose) if depth else None
            return Classification("composite", "CompositeImplicitAutograd", basic, "CompositeImplicitAutograd")
        decomposition, source = self._decomposition(operator)
        if decomposition is None:
            return Classification("missing", None, [], note="no kernel and no decomposition")
        if not depth:
            return Classification("missing", None, None, source, "decomposition nested too deep to check")
        basic = self._basic_operators(operator, example, depth, decomposition)
        if basic is None:
            return Classification("missing", None, None, source, "the decomposition could not be traced")
        if not basic:
            # A generic kernel that dispatches nothing calls device code directly (a DispatchStub): it is a kernel.
            return Classification("missing", None, [], source, "the decomposition dispatches no operators")
        uncovered = [entry["name"] for entry in basic if entry["status"] not in COVERED]
        if uncovered:
            note = f"basic operators not covered: {', '.join(uncovered)}"
            return Classification("missing", None, basic, source, note)
        return Classification("decomposable", None, basic, source)

    def _decomposition(self, operator):
        if operator in decomposition_table:
            return decomposition_table[operator], "torch._decomp"
        if self.backend.virtual and has_kernel(operator, "CompositeExplicitAutograd"):
            def composite_kernel(*args, **kwargs):
                return operator._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *args, **kwargs)

            return composite_kernel, "CompositeExplicitAutograd"
        return None, None

    def _basic_operators(self, operator, example, depth, decomposition) -> list[dict] | None:
        """Run the decomposition on the recorded example and classify each operator it dispatches."""
        if example is None:
            return None
        recorder = OperatorRecorder()
        try:
            args, kwargs = materialize_example(example, self.backend.device, self.generator)
            with torch.no_grad(), recorder:
                decomposition(*args, **kwargs)
        except Exception:  # a decomposition that cannot run here counts as no decomposition, see the caller
            return None
        own_name = operator_name(operator)
        basic = []
        for name, record in sorted(recorder.operators.items()):
            if name != own_name:
                status = self.classify(record.overload, record.example, depth - 1).status
                basic.append({"name": name, "status": status})
        return basic


def classify_trace(operators: dict, backend: Backend, *, seed: int = 0) -> list[dict]:
    """One entry per traced operator: the trace record, its classification and its final ``status``."""
    classifier = Classifier(backend, seed)
    entries = []
    for name in sorted(operators):
        record = operators[name]
        try:
            classification = classifier.classify(record.overload, record.example)
        except Exception as error:  # one odd operator must not cost the whole report
            classification = Classification("missing", None, None, note=f"classification failed: {first_line(error)}")
        entry = {**record.as_dict(), **classification.as_dict()}
        # A failure on this device says nothing about a virtual backend, which is judged by its list alone.
        failed_here = record.failures and not backend.virtual
        entry["status"] = "failed" if failed_here else classification.status
        entries.append(entry)
    return entries


def summarise(entries: list[dict]) -> dict:
    """Counts per status, coverage (share of distinct operators covered) and the same weighted by calls."""
    counts = {status: sum(entry["status"] == status for entry in entries) for status in STATUSES}
    calls = sum(entry["count"] for entry in entries)
    covered_calls = sum(entry["count"] for entry in entries if entry["status"] in COVERED)
    return {"statuses": counts,
            "coverage": round(sum(counts[status] for status in COVERED) / len(entries), 4) if entries else 0.0,
            "coverage_by_calls": round(covered_calls / calls, 4) if calls else 0.0,
            "gaps": [entry["name"] for entry in entries if entry["status"] not in ("native", "composite")]}
