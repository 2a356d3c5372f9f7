"""A checkpoint's safetensors checked against its config.json before an engine spends any device time on it.

Only the headers are read (8 bytes of length, then JSON: each tensor's dtype, shape and byte range), never tensor
data. The expected tensors are the architecture's as transformers saves them: the model built on the meta device
(no memory), its state dict put back into the checkpoint's layout by transformers' own ``revert_weight_conversion``
(per-expert tensors, original names). A quantized checkpoint stores a linear weight in its format's tensors:

- ``fp8`` (DeepSeek-V3's block FP8): ``weight`` in float8 and ``weight_scale_inv`` of ceil(out/bo) x ceil(in/bi);
- ``mxfp4`` (gpt-oss): an expert tensor [E, in, out] as ``*_blocks`` [E, out, in/32, 16] and ``*_scales``
  [E, out, in/32], bytes;
- ``awq``: ``qweight`` [in, out/pack], ``qzeros`` [in/group, out/pack], ``scales`` [in/group, out];
- ``gptq``: ``qweight`` [in/pack, out], ``qzeros`` [in/group, out/pack], ``scales`` [in/group, out], ``g_idx``;
- ``compressed-tensors``: pack-quantized ``weight_packed`` [out, in/pack], ``weight_scale`` [out, in/group],
  ``weight_shape``; float-quantized ``weight`` (float8) and ``weight_scale``.

A weight may also be kept unquantized (mixed checkpoints leave attention or routers in bf16). Missing, unexpected
and mis-shaped tensors refuse the checkpoint (``CheckpointRefused``, naming them); a multi-token-prediction layer
past ``num_hidden_layers`` is reported, not refused (engines load it or skip it).
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U32": 4, "U16": 2, "F4": 1}
MAX_HEADER_BYTES = 100 * 1024 * 1024
SHOWN = 10
LAYER = re.compile(r"\.layers\.(\d+)\.")


class CheckpointRefused(ValueError):
    def __init__(self, problems: dict):
        self.problems = problems
        parts = []
        for label, key in (("missing", "missing"), ("unexpected", "unexpected"), ("mis-shaped", "mis_shaped")):
            items = problems.get(key) or []
            if items:
                names = [item if isinstance(item, str) else
                         f"{item['name']} {item['found']} (expected {item['expected']})" for item in items[:SHOWN]]
                more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
                parts.append(f"{len(items)} {label} tensors: {', '.join(names)}{more}")
        parts += problems.get("errors") or []
        super().__init__("; ".join(parts))


def read_headers(folder: Path) -> dict[str, dict]:
    """Every tensor's ``{"dtype", "shape", "bytes", "file"}`` from the folder's safetensors headers."""
    tensors = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointRefused({"errors": [f"no .safetensors files in {folder}"]})
    for path in files:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > MAX_HEADER_BYTES:
                raise CheckpointRefused({"errors": [f"{path.name}: a header of {length} bytes is not safetensors"]})
            header = json.loads(handle.read(length))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            tensors[name] = {"dtype": entry["dtype"], "shape": list(entry["shape"]), "bytes": end - start,
                             "file": path.name}
    return tensors


def expected_tensors(config: dict) -> tuple[dict[str, list[int]], set[str]]:
    """The architecture's tensors as a checkpoint holds them: name -> shape, and the names that are weights of
    linear layers (the ones a quantization format stores in its own tensors)."""
    import torch
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    from ..models.loading import build_meta_model, load_config

    model = build_meta_model(load_config(config))
    state = remove_tied_weights_from_state_dict(model.state_dict(), model)
    saved = revert_weight_conversion(model, state)
    modules = dict(model.named_modules())
    linear = set()
    for name, tensor in saved.items():
        module = modules.get(name.rsplit(".", 1)[0])
        is_linear = isinstance(module, torch.nn.Linear) or (module is None and tensor.dim() == 2)
        experts = module is not None and tensor.dim() == 3 and not name.endswith("bias")
        if (is_linear and name.endswith(".weight")) or experts:
            linear.add(name)
    return {name: list(tensor.shape) for name, tensor in saved.items()}, linear


def _quantization(config: dict) -> dict:
    quantization = config.get("quantization_config") or {}
    method = quantization.get("quant_method")
    if method == "compressed-tensors":
        formats = {group.get("format") or quantization.get("format")
                   for group in (quantization.get("config_groups") or {}).values()} or {quantization.get("format")}
        weights = [group.get("weights") or {} for group in (quantization.get("config_groups") or {}).values()]
        return {"method": method, "format": sorted(f for f in formats if f), "bits": (weights[0] if weights
                else {}).get("num_bits", 4), "group_size": (weights[0] if weights else {}).get("group_size") or 128,
                "ignore": quantization.get("ignore") or []}
    return {"method": method, "bits": quantization.get("bits", 4), "group_size": quantization.get("group_size", 128),
            "block": quantization.get("weight_block_size") or [128, 128],
            "ignore": quantization.get("modules_to_not_convert") or []}


def _ignored(name: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif re.fullmatch(re.escape(pattern).replace(r"\*", ".*") + r"(\..*)?", name):
            return True
    return False


def quantized_forms(name: str, shape: list[int], quantization: dict) -> list[dict[str, list[int] | None]]:
    """The ways a linear weight of ``shape`` may be stored under ``quantization``: tensor name -> shape (None: any
    shape). The plain form comes last."""
    plain = {name: shape}
    method = quantization.get("method")
    if not method or _ignored(name.rsplit(".", 1)[0], quantization["ignore"]) or name.startswith("lm_head"):
        return [plain]
    base = name[: -len(".weight")] if name.endswith(".weight") else name
    if len(shape) == 3:
        if method == "mxfp4":
            experts, inner, outer = shape
            return [{f"{base}_blocks": [experts, outer, math.ceil(inner / 32), 16],
                     f"{base}_scales": [experts, outer, math.ceil(inner / 32)]}, plain]
        return [plain]
    out, inner = shape
    group = quantization.get("group_size") or 128
    group = inner if group == -1 else group
    pack = 32 // int(quantization.get("bits") or 4)
    if method == "fp8":
        block_out, block_in = quantization["block"]
        return [{name: shape, f"{base}.weight_scale_inv": [math.ceil(out / block_out), math.ceil(inner / block_in)]},
                plain]
    if method == "awq":
        return [{f"{base}.qweight": [inner, out // pack], f"{base}.qzeros": [inner // group, out // pack],
                 f"{base}.scales": [inner // group, out]}, plain]
    if method == "gptq":
        return [{f"{base}.qweight": [inner // pack, out], f"{base}.qzeros": [inner // group, out // pack],
                 f"{base}.scales": [inner // group, out], f"{base}.g_idx": [inner]}, plain]
    if method == "compressed-tensors":
        if "pack-quantized" in quantization["format"]:
            return [{f"{base}.weight_packed": [out, inner // pack], f"{base}.weight_scale": [out, inner // group],
                     f"{base}.weight_shape": [2]}, plain]
        return [{name: shape, f"{base}.weight_scale": None}, plain]
    return [plain]


def _extra_layer(name: str, layers: int) -> bool:
    found = LAYER.search(name)
    return bool(found) and int(found.group(1)) >= layers


def check_checkpoint(folder: Path, *, layout: dict | None = None) -> dict:
    """Compare the folder's safetensors headers with its config.json; returns what was found (tensors, dtypes,
    quantization, bytes in total and per device for the layout), or raises CheckpointRefused naming the problems."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointRefused({"errors": [f"no config.json in {folder}"]})
    config = json.loads(config_path.read_text())
    found = read_headers(folder)
    expected, linear = expected_tensors(config)
    quantization = _quantization(config)
    claimed: set[str] = set()
    missing, mis_shaped, quantized, plain = [], [], 0, 0
    for name, shape in expected.items():
        forms = quantized_forms(name, shape, quantization) if name in linear else [{name: shape}]
        match = next((form for form in forms if all(tensor in found for tensor in form)), None)
        if match is None:
            # Name the tensors of the form it came closest to (the quantized one when any of its tensors is there).
            closest = max(forms, key=lambda form: sum(tensor in found for tensor in form))
            missing += [tensor for tensor in closest if tensor not in found]
            claimed.update(tensor for tensor in closest if tensor in found)
            continue
        claimed.update(match)
        quantized += match is not forms[-1]
        plain += match is forms[-1]
        for tensor, want in match.items():
            if want is not None and found[tensor]["shape"] != want:
                mis_shaped.append({"name": tensor, "expected": want, "found": found[tensor]["shape"]})
    layers = (config.get("text_config") or config).get("num_hidden_layers") or 0
    leftover = sorted(set(found) - claimed)
    extra_layers = [name for name in leftover if layers and _extra_layer(name, layers)]
    unexpected = [name for name in leftover if name not in extra_layers]
    total = sum(entry["bytes"] for entry in found.values())
    layout = layout or {}
    devices = max(1, int(layout.get("tensor_parallel_size", 1)) * int(layout.get("pipeline_parallel_size", 1)))
    dtypes: dict[str, int] = {}
    for entry in found.values():
        dtypes[entry["dtype"]] = dtypes.get(entry["dtype"], 0) + entry["bytes"]
    report = {"tensors": len(found), "expected": len(expected), "files": len({e["file"] for e in found.values()}),
              "quantization": quantization.get("method"), "quantized_weights": quantized,
              "unquantized_linear_weights": plain, "bytes_by_dtype": dtypes, "total_bytes": total,
              "devices": devices, "bytes_per_device": math.ceil(total / devices),
              "bytes_per_device_basis": "an even split over tensor x pipeline parallel ranks",
              "extra_layer_tensors": len(extra_layers),
              "extra_layer_note": (f"{len(extra_layers)} tensors of layers past num_hidden_layers ({layers}): "
                                   "multi-token-prediction layers, which engines load or skip")
              if extra_layers else None}
    if missing or unexpected or mis_shaped:
        raise CheckpointRefused({"missing": missing, "unexpected": unexpected, "mis_shaped": mis_shaped,
                                 "report": report})
    return report
