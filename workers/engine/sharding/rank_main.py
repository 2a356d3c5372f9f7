"""What one rank process runs: ``python -m workers.engine.sharding.rank_main JOB.json``.

The launcher starts it with torchrun's env:// variables (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK).
Every rank builds the same full model on the CPU, proves its weights equal rank 0's, keeps its shard, and runs
prefill + greedy decode; the rank that ends up with the logits (first rank of the last stage) has run the
unsharded fp32 reference first and compares. Progress lines (``progress FRACTION MESSAGE``) go to stderr, where
the launcher reads them; the report goes to ``result-rank<R>.json`` next to the job file.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _progress(fraction: float, message: str) -> None:
    _say(f"progress {fraction:.2f} {message}")


def _exit_with_parent() -> None:
    """End this rank if its launcher dies (a hard time limit kills the node worker): no orphan keeps a device."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _inject(fault, rank: int):
    """The hang/crash/kill test hooks: act on ``rank`` right after prefill, while the others wait in collectives."""
    if fault is None or fault[0] == "corrupt_shard" or fault[1] != rank:
        return None

    def after_step(index: int) -> None:
        if index != 0:
            return
        kind = fault[0]
        what = {"hang": "stops responding", "crash": "crashes", "kill": "is killed"}[kind]
        _say(f"fault {kind}_rank_{rank}: rank {rank} {what} after prefill")
        if kind == "hang":
            while True:
                time.sleep(3600)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected fault crash_rank_{rank}")

    return after_step


def _weights_fingerprint(model) -> float:
    """An order-sensitive float64 checksum of every weight; equal on all ranks iff they built the same model."""
    import torch

    total = torch.zeros((), dtype=torch.float64)
    for index, (_, tensor) in enumerate(sorted(model.state_dict().items())):
        total += tensor.double().sum() * (index + 1) + tensor.double().abs().sum()
    return float(total)


def _check_identical_weights(model, world_size: int, device) -> None:
    from .exchange import all_gather_json

    fingerprints = all_gather_json(_weights_fingerprint(model), world_size, device)
    differing = [rank for rank, value in enumerate(fingerprints) if value != fingerprints[0]]
    if differing:
        raise RuntimeError(f"ranks {differing} built different weights than rank 0 from the same seed "
                           f"(fingerprints {fingerprints}); the sharded run would compare different models")


def _model_summary(config, model) -> dict:
    from .expert_parallel import experts_modules

    experts = next((getattr(config, key) for key in ("num_local_experts", "num_experts", "n_routed_experts")
                    if getattr(config, key, None)), None)
    # DBRX keeps its expert count in ffn_config: the experts modules know it.
    experts = experts or next((module.num_experts for _, _, module in experts_modules(model)), None)
    return {"layers": config.num_hidden_layers, "hidden_size": config.hidden_size,
            "attention_heads": config.num_attention_heads,
            "kv_heads": getattr(config, "num_key_value_heads", None), "vocab_size": config.vocab_size,
            "experts": experts, "experts_per_token": getattr(config, "num_experts_per_tok", None) if experts else None,
            "parameters": sum(parameter.numel() for parameter in model.parameters())}


def _shard(model, layout, stage: int, group, meter, fault) -> tuple[dict, list[list[int]]]:
    """Cut ``model`` down to this rank's part: its pipeline stage, its experts, its tensor-parallel shards."""
    from .expert_parallel import (DenseExpertParallelExperts, ExpertParallelExperts, apply_expert_parallel,
                                  experts_modules)
    from .pipeline_parallel import keep_stage
    from .tensor_parallel import apply_tensor_parallel
    from .verdict import ideal_held_params

    kind = fault[0] if fault else None
    corrupt = kind == "corrupt_shard"
    # corrupt_shard goes to one place, the innermost split the layout has; corrupt_experts to the expert placement.
    corrupt_tp = corrupt and layout.tp > 1
    corrupt_ep = kind == "corrupt_experts" or corrupt and layout.tp == 1 and layout.ep > 1
    sharding = {}
    stages = [[0, model.config.num_hidden_layers - 1]]
    if layout.pp > 1:
        sharding["pipeline"] = keep_stage(model, stage, layout.pp, corrupt=corrupt and layout.group_size == 1)
        stages = sharding["pipeline"]["all_stages"]
    stage_parameters = {name: parameter.numel() for name, parameter in model.named_parameters()}
    expert_prefixes = tuple(f"{name}." for name, _, _ in experts_modules(model))
    ideal = ideal_held_params({name: (parameter.numel(), parameter.dim()) for name, parameter in
                               model.named_parameters()}, expert_prefixes, tp=layout.tp, group_size=layout.group_size)
    if layout.ep > 1:
        sharding["experts"] = apply_expert_parallel(model, group, meter, corrupt=corrupt_ep)
    if layout.tp > 1:
        sharding["tensor"] = apply_tensor_parallel(model, group, meter,
                                                   skip_modules=(ExpertParallelExperts, DenseExpertParallelExperts),
                                                   corrupt=corrupt_tp)
    if layout.group_size > 1:
        sharding["split"] = _split_share(stage_parameters, model, ideal)
    return sharding, stages


def _split_share(stage_parameters: dict[str, int], model, ideal: float) -> dict:
    """How much of its stage's parameters this rank holds after the tensor/expert split, what the layout should
    leave it (``verdict.ideal_held_params``), and the largest parameters that every rank holds whole."""
    held = {name: parameter.numel() for name, parameter in model.named_parameters()}
    whole = sorted(((name, count) for name, count in held.items() if stage_parameters.get(name) == count),
                   key=lambda item: -item[1])
    return {"held_params": sum(held.values()), "stage_params": sum(stage_parameters.values()),
            "ideal_params": ideal, "share": sum(held.values()) / max(sum(stage_parameters.values()), 1),
            "replicated_params": sum(count for _, count in whole),
            "largest_replicated": [{"name": name, "params": count} for name, count in whole[:5]]}


def run_rank(job: dict) -> dict:
    import torch
    import torch.distributed as dist

    from .compare import compare_traces
    from .verdict import exercised_axes, split_verdict
    from .exchange import all_gather_json, broadcast_json
    from ..models import build_random_model, load_checkpoint, load_config
    from .expert_parallel import experts_modules
    from .layout import Layout, parse_fault
    from .measure import CollectiveMeter, RoutingRecorder, peak_memory, routing_summary
    from .pipeline_parallel import stage_forward
    from .reference import greedy_decode, new_cache, reference_trace
    from .tensor_parallel import Group

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    layout = Layout(**job["layout"])
    fault = parse_fault(job.get("fault"), layout.world_size, ep=layout.ep)
    if world_size != layout.world_size:
        raise ValueError(f"WORLD_SIZE {world_size} but the layout needs {layout.world_size} ranks")
    device = torch.device("cuda", local_rank) if job["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    _progress(0.05, f"rank {rank}: joining a world of {world_size} ({backend})")
    # device_id binds the rank to its GPU up front, so nccl's barrier and object collectives use the right one.
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=job["timeout_s"]),
                            device_id=device if device.type == "cuda" else None)
    # new_group is collective over the whole world: every rank creates every stage's group, in the same order.
    handles = [dist.new_group(layout.group_ranks(stage)) for stage in range(layout.pp)] \
        if layout.group_size > 1 else [None] * layout.pp
    stage, group_rank = layout.stage_of(rank), layout.group_rank_of(rank)
    group = Group(handles[stage], group_rank, layout.group_size)
    reporting = rank == layout.reporting_rank
    meter = CollectiveMeter(device)

    _progress(0.15, f"rank {rank}: building the model")
    # Same seed, same CPU build on every rank: every rank holds identical weights before it keeps its shard (the
    # fingerprint check below proves it across machines).
    model = (load_checkpoint(job["weights_path"]) if job.get("weights_path") else
             build_random_model(load_config(job["config"]), dtype=torch.float32, device=torch.device("cpu"),
                                seed=job["seed"]))
    config = model.config
    summary = _model_summary(config, model)
    _check_identical_weights(model, world_size, device)
    generator = torch.Generator().manual_seed(job["seed"] + 1)
    prompt = torch.randint(0, config.vocab_size, (1, job["prompt_tokens"]), generator=generator)

    reference = None
    if reporting:
        _progress(0.3, f"rank {rank}: single-process fp32 reference")
        reference = reference_trace(model, prompt, job["decode_steps"])

    _progress(0.5, f"rank {rank}: sharding (stage {stage}, group rank {group_rank})")
    sharding, stages = _shard(model, layout, stage, group, meter, fault)
    recorder = RoutingRecorder()
    for _, layer_index, experts in experts_modules(model):
        experts.register_forward_pre_hook(recorder.hook(layer_index, summary["experts"]))
    model.to(device=device, dtype=getattr(torch, DTYPES[job["dtype"]]))
    gc.collect()  # the full weights each shard was cut from are garbage now; peak RSS keeps the build's peak
    held_bytes = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())

    first, last = stage == 0, stage == layout.pp - 1
    previous_rank, next_rank = rank - layout.group_size, rank + layout.group_size
    cache = new_cache(model)

    def step(input_ids, position_ids):
        hidden = None
        if not first:
            hidden = torch.empty((1, input_ids.shape[1], config.hidden_size), dtype=model.dtype, device=device)
            meter.recv(hidden, previous_rank)
        output = stage_forward(model, first=first, last=last, input_ids=input_ids, hidden_states=hidden,
                               position_ids=position_ids, cache=cache)
        if not last:
            meter.send(output.contiguous(), next_rank)
            return None
        return output if reporting else None

    def next_token(logits) -> int:
        token = torch.zeros(1, dtype=torch.long, device=device)
        if reporting:
            token[0] = logits[0, -1].argmax()
        if world_size > 1:
            meter.broadcast(token, layout.reporting_rank)
        return int(token)

    _progress(0.6, f"rank {rank}: sharded prefill and {job['decode_steps']} decode steps")
    meter.reset()
    dist.barrier()
    with torch.inference_mode():
        sharded = greedy_decode(step, prompt.to(device), job["decode_steps"], next_token,
                                after_step=_inject(fault, rank))
    decode_seconds = sharded.step_seconds[1:]
    figures = {
        "rank": rank, "node_rank": int(os.environ.get("NODE_RANK", "0")), "local_rank": local_rank,
        "host": socket.gethostname(), "device": str(device), "stage": stage, "group_rank": group_rank,
        "layers": stages[stage], "held_parameter_bytes": held_bytes, **peak_memory(device),
        "prefill_s": sharded.step_seconds[0],
        "decode_s_per_step": sum(decode_seconds) / len(decode_seconds) if decode_seconds else None,
        "decode_s_max": max(decode_seconds, default=None),
        "collectives": meter.report(),
        "corrupted": {kind: part["corrupted"] for kind, part in sharding.items()
                      if isinstance(part, dict) and part.get("corrupted")} or None,
        "split": sharding.get("split"),
        "experts_held": (sharding.get("experts") or {}).get("held"),
        "experts_per_rank": (sharding.get("experts") or {}).get("per_rank"),
        "routing_counts": recorder.counts,
    }
    _progress(0.9, f"rank {rank}: gathering figures")
    gathered = all_gather_json(figures, world_size, device)
    verdict = [broadcast_json(compare_traces(reference, sharded, job["dtype"]) if reporting else None,
                              layout.reporting_rank, device)]
    routing_counts = {}
    for figure in gathered:
        for layer_index, counts in figure.pop("routing_counts").items():
            routing_counts.setdefault(int(layer_index), counts)
    dist.destroy_process_group()

    random_weights = not job.get("weights_path")
    placement = _placement(gathered, layout)
    verdict = verdict[0]
    if placement:
        verdict = {**verdict, "correct": False, "reason": "expert placement: " + " | ".join(placement)}
    report = {
        "architecture": config.model_type, "model_class": type(model).__name__, "model": summary,
        "weights": "random (seed {})".format(job["seed"]) if random_weights else job["weights_path"],
        "world_size": world_size,
        "layout": {**layout.describe(), "label": layout.label(), "stages": stages,
                   "tensor_plan": sharding.get("tensor", {}).get("plan"),
                   "mla": sharding.get("tensor", {}).get("mla"),
                   "experts_per_rank": summary["experts"] // layout.ep if layout.ep > 1 else None},
        "backend": backend, "device": device.type, "dtype": job["dtype"],
        "reference": {"device": "cpu", "dtype": "fp32", "rank": layout.reporting_rank},
        "decode_steps": job["decode_steps"], "prompt_tokens": job["prompt_tokens"],
        "decoding": "greedy with a KV cache (transformers DynamicCache, or the model's own cache class), batch 1",
        **verdict,
        "ranks": gathered,
        "fault": job.get("fault"),
    }
    if routing_counts:
        report["routing"] = routing_summary(routing_counts, layout.ep, random_weights=random_weights)
    if layout.group_size > 1:
        report["split"] = split_verdict([figure["split"] for figure in gathered], layout.group_size)
    report["axes"] = exercised_axes(report["layout"], gathered, sharding.get("tensor"), placement)
    return report


def _placement(gathered: list[dict], layout) -> list[str]:
    """``placement_problems`` for each pipeline stage's expert-parallel group (its ranks in group-rank order)."""
    from .expert_parallel import placement_problems

    problems = []
    for stage in range(layout.pp if layout.ep > 1 else 0):
        group = sorted((figure for figure in gathered if figure["stage"] == stage), key=lambda f: f["group_rank"])
        held = [figure.get("experts_held") or {} for figure in group]
        per_rank = next((figure["experts_per_rank"] for figure in group if figure.get("experts_per_rank")), {})
        problems += placement_problems(held, per_rank)
    return problems


def main(job_path: str) -> int:
    _exit_with_parent()
    job_file = Path(job_path)
    job = json.loads(job_file.read_text())
    report = run_rank(job)
    result = job_file.parent / f"result-rank{os.environ['RANK']}.json"
    result.write_text(json.dumps(report))
    _progress(1.0, f"rank {os.environ['RANK']}: done")
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: after gloo send/recv, destroying its worker threads at exit can abort the
    # process ("terminate called without an active exception") although the run finished and reported.
    os._exit(code)
