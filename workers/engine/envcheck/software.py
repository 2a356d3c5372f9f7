"""The software stack a node runs: Python, torch and its accelerator builds, drivers, relevant packages and
the environment variables that change how collectives and devices behave."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess

RELEVANT_PACKAGES = (
    "torch", "transformers", "accelerate", "safetensors", "triton", "flash-attn", "flash_attn_3", "xformers",
    "vllm", "sglang", "deepspeed", "bitsandbytes", "nvidia-nccl-cu12", "nvidia-cudnn-cu12", "torch-npu",
    "intel-extension-for-pytorch", "celery", "numpy",
)
# Prefixes of variables that select devices or tune collectives (NCCL_*, RCCL via NCCL_*, HIP/ROCm, oneCCL...).
ENV_PREFIXES = ("CUDA_", "NCCL_", "HIP_", "ROCR_", "HSA_", "TORCH_", "PYTORCH_", "OMP_", "CCL_", "ZE_",
                "ASCEND_", "MASTER_", "GLOO_", "UCX_", "FI_")


def package_versions(names=RELEVANT_PACKAGES) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def relevant_environment() -> dict[str, str]:
    return {key: value for key, value in sorted(os.environ.items()) if key.startswith(ENV_PREFIXES)}


def driver_version() -> str | None:
    """The GPU driver version from nvidia-smi, /proc or rocm-smi, when readable."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
            if out:
                return out[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as version_file:
            match = re.search(r"Kernel Module\s+([\d.]+)", version_file.read())
            if match:
                return match.group(1)
    except OSError:
        pass
    if shutil.which("rocm-smi"):
        try:
            out = subprocess.run(["rocm-smi", "--showdriverversion"], capture_output=True, text=True, timeout=20)
            match = re.search(r"Driver version:\s*(\S+)", out.stdout)
            if match:
                return match.group(1)
        except (OSError, subprocess.SubprocessError):
            pass
    return None


def software_stack() -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "hip_build": getattr(torch.version, "hip", None),
        "xpu_available": bool(getattr(torch, "xpu", None) and torch.xpu.is_available()),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
        "driver": driver_version(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "packages": package_versions(),
        "environment": relevant_environment(),
    }
