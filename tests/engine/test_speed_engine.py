"""Engine commands pay only for what they do: the analyze verb imports nothing beyond what
building the model on the meta device needs, and the compile-readiness check traces the model once.

No timing here: the figures are printed by benchmarks/analyze_speed.py and benchmarks/coverage_speed.py.
"""

import json
import subprocess
import sys
from typing import NamedTuple

import pytest
import torch

from workers.engine.coverage.compile_check import compile_check

from .conftest import CONFIGS

CONFIG = CONFIGS / "qwen3-0.6b.json"

# The modules a process holds after running ``code``, printed as JSON on its last line.
LOADED_AFTER = "import io, json, sys, contextlib\n{code}\nprint(json.dumps(sorted(sys.modules)))"

# What building this config's model on the meta device takes by itself, the floor the analyze verb is held to.
MODEL_ONLY = """
from transformers import AutoConfig, AutoModelForCausalLM
import torch
raw = json.load(open(sys.argv[1]))
config = AutoConfig.for_model(raw.pop("model_type"), **raw)
with torch.device("meta"):
    AutoModelForCausalLM.from_config(config)
"""

# The verb as ``python -m workers.engine analyze CONFIG --json`` runs it, minus the exit without tear-down.
ANALYZE_VERB = """
from workers.engine.__main__ import main
with contextlib.redirect_stdout(io.StringIO()) as output:
    assert main(["analyze", sys.argv[1], "--json"]) == 0
assert json.loads(output.getvalue())["method"] == "exact"
"""


def loaded_modules(code: str) -> set[str]:
    result = subprocess.run([sys.executable, "-c", LOADED_AFTER.format(code=code), str(CONFIG)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


@pytest.mark.slow
def test_the_analyze_verb_imports_nothing_that_building_the_model_does_not():
    extra = loaded_modules(ANALYZE_VERB) - loaded_modules(MODEL_ONLY)
    # d0's own analysis, and none of the other verbs' machinery (coverage's tracing, sharding, sweeps, serving).
    assert extra and all(name.partition(".")[0] == "workers" for name in extra), sorted(extra)
    assert not {name for name in extra if name.startswith(("workers.engine.coverage", "workers.engine.sharding",
                                                           "workers.engine.sweep", "workers.engine.serving"))}


# What the first import of transformers through d0's engine leaves in transformers' folder-scan cache.
SCANS = """
import workers.engine, transformers.models.llama.modeling_llama
from transformers.utils import import_utils
info = import_utils.create_import_structure_from_path.cache_info()
print(json.dumps({"misses": info.misses, "hits": info.hits}))
"""


@pytest.mark.slow
def test_transformers_scans_each_folder_of_its_models_once_in_an_engine_process():
    """transformers' own lru_cache (128 entries) lets ``import transformers.models`` scan its ~560 folders a second
    time after ``import transformers`` did (~0.4 s); workers/engine/transformers_index.py keeps every scan."""
    from pathlib import Path

    import transformers

    folders = sum(1 for path in (Path(transformers.__file__).parent / "models").rglob("*")
                  if path.is_dir() and path.name != "__pycache__")
    result = subprocess.run([sys.executable, "-c", LOADED_AFTER.format(code=SCANS)], capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr
    scans = json.loads(result.stdout.splitlines()[-2])
    # Each folder once (give or take the few the import system names twice); scanned twice it would be ~2x.
    assert scans["misses"] <= folders * 1.05, (scans, folders)
    assert scans["hits"] >= folders * 0.95, (scans, folders)


class Output(NamedTuple):
    logits: torch.Tensor


class BreaksOnce(torch.nn.Module):
    """A model with one known graph break between two linear layers, called the way coverage calls a causal LM."""

    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, input_ids, use_cache=False):
        hidden = self.first(input_ids.float())
        torch._dynamo.graph_break()
        return Output(logits=self.second(hidden))


def test_the_compile_check_traces_the_model_once_and_reports_its_graph_break(monkeypatch):
    import torch._dynamo.convert_frame as convert_frame

    traced = []
    trace_frame = convert_frame._compile

    def counting(code, *args, **kwargs):
        traced.append(code)
        return trace_frame(code, *args, **kwargs)

    monkeypatch.setattr(convert_frame, "_compile", counting)
    torch.manual_seed(0)
    result = compile_check(BreaksOnce().eval(), torch.ones(1, 8, dtype=torch.long))
    assert BreaksOnce.forward.__code__ in traced
    assert len(traced) == len(set(traced)), [code.co_name for code in traced]  # explain + compile traced each twice
    explained = result["explain"]
    assert explained["graph_count"] == 2 and explained["graph_break_count"] == 1
    assert len(explained["break_reasons"]) == 1 and "graph_break" in explained["break_reasons"][0]["reason"]
    assert "test_speed_engine.py" in explained["break_reasons"][0]["where"]
    assert result["compiles"] and result["backend"] == "aot_eager"
    assert result["max_abs_difference_to_eager"] == 0.0
    assert 0 <= explained["seconds"] <= result["seconds"]
