#!/usr/bin/env bash
# The GPU checks the issues ask for, as one short run on a lent accelerator machine (a few minutes):
# envcheck, operator coverage of two models in bf16, the backend-parity sharded run (bf16 on the GPU against the
# CPU fp32 reference) for two architectures, and one small sweep. JSON (and the sweep's CSV) go to
# docs/validation/<date>-<gpu>/ ; commit that folder.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
gpu=$($PY -c "import torch; print(torch.cuda.get_device_name(0).replace(' ', '-') if torch.cuda.is_available() else 'no-gpu')")
out=${OUT_DIR:-docs/validation/$(date -u +%Y-%m-%d)-$gpu}
mkdir -p "$out"
configs=adaptation/intake/catalog/configs
run() {  # name, then the engine command; a failing check is recorded, the others still run
  local name=$1; shift
  echo "== $name"
  if ! timeout "${TIMEOUT:-300}" $PY -m workers.engine "$@" --json > "$out/$name.json" 2> "$out/$name.stderr"; then
    echo "   failed: see $out/$name.stderr"
  fi
}
run envcheck envcheck --expected-devices 1
run coverage-qwen3-30b-a3b-bf16 coverage "$configs/qwen3-30b-a3b.json" --dtype bf16
run coverage-llama-3.1-8b-bf16 coverage "$configs/llama-3.1-8b.json" --dtype bf16
run parity-llama-3.1-8b-bf16 shard "$configs/llama-3.1-8b.json" --tp 1 --dtype bf16 --device cuda
run parity-mixtral-8x7b-bf16 shard "$configs/mixtral-8x7b-v0.1.json" --tp 1 --dtype bf16 --device cuda
run sweep-qwen3-30b-a3b-bf16 sweep "$configs/qwen3-30b-a3b.json" --precisions bf16 --batch-sizes 1,4,16 \
  --page-sizes 16,64 --requests 16 --device cuda
# The node's stage memory limit with CUDA in the process (workers/stage_memory.py): under an 8 GiB RLIMIT_DATA the
# stage still starts CUDA and takes 20 GiB of device memory, while a 9 GiB host allocation fails as MemoryError.
echo "== stage-memory-cuda"
timeout "${TIMEOUT:-300}" $PY - > "$out/stage-memory-cuda.json" 2> "$out/stage-memory-cuda.stderr" <<'EOF2' || echo "   failed: see $out/stage-memory-cuda.stderr"
import json
import torch
from workers import stage_memory
stage_memory.configure(8 << 30)
stage_memory.enter()
result = {"limit_bytes": stage_memory.configured()}
try:
    device = torch.empty(20 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    result["device_bytes_allocated"] = torch.cuda.memory_allocated()
    del device
except Exception as error:  # recorded: the point is what happens
    result["device_error"] = f"{type(error).__name__}: {error}"
try:
    host = bytearray(9 << 30)
    result["host_9GiB"] = "allocated (the limit did not hold)"
except MemoryError:
    result["host_9GiB"] = "MemoryError (the limit held)"
stage_memory.leave()
print(json.dumps(result, indent=2))
EOF2
# An engine trial when the machine has vLLM (D0_VLLM_PYTHON names its interpreter, else `python -c "import vllm"`):
# the validation checkpoint of Llama-3.1-8B's architecture served on the GPU, two configurations, with correctness.
VLLM_PY=${D0_VLLM_PYTHON:-}
if [ -z "$VLLM_PY" ] && $PY -c "import vllm" 2>/dev/null; then VLLM_PY=$(command -v "$PY"); fi
if [ -n "$VLLM_PY" ]; then
  TIMEOUT=540 run serve-llama-3.1-8b-vllm serve "$configs/llama-3.1-8b.json" --engine "vllm=$VLLM_PY" \
    --grid '{"max_num_seqs": [8, 32]}' --settings '{"gpu_memory_utilization": 0.5}'
else
  echo "no vLLM on this machine: the engine trial was not run" | tee "$out/serve-not-run.txt"
fi
# A multi-process expert-parallel trial: one deployment of two "nodes" on this machine (two d0 serve processes, each
# its own GPU, joined by vLLM's --data-parallel-* flags through d0's rendezvous on 127.0.0.1), DP=2 + EP on the
# validation checkpoint of Qwen3-30B-A3B's architecture: the layout the CPU build cannot run (tests/
# test_serving_multinode.py), and DeepSeek-style deployments use on GPUs. Needs vLLM and two GPUs.
gpus=$($PY -c "import torch; print(torch.cuda.device_count())")
if [ -n "$VLLM_PY" ] && [ "$gpus" -ge 2 ]; then
  echo "== serve-ep-qwen3-30b-a3b-2nodes"
  port=$($PY -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  pids=()
  for rank in 1 0; do
    CUDA_VISIBLE_DEVICES=$rank D0_NODE_ADDRESS=127.0.0.1 VLLM_HOST_IP=127.0.0.1 timeout 540 $PY -m workers.engine serve \
      "$configs/qwen3-30b-a3b.json" --engine "vllm=$VLLM_PY" --grid '{"max_num_seqs": [8]}' --no-correctness \
      --settings '{"data_parallel_size": 2, "enable_expert_parallel": true, "gpu_memory_utilization": 0.5}' \
      --nodes node-0,node-1 --node-rank $rank --master "127.0.0.1:$port" --json \
      > "$out/serve-ep-rank$rank.json" 2> "$out/serve-ep-rank$rank.stderr" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || echo "   failed: see $out/serve-ep-rank*.stderr"; done
else
  echo "the expert-parallel trial needs vLLM and two GPUs (vLLM: ${VLLM_PY:-none}, GPUs: $gpus): not run" \
    | tee "$out/serve-ep-not-run.txt"
fi
ls -la "$out"
