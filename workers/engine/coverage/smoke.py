"""Run each traced operator alone on the device, with its recorded signature and random floating inputs.

The trace shows an operator ran inside the model; the smoke test shows it runs on its own with that signature,
which separates "this kernel works" from "the model happened to route around it", and gives a per-operator
pass/fail list that a vendor can reproduce without the model.
"""

from __future__ import annotations

import time

import torch

from .tracing import first_line, materialize_example


def synchronize(device: torch.device) -> None:
    if device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize()


def smoke_test(operator, example: tuple | None, device: torch.device, generator: torch.Generator) -> dict:
    """``{"passed": bool, "seconds": float, "error": str | None}``; no example means nothing to replay."""
    if example is None:
        return {"passed": None, "seconds": 0.0, "error": "no example call was recorded"}
    started = time.perf_counter()
    try:
        args, kwargs = materialize_example(example, device, generator)
        with torch.no_grad():
            operator(*args, **kwargs)
        synchronize(device)
    except Exception as error:  # every failure is a result here, whatever its type
        return {"passed": False, "seconds": round(time.perf_counter() - started, 6),
                "error": f"{type(error).__name__}: {first_line(error)}"}
    return {"passed": True, "seconds": round(time.perf_counter() - started, 6), "error": None}


def smoke_test_all(operators: dict, device: torch.device, *, seed: int = 0) -> dict[str, dict]:
    generator = torch.Generator().manual_seed(seed)
    return {name: smoke_test(record.overload, record.example, device, generator)
            for name, record in sorted(operators.items())}
