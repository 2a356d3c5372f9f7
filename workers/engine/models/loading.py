"""From a config.json dict to a transformers config and a model, without remote code or hub access."""

from __future__ import annotations

import copy
import math

import torch

# Keys that never describe the architecture. `auto_map` names remote code, which d0 never runs; quantisation
# configs would make transformers swap in quantised layers that need vendor kernels or hub downloads, while the
# coverage trace runs on random weights in the requested dtype (float8 support is checked as a mechanism instead).
IGNORED_KEYS = ("auto_map", "quantization_config", "_name_or_path", "transformers_version")


NON_FINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _numbers_back(value):
    """Uploads keep JSON's bare Infinity / NaN as text (PostgreSQL's jsonb has no such numbers); transformers
    wants the floats (Nemotron-H's time_step_limit is [0.0, Infinity])."""
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    if isinstance(value, list):
        return [_numbers_back(item) for item in value]
    if isinstance(value, dict):
        return {key: _numbers_back(item) for key, item in value.items()}
    return value


def canonical_config(config: dict) -> tuple[dict, str | None]:
    """The config a model is built from, and the note a report must carry when it is not the release's own: a
    config no transformers architecture fits becomes d0's generic decoder of its shape (``models.generic_decoder``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if not isinstance(config, dict):
        raise ValueError(f"a model config must be a JSON object, not {type(config).__name__}")
    if config.get("model_type") in CONFIG_MAPPING_NAMES:
        return config, None
    from .config_loading import ConfigView
    from .resolution import resolve

    if resolve(ConfigView(config)).exact:
        return config, None
    from .generic_decoder import generic_config

    return generic_config(config)


def load_config(config: dict):
    """Build the transformers config for a config.json dict: ``AutoConfig.for_model(model_type, **rest)``.

    An unknown ``model_type`` is resolved as model intake resolves it (``resolution``): by the
    ``architectures`` entry and key signature (``kimi_k2`` is a DeepSeek-V3); a config no transformers architecture
    fits is built as d0's generic decoder of its shape (``canonical_config``). ``trust_remote_code`` is never used.
    (Reduced configs come through here too, so known types skip intake's alias cross-checks: a reducer shrinking
    ``num_experts`` leaves a stale ``num_local_experts`` that transformers ignores.)
    """
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if not isinstance(config, dict):
        raise ValueError(f"a model config must be a JSON object, not {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type in CONFIG_MAPPING_NAMES:
        rest = {key: _numbers_back(copy.deepcopy(value)) for key, value in config.items()
                if key != "model_type" and key not in IGNORED_KEYS}
        return AutoConfig.for_model(model_type, **rest)
    from .config_loading import ConfigView
    from .resolution import build_config, resolve

    view = ConfigView(config)
    resolution = resolve(view)
    if not resolution.exact:
        return load_config(canonical_config(config)[0])
    return build_config(view, resolution.resolved_architecture)


def causal_lm_config(transformers_config):
    """The decoder config a causal LM is built from: the text part of a multimodal config (Llama-4), else itself."""
    return transformers_config.get_text_config(decoder=True)


def text_config_dict(config: dict) -> dict:
    """The config dict of the text decoder: ``text_config`` (with its own model_type) for multimodal configs."""
    text = config.get("text_config")
    if isinstance(text, dict) and text.get("model_type"):
        return text
    return config


def build_meta_model(transformers_config, dtype: torch.dtype | None = None):
    """The model on the meta device: every module and parameter shape, no memory, no initialisation."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(causal_lm_config(transformers_config), dtype=dtype)


def build_random_model(transformers_config, *, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """The model with seeded random weights (transformers' own initialisation), in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM

    # A forked generator, so that seeding here leaves the process's own random state (a worker's) alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(causal_lm_config(transformers_config), dtype=dtype)
    return model.to(device).eval()


def load_checkpoint(path: str, *, dtype: torch.dtype = torch.float32):
    """A model from a checkpoint folder on local disk: safetensors only (never pickled weights), no hub."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(Path(path), local_files_only=True, use_safetensors=True,
                                                dtype=dtype).eval()
