"""Bytes of weights per precision, with the scale overhead of block/group quantization.

- bf16 / fp16: 2 bytes for every parameter.
- fp8: 1 byte per weight of the linear layers plus one fp32 scale per 128 x 128 block, as DeepSeek-V3 and Kimi-K2
  ship it (``weight_block_size`` [128, 128], ``weight_scale_inv`` float32 tensors).
- int8 / int4: group-wise quantization as AWQ (Lin et al. 2024) and GPTQ (Frantar et al. 2023) store it: groups of
  128 consecutive weights along the input dimension, each with an fp16 scale and a zero point of the weight's own
  width (GPTQ's packed ``qzeros``). Symmetric schemes drop the zero point; counting it keeps this an upper bound.

Only the matrices of attention, SSM, MLP and expert layers are quantized. Embeddings, the output head, routers,
norms, biases and other small tensors stay in bf16, as vLLM's and the vendors' quantized checkpoints keep them
(e.g. gpt-oss ``modules_to_not_convert``: embed_tokens, lm_head, router).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .parameters import TensorRecord

HIGH_PRECISION_BYTES = 2
GROUP_SIZE = 128
FP8_BLOCK = 128
QUANTIZED_COMPONENTS = frozenset({"attention", "ssm", "dense_mlp", "routed_experts", "shared_experts",
                                  "mtp_projection"})
KEPT_IN_HIGH_PRECISION = ("embeddings", "lm_head", "router", "norms", "biases, convolutions and other vectors")


@dataclass(frozen=True)
class Precision:
    name: str
    bits: int
    scheme: str  # "none", "block" (fp8 128x128 blocks, fp32 scale) or "group" (groups of 128, fp16 scale + zero)

    def matrix_bytes(self, shape: tuple[int, ...]) -> int:
        numel = math.prod(shape)
        if self.scheme == "none":
            return numel * self.bits // 8
        if self.scheme == "block":
            lead = math.prod(shape[:-2]) if len(shape) > 2 else 1
            rows = shape[-2] if len(shape) > 1 else 1
            blocks = lead * math.ceil(rows / FP8_BLOCK) * math.ceil(shape[-1] / FP8_BLOCK)
            return numel + 4 * blocks
        groups = (numel // shape[-1]) * math.ceil(shape[-1] / GROUP_SIZE)
        # Weights, then per group a 16-bit scale and a zero point as wide as the weights.
        return math.ceil((numel * self.bits + groups * (16 + self.bits)) / 8)


PRECISIONS = {
    "bf16": Precision("bf16", 16, "none"),
    "fp16": Precision("fp16", 16, "none"),
    "fp8": Precision("fp8", 8, "block"),
    "int8": Precision("int8", 8, "group"),
    "int4": Precision("int4", 4, "group"),
}


def precision_named(name: str) -> Precision:
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ValueError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}") from None


def is_quantized(record: TensorRecord) -> bool:
    return record.matrix and record.component in QUANTIZED_COMPONENTS


def tensor_bytes(record: TensorRecord, precision: Precision) -> int:
    if precision.scheme != "none" and is_quantized(record):
        return precision.matrix_bytes(record.shape)
    return record.numel * HIGH_PRECISION_BYTES


def weights_bytes(records: list[TensorRecord], precision: Precision) -> int:
    return sum(tensor_bytes(record, precision) for record in records)


def weights_report(records: list[TensorRecord], mtp: list[TensorRecord]) -> tuple[dict, dict]:
    """(bytes per precision, details: what is quantized, what stays bf16, scale overhead, MTP weights)."""
    quantized = sum(record.numel for record in records if is_quantized(record))
    high = sum(record.numel for record in records) - quantized
    by_precision = {name: weights_bytes(records, precision) for name, precision in PRECISIONS.items()}
    details = {
        "quantized_params": quantized,
        "high_precision_params": high,
        "high_precision_dtype": "bf16",
        "kept_in_high_precision": list(KEPT_IN_HIGH_PRECISION),
        "scale_overhead_bytes": {
            name: by_precision[name] - quantized * precision.bits // 8 - high * HIGH_PRECISION_BYTES
            for name, precision in PRECISIONS.items() if precision.scheme != "none"},
        "schemes": {
            "bf16": "2 bytes per parameter",
            "fp16": "2 bytes per parameter",
            "fp8": f"1 byte per quantized weight + one fp32 scale per {FP8_BLOCK}x{FP8_BLOCK} block",
            "int8": f"1 byte per quantized weight + per group of {GROUP_SIZE}: fp16 scale + 8-bit zero point",
            "int4": f"0.5 byte per quantized weight + per group of {GROUP_SIZE}: fp16 scale + 4-bit zero point",
        },
        "mtp_weights_bytes": {name: weights_bytes(mtp, precision) for name, precision in PRECISIONS.items()}
        if mtp else None,
    }
    return by_precision, details
