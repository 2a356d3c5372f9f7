"""torch.compile readiness of the reduced model, in one Dynamo pass: graphs and graph breaks (with reasons), the
compile time and the compiled model's agreement with eager mode all come from one ``torch.compile`` whose backend
is wrapped in torch's own ``ExplainWithBackend`` (what ``torch._dynamo.explain`` records, without a second trace;
explaining first and compiling after traced the model twice, up to 86% of a coverage run).

Bounded by construction: the reduced model is a few tiny layers and the input is one short prefill. Inductor on
a CPU spends ~20 s generating C++ even for that, so on the CPU the default compile backend is ``aot_eager``
(Dynamo capture plus AOTAutograd tracing, ~1-2 s), which finds the same graph breaks and tracing failures;
pass ``backend="inductor"`` to check code generation as well. Accelerators default to inductor.
"""

from __future__ import annotations

import math
import time
import warnings

import torch

from .tracing import first_line

CPU_BACKEND_REASON = "inductor code generation on a CPU takes ~20 s even for the reduced model; aot_eager is used"


def default_backend(device: torch.device) -> str:
    return "aot_eager" if device.type == "cpu" else "inductor"


def _break_reasons(explanation) -> list[dict]:
    reasons = []
    for graph_break in explanation.break_reasons:
        frame = graph_break.user_stack[-1] if graph_break.user_stack else None
        where = f"{frame.filename}:{frame.lineno} in {frame.name}" if frame else None
        reasons.append({"reason": first_line(graph_break.reason), "where": where})
    return reasons


class _TimedBackend:
    """The compile backend, timed: the time outside it is Dynamo's capture, what ``explain`` used to measure."""

    def __init__(self, name: str):
        from torch._dynamo.backends.registry import lookup_backend

        self.backend = lookup_backend(name)
        self.seconds = 0.0

    def __call__(self, graph_module, example_inputs):
        started = time.perf_counter()
        try:
            return self.backend(graph_module, example_inputs)
        finally:
            self.seconds += time.perf_counter() - started


def compile_check(model, input_ids: torch.Tensor, *, backend: str | None = None) -> dict:
    """Compile ``model`` on one prefill of ``input_ids`` (no KV cache), recording its graphs and graph breaks."""
    import torch._dynamo
    from torch._dynamo.backends.debugging import ExplainWithBackend

    device = input_ids.device
    backend = backend or default_backend(device)
    result = {"checked": True, "backend": backend, "input": f"prefill of {input_ids.shape[-1]} tokens, no cache"}
    if backend != "inductor" and device.type == "cpu":
        result["note"] = CPU_BACKEND_REASON
    torch._dynamo.reset()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            started = time.perf_counter()
            try:
                timed = _TimedBackend(backend)
                explaining = ExplainWithBackend(timed)
                compiled_logits = torch.compile(model, backend=explaining)(input_ids=input_ids,
                                                                           use_cache=False).logits
            except Exception as error:  # a capture or compile failure is the finding
                message = f"{type(error).__name__}: {first_line(error)}"
                result["explain"] = {"error": message}
                result.update(compiles=False, error=message)
            else:
                seconds = time.perf_counter() - started
                explanation = explaining.output()
                result["explain"] = {"graph_count": explanation.graph_count,
                                     "graph_break_count": max(explanation.graph_break_count, 0),
                                     "break_reasons": _break_reasons(explanation),
                                     "seconds": round(seconds - timed.seconds, 3)}
                result.update(compiles=True, seconds=round(seconds, 3))
                eager_logits = model(input_ids=input_ids, use_cache=False).logits
                difference = float((compiled_logits.float() - eager_logits.float()).abs().max())
                # JSON has no NaN: a non-finite difference (NaN logits) is reported as unknown.
                result["max_abs_difference_to_eager"] = difference if math.isfinite(difference) else None
    finally:
        torch._dynamo.reset()
    return result


def skipped(reason: str) -> dict:
    return {"checked": False, "reason": reason}
