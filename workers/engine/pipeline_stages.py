"""How a model's layers are split into pipeline stages: one rule for the planner's plans and the sharded runs that
check them (a module of its own, so that planning imports nothing of the sharded runs)."""

from __future__ import annotations


def stage_layer_ranges(num_layers: int, pp: int) -> list[range]:
    """Contiguous layer ranges, one per stage, split as vLLM splits them (``get_pp_indices`` in
    vllm/distributed/utils.py): as even as possible, the extra layers going to the stages before the last, from the
    second-to-last backwards (61 layers: PP2 [31, 30], PP4 [15, 15, 16, 15]). The last stage never takes one: it
    also holds the final norm and the LM head."""
    if pp > num_layers:
        raise ValueError(f"pp={pp} stages need at least {pp} layers; the model has {num_layers}")
    base, extra = divmod(num_layers, pp)
    lengths = [base] * pp
    for stage in range(pp - 1 - extra, pp - 1):
        lengths[stage] += 1
    ranges, start = [], 0
    for length in lengths:
        ranges.append(range(start, start + length))
        start += length
    return ranges
