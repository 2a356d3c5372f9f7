"""torch.compile readiness of the reduced model: graphs and graph breaks (with reasons) from
``torch._dynamo.explain``, then one real compile with its time and its agreement with eager mode.

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


def compile_check(model, input_ids: torch.Tensor, *, backend: str | None = None) -> dict:
    """Explain and compile ``model`` on one prefill of ``input_ids`` (no KV cache)."""
    import torch._dynamo

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
                explanation = torch._dynamo.explain(model)(input_ids=input_ids, use_cache=False)
            except Exception as error:  # a capture failure is the finding
                result["explain"] = {"error": f"{type(error).__name__}: {first_line(error)}"}
            else:
                result["explain"] = {"graph_count": explanation.graph_count,
                                     "graph_break_count": explanation.graph_break_count,
                                     "break_reasons": _break_reasons(explanation),
                                     "seconds": round(time.perf_counter() - started, 3)}
            torch._dynamo.reset()
            started = time.perf_counter()
            try:
                compiled = torch.compile(model, backend=backend)
                compiled_logits = compiled(input_ids=input_ids, use_cache=False).logits
            except Exception as error:  # idem
                result.update(compiles=False, error=f"{type(error).__name__}: {first_line(error)}")
            else:
                result.update(compiles=True, seconds=round(time.perf_counter() - started, 3))
                eager_logits = model(input_ids=input_ids, use_cache=False).logits
                difference = float((compiled_logits.float() - eager_logits.float()).abs().max())
                # JSON has no NaN: a non-finite difference (NaN logits) is reported as unknown.
                result["max_abs_difference_to_eager"] = difference if math.isfinite(difference) else None
    finally:
        torch._dynamo.reset()
    return result


def skipped(reason: str) -> dict:
    return {"checked": False, "reason": reason}
