"""The precision a release ships in: its ``quantization_config`` when the config has one, else its dtype.

Each tensor record is given the precision its checkpoint stores it in, so the ``as_shipped`` precision of
memory.py sizes the release as downloaded and the planner plans it as served:

- ``mxfp4`` (gpt-oss): the routed experts' weights in MXFP4; ``modules_to_not_convert`` (attention, router,
  embeddings, lm_head) and everything else in bf16;
- ``fp8`` (DeepSeek-V3/V3.2, Kimi-K2, MiniMax-M2): the linear weights in FP8 with one fp32 scale per
  ``weight_block_size`` block (one per matrix without it); the modules listed in ``modules_to_not_convert``,
  embeddings, lm_head, routers, norms and the MTP projection in bf16;
- ``awq`` / ``gptq``: ``bits``-wide integers in groups of ``group_size``, each with an fp16 scale and zero point.

A module is "not converted" by transformers' own rule (``should_convert_module``: a prefix or regex up to a module
boundary, or a suffix). Names are those of the model transformers builds; the generic estimate's own names
("layers.0.attention.q") match no vendor pattern, so there only the component rules apply.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..models.config_loading import ConfigView
from .memory import BF16, MX_BLOCK, PRECISIONS, Precision
from .parameter_counts import TensorRecord

# The dtype the unquantized tensors are served in. vLLM's dtype "auto" serves a float32 checkpoint in 16 bits, so a
# float32 release counts as bf16 here, as the planner needs it.
DTYPES = {"bfloat16": BF16, "bf16": BF16, "float16": PRECISIONS["fp16"], "fp16": PRECISIONS["fp16"],
          "half": PRECISIONS["fp16"]}
MODELLED = ("mxfp4", "fp8", "awq", "gptq")


@dataclass(frozen=True)
class ShippedFormat:
    method: str | None              # quant_method as the config writes it; None for an unquantized release
    precision: Precision | None     # how the quantized tensors are stored; None when nothing is quantized
    dtype: Precision                # every other tensor
    not_converted: tuple[str, ...]  # modules_to_not_convert
    note: str

    def stored_as(self, record: TensorRecord) -> Precision:
        if self.precision is None or not self.precision.quantizes_record(record):
            return self.dtype
        if self.not_converted and not _converted(record.name.rpartition(".")[0], self.not_converted):
            return self.dtype
        return self.precision

    def apply(self, records: list[TensorRecord]) -> list[TensorRecord]:
        return [dataclasses.replace(record, shipped=self.stored_as(record)) for record in records]

    def describe(self) -> dict:
        precision = self.precision
        return {
            "method": self.method,
            "format": precision.name if precision else self.dtype.name,
            "block": list(precision.block) if precision and precision.scheme == "block" and precision.block
            else None,
            "group": precision.group if precision and precision.scheme in ("group", "mx") else None,
            "bits_per_quantized_weight": _bits_per_weight(precision) if precision else None,
            "quantized_components": sorted(precision.quantizes) if precision else [],
            "modules_to_not_convert": list(self.not_converted),
            "unquantized_dtype": self.dtype.name,
            "note": self.note,
        }


def _converted(module: str, patterns: tuple[str, ...]) -> bool:
    from transformers.quantizers.quantizers_utils import should_convert_module

    return should_convert_module(module, list(patterns))


def _bits_per_weight(precision: Precision) -> float:
    """Bits per weight of a large matrix, scales included (MXFP4: 4 + 8 / 32 = 4.25)."""
    if precision.scheme == "mx":
        return precision.bits + 8 / precision.group
    if precision.scheme == "group":
        return precision.bits + (16 + precision.bits) / precision.group
    if precision.scheme == "block" and precision.block:
        return precision.bits + 32 / (precision.block[0] * precision.block[1])
    return float(precision.bits)


def _positive_int(value, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def shipped_format(view: ConfigView) -> ShippedFormat:
    dtype_name = view.get("torch_dtype", "dtype")
    dtype = DTYPES.get(dtype_name, BF16) if isinstance(dtype_name, str) else BF16
    config = view.get("quantization_config")
    if not isinstance(config, dict):
        return ShippedFormat(None, None, dtype, (), f"no quantization_config: every tensor in {dtype.name} "
                                                    f"(the config's dtype {dtype_name or 'unstated, bf16 assumed'})")
    method = config.get("quant_method")
    patterns = config.get("modules_to_not_convert") or ()
    patterns = tuple(pattern for pattern in patterns if isinstance(pattern, str)) \
        if isinstance(patterns, list | tuple) else ()
    if method == "mxfp4":
        precision = PRECISIONS["mxfp4"]
        note = (f"MXFP4 as shipped: routed-expert weights in blocks of {MX_BLOCK} FP4 values with one E8M0 scale "
                f"byte each (*_blocks, *_scales); the rest in {dtype.name}")
    elif method == "fp8":
        block = config.get("weight_block_size")
        block = tuple(block) if isinstance(block, list) and len(block) == 2 and all(
            _positive_int(side, 0) for side in block) else None
        precision = Precision("fp8", 8, "block", block=block)
        scales = f"one fp32 scale per {block[0]}x{block[1]} block" if block else "one fp32 scale per matrix"
        note = (f"FP8 as shipped: linear weights in float8 with {scales} (weight_scale_inv); embeddings, lm_head, "
                f"routers, norms, the MTP projection and modules_to_not_convert in {dtype.name}")
    elif method in ("awq", "gptq"):
        bits, group = _positive_int(config.get("bits"), 4), config.get("group_size")
        group = _positive_int(group, 128)
        precision = Precision(f"int{bits}", bits, "group", group=group)
        note = (f"{method.upper()} as shipped: {bits}-bit weights in groups of {group}, each with an fp16 scale "
                f"and a zero point; the rest in {dtype.name}")
    else:
        return ShippedFormat(method, None, dtype, patterns,
                             f"quantization method {method!r} is not modelled (d0 models {', '.join(MODELLED)}): "
                             f"as_shipped counts every tensor in {dtype.name}")
    return ShippedFormat(method, precision, dtype, patterns, note)
