"""Greedy decoding with a KV cache, shared by the single-process reference and the sharded run.

One prefill of the prompt, then ``decode_steps`` steps that each feed the previous greedy token and reuse the
transformers ``DynamicCache`` (no recomputation of the sequence). The trace keeps the float32 logits of every
position the rank has: all prompt positions at prefill, the last position at each decode step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Trace:
    tokens: list[int] = field(default_factory=list)
    logits: list = field(default_factory=list)  # [prompt, vocab] then [vocab] per step; empty on non-last stages
    step_seconds: list[float] = field(default_factory=list)


def greedy_decode(step: Callable, prompt_ids, decode_steps: int, next_token: Callable, *,
                  after_step: Callable[[int], None] | None = None) -> Trace:
    """Run prefill + ``decode_steps`` decode steps.

    ``step(input_ids, position_ids)`` returns logits [1, q, vocab] on ranks that have them, else None;
    ``next_token(logits_or_none)`` returns the token every rank continues with (an argmax, or a broadcast of it).
    ``after_step(index)`` runs after each step (0 = prefill); fault injection hooks in there.
    """
    import torch

    trace = Trace()
    inputs = prompt_ids
    past = 0
    for index in range(decode_steps + 1):
        started = time.perf_counter()
        positions = torch.arange(past, past + inputs.shape[1], device=inputs.device).unsqueeze(0)
        logits = step(inputs, positions)
        token = next_token(logits)
        trace.step_seconds.append(time.perf_counter() - started)
        if logits is not None:
            step_logits = logits[0] if index == 0 else logits[0, -1]
            trace.logits.append(step_logits.detach().float().cpu())
        trace.tokens.append(token)
        past += inputs.shape[1]
        inputs = torch.tensor([[token]], device=prompt_ids.device)
        if after_step is not None:
            after_step(index)
    return trace


def new_cache(model):
    """An empty KV cache of the kind the model's forward accepts: transformers' ``DynamicCache`` built from the
    config (it lays out sliding, linear-attention and state-space layers itself), or the cache class of the model's
    own module where it declares one (MiniMax's ``MiniMaxCache`` keeps its lightning-attention states apart and
    refuses any other)."""
    import inspect
    import sys

    from transformers import DynamicCache

    module = sys.modules.get(type(model).__module__)
    own = [value for value in vars(module).values() if isinstance(value, type) and issubclass(value, DynamicCache)
           and value is not DynamicCache and value.__module__ == module.__name__] if module else []
    if not own:
        return DynamicCache(config=model.config)
    cache_class = own[0]
    takes_config = "config" in inspect.signature(cache_class.__init__).parameters
    return cache_class(config=model.config) if takes_config else cache_class()


def reference_trace(model, prompt_ids, decode_steps: int) -> Trace:
    """The unsharded model, in one process, on the CPU in float32: what every sharded run must reproduce."""
    import torch

    cache = new_cache(model)

    def step(input_ids, position_ids):
        return model(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True).logits

    with torch.inference_mode():
        return greedy_decode(step, prompt_ids, decode_steps, lambda logits: int(logits[0, -1].argmax()))
