"""A recipe for every launcher: one deployment description, from a serve sweep's stored result, rendered as the
per-node commands of a bare-metal deployment (``recipe.sh``), a Slurm batch script (``recipe.sbatch``: one task per
node, ``srun``) and a Kubernetes LeaderWorkerSet manifest (``lws.yaml``: the leader is node rank 0).

Every renderer starts from ``Deployment``, which is built from checked values only (``recipe.checked_engine`` and
``recipe.checked_recipe``; the ``deployment`` part of the result checked here): a node's report is untrusted data.
The engine's command is rebuilt by its launcher (``launchers.VllmLauncher``, with each node's ``NodeRole``), so the
three recipes carry the same flags as the deployment d0 measured. The words a launcher fills in per node (the model
folder, the address and ports, the node rank) become parameters of the launcher at hand: shell parameters in the
scripts, ``LWS_*`` variables in the manifest. Every other value is quoted for its target: ``shlex.quote`` in the
scripts; in the manifest every string is a JSON-quoted YAML scalar, with ``$`` doubled so that Kubernetes' own
``$(VAR)`` expansion cannot pick up anything a node sent. Comments carry checked names and formatted numbers only.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from .launchers import LAUNCHERS, NodeRole, ranks_of, split_over_nodes
from .recipe import checked_engine, checked_recipe, number, version

# A host name or address as a recipe may use it (a default MASTER_ADDR, a comment): letters, digits, dots, colons
# and dashes, not starting with a dash.
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")
SLO_KEY = re.compile(r"[a-z][a-z0-9_]{0,63}")
MAX_NODES = 1024  # NodeRole's bound
DEFAULT_PORT = 8000
# The engine's rendezvous port on node rank 0 (TP/PP: --master-port; DP: --data-parallel-rpc-port).
DEFAULT_MASTER_PORT = 29500
# Per-node variables that are the machine's own, never a recipe's: VLLM_HOST_IP is the address vLLM binds its
# message queues to (d0 sets it when nodes share a machine); unset, vLLM takes the node's outward address.
MACHINE_ENV = ("VLLM_HOST_IP",)
SPLITS = {"one": "one node", "nnodes": "one replica's TP/PP ranks across the nodes (--nnodes/--node-rank)",
          "dp": "whole data-parallel replicas per node (--data-parallel-*)"}
# Stand-ins while the launcher builds a node's command; each becomes a parameter of the launcher at hand.
_PYTHON_MARK = "\0python"
_MODEL_MARK = "\0model"
_ADDR_MARK = "\0master-addr"
# The word after each flag is a per-deployment parameter (whatever value the launcher put there).
_PARAMETER_AFTER = {"--host": "host", "--port": "port", "--master-addr": "master_addr",
                    "--data-parallel-address": "master_addr", "--master-port": "master_port",
                    "--data-parallel-rpc-port": "master_port", "--node-rank": "node_rank",
                    "--data-parallel-start-rank": "start_rank"}


@dataclass(frozen=True)
class Parameter:
    """A word of a node's command that each launcher fills in its own way (``model``, ``port``, ``node_rank``...)."""

    name: str


Word = str | Parameter


@dataclass(frozen=True)
class Deployment:
    """What to deploy and what d0 measured of it, every value checked."""

    engine: str
    version: str | None
    cpu_build: bool
    python: str | None  # the node's engine interpreter, when it is a plain path
    settings: dict
    nodes: int
    split: str
    env: dict[str, str]
    checkpoint: str | None  # the team's checkpoint folder (the same path on every node); None: MODEL
    weights: str  # "checkpoint", "validation checkpoint" or "unknown"
    measured: dict[str, float] = field(default_factory=dict)
    slo: dict[str, float] = field(default_factory=dict)
    trial: int | None = None
    startup_s: float | None = None
    master_addr: str | None = None
    hostnames: tuple[str, ...] = ()
    # The roofline ceiling the measurement is compared with: (output tokens/s, precision, bound), when there is one.
    ceiling: tuple[float, str, str] | None = None

    @property
    def ranks_per_node(self) -> int:
        """Engine ranks (devices) on each node."""
        replica, dp = ranks_of(self.settings)
        return replica * dp // self.nodes

    @property
    def replicas_per_node(self) -> int:
        """Data-parallel replicas on each node (DP across nodes: a node's start rank is its node rank times this)."""
        return max(1, ranks_of(self.settings)[1] // self.nodes)

    def command(self, rank: int, *, cpu_cli: bool | None = None) -> list[Word]:
        """Node ``rank``'s engine command as its launcher builds it, the per-deployment words as ``Parameter``s.
        ``cpu_cli``: whether to start vLLM's CLI as the CPU build's PyPI distribution needs (default: as measured)."""
        launcher = LAUNCHERS[self.engine]
        options = {"port": DEFAULT_PORT, "cpu_build": self.cpu_build if cpu_cli is None else cpu_cli}
        if self.nodes > 1:
            options["role"] = NodeRole(self.nodes, rank, _ADDR_MARK, DEFAULT_MASTER_PORT)
        launch = launcher.launch(_PYTHON_MARK, Path(_MODEL_MARK), self.settings, **options)
        words: list[Word] = []
        for index, word in enumerate(launch.command):
            before = launch.command[index - 1] if index else None
            if word == _PYTHON_MARK:
                words.append(Parameter("python"))
            elif word == _MODEL_MARK:
                words.append(Parameter("model"))
            elif before in _PARAMETER_AFTER:
                words.append(Parameter(_PARAMETER_AFTER[before]))
            else:
                words.append(word)
        return words

    def hostname(self, rank: int) -> str | None:
        return self.hostnames[rank] if rank < len(self.hostnames) else None


def checked_slo(slo) -> dict[str, float]:
    """The workload's SLOs whose names are names and whose targets are positive numbers."""
    if not isinstance(slo, dict):
        return {}
    return {key: float(value) for key, value in slo.items()
            if isinstance(key, str) and SLO_KEY.fullmatch(key) and (number(value) or 0) > 0}


def host(value) -> str | None:
    return value if isinstance(value, str) and HOST.fullmatch(value) else None


def deployment(result: dict) -> Deployment:
    """The deployment a stored serve-sweep result describes. A ValueError when it makes no recipe: the recipe
    fails its checks (``recipe.checked_recipe``), or the node count or split is not one vLLM can deploy."""
    if not isinstance(result, dict):
        raise ValueError("the report is not an object")
    if result.get("role") == "follower":  # a node rank above 0 of a deployment reports no recipe of its own
        raise ValueError("this is a following node's report; the recipe is in node rank 0's")
    engine = checked_engine(result.get("engine"))
    checked = checked_recipe(result.get("recipe"), engine)
    described = result.get("deployment")
    described = described if isinstance(described, dict) else {}  # absent: a report of one node
    nodes = described.get("nodes", 1)
    if not (isinstance(nodes, int) and not isinstance(nodes, bool) and 1 <= nodes <= MAX_NODES):
        raise ValueError(f"the deployment's node count must be an int in 1-{MAX_NODES}")
    split = split_over_nodes(checked["settings"], nodes)
    if "split" in described and described["split"] != split:
        raise ValueError(f"the deployment's split is not what vLLM does with these settings over {nodes} nodes "
                         f"({split})")
    if nodes > 1 and checked["engine"] != "vllm":
        raise ValueError(f"d0 deploys {checked['engine']} on one node only")
    # The nodes' names, in node rank order, for the comments and a default MASTER_ADDR: all of them or none.
    hostnames = described.get("hostnames")
    hostnames = (tuple(hostnames) if isinstance(hostnames, list) and len(hostnames) == nodes
                 and all(map(host, hostnames)) else ())
    measured = checked.get("measured") if isinstance(checked.get("measured"), dict) else {}
    figures = {key: number(measured.get(key)) for key in ("output_tokens_per_s", "goodput_requests_per_s")}
    for metric in ("ttft_s", "tpot_s"):
        spread = measured.get(metric) if isinstance(measured.get(metric), dict) else {}
        figures.update({f"{metric}_{key}": number(spread.get(key)) for key in ("p50", "p99")})
    workload = result.get("workload") if isinstance(result.get("workload"), dict) else {}
    predicted = checked.get("prediction") if isinstance(checked.get("prediction"), dict) else {}
    ceiling = number(predicted.get("predicted_output_tokens_per_s"))
    return Deployment(
        engine=checked["engine"], version=checked["version"] or engine["version"], cpu_build=engine["cpu_build"],
        python=engine["python"], settings=checked["settings"], nodes=nodes, split=split,
        env={key: value for key, value in checked["env"].items() if key not in MACHINE_ENV},
        checkpoint=checked["weights"].get("path"), weights=checked["weights"]["kind"],
        measured={key: value for key, value in figures.items() if value is not None},
        slo=checked_slo(workload.get("slo")), trial=checked["trial"], startup_s=checked["startup_s"],
        master_addr=host(described.get("master_addr")), hostnames=hostnames,
        ceiling=(ceiling, version(predicted.get("precision")) or "?", version(predicted.get("bound")) or "?")
        if predicted.get("available") is True and ceiling is not None else None)


def summary(plan: Deployment, launcher: str) -> list[str]:
    """The recipe's header, one line each (without the comment marker): engine, layout and nodes, what d0 measured,
    the SLO, the weights."""
    settings = plan.settings
    layout = (f"TP={settings.get('tensor_parallel_size', 1)} PP={settings.get('pipeline_parallel_size', 1)} "
              f"DP={settings.get('data_parallel_size', 1)}"
              + (" EP" if settings.get("enable_expert_parallel") else ""))
    engine = " ".join(part for part in (plan.engine, plan.version) if part) + (" (CPU build)" if plan.cpu_build
                                                                               else "")
    lines = [f"d0 deployment recipe ({launcher}): {engine}",
             f"layout: {layout} on {plan.nodes} node{'s' if plan.nodes > 1 else ''}, {plan.ranks_per_node} "
             f"rank{'s' if plan.ranks_per_node > 1 else ''} per node; {SPLITS[plan.split]}"]
    measured = plan.measured
    figures = []
    if "output_tokens_per_s" in measured:
        figures.append(f"{measured['output_tokens_per_s']:.1f} output tokens/s")
    if "goodput_requests_per_s" in measured:
        figures.append(f"goodput {measured['goodput_requests_per_s']:.2f} requests/s")
    for metric, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT")):
        if f"{metric}_p50" in measured or f"{metric}_p99" in measured:
            figures.append(f"{name} " + ", ".join(f"{key} {measured[f'{metric}_{key}']:.4f} s" for key in
                                                   ("p50", "p99") if f"{metric}_{key}" in measured))
    if plan.startup_s is not None:
        figures.append(f"engine start {plan.startup_s:.0f} s")
    trial = f" (trial {plan.trial})" if plan.trial is not None else ""
    lines.append(f"measured by d0{trial}: " + ("; ".join(figures) if figures else "no figures reported"))
    if plan.ceiling is not None:
        lines.append(f"roofline ceiling: {plan.ceiling[0]:.1f} output tokens/s ({plan.ceiling[1]}, {plan.ceiling[2]}, "
                     "from the node's env check)")
    units = {"s": " s", "ms": " ms"}
    lines.append("SLO: " + (", ".join(f"{key} <= {value:g}{units.get(key.rsplit('_', 1)[-1], '')}"
                                      for key, value in plan.slo.items()) if plan.slo
                            else "none given (the best configuration is the highest output tokens/s)"))
    if plan.hostnames:
        lines.append("d0 ran it on: " + ", ".join(f"node rank {rank} {name}" for rank, name in
                                                   enumerate(plan.hostnames)))
    if plan.weights == "checkpoint":
        lines.append("weights: the team's checkpoint, the same folder on every node")
    elif plan.weights == "validation checkpoint":
        lines.append("weights: validation checkpoint (d0 served reduced, random weights: the figures are the serving "
                     "path's, not your model's); give your checkpoint folder as MODEL")
    else:
        lines.append("weights: not reported; give your checkpoint folder as MODEL")
    return lines


def _role(rank: int, nodes: int) -> str:
    return f"node rank {rank} (serves the API on $PORT)" if rank == 0 else f"node rank {rank} of {nodes} (headless)"


# --- Shell: the bare-metal script and the Slurm batch script ---------------------------------------------------

_SHELL_PARAMETERS = {"python": '"$PYTHON"', "model": '"$MODEL"', "host": '"$HOST"', "port": '"$PORT"',
                     "master_addr": '"$MASTER_ADDR"', "master_port": '"$MASTER_PORT"'}


def _shell_words(words: list[Word], rank_word: str, start_word: str) -> str:
    """A command as shell words: values quoted, parameters as shell parameters, the node rank and the data-parallel
    start rank as the launcher at hand gives them (a number, or an expression of its own rank variable)."""
    parameters = {**_SHELL_PARAMETERS, "node_rank": rank_word, "start_rank": start_word}
    return " ".join(parameters[word.name] if isinstance(word, Parameter) else shlex.quote(word) for word in words)


def _shell_settings(plan: Deployment, *, master_line: str) -> list[str]:
    """The scripts' parameters with their defaults (each can be set from outside; ``master_line`` sets
    MASTER_ADDR), and the engine's environment."""
    python = plan.python or "python3"
    lines = [f'[ -n "${{PYTHON:-}}" ] || PYTHON={shlex.quote(python)}']
    if plan.checkpoint:
        lines.append(f'[ -n "${{MODEL:-}}" ] || MODEL={shlex.quote(plan.checkpoint)}')
    else:
        lines.append(': "${MODEL:?set MODEL to your checkpoint folder (the same path on every node)}"')
    lines += [f"PORT=${{PORT:-{DEFAULT_PORT}}}", "HOST=${HOST:-0.0.0.0}"]
    if plan.nodes > 1:
        lines += [master_line, f"MASTER_PORT=${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}"]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(plan.env.items())]
    return lines


def bare_metal_script(plan: Deployment) -> str:
    """``recipe.sh``: each node's exact environment and command, one block per node rank; run it on every node
    with that node's ``NODE_RANK`` (a single node needs none)."""
    lines = ["#!/bin/sh", *(f"# {line}" for line in summary(plan, "bare metal"))]
    default = plan.master_addr or plan.hostname(0)
    if plan.nodes > 1:
        lines += ["#", "# Run it on every node with that node's rank (node rank 0 serves the API):",
                  *(f"#   NODE_RANK={rank} sh recipe.sh" + (f"   (d0 ran it on {plan.hostname(rank)})"
                                                            if plan.hostname(rank) else "")
                    for rank in range(plan.nodes)),
                  "# MASTER_ADDR is node rank 0's address, as the other nodes reach it"
                  + (f" (default: {default}, where d0 ran it)" if default else "") + "."]
    lines += ["# Parameters (environment variables): PYTHON, MODEL, PORT, HOST"
              + (", MASTER_ADDR, MASTER_PORT, NODE_RANK" if plan.nodes > 1 else ""), "set -eu"]
    master = (f'[ -n "${{MASTER_ADDR:-}}" ] || MASTER_ADDR={shlex.quote(default)}' if default
              else ': "${MASTER_ADDR:?set MASTER_ADDR to the address of node rank 0}"')
    lines += _shell_settings(plan, master_line=master)
    if plan.nodes == 1:
        lines += [f"# {_role(0, 1)}", "exec " + _shell_words(plan.command(0), "0", "0")]
        return "\n".join(lines) + "\n"
    # (No quote marks in the messages of ${...:?}: inside double quotes bash still pairs them.)
    lines.append(f'case "${{NODE_RANK:?set NODE_RANK to the rank of this node, 0 to {plan.nodes - 1}}}" in')
    for rank in range(plan.nodes):
        lines += [f"{rank})", f"    # {_role(rank, plan.nodes)}",
                  "    exec " + _shell_words(plan.command(rank), str(rank), str(rank * plan.replicas_per_node)),
                  "    ;;"]
    lines += [f'*)\n    echo "NODE_RANK must be 0 to {plan.nodes - 1}" >&2\n    exit 2\n    ;;', "esac"]
    return "\n".join(lines) + "\n"


def slurm_script(plan: Deployment, *, job_name: str = "d0-engine") -> str:
    """``recipe.sbatch``: one task per node (``srun``); the master is the job's first host and each task's node
    rank is its ``SLURM_NODEID``: node rank 0 serves the API, the others run headless."""
    lines = ["#!/bin/bash", *(f"# {line}" for line in summary(plan, "Slurm")),
             "# Submit with: sbatch recipe.sbatch (parameters, as environment variables: PYTHON, MODEL, PORT, HOST,"
             " MASTER_ADDR, MASTER_PORT)",
             f"#SBATCH --job-name={job_name}", f"#SBATCH --nodes={plan.nodes}", "#SBATCH --ntasks-per-node=1"]
    if not plan.cpu_build:
        lines.append(f"#SBATCH --gpus-per-node={plan.ranks_per_node}")
    lines += ["#SBATCH --exclusive", "set -eu"]
    # The job's first host is node rank 0 (SLURM_NODEID 0), so it is the master and serves the API.
    master = 'MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}'
    lines += _shell_settings(plan, master_line=master)
    exported = "PYTHON MODEL PORT HOST" + (" MASTER_ADDR MASTER_PORT" if plan.nodes > 1 else "")
    lines += [f"export {exported}", "", "# One task per node; srun gives each its SLURM_NODEID, its node rank.",
              "d0_node() {"]
    if plan.nodes == 1:
        lines.append("    exec " + _shell_words(plan.command(0), "0", "0"))
    else:
        start = f'"$((SLURM_NODEID * {plan.replicas_per_node}))"'
        lines += ['    if [ "$SLURM_NODEID" -eq 0 ]; then', f"        # {_role(0, plan.nodes)}",
                  "        exec " + _shell_words(plan.command(0), "0", "0"), "    fi",
                  f"    # node ranks 1 to {plan.nodes - 1} (headless)",
                  "    exec " + _shell_words(plan.command(1), '"$SLURM_NODEID"', start)]
    lines += ["}", "export -f d0_node",
              'echo "d0: the API will be served at http://$MASTER_ADDR:$PORT"' if plan.nodes > 1 else
              'echo "d0: the API will be served on port $PORT of $(scontrol show hostnames "$SLURM_JOB_NODELIST")"',
              # A task that fails ends the others: a deployment with a rank missing never serves.
              f"srun --nodes={plan.nodes} --ntasks={plan.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 "
              "bash -c d0_node"]
    return "\n".join(lines) + "\n"


# --- Kubernetes: a LeaderWorkerSet -------------------------------------------------------------------------------

LWS_API = "leaderworkerset.x-k8s.io/v1"
# What the LeaderWorkerSet controller gives every pod of a group (LWS >= 0.6): the leader's address, the group's
# size and the pod's index in it (the leader's is 0). Kubernetes expands $(NAME) in a container's command.
LWS_LEADER = "$(LWS_LEADER_ADDRESS)"
LWS_INDEX = "$(LWS_WORKER_INDEX)"
LWS_MODEL_DIR = "/models/checkpoint"  # where the manifest expects the checkpoint when d0 knows no folder of its own
# The engines' own images: vLLM's OpenAI server (GPU) and its CPU build's, tagged v<version>; SGLang's.
VLLM_IMAGE = "docker.io/vllm/vllm-openai"
VLLM_CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo"
SGLANG_IMAGE = "docker.io/lmsysorg/sglang:latest"


def _image(plan: Deployment) -> str:
    if plan.engine != "vllm":
        return SGLANG_IMAGE
    # A local version label (0.11.1+cpu) is the build's, not the image tag's.
    tag = f"v{plan.version.split('+')[0]}" if plan.version else "latest"
    return f"{VLLM_CPU_IMAGE if plan.cpu_build else VLLM_IMAGE}:{tag}"


def _kubernetes(value: str) -> str:
    """A value Kubernetes takes literally: its ``$(VAR)`` expansion (in command, args and env) reads ``$$`` as $."""
    return value.replace("$", "$$")


def _lws_container(plan: Deployment, rank: int) -> dict:
    """Node rank 0's container (the leader) or any worker's (node rank from LWS_WORKER_INDEX)."""
    # The image's vLLM is the "vllm" distribution, so its CLI starts as is (cpu_cli=False).
    words = plan.command(rank, cpu_cli=False)
    parameters = {"python": "python3", "model": "$(MODEL)", "host": "0.0.0.0", "port": str(DEFAULT_PORT),
                  "master_addr": LWS_LEADER, "master_port": str(DEFAULT_MASTER_PORT),
                  "node_rank": "0" if rank == 0 else LWS_INDEX, "start_rank": LWS_INDEX}
    command = []
    for word in words:
        if isinstance(word, Parameter) and word.name == "start_rank" and plan.replicas_per_node > 1:
            command.pop()  # its flag: this start rank is a product, which a shell works out (below)
            continue
        command.append(parameters[word.name] if isinstance(word, Parameter) else _kubernetes(word))
    if len(command) < len(words):
        # $$ is Kubernetes' escape for $: the shell sees "$@" and $((LWS_WORKER_INDEX * n)), the command's words
        # stay its arguments (never parsed by the shell).
        command = ["sh", "-c", f'exec "$$@" --data-parallel-start-rank '
                               f'"$$((LWS_WORKER_INDEX * {plan.replicas_per_node}))"', "sh", *command]
    model_dir = plan.checkpoint or LWS_MODEL_DIR
    container = {"name": "leader" if rank == 0 else "worker", "image": _image(plan), "command": command,
                 "env": [{"name": "MODEL", "value": _kubernetes(model_dir)},
                         *({"name": key, "value": _kubernetes(value)} for key, value in sorted(plan.env.items()))],
                 "volumeMounts": [{"name": "weights", "mountPath": model_dir, "readOnly": True},
                                  {"name": "dshm", "mountPath": "/dev/shm"}]}
    if not plan.cpu_build:
        container["resources"] = {"limits": {"nvidia.com/gpu": plan.ranks_per_node}}
    if rank == 0:
        container["ports"] = [{"containerPort": DEFAULT_PORT, "name": "http"}]
        container["readinessProbe"] = {"httpGet": {"path": "/health", "port": DEFAULT_PORT},
                                       "initialDelaySeconds": 30, "periodSeconds": 10}
    return container


def lws_manifest(plan: Deployment, *, name: str = "d0-engine") -> str:
    """``lws.yaml``: a LeaderWorkerSet of one group of ``nodes`` pods, one per node: the leader runs node rank 0
    (it serves the API on port 8000), the workers run headless, each with its LWS_WORKER_INDEX as its node rank.
    The weights are mounted from the same folder on every Kubernetes node (hostPath)."""
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", name):
        raise ValueError(f"a LeaderWorkerSet's name is a DNS label, not {name!r}")
    model_dir = plan.checkpoint or LWS_MODEL_DIR

    def template(rank: int) -> dict:
        return {"metadata": {"labels": {"app": name, "role": "leader" if rank == 0 else "worker"}},
                "spec": {"containers": [_lws_container(plan, rank)],
                         "volumes": [{"name": "weights", "hostPath": {"path": model_dir, "type": "Directory"}},
                                     # vLLM's processes share tensors through /dev/shm, which a pod keeps small.
                                     {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}

    # RecreateGroupOnPodRestart: a pod that fails restarts the whole group, as a deployment with a rank missing
    # never serves. A group of one is its leader; LWS requires a worker template all the same (node rank 0's).
    group = {"size": plan.nodes, "restartPolicy": "RecreateGroupOnPodRestart", "leaderTemplate": template(0),
             "workerTemplate": template(1 if plan.nodes > 1 else 0)}
    manifest = {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": {"name": name},
                "spec": {"replicas": 1, "leaderWorkerTemplate": group}}
    notes = [*summary(plan, "Kubernetes LeaderWorkerSet"),
             f"Apply with: kubectl apply -f lws.yaml (LeaderWorkerSet >= 0.6 installed); the API is port "
             f"{DEFAULT_PORT} of pod {name}-0 (the leader).",
             # The folder itself only in the manifest's quoted values: a path is the node's string.
             "The weights: volume weights, " + ("the checkpoint folder d0 served" if plan.checkpoint else
                                                f"the folder {LWS_MODEL_DIR}") + " of each Kubernetes node "
             "(hostPath), mounted at the same path in every pod; point it (or a volume of your own) at your "
             "checkpoint."]
    return "\n".join([*(f"# {line}" for line in notes), *_yaml(manifest)]) + "\n"


def _scalar(value) -> str:
    """A YAML scalar that means exactly ``value``: strings JSON-quoted (YAML reads JSON's double-quoted strings as
    they are), so no string turns into a number, a boolean or YAML syntax."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))


def _yaml(value, indent: int = 0) -> list[str]:
    """Block-style YAML of plain data (dicts, lists, strings, ints, booleans): d0's engine package does not depend
    on a YAML library, and this much needs none."""
    pad = " " * indent
    lines = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines += [f"{pad}{_key(key)}:", *_yaml(item, indent + 2)]
            else:
                lines.append(f"{pad}{_key(key)}: {_flow(item)}")
    else:
        for item in value:
            if isinstance(item, dict | list) and item:
                nested = _yaml(item, indent + 2)
                lines += [f"{pad}- {nested[0].lstrip()}", *nested[1:]]
            else:
                lines.append(f"{pad}- {_flow(item)}")
    return lines


def _key(key: str) -> str:
    """A mapping key: the manifest's own names plain (``nvidia.com/gpu``), anything else quoted."""
    return key if re.fullmatch(r"[A-Za-z][A-Za-z0-9_./-]*", key) else _scalar(key)


def _flow(value) -> str:
    """A scalar, or an empty dict or list."""
    if isinstance(value, dict | list):
        return "{}" if isinstance(value, dict) else "[]"
    return _scalar(value)


RECIPES = {"shell": bare_metal_script, "slurm": slurm_script, "lws": lws_manifest}


def render(result: dict, launcher: str, *, name: str = "d0-engine") -> str:
    """The recipe for ``launcher`` ("shell", "slurm" or "lws") from a stored serve-sweep result; a ValueError when
    the result makes none (or the launcher is none of these)."""
    if launcher not in RECIPES:
        raise ValueError(f"unknown launcher {launcher!r}; one of {', '.join(RECIPES)}")
    plan = deployment(result)
    if launcher == "slurm":
        return slurm_script(plan, job_name=name)
    if launcher == "lws":
        return lws_manifest(plan, name=name)
    return bare_metal_script(plan)
