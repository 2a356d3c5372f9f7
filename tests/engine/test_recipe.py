"""``recipe.sh`` is data, not code from the node: from a hostile node report (newlines, ``;``, ``$(...)`` and backticks
in every field the node supplies) the script is valid shell, running it creates no file, and the engine's command
gets the node's strings, where it uses them at all, as plain arguments."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workers.engine.serving.recipe import checked_engine, checked_recipe, recipe_script


def payload(tag: str) -> str:
    """A string that makes a file named ``pwned-<tag>`` if a shell ever runs it, by each of the usual ways."""
    return f"x\ntouch pwned-{tag}-nl; touch pwned-{tag}-semi $(touch pwned-{tag}-subst) `touch pwned-{tag}-tick`"


def hostile_report(weights_kind: str = "hostile") -> dict:
    """A serve-sweep result as a compromised node could send it: every string it supplies is an attack, beside
    engine settings that pass the engine's own checks (the command is rebuilt from those)."""
    weights = ({"kind": "checkpoint", "path": "/models/" + payload("path")} if weights_kind == "checkpoint"
               else {"kind": payload("kind"), "path": payload("path2")})
    return {
        "engine": {"name": "vllm", "python": "/opt/vllm/bin/python" + payload("python"),
                   "version": payload("engine-version"), "distribution": payload("distribution"),
                   "cpu_build": payload("cpu")},
        "recipe": {
            "engine": "vllm", "version": payload("version"), "distribution": payload("dist"),
            "command": payload("command"),
            "env": {"VLLM_CPU_KVCACHE_SPACE": payload("env-value"), payload("env-key"): "1",
                    "OK;touch pwned-env-key2": "1", "lower_case": "1", "NUMBER": 4, "FLAG": True,
                    "NESTED": {"a": payload("nested")}},
            "settings": {"max_num_seqs": 4, "dtype": "bfloat16", "enforce_eager": True},
            "client": {"concurrency": payload("client")},
            "weights": weights,
            "measured": {"output_tokens_per_s": payload("measured"), "ttft_s": {"p50": payload("ttft")}},
            "startup_s": payload("startup"), "trial": payload("trial"),
            "prediction": {"available": True, "predicted_output_tokens_per_s": 12.5,
                           "precision": payload("precision"), "bound": payload("bound")},
        },
    }


def run_recipe(script: str, folder: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``bash -n``, then the script itself in ``folder``, PATH leading with harmless stubs of the engine's
    interpreter (they print their arguments and do nothing else); the rest of PATH stays, so an injected ``touch``
    would run and show."""
    (folder / "recipe.sh").write_text(script)
    checked = subprocess.run(["bash", "-n", "recipe.sh"], cwd=folder, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    stubs = folder / "bin"
    stubs.mkdir()
    for name in ("python3", "python", "vllm"):
        stub = stubs / name
        stub.write_text(f"#!{sys.executable}\nimport sys\nprint(repr(sys.argv[1:]))\n")
        stub.chmod(0o755)
    before = {path.name for path in folder.iterdir()}
    ran = subprocess.run([shutil.which("sh"), "recipe.sh"], cwd=folder, capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{stubs}:{os.environ['PATH']}", "HOME": str(folder), **(env or {})})
    assert {path.name for path in folder.iterdir()} == before, "the recipe made a file"
    assert not list(folder.rglob("pwned*"))
    return ran


def test_a_hostile_report_makes_a_valid_script_that_runs_nothing_of_the_nodes(tmp_path):
    script = recipe_script(hostile_report())
    assert "pwned" not in "\n".join(line for line in script.splitlines() if line.startswith("#"))
    # The one node string kept is an environment value, as one quoted word
    assert f"export VLLM_CPU_KVCACHE_SPACE={shlex.quote(payload('env-value'))}\n" in script
    assert "pwned" not in script.replace(shlex.quote(payload("env-value")), "''")
    ran = run_recipe(script, tmp_path, env={"MODEL": "/models/mine"})
    assert ran.returncode == 0, ran.stderr
    arguments = eval(ran.stdout.strip().splitlines()[-1])  # noqa: S307 - the stub's own repr() of its argv
    assert arguments[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert arguments[arguments.index("--model") + 1] == "/models/mine"
    assert arguments[arguments.index("--port") + 1] == "8000"
    assert "--max-num-seqs" in arguments and "--enforce-eager" in arguments
    assert not any("pwned" in argument for argument in arguments)


def test_a_hostile_checkpoint_path_reaches_the_engine_as_one_argument(tmp_path):
    report = hostile_report("checkpoint")
    ran = run_recipe(recipe_script(report), tmp_path)
    assert ran.returncode == 0, ran.stderr
    arguments = eval(ran.stdout.strip().splitlines()[-1])  # noqa: S307
    assert arguments[arguments.index("--model") + 1] == report["recipe"]["weights"]["path"]


def test_without_a_model_folder_the_script_stops_before_the_engine(tmp_path):
    ran = run_recipe(recipe_script(hostile_report()), tmp_path)
    assert ran.returncode != 0 and "the checkpoint folder" in ran.stderr and not ran.stdout


def test_what_the_node_supplied_is_kept_only_where_it_passes_its_check():
    report = hostile_report()
    engine = checked_engine(report["engine"])
    assert (engine["version"], engine["distribution"], engine["python"], engine["cpu_build"]) == (
        None, None, None, False)
    recipe = checked_recipe(report["recipe"], engine)
    assert recipe["version"] is None and recipe["distribution"] is None and recipe["trial"] is None
    assert recipe["env"] == {"VLLM_CPU_KVCACHE_SPACE": payload("env-value"), "NUMBER": "4"}
    assert recipe["weights"] == {"kind": "unknown"} and recipe["startup_s"] is None
    assert "pwned-command" not in recipe["command"] and "--max-num-seqs 4" in recipe["command"]
    good = {"name": "vllm", "python": "/opt/vllm/bin/python", "version": "0.11.1+cpu", "distribution": "vllm-cpu",
            "cpu_build": True}
    assert checked_engine(good) == good
    recipe = checked_recipe({**report["recipe"], "version": "0.11.1+cpu", "trial": 3}, good)
    assert recipe["version"] == "0.11.1+cpu" and recipe["trial"] == 3
    assert " /opt/vllm/bin/python -m vllm.entrypoints.openai.api_server " in recipe["command"]


@pytest.mark.parametrize("change, message", [
    ({"engine": "vllm; touch pwned"}, "no engine d0 drives"),
    ({"settings": {"dtype": "bf16; touch pwned"}}, "engine setting dtype"),
    ({"settings": {"max_num_seqs": "4 $(touch pwned)"}}, "engine setting max_num_seqs"),
    ({"settings": {"--trust-remote-code": True}}, "unknown engine setting"),
])
def test_a_recipe_whose_engine_or_settings_fail_their_checks_makes_no_script(change, message):
    report = hostile_report()
    with pytest.raises(ValueError, match=message):
        recipe_script({**report, "recipe": {**report["recipe"], **change}})


def test_the_scripts_comments_keep_a_good_reports_figures():
    engine = {"name": "vllm", "python": "/opt/vllm/bin/python", "version": "0.11.1", "cpu_build": True}
    report = {"engine": engine, "recipe": {
        "engine": "vllm", "version": "0.11.1", "settings": {"max_num_seqs": 4, "kv_cache_space_gib": 1},
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "weights": {"kind": "validation checkpoint"}, "trial": 2,
        "measured": {"output_tokens_per_s": 431.25}, "startup_s": 31.4,
        "prediction": {"available": True, "predicted_output_tokens_per_s": 900.0, "precision": "bf16",
                       "bound": "memory"}}}
    script = recipe_script(report)
    assert script.splitlines()[:5] == [
        "#!/bin/sh", "# d0 deployment recipe: vllm 0.11.1",
        "# measured: 431.2 output tokens/s, engine start 31 s (trial 2)", "# weights: validation checkpoint",
        "# roofline ceiling: 900.0 output tokens/s (bf16, memory, from the node's env check)"]
    assert "export VLLM_CPU_KVCACHE_SPACE=1\n" in script
    assert script.rstrip().splitlines()[-1].startswith("exec /opt/vllm/bin/python -m vllm.entrypoints")
