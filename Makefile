# The two commands of the README: `make run` (d0 on this machine, no external services) and `make test`; `make test-fast`
# is the quick tier beside it.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test test-fast venv

$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

run: venv
	$(PY) manage.py up

# scripts/test.sh makes the venv itself, beside the vLLM environment the serving tests use.
test:
	scripts/test.sh

# No service at all (no PostgreSQL, Redis, workers, Chromium or vLLM), under 3 minutes on 2 cores: the Django-free
# tests in tests/engine without pytest-django and without the web app's conftest above them, less those marked slow;
# then the control plane's unit tests on SQLite (the job state machine, the stage registries, the code's shape,
# settings). `make test` runs everything.
UNIT_TESTS := tests/test_architecture.py tests/test_job_flow.py tests/test_job_outcomes.py \
	tests/test_stage_parameters.py tests/test_stage_registry.py tests/test_trial_row.py tests/test_settings.py \
	tests/test_lost_stages.py
test-fast: venv
	.venv/bin/ruff check --quiet .
	$(PY) -m pytest -p no:django --confcutdir=tests/engine -m "not slow" tests/engine
	env -u DATABASE_URL -u REDIS_URL $(PY) -m pytest -m "not workers and not browser" $(UNIT_TESTS)
