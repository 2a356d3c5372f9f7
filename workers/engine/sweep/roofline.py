"""Roofline: the fastest a trial's work could run on this node, from the model's FLOPs and bytes moved.

Per phase (prefill, decode) the ceiling time is ``max(FLOPs / FLOP/s, bytes / (bytes/s))`` (Williams, Waterman and
Patterson, "Roofline", CACM 2009), with:

- FLOPs = 2 x active parameters x tokens (one multiply and one add per weight per token, Kaplan et al. 2020's
  "C_forward ~ 2N"). Active parameters = ``sum(p.numel())`` of the model as built (tied tensors once), routed
  experts scaled by top-k / experts, an input embedding that is not tied to the LM head left out (it is a lookup,
  not a product). Attention's score and value products (4 x layers x heads x head_dim x context) are left out:
  they are small next to the weights at the contexts a sweep uses.
- Bytes = weights read once per forward step (a step serves every request in the batch; routed experts count for
  the share a step's tokens are expected to touch, E x (1 - (1 - k/E)^tokens) of E experts under uniform routing)
  + the KV cache: prefill writes kv_bytes_per_token for each prompt token, each decode token reads its whole
  context (sliding-window layers at most their window), as transformers' paged cache stores it
  (2 x KV heads x head_dim x activation bytes per layer and token).
- Steps, as transformers' continuous batching schedules them: a step carries at most ``max_batch_tokens`` tokens
  and ``max_requests_per_batch`` (the batch size) requests, a long prompt in chunks of at most max_batch_tokens;
  so prefill takes max(ceil(prompt tokens / max_batch_tokens), ceil(prompt chunks / requests per step)) steps
  (batch 1 prefills one request per step: eight requests, eight steps); decode runs
  ceil(decode tokens / concurrency) steps, each producing one token for every request in flight.

Each step also costs a fixed overhead that is neither bandwidth nor compute (Python scheduling, kernel launches,
sampling): ``step_overhead`` fits measured seconds per step against ceiling seconds per step over the smallest
trials of a sweep (the intercept is the overhead, Williams et al.'s roofline has none), and ``separate_overhead``
takes ``steps x overhead`` out of each trial's measured time before dividing: efficiency = ceiling time /
(measured - steps x overhead) describes the hardware, ``end_to_end_efficiency`` = ceiling / measured the whole.
An efficiency above 1 cannot be true; such a trial carries ``flag`` (its figure is not shown as one): the rule is
``result.Efficiency``'s, which every report reads.

The trial is memory-bound when its arithmetic intensity (FLOPs / bytes) is below the ridge point (FLOP/s / bytes/s),
else compute-bound. The node's figures come from the ``hardware`` parameter (the node's latest env check, passed
by the control plane) or, when absent, are measured on the device the way the env check measures them (the median
of repeated timings on a buffer past the caches, ``envcheck.measure``); the output says which.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..models.reducer import EXPERT_COUNT_KEYS, TOP_K_KEYS
from ..envcheck.measure import copy_bandwidth, matmul_throughput
from .line_fit import least_squares_line
# The flags are the efficiency rule's (result.Efficiency); named here too, beside the roofline that raises them.
from .result import OVER_CEILING, OVERHEAD_EXPLAINS_ALL, Efficiency  # noqa: F401

FORMULAS = {
    "flops": "2 x active parameters x tokens (active: sum(p.numel()) of the built model, routed experts x top_k / "
             "experts, an untied input embedding left out)",
    "bytes": "weights read once per step + KV cache (prefill writes prompt tokens, each decode token reads its "
             "context) at kv_bytes_per_token",
    "time": "per phase max(flops / flops_per_s, bytes / memory_bandwidth_bytes_per_s); predicted = prefill + decode",
    "steps": "prefill max(ceil(prompt tokens / max_batch_tokens), ceil(prompt chunks / requests per step)); decode "
             "ceil(decode tokens / concurrency)",
    "overhead": "seconds per step = overhead + slope x ceiling seconds per step, fitted over the smallest trials",
    "efficiency": "predicted ceiling seconds / (measured seconds - steps x per-step overhead)",
    "end_to_end_efficiency": "predicted ceiling seconds / measured duration seconds",
    "bound": "memory-bound if flops / bytes < flops_per_s / memory_bandwidth_bytes_per_s (the ridge point)",
}
# The trials the overhead is fitted over: the smallest third by ceiling seconds per step, and at least this many.
OVERHEAD_FIT_MIN_TRIALS = 3


@dataclass(frozen=True)
class ModelCost:
    parameters: int
    active_parameters: int
    dense_weight_bytes: int
    expert_weight_bytes: int
    experts: int
    experts_per_token: int
    # One entry per attention layer: (KV bytes per token, sliding window or None for full attention).
    kv_layers: tuple[tuple[int, int | None], ...]

    @property
    def kv_bytes_per_token(self) -> int:
        return sum(per_token for per_token, _ in self.kv_layers)

    def kv_bytes(self, context: int) -> int:
        """Bytes of KV cache that ``context`` tokens of one sequence occupy (and a decode step reads)."""
        return sum(per_token * (min(context, window) if window else context) for per_token, window in self.kv_layers)

    def weight_bytes_per_step(self, tokens: int) -> float:
        if not self.experts:
            return self.dense_weight_bytes
        touched = self.experts * (1 - (1 - self.experts_per_token / self.experts) ** tokens)
        return self.dense_weight_bytes + self.expert_weight_bytes * touched / self.experts

    def as_dict(self) -> dict:
        return {**asdict(self), "kv_bytes_per_token": self.kv_bytes_per_token}


def _first_int(config, keys) -> int | None:
    return next((getattr(config, key) for key in keys if isinstance(getattr(config, key, None), int)), None)


# Layer types whose cache grows with every token (transformers' names); the others (linear attention, Mamba)
# keep a state of fixed size, which the per-token roofline leaves out.
ATTENTION_LAYER_TYPES = {"full_attention": False, "sliding_attention": True, "chunked_attention": True}


def kv_layers(text_config, activation_bytes: int) -> tuple[tuple[int, int | None], ...]:
    """Per attention layer, the KV bytes a token adds and its window (sliding or chunked), as transformers'
    paged cache sizes them; layers without a per-token cache add none."""
    from transformers.generation.continuous_batching.utils import find_head_dim, find_num_key_value_heads

    per_token = 2 * find_num_key_value_heads(text_config) * find_head_dim(text_config) * activation_bytes
    types = getattr(text_config, "layer_types", None) or ["full_attention"] * text_config.num_hidden_layers
    window = getattr(text_config, "sliding_window", None) or getattr(text_config, "attention_chunk_size", None)
    return tuple((per_token, window if ATTENTION_LAYER_TYPES[kind] else None) for kind in types
                 if kind in ATTENTION_LAYER_TYPES)


def model_cost(model, weight_bytes_of, activation_bytes: int) -> ModelCost:
    """The cost model of a built model; ``weight_bytes_of(module, parameter)`` is a weight's bytes per element at
    the trial precision (1 for int8-quantised linear weights, the parameter's element size otherwise)."""
    text = model.config.get_text_config(decoder=True)
    experts = _first_int(text, EXPERT_COUNT_KEYS) or 0
    top_k = _first_int(text, TOP_K_KEYS) or 0
    input_embedding = model.get_input_embeddings().weight
    output_embedding = model.get_output_embeddings()
    tied = output_embedding is not None and output_embedding.weight is input_embedding
    seen: set[int] = set()
    total = expert_params = dense_bytes = expert_bytes = lookup = 0
    for module_name, module in model.named_modules():
        for parameter in module.parameters(recurse=False):
            if id(parameter) in seen:
                continue
            seen.add(id(parameter))
            count = parameter.numel()
            total += count
            if parameter is input_embedding and not tied:
                lookup = count
                continue
            size = count * weight_bytes_of(module, parameter)
            # Routed experts live under a module named "experts" (fused 3-D tensors in transformers 5, a ModuleList
            # before); shared experts are "shared_expert(s)" and run for every token, like dense weights.
            if experts and "experts" in module_name.split("."):
                expert_params += count
                expert_bytes += size
            else:
                dense_bytes += size
    active = total - lookup - expert_params + (expert_params * top_k // experts if experts else 0)
    return ModelCost(parameters=total, active_parameters=active, dense_weight_bytes=dense_bytes,
                     expert_weight_bytes=expert_bytes, experts=experts if expert_params else 0,
                     experts_per_token=top_k if expert_params else 0,
                     kv_layers=kv_layers(text, activation_bytes))


def hardware_figures(hardware: dict | None, device, precisions: list[str]) -> dict:
    """Memory bandwidth and FLOP/s per precision for the roofline: the given figures where present, measured on
    ``device`` where not. ``source`` says where each figure came from."""
    hardware = dict(hardware or {})
    unknown = set(hardware) - {"memory_bandwidth_bytes_per_s", "flops_per_s"}
    if unknown:
        raise ValueError(f"unknown hardware keys: {', '.join(sorted(unknown))}")
    given_flops = dict(hardware.get("flops_per_s") or {})
    for name, value in [("memory_bandwidth_bytes_per_s", hardware.get("memory_bandwidth_bytes_per_s")),
                        *given_flops.items()]:
        if value is not None and not (isinstance(value, int | float) and value > 0):
            raise ValueError(f"hardware figure {name} must be a positive number, not {value!r}")
    given = "hardware parameter (the node's env check)"
    measured = f"measured by the sweep on {device} as the env check does"
    figures = {"memory_bandwidth_bytes_per_s": hardware.get("memory_bandwidth_bytes_per_s"), "flops_per_s": {},
               "source": {"memory_bandwidth_bytes_per_s": given, "flops_per_s": {}}, "spread": {},
               "formulas": FORMULAS}
    if figures["memory_bandwidth_bytes_per_s"] is None:
        copy = copy_bandwidth(device)
        figures["memory_bandwidth_bytes_per_s"] = copy["bytes_per_s"]
        figures["spread"]["memory_bandwidth_bytes_per_s"] = copy["spread"]
        figures["source"]["memory_bandwidth_bytes_per_s"] = (
            f"{measured}: copy of {copy['size_bytes'] / 2**20:.0f} MiB ({copy['size_from']}), {copy['counting']}, "
            f"median of {copy['repetitions']}")
    for precision in precisions:
        if given_flops.get(precision):
            figures["flops_per_s"][precision] = given_flops[precision]
            figures["source"]["flops_per_s"][precision] = given
            continue
        result = matmul_throughput(device, precision)
        if result["supported"]:
            figures["flops_per_s"][precision] = result["flops_per_s"]
            figures["spread"][precision] = result["spread"]
            figures["source"]["flops_per_s"][precision] = (f"{measured}: {result['n']}^3 matmul, median of "
                                                           f"{result['repetitions']}")
        else:
            figures["flops_per_s"][precision] = None
            figures["source"]["flops_per_s"][precision] = f"not measurable: {result['reason']}"
    return figures


def _phase(flops: float, moved: float, steps: int, flops_per_s: float, bytes_per_s: float) -> dict:
    seconds = max(flops / flops_per_s, moved / bytes_per_s) if steps else 0.0
    intensity = flops / moved if moved else None
    return {"flops": flops, "bytes": moved, "steps": steps, "seconds": seconds,
            "step_seconds": seconds / steps if steps else None, "arithmetic_intensity": intensity,
            "bound": None if intensity is None else bound(intensity, flops_per_s / bytes_per_s)}


def bound(intensity: float, ridge: float) -> str:
    return "compute-bound" if intensity >= ridge else "memory-bound"


def prefill_steps(prompts: list[int], *, max_batch_tokens: int, requests_per_step: int) -> int:
    """Steps that prefill ``prompts`` when a step carries at most ``max_batch_tokens`` tokens and
    ``requests_per_step`` requests, and a prompt longer than max_batch_tokens is split into chunks."""
    if not sum(prompts):
        return 0
    chunks = sum(math.ceil(prompt / max_batch_tokens) for prompt in prompts if prompt)
    return max(math.ceil(sum(prompts) / max_batch_tokens), math.ceil(chunks / max(requests_per_step, 1)))


def predict(cost: ModelCost, lengths: list[tuple[int, int]], *, concurrency: int, max_batch_tokens: int,
            flops_per_s: float, bytes_per_s: float) -> dict:
    """The ceiling time of serving requests of (prompt tokens, output tokens), see the module docstring;
    ``concurrency``: requests a step can carry (the batch size, or fewer when fewer are in flight)."""
    prompt_tokens = sum(prompt for prompt, _ in lengths)
    steps = prefill_steps([prompt for prompt, _ in lengths], max_batch_tokens=max_batch_tokens,
                          requests_per_step=concurrency)
    tokens_per_prefill_step = math.ceil(prompt_tokens / steps) if steps else 0
    prefill = _phase(2 * cost.active_parameters * prompt_tokens,
                     steps * cost.weight_bytes_per_step(tokens_per_prefill_step)
                     + sum(cost.kv_bytes(prompt) for prompt, _ in lengths),
                     steps, flops_per_s, bytes_per_s)
    # The first output token comes out of the prefill step; each later one is a decode step over the context so far.
    decode_tokens = sum(max(output - 1, 0) for _, output in lengths)
    decode_steps = math.ceil(decode_tokens / concurrency) if decode_tokens else 0
    kv_read = sum(cost.kv_bytes(prompt + position) for prompt, output in lengths for position in range(1, output))
    decode = _phase(2 * cost.active_parameters * decode_tokens,
                    decode_steps * cost.weight_bytes_per_step(concurrency) + kv_read,
                    decode_steps, flops_per_s, bytes_per_s)
    flops, moved = prefill["flops"] + decode["flops"], prefill["bytes"] + decode["bytes"]
    ridge = flops_per_s / bytes_per_s
    return {"prefill": prefill, "decode": decode, "seconds": prefill["seconds"] + decode["seconds"],
            "steps": steps + decode_steps, "arithmetic_intensity": flops / moved, "ridge_point": ridge,
            "bound": bound(flops / moved, ridge)}


def _per_step(roofline: dict) -> tuple[float, float]:
    """(ceiling seconds per step, measured seconds per step) of one trial's roofline entry."""
    steps = roofline["steps"]
    return roofline["predicted_seconds"] / steps, roofline["measured_seconds"] / steps


def step_overhead(entries: list[dict]) -> dict | None:
    """The fixed seconds every step costs beyond its bandwidth and compute time, from roofline entries (each with
    ``steps``, ``predicted_seconds``, ``measured_seconds``): a least-squares line of measured seconds per step
    against ceiling seconds per step over the smallest trials (the third with the least work per step, at least
    ``OVERHEAD_FIT_MIN_TRIALS``), whose intercept at zero work is the overhead. Small trials are where the overhead
    dominates, and the line through them extrapolated to no work leaves only it. None without entries."""
    usable = sorted((entry for entry in entries if entry and entry.get("steps")), key=_per_step)
    if not usable:
        return None
    fitted = usable[:max(OVERHEAD_FIT_MIN_TRIALS, math.ceil(len(usable) / 3))]
    points = [_per_step(entry) for entry in fitted]
    ys = [y for _, y in points]
    line = least_squares_line(points)
    if line:
        (intercept, slope), method = line, "intercept of a least-squares line"
    else:
        # One trial, or trials of equal work per step: no line; the least time beyond the ceiling is the overhead.
        slope, intercept, method = 1.0, min(y - x for x, y in points), "least measured - ceiling seconds per step"
    # The overhead cannot be negative, nor more than the fastest fitted step took.
    overhead = min(max(intercept, 0.0), min(ys))
    return {"seconds_per_step": overhead, "slope": slope, "fitted_trials": len(points), "method": method,
            "fitted_points": [{"ceiling_seconds_per_step": x, "measured_seconds_per_step": y} for x, y in points]}


def separate_overhead(entry: dict, overhead_per_step: float) -> dict:
    """One trial's roofline entry with ``steps x overhead`` taken out of its measured time: its efficiency of the
    hardware judged by ``result.Efficiency`` (flagged when above 1, or when no time is left once the overhead is
    out), and ``end_to_end_efficiency`` of the whole."""
    measured, predicted = entry["measured_seconds"], entry["predicted_seconds"]
    overhead = entry["steps"] * overhead_per_step
    hardware = measured - overhead
    itl_step, decode_step = entry.get("measured_decode_step_seconds"), entry["decode"]["step_seconds"]
    decode_hardware = itl_step - overhead_per_step if itl_step else None
    return {**entry, "overhead_seconds": overhead, "overhead_seconds_per_step": overhead_per_step,
            "hardware_seconds": hardware, "end_to_end_efficiency": predicted / measured,
            **Efficiency.judge(predicted, hardware).as_dict(),
            "decode_step_efficiency": decode_step / decode_hardware if decode_step and decode_hardware and
            decode_hardware > 0 else None}
