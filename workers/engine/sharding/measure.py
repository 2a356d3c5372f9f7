"""What each rank measures: the collectives it issues, its peak memory, and where an MoE router sends tokens.

Collective bytes are the payload this rank hands to the call (its input tensor; for all_to_all the send buffer),
not the bytes on the wire, which depend on the algorithm the backend picks. On GPUs each call is followed by a
synchronize so its time is the collective's, not the launch's; that serialises work, which a validation run
can afford.
"""

from __future__ import annotations

import resource
import sys
import time
from collections import defaultdict

RANDOM_ROUTING_WARNING = ("routing figures come from random weights: a trained router sends tokens differently, "
                          "so the imbalance shown here says nothing about the real model")


def _payload_bytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


class CollectiveMeter:
    """Issues torch.distributed calls for the sharded model and counts calls, payload bytes and seconds per kind."""

    def __init__(self, device):
        self.device = device
        self.figures: dict[str, dict] = defaultdict(lambda: {"calls": 0, "bytes": 0, "seconds": 0.0})

    def reset(self) -> None:
        self.figures.clear()

    def _timed(self, kind: str, payload: int, operation) -> None:
        started = time.perf_counter()
        operation()
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
        figure = self.figures[kind]
        figure["calls"] += 1
        figure["bytes"] += payload
        figure["seconds"] += time.perf_counter() - started

    def all_reduce(self, tensor, group) -> None:
        import torch.distributed as dist

        self._timed("all_reduce", _payload_bytes(tensor), lambda: dist.all_reduce(tensor, group=group))

    def all_gather(self, tensor, group, group_size: int):
        import torch
        import torch.distributed as dist

        gathered = [torch.empty_like(tensor) for _ in range(group_size)]
        self._timed("all_gather", _payload_bytes(tensor), lambda: dist.all_gather(gathered, tensor, group=group))
        return gathered

    def all_to_all(self, output, send, output_split_sizes, input_split_sizes, group) -> None:
        import torch.distributed as dist

        self._timed("all_to_all", _payload_bytes(send), lambda: dist.all_to_all_single(
            output, send, output_split_sizes, input_split_sizes, group=group))

    def send(self, tensor, destination: int) -> None:
        import torch.distributed as dist

        self._timed("send", _payload_bytes(tensor), lambda: dist.send(tensor, destination))

    def recv(self, tensor, source: int) -> None:
        import torch.distributed as dist

        self._timed("recv", _payload_bytes(tensor), lambda: dist.recv(tensor, source))

    def broadcast(self, tensor, source: int) -> None:
        import torch.distributed as dist

        self._timed("broadcast", _payload_bytes(tensor), lambda: dist.broadcast(tensor, source))

    def report(self) -> dict:
        kinds = {kind: dict(figure) for kind, figure in sorted(self.figures.items())}
        return {"by_kind": kinds, "seconds": sum(figure["seconds"] for figure in kinds.values()),
                "bytes": sum(figure["bytes"] for figure in kinds.values())}


def peak_memory(device) -> dict:
    """Peak resident memory of this process, and peak allocated device memory on a GPU."""
    # ru_maxrss is KiB on Linux and bytes on macOS (getrusage(2) on each).
    rss_unit = 1 if sys.platform == "darwin" else 1024
    figures = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * rss_unit}
    if device.type == "cuda":
        import torch

        figures["peak_device_bytes"] = torch.cuda.max_memory_allocated(device)
    return figures


class RoutingRecorder:
    """Counts the (token, expert) assignments an MoE router makes in each layer it runs on this rank."""

    def __init__(self):
        self.counts: dict[int, list[int]] = {}

    def hook(self, layer_index: int, expert_count: int):
        """A forward pre-hook for an experts module called as ``experts(hidden, top_k_index, top_k_weights)``."""
        import torch

        def record(_module, args):
            if len(args) < 2:
                return  # experts that run every token weighted (Llama-4) have no assignments to count
            top_k_index = args[1]
            counted = torch.bincount(top_k_index.reshape(-1).cpu(), minlength=expert_count).tolist()
            previous = self.counts.get(layer_index, [0] * expert_count)
            self.counts[layer_index] = [a + b for a, b in zip(previous, counted, strict=True)]

        return record


def routing_summary(counts_by_layer: dict[int, list[int]], expert_parallel: int, *, random_weights: bool) -> dict:
    """Per MoE layer: tokens per expert and the imbalance factor max/mean.

    max/mean is 1.0 for a perfectly balanced router; minus one it is MaxVio, the imbalance measure of
    "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts" (Wang et al., arXiv:2408.15664).
    With expert parallelism the same factor is given per rank, since the busiest rank sets the step time.
    """
    layers = {}
    for layer_index, counts in sorted(counts_by_layer.items()):
        mean = sum(counts) / len(counts)
        figures = {"tokens_per_expert": counts, "imbalance": max(counts) / mean if mean else None}
        if expert_parallel > 1:
            per_rank = len(counts) // expert_parallel
            by_rank = [sum(counts[rank * per_rank:(rank + 1) * per_rank]) for rank in range(expert_parallel)]
            rank_mean = sum(by_rank) / expert_parallel
            figures.update(tokens_per_ep_rank=by_rank, ep_rank_imbalance=max(by_rank) / rank_mean if rank_mean
                           else None)
        layers[str(layer_index)] = figures
    summary = {"layers": layers, "imbalance_max": max((figures["imbalance"] or 0) for figures in layers.values())}
    if random_weights:
        summary["warning"] = RANDOM_ROUTING_WARNING
    return summary
