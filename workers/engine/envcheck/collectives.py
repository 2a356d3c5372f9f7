"""Collective bus bandwidth across a node's devices with torch.distributed (nccl on GPUs, gloo on CPU processes).

Ranks are separate processes started with ``subprocess`` (a Celery prefork child is daemonic and may not use
multiprocessing to fork children), rendezvousing over TCP on 127.0.0.1 like torchrun's env:// method. Rank 0
prints the timings as JSON; a rank that hangs is killed at the deadline so nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

from .busbw import bus_bandwidth

COLLECTIVES = ("all_reduce", "all_gather", "all_to_all")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure_collectives(world_size: int, backend: str, size_bytes: int = 16 * 2**20, iterations: int = 5,
                        timeout: float = 60.0) -> dict:
    """Time each collective over ``world_size`` local ranks; figures per collective in bytes/s (nccl-tests)."""
    port = _free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "workers.engine.envcheck.collectives", "--backend", backend,
               "--size-bytes", str(size_bytes), "--iterations", str(iterations)]
    ranks = [subprocess.Popen(command, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(world_size)]
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for process in ranks:
            outputs.append(process.communicate(timeout=max(0.1, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        return {"error": f"collective ranks did not finish within {timeout:g}s", "backend": backend,
                "world_size": world_size}
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()
    failed = [(rank, err) for rank, (process, (_, err)) in enumerate(zip(ranks, outputs, strict=True))
              if process.returncode]
    if failed:
        rank, err = failed[0]
        return {"error": f"rank {rank} failed: {err.strip().splitlines()[-1] if err.strip() else 'no output'}",
                "backend": backend, "world_size": world_size}
    timings = json.loads(outputs[0][0])
    results = {}
    for name, seconds in timings["seconds"].items():
        if seconds is None:
            results[name] = {"error": timings["errors"].get(name, "not supported")}
            continue
        # nccl-tests sizes: each rank's buffer for all_reduce/all_to_all, the gathered output for all_gather.
        counted = size_bytes * world_size if name == "all_gather" else size_bytes
        results[name] = {"size_bytes": counted, "seconds": seconds,
                         **bus_bandwidth(name, counted, seconds, world_size)}
    return {"backend": backend, "world_size": world_size, "results": results}


def _rank_main(backend: str, size_bytes: int, iterations: int) -> None:
    import torch
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    elements = size_bytes // 4
    send = torch.ones(elements, dtype=torch.float32, device=device)
    gathered = [torch.empty_like(send) for _ in range(world_size)]
    exchanged = torch.empty_like(send)
    operations = {
        "all_reduce": lambda: dist.all_reduce(send),
        "all_gather": lambda: dist.all_gather(gathered, send),
        "all_to_all": lambda: dist.all_to_all_single(exchanged, send),
    }
    seconds, errors = {}, {}
    for name, operation in operations.items():
        try:
            operation()  # warm-up: connection set-up is not bandwidth
            if device.type == "cuda":
                torch.cuda.synchronize()
            dist.barrier()
            started = time.perf_counter()
            for _ in range(iterations):
                operation()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds[name] = (time.perf_counter() - started) / iterations
        except (RuntimeError, NotImplementedError) as error:  # e.g. a backend without all_to_all
            seconds[name], errors[name] = None, f"{type(error).__name__}: {error}".splitlines()[0]
        dist.barrier()
    if rank == 0:
        print(json.dumps({"seconds": seconds, "errors": errors}))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["gloo", "nccl"], required=True)
    parser.add_argument("--size-bytes", type=int, required=True)
    parser.add_argument("--iterations", type=int, default=5)
    arguments = parser.parse_args()
    _rank_main(arguments.backend, arguments.size_bytes, arguments.iterations)
