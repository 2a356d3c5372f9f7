#!/usr/bin/env bash
# The test command: real PostgreSQL and Redis on 127.0.0.1 (started if needed), then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-services.sh
export DATABASE_URL="${D0_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/d0}"
export REDIS_URL="${D0_TEST_REDIS_URL:-redis://127.0.0.1:6379/15}"
export D0_VAR_DIR="${D0_VAR_DIR:-$(mktemp -d)}"
# The workers tests use queue names of their own; clear what an interrupted earlier run left in the test DB.
redis-cli -u "$REDIS_URL" flushdb >/dev/null
.venv/bin/ruff check --quiet .
# The real serving engine the engine tests run: vLLM's CPU build in an environment of its own, made once.
export D0_TEST_VLLM_PYTHON="${D0_TEST_VLLM_PYTHON:-$(scripts/vllm-env.sh)}"
exec .venv/bin/python -m pytest "$@"
