"""The virtual backends d0 ships: torch's own backends (CUDA, MPS, CPU), as operator lists generated from the pinned
torch's ``native_functions.yaml`` by ``scripts/generate-virtual-backends.py`` into ``backends/``.

Each list names the operators with a kernel of the backend's own; what it runs through a composite kernel is not
listed (the classifier finds those). ``torch-<version>-composite.json`` in the same folder holds which operators have
a CompositeExplicitAutograd / CompositeExplicitAutogradNonFunctional / CompositeImplicitAutograd kernel. Reading
them needs no torch (the web tier offers them on the coverage page).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

BACKENDS_DIR = Path(__file__).with_name("backends")
GENERATED_BY = "scripts/generate-virtual-backends.py"


def torch_label(version: str) -> str:
    """``2.13.0+cpu`` -> ``2-13``: a slug (virtual backend names are slugs) naming the torch release."""
    major, minor = version.split("+")[0].split(".")[:2]
    return f"{major}-{minor}"


def backend_file_name(version: str, dispatch_key: str) -> str:
    return f"torch-{torch_label(version)}-{dispatch_key.lower()}.json"


def composite_file_name(version: str) -> str:
    return f"torch-{torch_label(version)}-composite.json"


@cache
def shipped_backends(directory: Path = BACKENDS_DIR) -> tuple[dict, ...]:
    """Every shipped backend: ``{"name", "dispatch_key", "torch", "description", "operators", "path"}``."""
    backends = []
    for path in sorted(directory.glob("torch-*.json")):
        data = json.loads(path.read_text())
        if "dispatch_key" in data:
            backends.append({**data, "path": str(path)})
    return tuple(backends)


def shipped_backend(name: str) -> dict | None:
    return next((backend for backend in shipped_backends() if backend["name"] == name), None)


@cache
def composite_kernels(directory: Path = BACKENDS_DIR) -> dict[str, frozenset[str]]:
    """``{composite key: operators with a kernel for it}`` from the shipped composite file."""
    paths = sorted(directory.glob("torch-*-composite.json"))
    if not paths:
        return {}
    data = json.loads(paths[-1].read_text())
    return {key: frozenset(names) for key, names in data["kernels"].items()}
