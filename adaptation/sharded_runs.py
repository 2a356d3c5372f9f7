"""Pages for sharded validation runs (a job's ``sharded_run`` stage): the run page and the comparison of runs.

Both read the engine's report as the node stored it on the stage run (``workers/engine/sharding``): the verdict
against the single-process fp32 reference and what each rank measured. A multi-node run has one stage run per
node, each holding the report of the whole world; the pages show it once.

Time split per rank: the collective meter runs over exactly the timed prefill and decode steps, so
compute = (prefill + decode) - collectives. Collective time is wall time inside the call, which includes waiting
for the slowest peer: on a pipeline stage a ``recv`` holds the bubble, on CPU an all_reduce holds the other
rank's skew. "Communication" here is therefore time not spent computing, not bytes over bandwidth.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render

from .choices import JobStatus
from .models import ModelSpec, StageRun

KIND = "sharded_run"


def _scientific(value) -> str:
    return "—" if value is None else f"{value:.2e}"


def _percent(value) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def _relative(value) -> str:
    """A fraction of the logit scale: a percentage where bf16/fp16 rounding shows, else scientific (fp32)."""
    return "—" if value is None else _percent(value) if value >= 1e-4 else f"{value:.2e}"


def _milliseconds(seconds) -> float | None:
    return None if seconds is None else seconds * 1e3


def layout_label(layout: dict) -> str:
    return f"tp{layout.get('tp', 1)} pp{layout.get('pp', 1)} ep{layout.get('ep', 1)}"


def threshold_lines(thresholds: dict) -> list[str]:
    """The engine's pass criteria for the run's dtype (``compare.THRESHOLDS``), as sentences."""
    lines = []
    if "max_abs_diff" in thresholds:
        lines.append(f"max abs diff ≤ {thresholds['max_abs_diff']:.0e}")
    if thresholds.get("greedy_match"):
        lines.append("greedy tokens identical to the reference")
    if "max_rel_diff" in thresholds:
        lines.append(f"max diff ≤ {_percent(thresholds['max_rel_diff'])} of the largest reference logit")
    if "min_top1_agreement" in thresholds:
        lines.append(f"top-1 agreement ≥ {_percent(thresholds['min_top1_agreement'])}")
    return lines


def rank_rows(report: dict, node_names: list[str]) -> list[dict]:
    """One row per rank: where it ran, what it held, and its time split into compute and collectives."""
    decode_steps = report.get("decode_steps") or 0
    rows = []
    for rank in report.get("ranks", []):
        collectives = rank.get("collectives") or {}
        busy = (rank.get("prefill_s") or 0.0) + (rank.get("decode_s_per_step") or 0.0) * decode_steps
        collective_s = collectives.get("seconds") or 0.0
        node_rank = rank.get("node_rank", 0)
        layers = rank.get("layers") or []
        rows.append({
            "rank": rank["rank"],
            "node": node_names[node_rank] if node_rank < len(node_names) else f"node rank {node_rank}",
            "host": rank.get("host", ""),
            "device": rank.get("device", ""),
            "stage": rank.get("stage"),
            "layers": f"{layers[0]}–{layers[1]}" if len(layers) == 2 else "—",
            "held_parameter_bytes": rank.get("held_parameter_bytes"),
            "peak_rss_bytes": rank.get("peak_rss_bytes"),
            "peak_device_bytes": rank.get("peak_device_bytes"),
            "prefill_ms": _milliseconds(rank.get("prefill_s")),
            "decode_ms_per_step": _milliseconds(rank.get("decode_s_per_step")),
            "collective_s": collective_s,
            "collective_bytes": collectives.get("bytes") or 0,
            "collective_kinds": ", ".join(f"{kind} ×{figure['calls']}"
                                          for kind, figure in (collectives.get("by_kind") or {}).items()),
            "compute_s": max(busy - collective_s, 0.0),
            "corrupted": rank.get("corrupted"),
        })
    return rows


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


def run_summary(report: dict | None) -> dict | None:
    """The figures the comparison lists for one run; the slowest rank sets a decode step's time."""
    if not report:
        return None
    rows = rank_rows(report, [])
    decode = [row["decode_ms_per_step"] for row in rows if row["decode_ms_per_step"] is not None]
    busy = sum(row["compute_s"] + row["collective_s"] for row in rows)
    share = sum(row["collective_s"] for row in rows) / busy if busy else None
    return {
        "layout": layout_label(report.get("layout") or {}),
        "world_size": report.get("world_size"),
        "dtype": report.get("dtype"),
        "correct": report.get("correct"),
        "max_abs_diff": report.get("max_abs_diff"),
        "max_abs_diff_text": _scientific(report.get("max_abs_diff")),
        "slowest_decode_ms_per_step": max(decode, default=None),
        "collective_share": share,
        "collective_share_text": _percent(share),
    }


@login_required
def sharded_run_page(request, pk):
    run = get_object_or_404(StageRun.objects.for_user(request.user).filter(kind=KIND)
                            .select_related("job", "job__model", "job__cluster")
                            .defer("job__log", "job__model__config", "job__model__analysis"), pk=pk)
    # The control plane creates a multi-node run's stage runs in node_rank order (services.stage_assignments).
    node_names = list(StageRun.objects.filter(job_id=run.job_id, kind=KIND).order_by("id")
                      .values_list("node_name", flat=True))
    report = run.result if run.status == JobStatus.SUCCEEDED else None
    context = {"run": run, "job": run.job, "report": report, "node_names": node_names}
    if report:
        ranks = rank_rows(report, node_names)
        context.update(
            ranks=ranks,
            layout=layout_label(report.get("layout") or {}),
            max_abs_diff=_scientific(report.get("max_abs_diff")),
            mean_abs_diff=_scientific(report.get("mean_abs_diff")),
            max_rel_diff=_relative(report.get("max_rel_diff")),
            top1_agreement=_percent(report.get("top1_agreement")),
            thresholds=threshold_lines(report.get("thresholds") or {}),
            corrupted=[(row["rank"], ", ".join(f"{kind} {name}" for kind, name in row["corrupted"].items()))
                       for row in ranks if row["corrupted"]],
            chart_data={"ranks": ranks, "routing": routing_heatmap(report)},
        )
    return render(request, "adaptation/sharded_run.html", context)


@login_required
def compare_runs_page(request, pk):
    spec = get_object_or_404(ModelSpec.objects.for_user(request.user).select_related("team"), pk=pk)
    runs = (StageRun.objects.for_user(request.user).filter(kind=KIND, job__model=spec)
            .select_related("job").defer("error_traceback", "job__log", "job__error_traceback")
            .order_by("-job__created", "job_id", "id"))
    # One row per run: a multi-node run's stage runs share one report; a failed node's run stands for them all.
    by_job: dict[int, StageRun] = {}
    node_count: dict[int, int] = {}
    for run in runs:
        node_count[run.job_id] = node_count.get(run.job_id, 0) + 1
        chosen = by_job.get(run.job_id)
        if chosen is None or (run.status == JobStatus.FAILED and chosen.status != JobStatus.FAILED):
            by_job[run.job_id] = run
    rows = [{"run": run, "nodes": node_count[run.job_id], "summary": run_summary(
        run.result if run.status == JobStatus.SUCCEEDED else None)} for run in by_job.values()]
    chart = [{"label": f"#{row['run'].job_id} {row['summary']['layout']} {row['summary']['dtype']}"
                       + (f" ×{row['nodes']} nodes" if row["nodes"] > 1 else ""),
              "decode_ms_per_step": row["summary"]["slowest_decode_ms_per_step"],
              "correct": row["summary"]["correct"]}
             for row in reversed(rows) if row["summary"]]
    return render(request, "adaptation/sharded_run_compare.html", {"spec": spec, "rows": rows, "chart": chart})
