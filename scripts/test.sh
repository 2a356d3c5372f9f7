#!/usr/bin/env bash
# The test command (`make test`): the test environment, real PostgreSQL and Redis on 127.0.0.1 (started if needed),
# then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export D0_VAR_DIR="${D0_VAR_DIR:-$(mktemp -d)}"
# The real serving engine the engine tests run: vLLM's CPU build in an environment of its own, made once. On a
# fresh clone it is made beside everything else (a minute or two of pip): the tests that serve with it run late
# and wait for it (the vllm_python fixture, tests/engine/conftest.py), the others do not.
if [ -z "${D0_TEST_VLLM_PYTHON:-}" ]; then
  export D0_TEST_VLLM_PENDING="$D0_VAR_DIR/vllm-env"
  mkdir -p "$D0_TEST_VLLM_PENDING"
  (set +e; scripts/vllm-env.sh >"$D0_TEST_VLLM_PENDING/python" 2>"$D0_TEST_VLLM_PENDING/log"
   echo $? >"$D0_TEST_VLLM_PENDING/rc.tmp" && mv "$D0_TEST_VLLM_PENDING/rc.tmp" "$D0_TEST_VLLM_PENDING/rc") &
fi
make --no-print-directory venv
scripts/ensure-services.sh
export DATABASE_URL="${D0_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/d0}"
export REDIS_URL="${D0_TEST_REDIS_URL:-redis://127.0.0.1:6379/15}"
# The workers tests use queue names of their own; clear what an interrupted earlier run left in the test DB.
redis-cli -u "$REDIS_URL" flushdb >/dev/null
.venv/bin/ruff check --quiet .
exec .venv/bin/python -m pytest "$@"
