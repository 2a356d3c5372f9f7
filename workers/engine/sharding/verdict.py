"""What a sharded run proves, beyond "the logits match": which parallel axes it really exercised, how much of its
stage's weights each rank holds against what the layout should leave it, whether every expert sits on the rank its
tokens are sent to, and one line that says it all ("EP2 × TP1 on 2 ranks (plan DP16 + EP16 on 16 devices): matched
the reference, ...").

The ideal share is the layout's, not 1/ranks: tensor parallelism divides every matrix of the model (embedding and
LM head by vocabulary) except the MoE router and MLA's latent down-projections, which every rank needs whole;
expert parallelism divides the routed experts and leaves the rest whole on each rank, as DP attention keeps it;
vectors (norms, biases) stay whole. A rank holding more than that by over ``HELD_TOLERANCE`` is weakly sharded:
the run validates less than its layout claims (gpt-oss's plan at tp=2 kept its attention whole; before MLA was
split by heads, a reduced Kimi-K2 kept 44 % of its weights whole on each rank).
"""

from __future__ import annotations

import re

HELD_TOLERANCE = 0.10
# Kept whole by design on every tensor-parallel rank: routers and MLA's latent down-projections (see module doc).
_WHOLE_BY_DESIGN = re.compile(r"\.(gate|router|q_a_proj|kv_a_proj_with_mqa)(\.|$)")


def ideal_held_params(parameters: dict[str, tuple[int, int]], expert_prefixes: tuple[str, ...], *, tp: int,
                      group_size: int) -> float:
    """The parameters a rank of this layout should hold, from its stage's ``{name: (numel, dims)}``: routed experts
    divided over the group (by EP, or by TP within each expert), other matrices by tp, the rest whole."""
    held = 0.0
    for name, (count, dims) in parameters.items():
        if name.startswith(expert_prefixes):
            held += count / group_size
        elif tp > 1 and dims >= 2 and not _WHOLE_BY_DESIGN.search(name):
            held += count / tp
        else:
            held += count
    return held


def split_verdict(splits: list[dict], group_size: int) -> dict:
    """Each rank's held share of its stage's parameters beside the layout's ideal (``ideal_held_params``), whether
    every rank is within ``HELD_TOLERANCE`` of it, and what the rank holding the most keeps whole."""
    ranks = []
    for rank, split in enumerate(splits):
        stage = max(split["stage_params"], 1)
        ideal = split["ideal_params"] / stage
        ranks.append({"rank": rank, "held_share": split["share"], "ideal_share": ideal,
                      "off_ideal": split["share"] / ideal - 1 if ideal else None})
    worst = max(range(len(splits)), key=lambda rank: splits[rank]["share"])
    return {"even_share": 1 / group_size, "ideal_share": ranks[worst]["ideal_share"],
            "largest_share": splits[worst]["share"], "ranks": ranks, "tolerance": HELD_TOLERANCE,
            "within_tolerance": all(abs(rank["off_ideal"] or 0) <= HELD_TOLERANCE for rank in ranks),
            "weakly_sharded": any((rank["off_ideal"] or 0) > HELD_TOLERANCE for rank in ranks),
            "replicated_share": splits[worst]["replicated_params"] / max(splits[worst]["stage_params"], 1),
            "largest_replicated": splits[worst]["largest_replicated"]}


def exercised_axes(layout: dict, ranks: list[dict], tensor: dict | None, placement: list[str]) -> dict:
    """Per axis of the layout: whether the run went through it, and how it shows (collectives issued, experts
    per rank, MLA split by heads or why not). An axis of size 1 is absent."""
    calls = {}
    for rank in ranks:
        for kind, figure in ((rank.get("collectives") or {}).get("by_kind") or {}).items():
            calls[kind] = calls.get(kind, 0) + figure["calls"]
    axes = {}
    if layout["ep"] > 1:
        axes["ep"] = {"size": layout["ep"], "exercised": calls.get("all_to_all", 0) > 0,
                      "placement_ok": not placement,
                      "experts_per_rank": layout.get("experts_per_rank"),
                      "all_to_all_calls": calls.get("all_to_all", 0),
                      "placement": "every expert on the rank its tokens are sent to" if not placement else placement}
    if layout["tp"] > 1:
        mla = (tensor or {}).get("mla")
        axes["tp"] = {"size": layout["tp"], "exercised": bool((tensor or {}).get("plan")) and
                      calls.get("all_reduce", 0) > 0, "all_reduce_calls": calls.get("all_reduce", 0)}
        if mla:
            axes["tp"]["mla"] = ("split by heads, latent down-projections whole" if mla.get("split")
                                 else f"kept whole: {mla.get('kept_whole')}")
    if layout["pp"] > 1:
        axes["pp"] = {"size": layout["pp"], "exercised": calls.get("send", 0) > 0, "send_calls": calls.get("send", 0)}
    return axes


def _share(value: float) -> str:
    return f"{value * 100:.1f} %"


def summary_line(report: dict) -> str:
    """One line: the layout, the plan it stands for, the verdict and its reason, what each rank holds, the axes."""
    layout = report.get("layout") or {}
    label = layout.get("label") or "one rank"
    planned = report.get("planned")
    head = f"{label} on {report.get('world_size', '?')} ranks" + (f" (plan {planned['text']})" if planned else "")
    if report.get("correct"):
        verdict = (f"matched the reference (max |Δ logit| {report['max_abs_diff']:.1e}, "
                   f"{report['greedy_tokens_matching']}/{report['greedy_tokens']} greedy tokens)")
    else:
        verdict = "did NOT match the reference: " + (report.get("reason") or (
            f"max |Δ logit| {report.get('max_abs_diff', float('nan')):.1e}, "
            f"{report.get('greedy_tokens_matching', '?')}/{report.get('greedy_tokens', '?')} greedy tokens"))
    parts = [verdict]
    split = report.get("split")
    if split:
        shares = [rank["held_share"] for rank in split["ranks"]]
        held = _share(min(shares)) if max(shares) - min(shares) < 5e-4 else \
            f"{_share(min(shares))}–{_share(max(shares))}"
        parts.append(f"each rank holds {held} of its stage's weights (ideal {_share(split['ideal_share'])}"
                     f"{'' if split['within_tolerance'] else ', NOT within 10 %'})")
    axes = report.get("axes") or {}
    if axes:
        shown = []
        for axis, figures in axes.items():
            text = f"{axis.upper()}{figures['size']}" + ("" if figures["exercised"] else " NOT exercised")
            if axis == "ep" and figures.get("experts_per_rank"):
                text += f" ({figures['experts_per_rank']} experts per rank" + \
                    ("" if figures["placement_ok"] else ", on the wrong ranks") + ")"
            if axis == "tp" and figures.get("mla"):
                text += f" (MLA {figures['mla']})"
            shown.append(text)
        parts.append("axes: " + ", ".join(shown))
    return f"{head}: {'; '.join(parts)}"
