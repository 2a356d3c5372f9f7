"""Write a quantized copy of a bf16/fp32 checkpoint in the compressed-tensors format, which vLLM serves natively.

Run by the engine's own interpreter (it has torch, transformers and compressed-tensors at the versions the engine
pins; d0's process imports none of them): ``engine_python quantize_checkpoint.py --scheme W8A8 --checkpoint DIR
--out DIR [--calibration FILE] --json``; prints one JSON object. ``variants.prepare_variant`` runs it.

Schemes are compressed-tensors' presets (``quantization.quant_scheme``), every decoder Linear quantized, lm_head
and the embeddings kept as shipped (llm-compressor's own recipes ignore lm_head):

- W8A8: int8 weights per output channel (symmetric, max-abs scale), activations int8 per token at run time
  (dynamic: no calibration). Weights round to nearest.
- W4A16: 4-bit weights in groups along the input dimension (symmetric), activations unquantized.
- W4A8: the same 4-bit weights, activations int8 per token at run time.

4-bit weights round to nearest, or with a calibration file are fitted by GPTQ (Frantar et al. 2022, "GPTQ: Accurate
Post-Training Quantization for Generative Pre-trained Transformers", Algorithm 1 with lazy batch updates, act-order
off, as llm-compressor's GPTQModifier does it). Unlike llm-compressor, every layer's Hessian comes from one pass of
the unquantized model (no sequential propagation of earlier layers' quantization error), which keeps it to seconds
on a CPU node. GPTQ needs calibration text in quantity: on the demo model, d0's few-KB file (1,280 tokens) makes it
worse than rounding on held-out text (perplexity 22.0 vs 18.8; bf16 14.8), so the default variants round.

llm-compressor itself pins transformers and compressed-tensors versions that vLLM's own pins exclude, so the
algorithm lives here and compressed-tensors (which vLLM already brings) writes the format.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

# Groups of 128 input channels are the W4A16 default (compressed-tensors' preset, vLLM's CPU kernel); a model whose
# input widths 128 does not divide gets the largest power of two down to 32 that divides them all.
GROUP_SIZES = (128, 64, 32)
# GPTQ's dampening: 1% of the Hessian's mean diagonal added to it (the paper's and llm-compressor's default).
DAMPENING = 0.01
# Calibration: at most this many sequences of this many tokens from the file.
CALIBRATION_SEQUENCES, CALIBRATION_TOKENS = 16, 256
# Files of the checkpoint that are not weights nor config.json and travel with the quantized copy.
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
              "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt")


def _group_size(model) -> int:
    import torch

    widths = {module.in_features for name, module in model.named_modules()
              if isinstance(module, torch.nn.Linear) and name != "lm_head"}
    for size in GROUP_SIZES:
        if all(width % size == 0 for width in widths):
            return size
    raise ValueError(f"no group size of {GROUP_SIZES} divides the Linear input widths {sorted(widths)}")


def _calibration_batches(tokenizer, path: Path) -> list:
    """Token id tensors [1, CALIBRATION_TOKENS] cut from the file's text (plain text, or JSON lines with "text")."""
    import torch

    raw = path.read_text()
    if path.suffix == ".jsonl":
        raw = "\n\n".join(json.loads(line)["text"] for line in raw.splitlines() if line.strip())
    ids = tokenizer(raw, return_tensors="pt").input_ids[0]
    count = min(CALIBRATION_SEQUENCES, len(ids) // CALIBRATION_TOKENS)
    if count == 0:
        raise ValueError(f"{path} holds {len(ids)} tokens, fewer than one calibration sequence "
                         f"({CALIBRATION_TOKENS})")
    return [ids[index * CALIBRATION_TOKENS:(index + 1) * CALIBRATION_TOKENS].unsqueeze(0).to(torch.long)
            for index in range(count)]


def _hessians(model, modules: dict, batches: list) -> list[tuple[list[str], object]]:
    """[(names, 2/n * X^T X of their input, float32)] from one pass of the unquantized model: Linears fed the very
    same input (q/k/v, gate/up) share one Hessian, and GPTQ runs once over their stacked rows (rows are independent
    given the Hessian, so the result is the same, at a fraction of the column steps)."""
    import torch

    sums = {name: torch.zeros(module.in_features, module.in_features) for name, module in modules.items()}
    counts = dict.fromkeys(modules, 0)
    inputs_of = {}

    def hook(name):
        def record(module, inputs, output):
            # The same tensor in the same parent module is the same input (memory is not reused while it lives).
            inputs_of.setdefault(name, (name.rsplit(".", 1)[0], inputs[0].data_ptr()))
            rows = inputs[0].reshape(-1, module.in_features).float()
            sums[name].addmm_(rows.t(), rows)
            counts[name] += rows.shape[0]
        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in modules.items()]
    try:
        with torch.no_grad():
            for batch in batches:
                model(batch)
    finally:
        for handle in handles:
            handle.remove()
    groups = {}
    for name in modules:
        groups.setdefault(inputs_of[name], []).append(name)
    return [(names, 2 * sums[names[0]] / counts[names[0]]) for names in groups.values()]


def _gptq(weight, hessian, group_size: int, maximum: int, scale_dtype, block: int = 128):
    """GPTQ of one [out, in] weight to symmetric ``maximum``-bounded integers in groups of ``group_size`` inputs:
    (the dequantized weight, the scales [out, in/group_size]). A group's scale is taken from the weights as GPTQ has
    updated them when it reaches the group's first column, as llm-compressor does with act-order off."""
    import torch

    weight = weight.float().clone()
    columns = weight.shape[1]
    hessian = hessian.clone()
    dead = torch.diag(hessian) == 0  # inputs that never fired: their weights cannot matter
    hessian[dead, dead] = 1
    weight[:, dead] = 0
    hessian += DAMPENING * torch.mean(torch.diag(hessian)) * torch.eye(columns)
    inverse = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hessian)), upper=True)
    scales = torch.zeros(weight.shape[0], columns // group_size)
    quantized = torch.zeros_like(weight)
    for start in range(0, columns, block):
        end = min(start + block, columns)
        chunk = weight[:, start:end].clone()
        errors = torch.zeros_like(chunk)
        for offset in range(end - start):
            column = start + offset
            if column % group_size == 0:
                group = torch.cat([chunk[:, offset:], weight[:, end:]], dim=1)[:, :group_size]
                # rounded to the dtype they are stored in, so the stored integers are exactly the fitted ones
                # compressed-tensors' symmetric scale (calculate_qparams): the largest magnitude over half the
                # integer range (7.5 for int4), so round-to-nearest and GPTQ differ only by GPTQ's updates
                scales[:, column // group_size] = ((group.abs().amax(dim=1) / (maximum + 0.5)).clamp(min=1e-8)
                                                   .to(scale_dtype).float())
            scale = scales[:, column // group_size]
            values = torch.clamp(torch.round(chunk[:, offset] / scale), -maximum - 1, maximum) * scale
            quantized[:, column] = values
            error = (chunk[:, offset] - values) / inverse[column, column]
            chunk[:, offset:] -= error.unsqueeze(1) * inverse[column, column:end].unsqueeze(0)
            errors[:, offset] = error
        weight[:, end:] -= errors @ inverse[start:end, end:]
    return quantized, scales


def quantize(checkpoint: Path, out: Path, scheme_name: str, calibration: Path | None) -> dict:
    import compressed_tensors
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationScheme, QuantizationStatus,
                                                 apply_quantization_config)
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype="auto")
    model.eval()
    preset = {key: value.model_copy() for key, value in PRESET_SCHEMES[scheme_name].items()}
    weights = preset["weights"]
    if weights.group_size is not None:
        weights.group_size = _group_size(model)
    config = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], **preset)},
                                ignore=["lm_head"], quantization_status=QuantizationStatus.INITIALIZED)
    modules = {name: module for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and name != "lm_head"}
    hessians = []
    if calibration is not None:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        hessians = _hessians(model, modules, _calibration_batches(tokenizer, calibration))
    apply_quantization_config(model, config)
    maximum = 2 ** (weights.num_bits - 1) - 1
    qparams = {}
    # GPTQ walks the columns one at a time with small tensor operations, which a thread pool only slows (measured
    # on a 2-core node: 3.8 s per 1536x576 weight with 2 threads, 0.16 s with 1).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.no_grad():
        for names, hessian in hessians:
            stacked = torch.cat([modules[name].weight.float() for name in names])
            fitted, scale = _gptq(stacked, hessian, weights.group_size, maximum, modules[names[0]].weight_scale.dtype)
            rows = 0
            for name in names:
                module = modules[name]
                module.weight.copy_(fitted[rows:rows + module.out_features].to(module.weight.dtype))
                part = scale[rows:rows + module.out_features]
                qparams[name] = (part, torch.zeros_like(part))
                rows += module.out_features
        for name, module in modules.items():
            if name not in qparams:
                weight = module.weight.float()
                grouped = weight.reshape(weight.shape[0], -1, weights.group_size or weight.shape[1])
                qparams[name] = calculate_qparams(grouped.amin(dim=-1), grouped.amax(dim=-1), weights)
            scale, zero_point = qparams[name]
            module.weight_scale.copy_(scale.reshape(module.weight_scale.shape).to(module.weight_scale.dtype))
            module.weight_zero_point.copy_(zero_point.reshape(module.weight_zero_point.shape)
                                           .to(module.weight_zero_point.dtype))
    torch.set_num_threads(threads)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    compressor.update_config(str(staging))
    for name in SIDE_FILES:
        if (checkpoint / name).exists():
            shutil.copy2(checkpoint / name, staging / name)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)  # complete or absent, as the demo checkpoint is written
    method = "GPTQ" if hessians else "round-to-nearest"
    return {"path": str(out), "scheme": scheme_name, "method": method,
            "group_size": weights.group_size, "format": compressor.quantization_config.format,
            "quantized_linears": len(modules), "made_by": f"compressed-tensors {compressed_tensors.__version__}"
            + (" + d0 GPTQ" if hessians else ""),
            "seconds": round(time.perf_counter() - started, 2),
            "disk_bytes": sum(path.stat().st_size for path in out.rglob("*") if path.is_file())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scheme", choices=("W8A8", "W4A16", "W4A8"), required=True)
    parser.add_argument("--calibration", type=Path, help="text (or JSON lines with 'text') for GPTQ (W4A16 only)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object (the default)")
    args = parser.parse_args(argv)
    if args.calibration is not None and args.scheme == "W8A8":
        parser.error("--calibration fits W4A16 weights by GPTQ; W8A8 rounds to nearest and needs none")
    print(json.dumps(quantize(args.checkpoint, args.out, args.scheme, args.calibration)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
