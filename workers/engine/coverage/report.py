"""The operator-coverage report: reduce the model, trace it on the node's device, classify every operator for
the backend (the device's own, or a virtual one from an operator list), smoke-test them, check mechanisms and
torch.compile. Plain data in and out, so the node's Celery task, the command line and tests share it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

import torch

from ..models.loading import build_meta_model, build_random_model, causal_lm_config, load_config
from ..models.reducer import compare_module_classes, parameter_count, reduce_config
from .classify import classify_trace, summarise
from .compile_check import compile_check, skipped
from .mechanisms import check_mechanisms
from .smoke import smoke_test_all
from .tracing import trace_model
from .virtual_backend import Backend, device_backend, load_backend, virtual_backend

Progress = Callable[[float, str], None]
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "half": torch.float16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32}
# Operators that reveal which fused attention kernel, grouped GEMM or float8 GEMM a virtual backend offers.
LISTED_MECHANISMS = {
    "sdpa_flash": ("aten::_scaled_dot_product_flash_attention", "aten::_flash_attention_forward"),
    "sdpa_memory_efficient": ("aten::_scaled_dot_product_efficient_attention", "aten::_efficient_attention_forward"),
    "sdpa_cudnn": ("aten::_scaled_dot_product_cudnn_attention",),
    "sdpa_overrideable": ("aten::_scaled_dot_product_fused_attention_overrideable",),
    "grouped_mm": ("aten::_grouped_mm",),
    "scaled_mm_float8": ("aten::_scaled_mm",),
}


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of bf16, fp16, fp32") from None


def resolve_device(device=None) -> torch.device:
    """The device to check: the one given, else this node's accelerator, else the CPU."""
    if device is not None:
        return torch.device(device)
    if hasattr(torch, "accelerator") and torch.accelerator.is_available():
        return torch.accelerator.current_accelerator()
    return torch.device("cpu")


def resolve_backend(device: torch.device, backend_list) -> Backend:
    """The device's own backend, or a virtual one from a list of operator names or a list file's path."""
    if backend_list is None:
        return device_backend(device)
    if isinstance(backend_list, str | os.PathLike):
        return load_backend(backend_list, device=device)
    if isinstance(backend_list, dict):  # {"name": ..., "operators": [...]}, as the control plane sends them
        return virtual_backend(list(backend_list["operators"]), name=backend_list["name"], device=device)
    return virtual_backend(list(backend_list), device=device)


def listed_mechanisms(backend: Backend) -> dict:
    """A virtual backend cannot run anything: its mechanisms are read from the operators it lists."""
    return {"virtual": True, **{mechanism: any(backend.lists(name) for name in names)
                                for mechanism, names in LISTED_MECHANISMS.items()}}


def run_coverage(config: dict, *, dtype: str = "bf16", device=None, backend_list: Iterable[str] | str | None = None,
                 progress: Progress | None = None, decode_steps: int = 3, prompt_tokens: int = 8,
                 check_compile: bool = True, compile_backend: str | None = None, smoke: bool = True,
                 seed: int = 0) -> dict:
    """Operator coverage of the model ``config`` (a config.json dict) for one dtype.

    ``backend_list`` (operator names, the path of a CSV/JSON list, or a shipped backend's name) judges a virtual
    backend instead of the device's own; the trace still runs on ``device``. Raises ValueError for a config that
    cannot be loaded or reduced; anything that goes wrong later (an operator without a kernel, a model that stops,
    a failed compile) is reported, never raised. See ``classify`` for the statuses.
    """
    progress = progress or (lambda fraction, message: None)
    timings: dict[str, float] = {}
    started = time.perf_counter()

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - since, 3)
        return now

    device = resolve_device(device)
    backend = resolve_backend(device, backend_list)
    torch_type = torch_dtype(dtype)
    progress(0.0, "reducing the model")
    full_config = load_config(config)
    full_model = build_meta_model(full_config)
    reduction = reduce_config(config, full_model=full_model)
    since = lap("reduce", started)

    progress(0.2, "building the reduced model")
    model = build_random_model(load_config(reduction.config), dtype=torch_type, device=device, seed=seed)
    classes = compare_module_classes(full_model, model)
    since = lap("build", since)

    progress(0.3, "tracing prefill and decode")
    trace = trace_model(model, prompt_tokens=prompt_tokens, decode_steps=decode_steps, seed=seed)
    since = lap("trace", since)

    progress(0.5, "classifying operators")
    operators = classify_trace(trace.operators, backend, seed=seed)
    summary = summarise(operators)
    since = lap("classify", since)

    smoke_summary = None
    if smoke and not backend.virtual:
        progress(0.6, "smoke-testing each operator")
        results = smoke_test_all(trace.operators, device, seed=seed)
        for entry in operators:
            entry["smoke"] = results[entry["name"]]
        smoke_summary = {"passed": sum(result["passed"] is True for result in results.values()),
                         "failed": sorted(name for name, result in results.items() if result["passed"] is False)}
        since = lap("smoke", since)

    progress(0.7, "checking attention, grouped GEMM and float8")
    if backend.virtual:
        mechanisms = listed_mechanisms(backend)
    else:
        mechanisms = check_mechanisms(causal_lm_config(full_config), [torch_type], device, backend.dispatch_key)
    since = lap("mechanisms", since)

    progress(0.8, "checking torch.compile")
    if backend.virtual:
        compiled = skipped("a virtual backend cannot compile")
    elif not check_compile:
        compiled = skipped("compile check turned off (--no-compile)")
    elif trace.error:
        compiled = skipped("the model did not run eagerly on this device")
    else:
        input_ids = torch.randint(0, reduction.config["vocab_size"], (1, prompt_tokens),
                                  generator=torch.Generator().manual_seed(seed)).to(device)
        compiled = compile_check(model, input_ids, backend=compile_backend)
    lap("compile", since)
    timings["total"] = round(time.perf_counter() - started, 3)
    progress(0.95, "report ready")

    import transformers

    return {
        "model_type": config.get("model_type"),
        "architecture": type(model).__name__,
        "backend": backend.as_dict(),
        "device": str(device),
        "dtype": dtype,
        "coverage": summary["coverage"],
        "gaps": summary["gaps"],
        "summary": summary,
        "operators": operators,
        "smoke": smoke_summary,
        "mechanisms": mechanisms,
        "compile": compiled,
        "trace": {"prompt_tokens": trace.prompt_tokens, "decode_steps": trace.decode_steps,
                  "seconds": round(trace.seconds, 3), "error": trace.error,
                  "operator_calls": sum(record.count for record in trace.operators.values())},
        "reduced_config": reduction.config,
        "reduction": {**reduction.as_dict(), "parameters": parameter_count(model),
                      "full_parameters": parameter_count(full_model)},
        "module_classes_match": classes["match"],
        "module_classes": classes,
        "timings": timings,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
