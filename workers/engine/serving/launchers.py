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
    # Not an engine argument: which checkpoint folder the engine is given (serving.variants), so that a sweep's
    # variants are configurations like any other and the recipe names the one chosen.
    "variant": ("str", "the checkpoint served: as_shipped, or a quantized variant d0 made on the node"),
}
# Settings d0 reads itself rather than passing to the engine as arguments.
NOT_ARGUMENTS = ("kv_cache_space_gib", "variant")
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
class NodeRole:
    """One node's place in an engine deployment that spans ``nodes`` nodes (vLLM's own multi-node mechanism, no Ray):
    node rank 0 serves the API, the others run headless. ``master_addr``/``master_port``: node rank 0's address and
    the engine's rendezvous port there (TP/PP across nodes: ``--master-addr/--master-port``; DP across nodes: the
    data-parallel RPC address and port). ``host_ip``: this node's own address, which vLLM binds its message queues
    to (``VLLM_HOST_IP``; unset: the machine's outward address)."""

    nodes: int
    rank: int
    master_addr: str
    master_port: int
    host_ip: str | None = None

    def __post_init__(self):
        if not (1 <= self.nodes <= 1024 and 0 <= self.rank < self.nodes):
            raise ValueError(f"node rank {self.rank} of {self.nodes} nodes is no place in a deployment")
        if not (1 <= self.master_port <= 65535):
            raise ValueError(f"the engine's rendezvous port must be in 1-65535, not {self.master_port}")


# The settings that say how an engine is laid out over devices and nodes (the rest tune it).
LAYOUT_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel")


def layout_of(settings: dict) -> dict:
    return {key: settings[key] for key in LAYOUT_KEYS if key in settings}


def ranks_of(settings: dict) -> tuple[int, int]:
    """(ranks of one replica: TP x PP, data-parallel replicas)."""
    return (settings.get("tensor_parallel_size", 1) * settings.get("pipeline_parallel_size", 1),
            settings.get("data_parallel_size", 1))


def split_over_nodes(settings: dict, nodes: int) -> str:
    """How a layout spreads over ``nodes`` nodes as vLLM does it: "dp" (whole replicas per node, the
    ``--data-parallel-*`` flags), "nnodes" (one replica's TP/PP ranks across nodes, ``--nnodes/--node-rank``) or
    "one" (a single node). A ValueError for a layout vLLM cannot spread so."""
    replica, dp = ranks_of(settings)
    if nodes == 1:
        return "one"
    if dp > 1:
        if dp % nodes:
            raise ValueError(f"data_parallel_size={dp} does not split evenly over {nodes} nodes")
        return "dp"
    if replica % nodes:
        raise ValueError(f"a replica of {replica} ranks (TP x PP) does not split evenly over {nodes} nodes")
    return "nnodes"


def node_arguments(settings: dict, role: NodeRole) -> list[str]:
    """vLLM's arguments that place this node in the deployment (none on a single node)."""
    split = split_over_nodes(settings, role.nodes)
    if split == "one":
        return []
    headless = ["--headless"] if role.rank else []
    if split == "dp":
        local = ranks_of(settings)[1] // role.nodes
        start = ["--data-parallel-start-rank", str(role.rank * local)] if role.rank else []
        return ["--data-parallel-size-local", str(local), "--data-parallel-address", role.master_addr,
                "--data-parallel-rpc-port", str(role.master_port), *start, *headless]
    return ["--nnodes", str(role.nodes), "--node-rank", str(role.rank), "--master-addr", role.master_addr,
            "--master-port", str(role.master_port), *headless]


# vLLM's CLI (``vllm serve``, the one path that honours --headless) builds its --version from
# importlib.metadata.version("vllm"), which the CPU build's distribution (vllm-cpu) does not answer: there the CLI is
# started with that one lookup answered as vLLM's own platform detection answers it (vllm_version_matches_substr:
# the vllm-cpu version + "+cpu", which also keeps the CPU platform chosen).
CPU_BUILD_CLI = ("import importlib.metadata as m, runpy, sys; v = m.version; "
                 "m.version = lambda name: v('vllm-cpu') + '+cpu' if name == 'vllm' else v(name); "
                 "sys.argv[0] = 'vllm'; "
                 "runpy.run_module('vllm.entrypoints.cli.main', run_name='__main__')")


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
               served_name: str = "d0", role: NodeRole | None = None) -> Launch:
        """The engine's command on one node; ``role``: its place in a deployment over several nodes (then vLLM's
        CLI, ``vllm serve``, which runs the followers headless)."""
        settings = check_settings(dict(settings))
        if role is None or role.nodes == 1:
            command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
        elif cpu_build:
            command = [python, "-c", CPU_BUILD_CLI, "serve", str(model)]
        else:
            command = [python, "-m", "vllm.entrypoints.cli.main", "serve", str(model)]
        command += ["--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
                    "--disable-uvicorn-access-log"]
        env = {}
        if role is not None:
            command += node_arguments(settings, role)
            if role.host_ip:
                env["VLLM_HOST_IP"] = role.host_ip
        for name, value in settings.items():
            if name in NOT_ARGUMENTS:
                if name == "kv_cache_space_gib" and cpu_build:
                    env["VLLM_CPU_KVCACHE_SPACE"] = str(value)
                continue
            flag = "--" + name.replace("_", "-")
            if SETTINGS[name][0] == "bool":
                command.append(flag if value else "--no-" + flag[2:])
            else:
                command += [flag, str(value)]
        replica, dp = ranks_of(settings)
        nodes = role.nodes if role is not None else 1
        if replica > 1 or nodes > 1:
            command += ["--distributed-executor-backend", "mp"]
        local = max(1, replica * dp // nodes)
        if cpu_build and local > 1:
            env["VLLM_CPU_OMP_THREADS_BIND"] = _cpu_binding(local)
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
