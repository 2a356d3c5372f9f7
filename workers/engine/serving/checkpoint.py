"""Validation checkpoints: the real architecture, reduced, with seeded random weights, written the way a release is
(config.json, safetensors, tokenizer), for a serving engine to load when a team has no weights yet.

What the engine's kernels require is kept as released: head dims and MLA's latent ranks (vLLM's MLA accepts only
its own head dims), the routing method (``topk_method: noaux_tc`` needs its score-correction bias tensor). Only
depth, widths of the MLPs, expert count and vocabulary shrink. The tokenizer is a word-level one generated for the
reduced vocabulary: the load client sends token ids, so no text needs to mean anything.
"""

from __future__ import annotations

import json
from pathlib import Path


def vocab_size(config: dict) -> int:
    """The vocabulary prompts' token ids are drawn from (a multimodal config keeps it in its text_config)."""
    text = config.get("text_config") or config
    vocab = text.get("vocab_size") or config.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 8:
        raise ValueError("the model's config.json gives no vocab_size to draw prompt token ids from")
    return vocab


def write_validation_checkpoint(config: dict, folder: Path, *, seed: int = 0, reduce: bool = True) -> dict:
    """Write the checkpoint into ``folder``; returns what it is (architecture, layers, vocabulary, notes).
    ``reduce=False`` writes the config as given (a benchmark's model of a chosen size)."""
    import torch

    from ..models import build_random_model, load_config, reduce_config

    reduction = reduce_config(config, keep_latent_ranks=True) if reduce else None
    model = build_random_model(load_config(reduction.config if reduction else config), dtype=torch.bfloat16,
                               device=torch.device("cpu"), seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    vocab_size = model.config.get_text_config().vocab_size
    _write_tokenizer(folder, vocab_size)
    description = {"architecture": type(model).__name__, "model_type": model.config.model_type,
                   "layers": reduction.layers if reduction else model.config.get_text_config().num_hidden_layers,
                   "full_layers": reduction.full_layers if reduction else None, "vocab_size": vocab_size,
                   "parameters": sum(parameter.numel() for parameter in model.parameters()),
                   "weights": f"seeded random (seed {seed}), bfloat16",
                   "notes": reduction.notes if reduction else ["not reduced: the config as given"]}
    (folder / "d0-validation-checkpoint.json").write_text(json.dumps(description, indent=2))
    return description


def _write_tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{index}": index for index in range(3, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)
