"""The deployment recipe: the best trial's engine configuration, as the node reports it and as ``recipe.sh`` gives it.

A recipe is data, never code from the node. The node reports the engine's name and version, the settings, the
environment and the weights; whoever reads the report (the control plane, on arrival and again when it writes the
script) keeps only what passes a check: a version is a version, a weight kind is one d0 writes, an environment key
is a variable name, the settings are engine settings (``launchers.check_settings``). The command is rebuilt from those
settings by the engine's launcher, and every value in the script is quoted (``shlex``), so a hostile report (newlines,
``;``, ``$(...)``, backticks) can at worst make a recipe that fails to start an engine.
"""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path

from .launchers import LAUNCHERS, check_settings

# What a node-supplied string must look like to be used at all; anything else is dropped (None or "unknown").
VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,64}")
ENV_KEY = re.compile(r"[A-Z_][A-Z0-9_]*")
# An engine's interpreter as the node names it (``--engine vllm=/opt/vllm/bin/python``): a plain path.
INTERPRETER = re.compile(r"[A-Za-z0-9._+/-]{1,255}")
WEIGHT_KINDS = ("checkpoint", "validation checkpoint")
ENV_VALUE_MAX = 4096
# Stand-ins for the model folder and the port while the launcher builds the command; the script puts shell
# parameters there ($MODEL, $PORT), since d0's validation checkpoint and port lived only for the stage.
_MODEL_MARK = "\0model"
_PORT_MARK = 65535


def recipe(best: dict, described: dict, weights: dict) -> dict:
    """The node's recipe from its best trial, the engine's probe and the weights it served."""
    return {"engine": described["name"], "version": described.get("version"),
            "distribution": described.get("distribution"), "command": best["command"], "env": best["env"],
            "settings": best["settings"], "client": best["client"], "weights": weights,
            "measured": {key: best["metrics"].get(key) for key in (
                "output_tokens_per_s", "requests_per_s", "goodput_requests_per_s", "ttft_s", "tpot_s", "itl_s",
                "e2e_latency_s", "peak_memory_bytes")},
            "startup_s": best["startup_s"], "trial": best["id"],
            # the highest load meeting the SLOs and per device, where the workload asked for a goodput search
            "goodput": {key: (best.get("goodput") or {}).get(key) for key in (
                "over", "max_load_meeting_slo", "goodput_requests_per_s", "goodput_per_device", "devices")}
            if best.get("goodput") else None}


def version(value) -> str | None:
    """A version (or a similar name: a distribution, a precision) when it looks like one; otherwise None."""
    return value if isinstance(value, str) and VERSION.fullmatch(value) else None


def number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def checked_environment(env) -> dict[str, str]:
    """The variables whose names are variable names and whose values are plain scalars; others are dropped."""
    if not isinstance(env, dict):
        return {}
    return {key: str(value) for key, value in env.items()
            if isinstance(key, str) and ENV_KEY.fullmatch(key) and not isinstance(value, bool)
            and isinstance(value, str | int | float) and len(str(value)) <= ENV_VALUE_MAX}


def checked_engine(engine) -> dict:
    """The ``engine`` part of a node's serve-sweep result (its probe) with its strings checked."""
    engine = dict(engine) if isinstance(engine, dict) else {}
    name = engine.get("name")
    python = engine.get("python")
    return {**engine, "name": name if name in LAUNCHERS else None, "version": version(engine.get("version")),
            "distribution": version(engine.get("distribution")),
            "python": python if isinstance(python, str) and INTERPRETER.fullmatch(python) else None,
            "cpu_build": engine.get("cpu_build") is True}


def checked_recipe(reported, engine: dict) -> dict:
    """The recipe a node reported, keeping only what passes the checks, its command rebuilt from the checked
    settings. ``engine``: the result's checked engine (``checked_engine``). A ValueError when no recipe can be made
    of it (an engine d0 does not drive, settings that are no engine settings)."""
    if not isinstance(reported, dict):
        raise ValueError("the recipe is not an object")
    name = reported.get("engine")
    if name not in LAUNCHERS:
        raise ValueError(f"the recipe names no engine d0 drives ({', '.join(LAUNCHERS)})")
    settings = check_settings(dict(reported.get("settings") or {}))
    weights = reported.get("weights") if isinstance(reported.get("weights"), dict) else {}
    kind = weights.get("kind") if weights.get("kind") in WEIGHT_KINDS else "unknown"
    path = weights.get("path") if kind == "checkpoint" and isinstance(weights.get("path"), str) else None
    trial = reported.get("trial")
    checked = {**reported, "engine": name, "version": version(reported.get("version")),
               "distribution": version(reported.get("distribution")), "settings": settings,
               "env": checked_environment(reported.get("env")), "weights": {**weights, "kind": kind, "path": path},
               "startup_s": number(reported.get("startup_s")),
               "trial": trial if isinstance(trial, int) and not isinstance(trial, bool) else None}
    if path is None:
        checked["weights"].pop("path")
    checked["command"] = " ".join([*(f"{key}={shlex.quote(value)}" for key, value in sorted(checked["env"].items())),
                                   *_command_words(checked, engine)])
    return checked


def _command_words(checked: dict, engine: dict) -> list[str]:
    """The engine's command line as shell words, rebuilt by its launcher from the checked settings: every word
    quoted, the model folder and the port as shell parameters where the node's own would not serve."""
    python = engine.get("python") or "python3"
    launch = LAUNCHERS[checked["engine"]].launch(python, Path(_MODEL_MARK), checked["settings"], port=_PORT_MARK,
                                                 cpu_build=False)  # the CPU build differs in the environment only
    path = checked["weights"].get("path")
    model = shlex.quote(path) if path else '"${MODEL:?the checkpoint folder}"'
    words = []
    for index, word in enumerate(launch.command):
        if word == _MODEL_MARK:
            words.append(model)
        elif word == str(_PORT_MARK) and launch.command[index - 1] == "--port":
            words.append('"${PORT:-8000}"')
        else:
            words.append(shlex.quote(word))
    return words


def recipe_script(result: dict) -> str:
    """``recipe.sh``: the engine's command and environment as the checked recipe gives them. Comments carry only
    checked names and formatted numbers; every other value is a quoted word."""
    engine = checked_engine(result.get("engine"))
    checked = checked_recipe(result.get("recipe"), engine)
    measured = checked.get("measured") if isinstance(checked.get("measured"), dict) else {}
    header = " ".join(part for part in (checked["engine"], checked["version"]) if part)
    trial = checked["trial"] if checked["trial"] is not None else "?"
    lines = ["#!/bin/sh", f"# d0 deployment recipe: {header}",
             f"# measured: {number(measured.get('output_tokens_per_s')) or 0:.1f} output tokens/s, "
             f"engine start {checked['startup_s'] or 0:.0f} s (trial {trial})",
             f"# weights: {checked['weights']['kind']}"]
    predicted = checked.get("prediction") if isinstance(checked.get("prediction"), dict) else {}
    ceiling = number(predicted.get("predicted_output_tokens_per_s"))
    if predicted.get("available") is True and ceiling is not None:
        lines.append(f"# roofline ceiling: {ceiling:.1f} output tokens/s ({version(predicted.get('precision')) or '?'}"
                     f", {version(predicted.get('bound')) or '?'}, from the node's env check)")
    if checked["weights"]["kind"] != "checkpoint":
        lines.append("# d0 served a validation checkpoint (reduced, random weights): set MODEL to your checkpoint")
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(checked["env"].items())]
    lines.append("exec " + " ".join(_command_words(checked, engine)))
    return "\n".join(lines) + "\n"
