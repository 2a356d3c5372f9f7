"""Small checkpoints in each quantization format d0 recognises, written from a validation checkpoint by the formats'
published layouts (not by d0's checker, so a test of the checker can fail): each linear weight [out, in] of the
decoder layers replaced by its format's tensors, and the format's quantization_config in config.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FORMATS = ("fp8", "awq", "gptq", "compressed-tensors", "mxfp4")
CONFIGS = {
    "fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm", "zero_point": True},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True},
    "compressed-tensors": {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
        "group_0": {"format": "pack-quantized", "targets": ["Linear"], "weights": {
            "num_bits": 4, "group_size": 32, "strategy": "group", "type": "int", "symmetric": True}}},
        "ignore": ["lm_head"]},
    "mxfp4": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                 "model.layers.*.mlp.router", "model.embed_tokens",
                                                                 "lm_head"]},
}


def _linear(name: str, tensor: torch.Tensor) -> bool:
    return (".layers." in name and name.endswith("_proj.weight") and tensor.dim() == 2)


def quantize_folder(folder: Path, method: str) -> None:
    files = sorted(folder.glob("*.safetensors"))
    for path in files:
        tensors = load_file(path)
        out = {}
        for name, tensor in tensors.items():
            base = name[: -len(".weight")]
            if method == "mxfp4":
                if ".mlp.experts." in name and tensor.dim() == 3 and not name.endswith("bias"):
                    experts, inner, outer = tensor.shape  # transformers' [E, in, out]
                    out[f"{name}_blocks"] = torch.zeros(experts, outer, math.ceil(inner / 32), 16, dtype=torch.uint8)
                    out[f"{name}_scales"] = torch.zeros(experts, outer, math.ceil(inner / 32), dtype=torch.uint8)
                else:
                    out[name] = tensor
                continue
            if not _linear(name, tensor):
                out[name] = tensor
                continue
            rows, cols = tensor.shape  # [out, in]
            if method == "fp8":
                out[name] = tensor.to(torch.float8_e4m3fn)
                out[f"{base}.weight_scale_inv"] = torch.ones(math.ceil(rows / 128), math.ceil(cols / 128))
            elif method == "awq":
                out[f"{base}.qweight"] = torch.zeros(cols, rows // 8, dtype=torch.int32)
                out[f"{base}.qzeros"] = torch.zeros(cols // 32, rows // 8, dtype=torch.int32)
                out[f"{base}.scales"] = torch.ones(cols // 32, rows, dtype=torch.float16)
            elif method == "gptq":
                out[f"{base}.qweight"] = torch.zeros(cols // 8, rows, dtype=torch.int32)
                out[f"{base}.qzeros"] = torch.zeros(cols // 32, rows // 8, dtype=torch.int32)
                out[f"{base}.scales"] = torch.ones(cols // 32, rows, dtype=torch.float16)
                out[f"{base}.g_idx"] = torch.arange(cols, dtype=torch.int32) // 32
            elif method == "compressed-tensors":
                out[f"{base}.weight_packed"] = torch.zeros(rows, cols // 8, dtype=torch.int32)
                out[f"{base}.weight_scale"] = torch.ones(rows, cols // 32, dtype=torch.bfloat16)
                out[f"{base}.weight_shape"] = torch.tensor([rows, cols], dtype=torch.int64)
        save_file(out, path, metadata={"format": "pt"})
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = CONFIGS[method]
    config_path.write_text(json.dumps(config, indent=2))


def edit_tensors(folder: Path, edit) -> None:
    """Apply ``edit(dict of tensors) -> dict`` to every file of the folder."""
    for path in sorted(folder.glob("*.safetensors")):
        save_file(edit(load_file(path)), path, metadata={"format": "pt"})
