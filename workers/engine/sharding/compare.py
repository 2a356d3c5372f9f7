"""Is the sharded run the same computation as the reference? Logit differences, top-1 agreement, greedy tokens.

Logits are compared position by position only while both runs have fed the same tokens: after the first greedy
token that differs the two runs continue different sequences and their logits no longer describe the same thing.

Thresholds per dtype. fp32 must match to 1e-4 absolute (sharding only reorders sums: TP splits a dot product
into partial sums, EP adds expert outputs in another order) and give identical greedy tokens. A bf16/fp16 run
against the fp32 reference differs by rounding: bf16 keeps 8 significant bits (relative step 2^-8 = 0.4 %), fp16
11 (2^-11), and the error grows through the layers, so the bound is relative to the largest reference logit, and
greedy tokens may part where two candidates are closer than that rounding; what is required there is that the
tokens the reference prefers are still preferred at nearly every compared position. The bounds are about three
times what correct 2-layer runs show (bf16 0.6-0.8 %, fp16 0.09 % of the logit scale); a mis-split shard is
off by 8 % and more.
"""

from __future__ import annotations

THRESHOLDS = {
    "fp32": {"max_abs_diff": 1e-4, "greedy_match": True},
    "bf16": {"max_rel_diff": 0.025, "min_top1_agreement": 0.9},
    "fp16": {"max_rel_diff": 0.004, "min_top1_agreement": 0.95},
}


def compare_traces(reference, sharded, dtype: str) -> dict:
    import torch

    threshold = THRESHOLDS[dtype]
    compared = []
    for index, (expected, actual) in enumerate(zip(reference.logits, sharded.logits, strict=True)):
        if reference.tokens[:index] != sharded.tokens[:index]:
            break  # the inputs differ from here on
        compared.append((expected.reshape(-1, expected.shape[-1]), actual.reshape(-1, actual.shape[-1])))
    expected = torch.cat([pair[0] for pair in compared])
    actual = torch.cat([pair[1] for pair in compared])
    difference = (expected - actual).abs()
    max_abs = float(difference.max())
    scale = float(expected.abs().max())
    top1 = float((expected.argmax(-1) == actual.argmax(-1)).float().mean())
    matching = next((index for index, (a, b) in enumerate(zip(reference.tokens, sharded.tokens, strict=True))
                     if a != b), len(reference.tokens))
    greedy_match = matching == len(reference.tokens)
    if dtype == "fp32":
        correct = max_abs <= threshold["max_abs_diff"] and greedy_match
    else:
        correct = max_abs / scale <= threshold["max_rel_diff"] and top1 >= threshold["min_top1_agreement"]
    worst = int(difference.max(-1).values.argmax())
    return {
        "correct": correct,
        "max_abs_diff": max_abs,
        "max_rel_diff": max_abs / scale if scale else None,
        "mean_abs_diff": float(difference.mean()),
        "reference_logit_scale": scale,
        "top1_agreement": top1,
        "compared_positions": expected.shape[0],
        "worst_position": worst,
        "greedy_match": greedy_match,
        "greedy_tokens_matching": matching,
        "greedy_tokens": len(reference.tokens),
        "tokens": {"reference": reference.tokens, "sharded": sharded.tokens},
        "thresholds": {"dtype": dtype, **threshold},
    }
