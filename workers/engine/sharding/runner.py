"""``run_sharded``: a model of a real architecture split tp x pp x ep over torch.distributed ranks started here (or
joining a world that spans nodes), checked against a single-process fp32 reference."""

from __future__ import annotations

from collections.abc import Callable

from .compare import THRESHOLDS
from .launcher import free_port, launch_ranks
from .layout import Layout, parse_fault, plan_text
from .verdict import summary_line

RENDEZVOUS_KEYS = ("master_addr", "master_port", "world_size", "node_rank", "nproc_per_node")


def _device(requested: str, nproc_per_node: int) -> str:
    if requested == "cpu":
        return "cpu"
    import torch

    gpus = torch.cuda.device_count()
    if requested == "cuda" and gpus < nproc_per_node:
        raise ValueError(f"{nproc_per_node} ranks on this node need {nproc_per_node} GPUs; torch sees {gpus}")
    if requested not in ("cuda", "auto"):
        raise ValueError(f"device must be auto, cpu or cuda, not {requested!r}")
    return "cuda" if gpus >= nproc_per_node else "cpu"


def run_sharded(config: dict | None, *, tp: int = 1, pp: int = 1, ep: int = 1, dtype: str = "fp32",
                decode_steps: int = 16, seed: int = 0, prompt_tokens: int = 8, weights_path: str | None = None,
                shrink: bool = True, device: str = "auto", rendezvous: dict | None = None,
                timeout_s: float = 600.0, fault: str | None = None, planned: dict | None = None,
                progress: Callable[[float, str], None] | None = None) -> dict:
    """Run ``config``'s architecture sharded tp x pp x ep and compare it with the fp32 CPU reference.

    ``config``: an HF config.json dict, reduced by the one model path (``models.reduce_for_layout``: every layer
    kind kept, heads divisible by tp, experts by ep, at least pp layers) unless ``shrink`` is False; ignored when
    ``weights_path`` names a local checkpoint folder. The report's ``reduction`` says what the reduction changed.
    ``dtype``: fp32, bf16 or fp16 for the sharded run (the reference is always CPU fp32). ``device``: auto (GPUs
    when this node has one per local rank), cpu or cuda. ``rendezvous``: master_addr, master_port, world_size,
    node_rank, nproc_per_node to join a multi-node world; without it all ranks run here. ``fault``: a test hook,
    ``corrupt_shard``, ``corrupt_experts`` or ``hang_rank_N`` / ``crash_rank_N`` / ``kill_rank_N``. ``planned``:
    the planner's layout ``{tp, pp, dp, ep}`` this layout was scaled from (``layout.scaled_from_plan``), named in
    the report's ``summary``.

    Returns the report of the whole world (the same on every node). Raises ``ShardedRunError`` when a rank fails
    or the run passes ``timeout_s``.
    """
    layout = Layout(tp=tp, pp=pp, ep=ep)
    if dtype not in THRESHOLDS:
        raise ValueError(f"dtype must be one of {', '.join(THRESHOLDS)}, not {dtype!r}")
    if decode_steps < 0 or prompt_tokens < 1:
        raise ValueError("decode_steps must be >= 0 and prompt_tokens >= 1")
    parse_fault(fault, layout.world_size, ep=layout.ep)
    reduction = None
    if weights_path is None:
        if not isinstance(config, dict):
            raise ValueError("give a config dict or a weights_path")
        if shrink:
            from ..models import reduce_for_layout

            reduction = reduce_for_layout(config, tp=tp, pp=pp, ep=ep)
            config = reduction.config
    if rendezvous is None:
        rendezvous = {"master_addr": "127.0.0.1", "master_port": free_port(), "world_size": layout.world_size,
                      "node_rank": 0, "nproc_per_node": layout.world_size}
    missing = [key for key in RENDEZVOUS_KEYS if key not in rendezvous]
    if missing:
        raise ValueError(f"rendezvous lacks {', '.join(missing)}")
    world_size, nproc, node_rank = (int(rendezvous[key]) for key in ("world_size", "nproc_per_node", "node_rank"))
    if world_size != layout.world_size:
        raise ValueError(f"tp={tp} pp={pp} ep={ep} needs {layout.world_size} ranks; the rendezvous has {world_size}")
    if nproc < 1 or not 0 <= node_rank * nproc < world_size or world_size % nproc:
        raise ValueError(f"node_rank {node_rank} x nproc_per_node {nproc} does not fit a world of {world_size}")
    job = {"config": None if weights_path else config, "weights_path": weights_path,
           "layout": {"tp": tp, "pp": pp, "ep": ep},
           "dtype": dtype, "decode_steps": decode_steps, "seed": seed, "prompt_tokens": prompt_tokens,
           "device": _device(device, nproc), "timeout_s": timeout_s, "fault": fault}
    report = launch_ranks(job, nproc_per_node=nproc, node_rank=node_rank, world_size=world_size,
                          master_addr=str(rendezvous["master_addr"]), master_port=int(rendezvous["master_port"]),
                          timeout_s=timeout_s, progress=progress)
    if reduction is not None:
        report["reduction"] = {"full_layers": reduction.full_layers, "layers": reduction.layers,
                               "notes": reduction.notes}
    if planned:
        report["planned"] = {**planned, "text": plan_text(planned)}
    report["summary"] = summary_line(report)
    return report
