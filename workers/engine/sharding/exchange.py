"""Plain data between ranks, as JSON in uint8 tensors.

torch.distributed's ``*_object`` collectives unpickle what peers send, so a rogue rank (or anything that can reach
the rendezvous port) could run code in every rank. Ranks here exchange only tensors: a value is JSON-encoded,
sent as bytes, and decoded as JSON — data, never code.
"""

from __future__ import annotations

import json


def _encode(value, device):
    import torch

    return torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8).to(device)


def _decode(tensor, length: int):
    return json.loads(tensor[:length].cpu().numpy().tobytes().decode())


def all_gather_json(value, world_size: int, device) -> list:
    """Every rank's ``value``, in rank order (``all_gather_object`` without pickle)."""
    import torch
    import torch.distributed as dist

    mine = _encode(value, device)
    lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world_size)]
    dist.all_gather(lengths, torch.tensor([mine.numel()], dtype=torch.int64, device=device))
    sizes = [int(length.item()) for length in lengths]
    padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    padded[:mine.numel()] = mine
    gathered = [torch.zeros(max(sizes), dtype=torch.uint8, device=device) for _ in range(world_size)]
    dist.all_gather(gathered, padded)
    return [_decode(tensor, size) for tensor, size in zip(gathered, sizes, strict=True)]


def broadcast_json(value, src: int, device):
    """Rank ``src``'s ``value`` on every rank (``broadcast_object_list`` without pickle)."""
    import torch
    import torch.distributed as dist

    mine = _encode(value, device) if dist.get_rank() == src else None
    length = torch.tensor([mine.numel() if mine is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(length, src=src)
    buffer = mine if mine is not None else torch.zeros(int(length.item()), dtype=torch.uint8, device=device)
    dist.broadcast(buffer, src=src)
    return _decode(buffer, int(length.item()))
