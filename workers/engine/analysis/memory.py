"""Bytes of weights per precision, with the scale overhead of block/group quantization.

- bf16 / fp16: 2 bytes for every parameter.
- fp8: 1 byte per weight of the linear layers plus one fp32 scale per 128 x 128 block, as DeepSeek-V3 and Kimi-K2
  ship it (``weight_block_size`` [128, 128], ``weight_scale_inv`` float32 tensors).
- int8 / int4: group-wise quantization as AWQ (Lin et al. 2024) and GPTQ (Frantar et al. 2023) store it: groups of
  128 consecutive weights along the input dimension, each with an fp16 scale and a zero point of the weight's own
  width (GPTQ's packed ``qzeros``). Symmetric schemes drop the zero point; counting it keeps this an upper bound.
- mxfp4: the OCP microscaling format gpt-oss ships its experts in: blocks of 32 FP4 (E2M1) values, 16 bytes, and
  one E8M0 scale byte per block (``*_blocks`` and ``*_scales``), 4.25 bits per weight. Only the routed experts:
  vLLM's ``Mxfp4Config`` quantizes fused-MoE layers and runs every linear layer unquantized.
- as_shipped: each tensor as the release stores it (``shipped.py`` reads its ``quantization_config``).

Only the matrices of attention, SSM, MLP and expert layers are quantized. Embeddings, the output head, routers,
norms, biases and other small tensors stay in bf16, as vLLM's and the vendors' quantized checkpoints keep them
(e.g. gpt-oss ``modules_to_not_convert``: embed_tokens, lm_head, router). So does the MTP projection ``eh_proj``:
DeepSeek's FP8 checkpoint stores it in bf16 (no ``weight_scale_inv``), and vLLM builds it as a plain
``nn.Linear`` (``model_executor/models/deepseek_mtp.py``) whatever the quantization.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .parameter_counts import TensorRecord

HIGH_PRECISION_BYTES = 2
GROUP_SIZE = 128
FP8_BLOCK = 128
MX_BLOCK = 32
QUANTIZED_COMPONENTS = frozenset({"attention", "ssm", "dense_mlp", "routed_experts", "shared_experts"})
KEPT_IN_HIGH_PRECISION = ("embeddings", "lm_head", "router", "norms", "MTP projection (eh_proj)",
                          "biases, convolutions and other vectors")


@dataclass(frozen=True)
class Precision:
    name: str
    bits: int
    # "none"; "block": fp8, one fp32 scale per block (``block`` None: one per matrix); "group": integers, per group
    # of ``group`` weights an fp16 scale and a zero point; "mx": microscaling, per group one E8M0 byte;
    # "as_shipped": each tensor in the precision its record says the release stores it in.
    scheme: str
    group: int = GROUP_SIZE
    block: tuple[int, int] | None = (FP8_BLOCK, FP8_BLOCK)
    quantizes: frozenset[str] = QUANTIZED_COMPONENTS

    def matrix_bytes(self, shape: tuple[int, ...]) -> int:
        numel = math.prod(shape)
        if self.scheme == "none":
            return numel * self.bits // 8
        lead = math.prod(shape[:-2]) if len(shape) > 2 else 1
        if self.scheme == "block":
            if self.block is None:
                return numel + 4 * lead
            rows = shape[-2] if len(shape) > 1 else 1
            blocks = lead * math.ceil(rows / self.block[0]) * math.ceil(shape[-1] / self.block[1])
            return numel + 4 * blocks
        # Groups run along the last dimension. gpt-oss stores experts [E, in, out], but both of its widths are
        # multiples of 32, so the count of blocks is the same either way.
        groups = (numel // shape[-1]) * math.ceil(shape[-1] / self.group)
        if self.scheme == "mx":
            return math.ceil(numel * self.bits / 8) + groups
        # Weights, then per group a 16-bit scale and a zero point as wide as the weights.
        return math.ceil((numel * self.bits + groups * (16 + self.bits)) / 8)

    def quantizes_record(self, record: TensorRecord) -> bool:
        return self.scheme != "none" and record.matrix and record.component in self.quantizes


BF16 = Precision("bf16", 16, "none")
PRECISIONS = {
    "bf16": BF16,
    "fp16": Precision("fp16", 16, "none"),
    "fp8": Precision("fp8", 8, "block"),
    "int8": Precision("int8", 8, "group"),
    "int4": Precision("int4", 4, "group"),
    "mxfp4": Precision("mxfp4", 4, "mx", group=MX_BLOCK, quantizes=frozenset({"routed_experts"})),
    "as_shipped": Precision("as_shipped", 0, "as_shipped"),
}
SCHEMES = {
    "bf16": "2 bytes per parameter",
    "fp16": "2 bytes per parameter",
    "fp8": f"1 byte per quantized weight + one fp32 scale per {FP8_BLOCK}x{FP8_BLOCK} block",
    "int8": f"1 byte per quantized weight + per group of {GROUP_SIZE}: fp16 scale + 8-bit zero point",
    "int4": f"0.5 byte per quantized weight + per group of {GROUP_SIZE}: fp16 scale + 4-bit zero point",
    "mxfp4": f"routed-expert weights in MXFP4: 0.5 byte per weight + one E8M0 scale byte per block of {MX_BLOCK} "
             "(4.25 bits); every other tensor bf16 (vLLM's MXFP4 method quantizes MoE experts only)",
    "as_shipped": "each tensor as the release stores it (see as_shipped)",
}


def precision_named(name: str | Precision) -> Precision:
    if isinstance(name, Precision):
        return name
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ValueError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}") from None


def is_quantized(record: TensorRecord, precision: Precision = PRECISIONS["fp8"]) -> bool:
    if precision.scheme == "as_shipped":
        return record.shipped is not None and record.shipped.quantizes_record(record)
    return precision.quantizes_record(record)


def tensor_bytes(record: TensorRecord, precision: Precision) -> int:
    if precision.scheme == "as_shipped":
        # A record the release format was never applied to (a planner model built from bare records) is bf16.
        precision = record.shipped or BF16
        if precision.scheme == "none":
            return precision.matrix_bytes(record.shape)
    if precision.quantizes_record(record):
        return precision.matrix_bytes(record.shape)
    return record.numel * HIGH_PRECISION_BYTES


def weights_bytes(records: list[TensorRecord], precision: Precision) -> int:
    return sum(tensor_bytes(record, precision) for record in records)


def weights_report(records: list[TensorRecord], mtp: list[TensorRecord], shipped: dict | None = None,
                   mtp_modules: int = 0) -> tuple[dict, dict]:
    """(bytes per precision, details: what is quantized, what stays bf16, scale overhead, MTP weights, and the
    release as shipped: ``shipped`` is ``ShippedFormat.describe()``; with ``mtp_modules`` MTP modules, the
    checkpoint also stores the embedding and output head once more per module, as DeepSeek's does)."""
    by_precision = {name: weights_bytes(records, precision) for name, precision in PRECISIONS.items()}
    total = sum(record.numel for record in records)
    overhead = {}
    for name, precision in PRECISIONS.items():
        if precision.scheme in ("none", "as_shipped"):
            continue
        quantized = sum(record.numel for record in records if is_quantized(record, precision))
        overhead[name] = by_precision[name] - math.ceil(quantized * precision.bits / 8) \
            - (total - quantized) * HIGH_PRECISION_BYTES
    fp8_quantized = sum(record.numel for record in records if is_quantized(record))
    details = {
        "quantized_params": fp8_quantized,
        "high_precision_params": total - fp8_quantized,
        "high_precision_dtype": "bf16",
        "kept_in_high_precision": list(KEPT_IN_HIGH_PRECISION),
        "scale_overhead_bytes": overhead,
        "schemes": dict(SCHEMES),
        "mtp_weights_bytes": {name: weights_bytes(mtp, precision) for name, precision in PRECISIONS.items()}
        if mtp else None,
        "as_shipped": _as_shipped(records, mtp, shipped, mtp_modules) if shipped is not None else None,
    }
    return by_precision, details


def _as_shipped(records: list[TensorRecord], mtp: list[TensorRecord], shipped: dict, mtp_modules: int) -> dict:
    precision = PRECISIONS["as_shipped"]
    weights = weights_bytes(records, precision)
    mtp_bytes = weights_bytes(mtp, precision)
    ends = [record for record in records if record.component in ("embeddings", "lm_head")]
    # A tied table is stored once in the main model but each MTP module keeps its own embedding and head.
    copies = weights_bytes(ends, precision) * (1 if any(r.component == "lm_head" for r in ends) else 2)
    by_format: dict[str, int] = {}
    for record in records + mtp:
        name = (record.shipped or BF16).name
        by_format[name] = by_format.get(name, 0) + record.numel
    return {
        **shipped,
        "weights_bytes": weights,
        "params_by_format": by_format,
        "mtp_bytes": mtp_bytes if mtp else None,
        # What the release's safetensors hold: main model, MTP modules and their own embedding and head copies.
        "checkpoint_bytes": weights + mtp_bytes + mtp_modules * copies if mtp else weights,
    }
