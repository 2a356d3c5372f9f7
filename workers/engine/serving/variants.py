"""Quantized variants of a checkpoint, as trials of the serve sweep: the checkpoint as shipped, and quantized
copies made on the node from its bf16/fp32 weights that the engine serves natively (the compressed-tensors format).

The copies are made by ``quantize_checkpoint.py`` run with the engine's own interpreter (d0 never imports the engine
or its torch): compressed-tensors, which vLLM already brings at the version it pins, writes the format; GPTQ is d0's
(llm-compressor pins transformers and compressed-tensors versions that vLLM's pins exclude). GPTQ variants calibrate
on a small English text shipped with d0 (``calibration/english.txt``) unless given another file; that text is too
little for GPTQ to beat rounding on the demo model (see quantize_checkpoint.py), so the default 4-bit variants round.

Recovery thresholds are the share of the unquantized checkpoint's accuracy a variant must keep to pass (the bars
published quantized releases are held to: 99% for 8-bit, 97% for 4-bit weights).

On vLLM's CPU build (0.32) every variant's kernel is chosen by the CPU's instruction set: the 4-bit weight-only
kernel (``cpu_gemm_wna16``) exists only in its AVX-512 libraries, so ``w4a16`` needs AVX-512 there; ``w4a8-int``
(int4 weights, int8 activations) runs through torch's own ``_dyn_quant_matmul_4bit`` on any x86 CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from .server import engine_environment

SCRIPT = Path(__file__).with_name("quantize_checkpoint.py")
CALIBRATION_FILE = Path(__file__).with_name("calibration") / "english.txt"
MADE_BY_ENGINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
STDERR_LINES = 20

# name -> what it is. ``scheme``: the compressed-tensors preset quantize_checkpoint.py applies (None: the checkpoint
# itself); ``calibrated``: whether GPTQ fits its weights on the calibration text; ``cpu_flags``: the x86 flags
# vLLM's CPU build needs to serve it (from /proc/cpuinfo); ``threshold``: the recovery a trial must reach.
AS_SHIPPED = "as_shipped"
VARIANTS = {
    AS_SHIPPED: {"bits": None, "method": "as shipped", "scheme": None, "calibrated": False, "cpu_flags": (),
                   "threshold": None, "help": "the checkpoint as shipped (bf16/fp32): the reference"},
    "w8a8-int8": {"bits": 8, "method": "INT8 W8A8, round to nearest: weights per channel, activations per token at "
                  "run time", "scheme": "W8A8", "calibrated": False, "cpu_flags": (), "threshold": 0.99,
                  "help": "int8 weights and activations (compressed-tensors int-quantized; vLLM's W8A8 int8 kernels)"},
    "w4a16": {"bits": 4, "method": "W4A16, round to nearest: 4-bit weights in groups, activations unquantized",
              "scheme": "W4A16", "calibrated": False, "cpu_flags": ("avx512f",), "threshold": 0.97,
              "help": "4-bit weight-only (compressed-tensors pack-quantized; vLLM's WNA16 kernels)"},
    "w4a16-gptq": {"bits": 4, "method": "W4A16, GPTQ on calibration text: 4-bit weights in groups, activations "
                   "unquantized", "scheme": "W4A16", "calibrated": True, "cpu_flags": ("avx512f",), "threshold": 0.97,
                   "help": "w4a16 with GPTQ-fitted weights; wants more calibration text than d0 ships"},
    "w4a8-int": {"bits": 4, "method": "W4A8, round to nearest: 4-bit weights in groups, int8 activations per token "
                 "at run time", "scheme": "W4A8", "calibrated": False, "cpu_flags": (), "threshold": 0.97,
                 "help": "4-bit weights, int8 activations (compressed-tensors int-quantized, one int4 per byte; "
                         "vLLM's dynamic 4-bit kernel, on a CPU torch's _dyn_quant_matmul_4bit)"},
}


class VariantFailed(RuntimeError):
    """Making a variant failed; the message ends with the tool's last stderr lines."""


def check_variants(value) -> list[str]:
    """A stage parameter's list of variant names, checked: known names, each once."""
    if not isinstance(value, list) or not value or not all(isinstance(name, str) for name in value):
        raise ValueError(f"variants must be a non-empty list of names; known: {', '.join(VARIANTS)}")
    unknown = [name for name in value if name not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants: {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    repeated = sorted({name for name in value if value.count(name) > 1})
    if repeated:
        raise ValueError(f"variants named more than once: {', '.join(repeated)}")
    return value


def missing_cpu_flags(name: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The x86 flags vLLM's CPU build needs to serve variant ``name`` that this machine's CPU lacks (a GPU build
    needs none of them). Without /proc/cpuinfo (not Linux) nothing is known to be missing."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return []
    flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")),
                 set())
    return [flag for flag in VARIANTS[name]["cpu_flags"] if flag not in flags]


def _disk_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())


def _text(output: str | bytes | None) -> str:
    # TimeoutExpired carries what was read so far as bytes, whatever ``text`` said
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def _stderr_tail(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return "\n".join(lines[-STDERR_LINES:])


def prepare_variant(name: str, *, checkpoint: Path, engine_python: str, out: Path,
                    calibration_file: Path | None = None, timeout_s: float = 3600) -> dict:
    """The variant ``name`` of ``checkpoint``, made into the folder ``out`` (replaced) unless it is the checkpoint
    as shipped. Returns {name, path (the folder to serve), settings (extra engine settings), bits, method, made_by,
    seconds, disk_bytes, threshold}. ``calibration_file`` (plain text, or JSON lines with "text"): what GPTQ
    variants fit on (default: d0's); the others take none. Raises VariantFailed when the tool fails."""
    check_variants([name])
    variant = VARIANTS[name]
    checkpoint = Path(checkpoint)
    described = {"name": name, "settings": {}, "bits": variant["bits"], "method": variant["method"],
                 "threshold": variant["threshold"]}
    if variant["scheme"] is None:
        return {**described, "path": str(checkpoint), "made_by": "as shipped", "seconds": 0.0,
                "disk_bytes": _disk_bytes(checkpoint)}
    command = [engine_python, str(SCRIPT), "--scheme", variant["scheme"], "--checkpoint", str(checkpoint),
               "--out", str(out), "--json"]
    if variant["calibrated"]:
        command += ["--calibration", str(calibration_file or CALIBRATION_FILE)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              env={**engine_environment(), **MADE_BY_ENGINE_ENV})
    except subprocess.TimeoutExpired as error:
        shutil.rmtree(Path(str(out) + ".partial"), ignore_errors=True)
        raise VariantFailed(f"making {name} took over {timeout_s:.0f} s; its last lines:\n"
                            f"{_stderr_tail(_text(error.stderr))}") from None
    if done.returncode != 0:
        raise VariantFailed(f"making {name} failed (exit {done.returncode}); its last lines:\n"
                            f"{_stderr_tail(done.stderr)}")
    try:
        made = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise VariantFailed(f"making {name} printed no result; its last lines:\n{_stderr_tail(done.stderr)}") from None
    return {**described, "path": made["path"], "made_by": made["made_by"],
            "seconds": round(time.perf_counter() - started, 2), "disk_bytes": made["disk_bytes"]}


MARKER = "d0-variant.json"


def variants_folder(checkpoint: Path, name: str) -> Path:
    """Where this node keeps the variant ``name`` of ``checkpoint``: under its state folder, named by the
    checkpoint's path and its weight files' sizes and times, so a changed checkpoint gets new variants."""
    checkpoint = Path(checkpoint).resolve()
    files = sorted((item.name, item.stat().st_size, item.stat().st_mtime_ns)
                   for item in checkpoint.glob("*.safetensors"))
    stamp = hashlib.sha256(json.dumps([str(checkpoint), files]).encode()).hexdigest()[:16]
    base = Path(os.environ.get("D0_VAR_DIR") or Path.home() / ".cache" / "d0")
    return base / "variants" / f"{checkpoint.name}-{stamp}" / name


def cached_variant(name: str, *, checkpoint: Path, engine_python: str) -> dict:
    """``prepare_variant`` into the node's cache (``variants_folder``), or what it made there before: a later
    sweep, and the recipe naming the folder, find the same variant again without quantizing twice."""
    out = variants_folder(checkpoint, name)
    try:
        return json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        pass
    made = prepare_variant(name, checkpoint=checkpoint, engine_python=engine_python, out=out)
    if Path(made["path"]) == out:  # the checkpoint as shipped is served from where it is: nothing to keep
        (out / MARKER).write_text(json.dumps(made))
    return made


# The stage parameter's help: each variant's name and what it is.
VARIANT_HELP = "; ".join(f"{name}: {spec['help']}" for name, spec in VARIANTS.items())
