"""Sharded validation runs (a job's ``sharded_run`` stage) as the pages read them.

The pages read the engine's report as the node stored it on the stage run (``workers/engine/sharding``): the
verdict against the single-process fp32 reference and what each rank measured. A multi-node run has one stage run
per node, each holding the report of the whole world; the pages show it once.

Time split per rank: the collective meter runs over exactly the timed prefill and decode steps, so
compute = (prefill + decode) - collectives. Collective time is wall time inside the call, which includes waiting
for the slowest peer: on a pipeline stage a ``recv`` holds the bubble, on CPU an all_reduce holds the other
rank's skew. "Communication" here is therefore time not spent computing, not bytes over bandwidth.
"""


from __future__ import annotations

from workers.engine.sharding.layout import Layout

from ..choices import JobStatus
from ..models import StageRun

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
    """"EP2 × TP1", "TP2 × PP2" (``Layout.label``)."""
    return Layout(**{axis: int(layout.get(axis, 1)) for axis in ("tp", "pp", "ep")}).label()


AXIS_NAMES = {"tp": "tensor parallelism", "ep": "expert parallelism", "pp": "pipeline parallelism"}


def axis_lines(axes: dict) -> list[str]:
    """The verdict's exercised axes (``workers/engine/sharding/verdict.exercised_axes``) as sentences."""
    lines = []
    for axis, figures in axes.items():
        said = f"{axis.upper()}{figures['size']} ({AXIS_NAMES.get(axis, axis)}): " + \
            ("exercised" if figures.get("exercised") else "NOT exercised")
        if axis == "ep":
            said += f", {figures.get('experts_per_rank')} experts per rank, {figures.get('all_to_all_calls', 0)} " \
                    "all_to_all calls; " + (figures["placement"] if figures.get("placement_ok", True) else
                                             "experts on the wrong ranks: " + " | ".join(figures["placement"]))
        elif axis == "tp":
            said += f", {figures.get('all_reduce_calls', 0)} all_reduce calls" + \
                (f"; MLA {figures['mla']}" if figures.get("mla") else "")
        elif axis == "pp":
            said += f", {figures.get('send_calls', 0)} activations sent between stages"
        lines.append(said)
    return lines


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
    shares = {figure["rank"]: figure for figure in (report.get("split") or {}).get("ranks", [])}
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
            "held_share": _percent(shares[rank["rank"]]["held_share"]) if rank["rank"] in shares else None,
            "ideal_share": _percent(shares[rank["rank"]]["ideal_share"]) if rank["rank"] in shares else None,
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


def run_figures(report: dict, node_names: list[str]) -> dict:
    """What the run page shows of a report: per-rank rows, the verdict's figures as text, the pass criteria, the
    ranks whose shard a fault hook corrupted."""
    ranks = rank_rows(report, node_names)
    return {
        "ranks": ranks,
        "layout": layout_label(report.get("layout") or {}),
        "max_abs_diff": _scientific(report.get("max_abs_diff")),
        "mean_abs_diff": _scientific(report.get("mean_abs_diff")),
        "max_rel_diff": _relative(report.get("max_rel_diff")),
        "top1_agreement": _percent(report.get("top1_agreement")),
        "thresholds": threshold_lines(report.get("thresholds") or {}),
        "corrupted": [(row["rank"], ", ".join(f"{kind} {name}" for kind, name in row["corrupted"].items()))
                      for row in ranks if row["corrupted"]],
        "split": _split(report.get("split")),
        "axes": axis_lines(report.get("axes") or {}),
    }


def _split(split: dict | None) -> dict | None:
    """The split verdict as the page words it (shares as percentages)."""
    if not split:
        return None
    return {**split, "largest": _percent(split["largest_share"]), "ideal": _percent(split["ideal_share"]),
            "replicated": _percent(split["replicated_share"])}


def one_run_per_job(runs) -> list[dict]:
    """One row per run for the comparison: a multi-node run's stage runs share one report; a failed node's run
    stands for them all. Each row: the stage run, its node count and its ``run_summary`` (None unless it
    succeeded)."""
    by_job: dict[int, StageRun] = {}
    node_count: dict[int, int] = {}
    for run in runs:
        node_count[run.job_id] = node_count.get(run.job_id, 0) + 1
        chosen = by_job.get(run.job_id)
        if chosen is None or (run.status == JobStatus.FAILED and chosen.status != JobStatus.FAILED):
            by_job[run.job_id] = run
    return [{"run": run, "nodes": node_count[run.job_id], "summary": run_summary(
        run.result if run.status == JobStatus.SUCCEEDED else None)} for run in by_job.values()]
