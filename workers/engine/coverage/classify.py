"""What each traced operator needs on a backend: classed by what the TARGET backend can run.

Statuses, from best to worst:

- ``native``: the backend has a kernel of its own: on a real device, one registered for its dispatch key (``CPU``,
  ``CUDA``, ``XPU``, ``PrivateUse1``...); on a virtual backend, an operator in its list. ``kernel`` says which.
- ``composite``: no kernel of its own, but a composite kernel (CompositeExplicitAutogradNonFunctional,
  CompositeExplicitAutograd or CompositeImplicitAutograd, the first the dispatcher would pick) that any backend
  inherits, and every operator it calls (``basic_operators``, found by running it on the traced example) is native
  or composite here. It runs as it is. A composite kernel that calls no other operator runs device code through a
  DispatchStub, which torch's own backends register; ``note`` says so.
- ``decomposable``: not runnable as it is, but a decomposition exists whose operators the backend covers: a
  ``torch._decomp`` decomposition into **aten** operators that are native or composite here (a decomposition into
  ``prims::`` operators helps no backend that lists aten operators), or a composite kernel whose callees are
  themselves decomposable. The backend registers the decomposition as its kernel, or torch.compile applies it.
- ``missing``: nothing above; ``note`` and ``suggestion`` name what the backend lacks.
- ``failed``: the operator raised on this device during the trace (no kernel for the key, or not for that dtype).
  ``kernel_status`` still says what the kernel table alone would say.

The trace runs on the node's device, which inserts its own variants (``_scaled_dot_product_flash_attention_for_cpu``
is what ``scaled_dot_product_attention`` becomes on a CPU). Judging another backend, such a variant is mapped to the
backend-neutral operator first (``neutral_operator``), and that operator is judged for the target.

Coverage is the share of distinct operator overloads that are native, composite or decomposable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch._decomp import decomposition_table

from .tracing import OperatorRecorder, first_line, materialize_example, operator_name
from .virtual_backend import Backend, split_operator

STATUSES = ("native", "composite", "decomposable", "missing", "failed")
COVERED = ("native", "composite", "decomposable")
RUNS = ("native", "composite")
# The composite kernels a backend without a kernel of its own inherits, in the dispatcher's order of preference
# (OperatorEntry::computeDispatchTableEntry: NonFunctional, then Explicit, then Implicit).
COMPOSITE_KERNELS = ("CompositeExplicitAutogradNonFunctional", "CompositeExplicitAutograd",
                     "CompositeImplicitAutograd")
# Composite kernels call composite kernels (ones -> empty + fill_, _to_copy -> empty_strided + copy_): deep enough
# for the chains torch has; a chain deeper than this is reported, never guessed.
MAX_DEPTH = 5
# Operators a trace device puts in place of a backend-neutral one, and that neutral operator.
DEVICE_VARIANTS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "aten::scaled_dot_product_attention.default",
    "aten::_scaled_dot_product_attention_math_for_mps": "aten::scaled_dot_product_attention.default",
}
DEVICE_SUFFIXES = ("_for_cpu",)  # _weight_int4pack_mm_for_cpu -> _weight_int4pack_mm, same arguments
# What scaled_dot_product_attention's CompositeImplicitAutograd kernel picks on each kind of backend when it has
# the kernel (the CPU's flash; flash, memory-efficient, cuDNN on CUDA; MPS's own math; XPU's and PrivateUse1's
# overrideable hook), and its fallback when it has none: the math composite.
FUSED_ATTENTION = tuple(f"aten::{name}.default" for name in (
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math_for_mps", "_scaled_dot_product_fused_attention_overrideable"))
ATTENTION = "aten::scaled_dot_product_attention.default"
ATTENTION_FALLBACK = "aten::_scaled_dot_product_attention_math.default"


def has_kernel(operator, dispatch_key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(operator.name(), dispatch_key)


def lookup_operator(name: str):
    """``aten::mm.default`` -> ``torch.ops.aten.mm.default``, or None when this torch has no such operator."""
    namespace, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")
    except (AttributeError, RuntimeError):
        return None


def rebind_example(example: tuple, source, target) -> tuple:
    """The ``(args, kwargs)`` of a call to ``source`` as keyword arguments of ``target``, by argument name (the two
    schemas order them differently); arguments ``target`` does not take are dropped."""
    args, kwargs = example
    names = [argument.name for argument in source._schema.arguments]
    values = {**dict(zip(names, args, strict=False)), **kwargs}
    taken = {argument.name for argument in target._schema.arguments}
    return (), {name: value for name, value in values.items() if name in taken}


def neutral_operator(name: str, overload, example):
    """``(name, overload, example)`` of the backend-neutral operator a device variant stands for, or None."""
    base, overload_name = split_operator(name)
    target = DEVICE_VARIANTS.get(base)
    if target is None and base.endswith(DEVICE_SUFFIXES):
        target = f"{base.removesuffix('_for_cpu')}.{overload_name or 'default'}"
    neutral = lookup_operator(target) if target else None
    if neutral is None:
        return None
    if example is not None:
        example = rebind_example(example, overload, neutral)
        if target == ATTENTION:
            # The CPU flash kernel takes keys and values with fewer heads than the queries (GQA) by itself; the
            # neutral operator has to be told (with as many heads, enable_gqa changes nothing).
            example[1]["enable_gqa"] = True
    return operator_name(neutral), neutral, example


@dataclass
class Classification:
    status: str
    kernel: str | None
    basic_operators: list[dict] | None = None
    decomposition: str | None = None
    note: str | None = None
    suggestion: str | None = None
    lacks: tuple[str, ...] = ()  # what the backend would have to implement for this path; not reported

    def as_dict(self) -> dict:
        return {"kernel_status": self.status, "kernel": self.kernel, "decomposition": self.decomposition,
                "basic_operators": self.basic_operators, "note": self.note, "suggestion": self.suggestion}


def names(entries: list[dict], statuses) -> list[str]:
    return [entry["name"] for entry in entries if entry["status"] in statuses]


def lacking(basic: list[dict]) -> list[str]:
    """The operators a backend has to implement for ``basic`` to run: the uncovered leaves, not their parents."""
    leaves = []
    for entry in basic:
        if entry["status"] in RUNS:
            continue
        below = lacking(entry.get("basic_operators") or [])
        leaves.extend(below or [entry["name"]])
    return list(dict.fromkeys(leaves))


class Classifier:
    """Classifies operators for one backend; results are cached by operator name and depth."""

    def __init__(self, backend: Backend, seed: int = 0):
        self.backend = backend
        self.generator = torch.Generator().manual_seed(seed)
        self.cache: dict[tuple[str, int], Classification] = {}

    def own_kernel(self, operator) -> str | None:
        if self.backend.virtual:
            return "listed" if self.backend.lists(operator_name(operator)) else None
        return self.backend.dispatch_key if has_kernel(operator, self.backend.dispatch_key) else None

    def classify(self, operator, example: tuple | None, depth: int = MAX_DEPTH) -> Classification:
        key = (operator_name(operator), depth)
        if key not in self.cache:
            self.cache[key] = self._classify(operator, example, depth)
        return self.cache[key]

    def _classify(self, operator, example, depth) -> Classification:
        kernel = self.own_kernel(operator)
        if kernel is not None:
            return Classification("native", kernel)
        if self.backend.virtual and operator_name(operator) == ATTENTION:
            return self._attention(example, depth)
        composite = next((key for key in COMPOSITE_KERNELS if has_kernel(operator, key)), None)
        through_composite = None
        if composite is not None:
            through_composite = self._through(composite, self._composite_call(operator, composite), operator,
                                              example, depth)
            if through_composite.status in ("composite", "decomposable"):
                return through_composite
        if operator in decomposition_table:
            decomposed = self._through("torch._decomp", decomposition_table[operator], operator, example, depth)
            if decomposed.status == "decomposable" or through_composite is None:
                return decomposed
            # Neither runs: report the path that needs the fewest new kernels (a known few beats an unknown).
            fewer = not through_composite.lacks or len(decomposed.lacks) < len(through_composite.lacks)
            if decomposed.lacks and fewer:
                return decomposed
        return through_composite or Classification(
            "missing", None, [], note="no kernel for this backend, no composite kernel and no decomposition",
            suggestion=f"write a kernel for {operator_name(operator)}")

    @staticmethod
    def _composite_call(operator, key: str):
        dispatch_key = getattr(torch._C.DispatchKey, key)

        def call(*args, **kwargs):
            return operator._op_dk(dispatch_key, *args, **kwargs)

        return call

    def _through(self, source: str, call, operator, example, depth) -> Classification:
        """Classify ``operator`` by what ``call`` (its composite kernel or decomposition) dispatches."""
        name = operator_name(operator)
        if not depth:
            return Classification("missing", None, None, source, f"{source} chain nested deeper than {MAX_DEPTH}",
                                  f"write a kernel for {name}")
        basic = self._basic_operators(operator, example, depth, call)
        if basic is None:
            return Classification("missing", None, None, source, f"its {source} code could not be run here to see "
                                  "what it calls", f"write a kernel for {name}")
        composite = source != "torch._decomp"
        if not basic:
            if composite:
                note = ("its composite kernel calls no other operator: a view, or device code reached through a "
                        "DispatchStub (copy_), which torch's own backends register")
                return Classification("composite", source, [], source, note)
            return Classification("missing", None, [], source, "the decomposition dispatches no operators",
                                  f"write a kernel for {name}")
        foreign = [] if composite else [entry["name"] for entry in basic if not entry["name"].startswith("aten::")]
        if foreign:
            # A backend lists aten operators: a decomposition into prims:: (or any other namespace) does not help,
            # and naming prims:: operators as the fix would send the reader after operators no backend lists.
            return Classification("missing", None, basic, source, f"its {source} decomposition goes to "
                                  f"{', '.join(foreign)}, which no aten operator list contains",
                                  f"write a kernel for {name}")
        uncovered = [entry["name"] for entry in basic if entry["status"] not in RUNS]
        if composite and not uncovered:
            return Classification("composite", source, basic, source)
        if not uncovered or (composite and all(entry["status"] in COVERED for entry in basic)):
            has = ", ".join(names(basic, RUNS))
            needs = ", ".join(names(basic, ("decomposable",)))
            suggestion = (f"register its {source} decomposition for this backend, or let torch.compile lower it: "
                          f"it calls {has}" + (f" and the decomposable {needs}" if needs else "") +
                          ", which the backend has")
            return Classification("decomposable", None, basic, source, suggestion=suggestion)
        has = names(basic, RUNS)
        roots = lacking(basic)
        suggestion = (f"write a kernel for {name}, or for {', '.join(uncovered)}" +
                      (f" (in the end {', '.join(roots)})" if roots != uncovered else "") +
                      (f"; its {source} code also calls {', '.join(has)}, which the backend has" if has else ""))
        return Classification("missing", None, basic, source, f"its {source} code calls {', '.join(uncovered)}, "
                              "which the backend lacks", suggestion, tuple(uncovered))

    def _attention(self, example, depth) -> Classification:
        """scaled_dot_product_attention on a virtual backend: one of its fused kernels, else the math composite."""
        fused = [name for name in FUSED_ATTENTION if self.backend.lists(name)]
        if fused:
            note = "scaled_dot_product_attention picks one of the backend's fused attention kernels"
            return Classification("composite", "CompositeImplicitAutograd",
                                  [{"name": name, "status": "native"} for name in fused],
                                  "CompositeImplicitAutograd", note)
        fallback = lookup_operator(ATTENTION_FALLBACK)
        attention = lookup_operator(ATTENTION)
        example = rebind_example(example, attention, fallback) if example else None
        classification = self._through("CompositeImplicitAutograd", fallback, attention, example, depth)
        classification.note = "no fused attention kernel listed: the math composite" + (
            f"; {classification.note}" if classification.note else "")
        return classification

    def _basic_operators(self, operator, example, depth, call) -> list[dict] | None:
        """Run ``call`` on the recorded example and classify each operator it dispatches."""
        if example is None:
            return None
        recorder = OperatorRecorder()
        try:
            args, kwargs = materialize_example(example, self.backend.device, self.generator)
            with torch.no_grad(), recorder:
                call(*args, **kwargs)
        except Exception:  # code that cannot run here counts as no decomposition, see the caller
            return None
        own_name = operator_name(operator)
        basic = []
        for name, record in sorted(recorder.operators.items()):
            if name == own_name:
                continue
            overload, callee_example = record.overload, record.example
            judged_as_variant = not self.backend.virtual or self.backend.lists(name)
            neutral = None if judged_as_variant else neutral_operator(name, overload, callee_example)
            if neutral is not None:
                name, overload, callee_example = neutral
            classification = self.classify(overload, callee_example, depth - 1)
            entry = {"name": name, "status": classification.status}
            if classification.status not in RUNS and classification.basic_operators:
                entry["basic_operators"] = classification.basic_operators
            basic.append(entry)
        return basic


def judged_operators(operators: dict, backend: Backend) -> dict:
    """The trace's records keyed by the operator the backend is judged on: a device variant (the trace device's
    own SDPA kernel) becomes its backend-neutral operator on a virtual backend; ``traced_as`` keeps its name."""
    if not backend.virtual:
        return {name: (record, record.overload, record.example, None) for name, record in operators.items()}
    judged = {}
    for name in sorted(operators):
        record = operators[name]
        neutral = None if backend.lists(name) else neutral_operator(name, record.overload, record.example)
        if neutral is None:
            judged[name] = (record, record.overload, record.example, None)
        else:
            judged[neutral[0]] = (record, neutral[1], neutral[2], name)
    return judged


def classify_trace(operators: dict, backend: Backend, *, seed: int = 0) -> list[dict]:
    """One entry per traced operator: the trace record, its classification and its final ``status``."""
    classifier = Classifier(backend, seed)
    entries = []
    for name, (record, overload, example, traced_as) in sorted(judged_operators(operators, backend).items()):
        try:
            classification = classifier.classify(overload, example)
        except Exception as error:  # one odd operator must not cost the whole report
            classification = Classification("missing", None, None, note=f"classification failed: {first_line(error)}")
        entry = {**record.as_dict(), **classification.as_dict(), "name": name}
        if traced_as:
            entry["traced_as"] = traced_as
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
            "gaps": [entry["name"] for entry in entries if entry["status"] not in RUNS]}
