"""Chart data of the sharded-run pages (``static/js/sharded_run.js`` and ``sharded_run_compare.js`` draw it)."""

from __future__ import annotations


def routing_heatmap(report: dict) -> dict | None:
    """Tokens routed to each expert in each MoE layer (layers × experts), with each expert's EP rank."""
    routing = report.get("routing")
    if not routing:
        return None
    layers = sorted(routing["layers"], key=int)
    tokens = [routing["layers"][layer]["tokens_per_expert"] for layer in layers]
    experts = len(tokens[0]) if tokens else 0
    ep = (report.get("layout") or {}).get("ep", 1)
    per_rank = experts // ep if ep > 1 else None
    return {
        "layers": [f"layer {layer}" for layer in layers],
        "experts": [f"expert {index}" + (f" · rank {index // per_rank}" if per_rank else "") for index in
                    range(experts)],
        "tokens": tokens,
        "imbalance": [routing["layers"][layer]["imbalance"] for layer in layers],
        "ep_rank_imbalance": [routing["layers"][layer].get("ep_rank_imbalance") for layer in layers],
        "warning": routing.get("warning", ""),
    }


def decode_time_chart(rows: list[dict]) -> list[dict]:
    """The comparison's bars, oldest run first: each run's slowest decode step and whether it was correct."""
    return [{"label": f"#{row['run'].job_id} {row['summary']['layout']} {row['summary']['dtype']}"
                      + (f" ×{row['nodes']} nodes" if row["nodes"] > 1 else ""),
             "decode_ms_per_step": row["summary"]["slowest_decode_ms_per_step"],
             "correct": row["summary"]["correct"]}
            for row in reversed(rows) if row["summary"]]
