"""Mechanisms a serving stack picks at run time, beyond single operators: which scaled-dot-product-attention
backends take the model's head dims and dtypes, flash-attn, grouped GEMM for MoE, and float8 dtypes.

Each check runs a tiny call on the device and records whether it worked and, if not, the first reason torch gave.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import time
import warnings

import torch
import torch.nn.functional as F

from .classify import has_kernel
from .tracing import dtype_name, first_line

SDPA_SEQUENCE = 16
FLOAT8_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


def attention_shapes(text_config) -> list[dict]:
    """The attention head layout of the full model: query/key and value head dims, heads and KV heads.

    MLA (DeepSeek) attends with ``qk_nope_head_dim + qk_rope_head_dim`` for queries and keys and ``v_head_dim``
    for values, with as many KV heads as query heads once the latent is expanded.
    """
    heads = text_config.num_attention_heads
    if getattr(text_config, "kv_lora_rank", None) and getattr(text_config, "qk_nope_head_dim", None):
        query = text_config.qk_nope_head_dim + text_config.qk_rope_head_dim
        return [{"query_head_dim": query, "value_head_dim": text_config.v_head_dim, "heads": heads,
                 "kv_heads": heads, "kind": "mla"}]
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
    kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
    return [{"query_head_dim": head_dim, "value_head_dim": head_dim, "heads": heads, "kv_heads": kv_heads,
             "kind": "mha" if kv_heads == heads else "gqa"}]


def _attempt(call) -> dict:
    """Run ``call``; the result says whether it worked, how long it took and, if not, why (errors, warnings)."""
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
        except Exception as error:  # every failure is a result here
            reasons = [first_line(warning.message) for warning in caught][:3]
            return {"works": False, "error": f"{type(error).__name__}: {first_line(error)}", "reasons": reasons}
    return {"works": True, "seconds": round(time.perf_counter() - started, 6)}


def _run_sdpa(backend: str, shape: dict, query_heads: int, query_length: int, dtype: torch.dtype,
              device: torch.device) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    query = torch.randn(1, query_heads, query_length, shape["query_head_dim"], dtype=dtype, device=device)
    key = torch.randn(1, 1, SDPA_SEQUENCE, shape["query_head_dim"], dtype=dtype, device=device)
    value = torch.randn(1, 1, SDPA_SEQUENCE, shape["value_head_dim"], dtype=dtype, device=device)
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        F.scaled_dot_product_attention(query, key, value, is_causal=query_length > 1, enable_gqa=query_heads > 1)


def sdpa_backends(shapes: list[dict], dtypes: list[torch.dtype], device: torch.device) -> list[dict]:
    """Try each SDPA backend alone for prefill (causal) and decode (one query) with the model's head layout."""
    from torch.nn.attention import SDPBackend

    backends = [backend for backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH",
                                         "OVERRIDEABLE") if hasattr(SDPBackend, backend)]
    results = []
    for shape in shapes:
        # One KV head with the model's group size: the GQA ratio is what kernels constrain, not the head count.
        query_heads = min(shape["heads"] // shape["kv_heads"], 16)
        for dtype in dtypes:
            for backend in backends:
                entry = {"backend": backend.lower(), "dtype": dtype_name(dtype), **shape}
                for phase, query_length in (("prefill", SDPA_SEQUENCE), ("decode", 1)):
                    entry[phase] = _attempt(functools.partial(_run_sdpa, backend, shape, query_heads, query_length,
                                                              dtype, device))
                entry["usable"] = entry["prefill"]["works"] and entry["decode"]["works"]
                results.append(entry)
    return results


def flash_attn_packages() -> dict:
    """Whether the flash-attn packages (FA2 ``flash_attn``, FA3 ``flash_attn_interface``) import here."""
    found = {}
    for package in ("flash_attn", "flash_attn_interface"):
        if importlib.util.find_spec(package) is None:
            found[package] = {"importable": False, "error": "not installed"}
            continue
        try:
            module = importlib.import_module(package)
        except Exception as error:  # a broken install (ABI mismatch, no GPU) is a finding, not a crash
            found[package] = {"importable": False, "error": f"{type(error).__name__}: {first_line(error)}"}
        else:
            found[package] = {"importable": True, "version": getattr(module, "__version__", None)}
    return found


def grouped_gemm(device: torch.device, dispatch_key: str, dtype: torch.dtype) -> dict:
    """``torch._grouped_mm`` (MoE expert GEMMs in one call): present, kernel for this key, and a run."""
    if not hasattr(torch, "_grouped_mm"):
        return {"available": False, "works": False, "error": "this torch has no torch._grouped_mm"}
    operator = torch.ops.aten._grouped_mm.default
    kernel = dispatch_key if has_kernel(operator, dispatch_key) else (
        "CompositeExplicitAutograd (a loop of mm)" if has_kernel(operator, "CompositeExplicitAutograd") else None)

    def call():
        tokens = torch.randn(16, 64, dtype=dtype, device=device)
        weights = torch.randn(4, 64, 32, dtype=dtype, device=device)
        offsets = torch.tensor([4, 8, 12, 16], dtype=torch.int32, device=device)
        torch._grouped_mm(tokens, weights, offs=offsets)

    return {"available": True, "kernel": kernel, "dtype": dtype_name(dtype), **_attempt(call)}


def float8_support(device: torch.device) -> dict:
    """Each float8 dtype: whether it exists in this torch and casts on the device; ``_scaled_mm`` with e4m3."""
    support = {}
    for name in FLOAT8_DTYPES:
        dtype = getattr(torch, name, None)
        if dtype is None:
            support[name] = {"exists": False}
            continue
        support[name] = {"exists": True, **_attempt(
            lambda dtype=dtype: torch.randn(8, 8, device=device).to(dtype).to(torch.float32))}

    def scaled_mm():
        left = torch.randn(16, 32, device=device).to(torch.float8_e4m3fn)
        right = torch.randn(16, 32, device=device).to(torch.float8_e4m3fn).t()
        scale = torch.tensor(1.0, device=device)
        torch._scaled_mm(left, right, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)

    support["scaled_mm_e4m3"] = _attempt(scaled_mm)
    return support


def check_mechanisms(text_config, dtypes: list[torch.dtype], device: torch.device, dispatch_key: str) -> dict:
    shapes = attention_shapes(text_config)
    sdpa = sdpa_backends(shapes, dtypes, device)
    return {
        "attention_shapes": shapes,
        "sdpa": sdpa,
        "sdpa_usable": sorted({entry["backend"] for entry in sdpa if entry["usable"]}),
        "flash_attn": flash_attn_packages(),
        "grouped_mm": grouped_gemm(device, dispatch_key, dtypes[0]),
        "float8": float8_support(device),
    }
