"""From a layout and engine settings to an engine's documented command line and environment.

d0's settings are named as vLLM's engine arguments are (``max_num_seqs``, ``block_size``...), so a recipe reads the
same as vLLM's documentation; SGLang's launcher maps the same settings to its own ``launch_server`` arguments.
Every value is checked here, before any engine starts: an unknown setting or a bad value is a ValueError naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# setting -> (type, help). Types: int (>= 1), fraction (0 < x <= 1), bool, str.
SETTINGS = {
    "tensor_parallel_size": ("int", "tensor-parallel ranks"),
    "pipeline_parallel_size": ("int", "pipeline stages"),
    "data_parallel_size": ("int", "data-parallel replicas"),
    "enable_expert_parallel": ("bool", "experts split over the tensor/data-parallel ranks instead of sliced"),
    "dtype": ("str", "weights and activations: auto, bfloat16, float16, float32"),
    "quantization": ("str", "quantization method (default: what the checkpoint's config says)"),
    "kv_cache_dtype": ("str", "KV-cache element type: auto, fp8, fp8_e4m3, ..."),
    "block_size": ("int", "tokens per KV-cache block"),
    "max_num_seqs": ("int", "sequences per scheduler step at most"),
    "max_num_batched_tokens": ("int", "tokens per scheduler step at most"),
    "enable_chunked_prefill": ("bool", "split long prefills across steps"),
    "enable_prefix_caching": ("bool", "reuse KV blocks of shared prompt prefixes"),
    "gpu_memory_utilization": ("fraction", "share of device memory the engine may take (on a CPU build: of RAM)"),
    "max_model_len": ("int", "longest sequence (prompt + output) the engine accepts"),
    "enforce_eager": ("bool", "no CUDA graphs / torch.compile (faster start, slower steps)"),
    "seed": ("int", "the engine's random seed"),
    "kv_cache_space_gib": ("int", "vLLM's CPU build: GiB of RAM for the KV cache (VLLM_CPU_KVCACHE_SPACE)"),
}
DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")


def check_settings(settings: dict) -> dict:
    """The settings, checked: known names, values of the right type and range."""
    if not isinstance(settings, dict):
        raise ValueError(f"engine settings must be an object, not {type(settings).__name__}")
    for name, value in settings.items():
        if name not in SETTINGS:
            raise ValueError(f"unknown engine setting {name!r}; known: {', '.join(SETTINGS)}")
        kind = SETTINGS[name][0]
        if kind == "int" and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1
                                  and value <= 1 << 24):
            raise ValueError(f"engine setting {name} takes a positive int, not {value!r}")
        if kind == "fraction" and not (isinstance(value, int | float) and not isinstance(value, bool)
                                       and 0 < value <= 1):
            raise ValueError(f"engine setting {name} takes a fraction in (0, 1], not {value!r}")
        if kind == "bool" and not isinstance(value, bool):
            raise ValueError(f"engine setting {name} takes true or false, not {value!r}")
        if kind == "str" and not (isinstance(value, str) and value.replace("_", "").replace("-", "").isalnum()
                                  and len(value) <= 64):
            raise ValueError(f"engine setting {name} takes a name such as bfloat16 or fp8, not {value!r}")
    if "dtype" in settings and settings["dtype"] not in DTYPES:
        raise ValueError(f"engine setting dtype takes one of {', '.join(DTYPES)}, not {settings['dtype']!r}")
    return settings


def _cpu_binding(ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for ``ranks`` workers: the node's CPUs split into as many contiguous blocks."""
    cpus = sorted(os.sched_getaffinity(0))
    per_rank = max(1, len(cpus) // ranks)
    blocks = [cpus[index * per_rank:(index + 1) * per_rank] or cpus[-1:] for index in range(ranks)]
    return "|".join(f"{block[0]}-{block[-1]}" if len(block) > 1 else str(block[0]) for block in blocks)


@dataclass(frozen=True)
class Launch:
    """An engine start: the exact command line and environment (what a recipe shows), and its health path."""

    command: list[str]
    env: dict[str, str]
    health_path: str = "/health"

    def shell(self) -> str:
        import shlex

        assignments = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items()))
        return (assignments + " " if assignments else "") + shlex.join(self.command)


class VllmLauncher:
    name = "vllm"

    @staticmethod
    def launch(python: str, model: Path, settings: dict, *, port: int, cpu_build: bool,
               served_name: str = "d0") -> Launch:
        settings = check_settings(dict(settings))
        command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                   "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
                   "--disable-uvicorn-access-log"]
        env = {}
        for name, value in settings.items():
            if name == "kv_cache_space_gib":
                if cpu_build:
                    env["VLLM_CPU_KVCACHE_SPACE"] = str(value)
                continue
            flag = "--" + name.replace("_", "-")
            if SETTINGS[name][0] == "bool":
                command.append(flag if value else "--no-" + flag[2:])
            else:
                command += [flag, str(value)]
        ranks = settings.get("tensor_parallel_size", 1) * settings.get("pipeline_parallel_size", 1)
        if ranks > 1:
            command += ["--distributed-executor-backend", "mp"]
            if cpu_build:
                env["VLLM_CPU_OMP_THREADS_BIND"] = _cpu_binding(ranks)
        return Launch(command, env)


class SglangLauncher:
    """SGLang's ``launch_server`` with the same settings (its CPU build is not on PyPI, so only the command line is
    tested here; a node with SGLang installed runs it the same way)."""

    name = "sglang"
    ARGUMENTS = {"tensor_parallel_size": "--tp-size", "pipeline_parallel_size": "--pp-size",
                 "data_parallel_size": "--dp-size", "dtype": "--dtype", "quantization": "--quantization",
                 "kv_cache_dtype": "--kv-cache-dtype", "block_size": "--page-size",
                 "max_num_seqs": "--max-running-requests", "max_num_batched_tokens": "--chunked-prefill-size",
                 "gpu_memory_utilization": "--mem-fraction-static", "max_model_len": "--context-length",
                 "seed": "--random-seed"}
    @classmethod
    def launch(cls, python: str, model: Path, settings: dict, *, port: int, cpu_build: bool,
               served_name: str = "d0") -> Launch:
        settings = check_settings(dict(settings))
        command = [python, "-m", "sglang.launch_server", "--model-path", str(model), "--served-model-name",
                   served_name, "--host", "127.0.0.1", "--port", str(port)]
        for name, value in settings.items():
            if name in cls.ARGUMENTS:
                command += [cls.ARGUMENTS[name], str(value)]
            elif name == "enable_expert_parallel" and value:
                command += ["--ep-size", str(settings.get("tensor_parallel_size", 1))]
            elif name == "enforce_eager" and value:
                command.append("--disable-cuda-graph")
            elif name == "enable_prefix_caching" and not value:
                command.append("--disable-radix-cache")
            elif name == "enable_chunked_prefill" and not value:
                command += ["--chunked-prefill-size", "-1"]
        return Launch(command, {})


LAUNCHERS = {"vllm": VllmLauncher, "sglang": SglangLauncher}
