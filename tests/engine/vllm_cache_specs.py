"""Run in the vLLM environment: vLLM's own KV-cache figures for a released config.json, as JSON on stdout.

    .venv-vllm/bin/python tests/engine/vllm_cache_specs.py CONFIG.json

Prints {"kv_bytes_per_token", "state_bytes_per_sequence", "attention_layers", "recurrent_layers", "how"} at bf16,
tensor parallel 1, vLLM's default cache dtypes ("auto"), no speculative decoding:

- which layers are attention and which recurrent comes from vLLM's (or transformers', as vLLM loads it) config
  class for the architecture, not from d0;
- bytes per token per attention layer are the ``real_page_size_bytes`` of a one-token page of
  ``FullAttentionSpec`` / ``MLAAttentionSpec`` (``vllm/v1/kv_cache_interface.py``), with the head size vLLM's
  attention layer of that architecture uses (MLA: the formula of ``MLAAttention.__init__``, checked in its source);
- the recurrent state per sequence is the model class's ``get_mamba_state_shape_from_config`` /
  ``get_mamba_state_dtype_from_config`` with a VllmConfig stand-in that carries the fields those classmethods read
  (model dtype, cache dtypes, TP size, no speculative tokens), summed as ``MambaSpec.real_page_size_bytes`` does,
  times the recurrent layers. Nemotron-H first gets the cache-dtype update vLLM applies to it
  (``NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype``).

MiniMax-M1's model class was removed from vLLM (registry: "MiniMaxM1ForCausalLM" removed in 0.23.0), so for it the
formulas its class called are used directly: ``MambaStateShapeCalculator.linear_attention_state_shape`` and
``MambaStateDtypeCalculator.linear_attention_state_dtype`` as vLLM still ships them ("how" says so).
"""

from __future__ import annotations

import json
import sys
from math import prod
from types import SimpleNamespace

import torch

MODEL_DTYPE = torch.bfloat16


def vllm_config(hf_config, mamba_ssm_cache_dtype: str = "auto"):
    from vllm.config import CacheConfig

    # vLLM's own cache settings at their defaults (mamba_cache_dtype "auto", no ReplaySSM/RecoverSSM rings).
    cache = CacheConfig(mamba_ssm_cache_dtype=mamba_ssm_cache_dtype)
    model = SimpleNamespace(hf_config=hf_config, hf_text_config=hf_config, dtype=MODEL_DTYPE)
    return SimpleNamespace(model_config=model, cache_config=cache, speculative_config=None, num_speculative_tokens=0,
                           parallel_config=SimpleNamespace(tensor_parallel_size=1))


def state_bytes(shapes, dtypes) -> int:
    # MambaSpec.state_content_size_bytes: sum(prod(shape) * dtype size).
    return sum(prod(shape) * torch.tensor([], dtype=dtype).element_size()
               for shape, dtype in zip(shapes, dtypes, strict=True))


def attention_bytes(heads: int, head_size: int, mla: bool = False) -> int:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    spec = (MLAAttentionSpec(block_size=1, num_kv_heads=1, head_size=head_size, dtype=MODEL_DTYPE) if mla else
            FullAttentionSpec(block_size=1, num_kv_heads=heads, head_size=head_size, dtype=MODEL_DTYPE))
    return spec.real_page_size_bytes


def mla_head_size(kv_lora_rank: int, qk_rope_head_dim: int) -> int:
    """The cache head size vLLM's MLAAttention gives itself, read from its source as written (building the layer
    needs a device and a full engine config)."""
    import inspect

    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    formula = "self.head_size = kv_lora_rank + qk_rope_head_dim"
    if formula not in inspect.getsource(MLAAttention.__init__):
        raise SystemExit(f"vLLM's MLAAttention no longer says {formula!r}: update this probe")
    return kv_lora_rank + qk_rope_head_dim


def kimi_linear(raw: dict) -> dict:
    from vllm.models.kimi_k3.nvidia.model import KimiLinearForCausalLM
    from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig

    config = KimiLinearConfig(**raw)
    kda = [index for index in range(config.num_hidden_layers) if config.is_kda_layer(index)]
    attention = [index for index in range(config.num_hidden_layers) if index not in kda]
    settings = vllm_config(config)
    per_layer = state_bytes(KimiLinearForCausalLM.get_mamba_state_shape_from_config(settings),
                            KimiLinearForCausalLM.get_mamba_state_dtype_from_config(settings))
    token = attention_bytes(1, mla_head_size(config.kv_lora_rank, config.qk_rope_head_dim), mla=True)
    return {"attention_layers": attention, "recurrent_layers": kda, "kv_bytes_per_token": token * len(attention),
            "state_bytes_per_sequence": per_layer * len(kda),
            "how": "KimiLinearConfig.is_kda_layer; MLAAttentionSpec; KimiLinearForCausalLM classmethods"}


def jamba(raw: dict) -> dict:
    from transformers import JambaConfig
    from vllm.model_executor.models.jamba import JambaForCausalLM

    config = JambaConfig(**{key: value for key, value in raw.items() if key != "auto_map"})
    kinds = config.layers_block_type
    attention = [index for index, kind in enumerate(kinds) if kind == "attention"]
    mamba = [index for index, kind in enumerate(kinds) if kind == "mamba"]
    settings = vllm_config(config)
    per_layer = state_bytes(JambaForCausalLM.get_mamba_state_shape_from_config(settings),
                            JambaForCausalLM.get_mamba_state_dtype_from_config(settings))
    head = config.hidden_size // config.num_attention_heads
    return {"attention_layers": attention, "recurrent_layers": mamba,
            "kv_bytes_per_token": attention_bytes(config.num_key_value_heads, head) * len(attention),
            "state_bytes_per_sequence": per_layer * len(mamba),
            "how": "JambaConfig.layers_block_type; FullAttentionSpec; JambaForCausalLM classmethods"}


def nemotron_h(raw: dict) -> dict:
    from transformers import NemotronHConfig
    from vllm.model_executor.models.config import NemotronHForCausalLMConfig
    from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM

    config = NemotronHConfig(**{key: value for key, value in raw.items() if key != "auto_map"})
    pattern = raw["hybrid_override_pattern"]
    attention = [index for index, char in enumerate(pattern) if char == "*"]
    mamba = [index for index, char in enumerate(pattern) if char == "M"]
    settings = vllm_config(config)
    NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(cache_config=settings.cache_config, hf_config=config)
    per_layer = state_bytes(NemotronHForCausalLM.get_mamba_state_shape_from_config(settings),
                            NemotronHForCausalLM.get_mamba_state_dtype_from_config(settings))
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {"attention_layers": attention, "recurrent_layers": mamba,
            "kv_bytes_per_token": attention_bytes(config.num_key_value_heads, head) * len(attention),
            "state_bytes_per_sequence": per_layer * len(mamba),
            "how": "hybrid_override_pattern; FullAttentionSpec; NemotronH cache-dtype update and classmethods"}


def minimax_m1(raw: dict) -> dict:
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator

    kinds = raw["attn_type_list"]
    attention = [index for index, kind in enumerate(kinds) if kind == 1]
    linear = [index for index, kind in enumerate(kinds) if kind == 0]
    heads = raw["num_attention_heads"]
    head = raw.get("head_dim") or raw["hidden_size"] // heads
    per_layer = state_bytes(MambaStateShapeCalculator.linear_attention_state_shape(heads, 1, head),
                            MambaStateDtypeCalculator.linear_attention_state_dtype(MODEL_DTYPE, "auto"))
    return {"attention_layers": attention, "recurrent_layers": linear,
            "kv_bytes_per_token": attention_bytes(raw["num_key_value_heads"], head) * len(attention),
            "state_bytes_per_sequence": per_layer * len(linear),
            "how": "MiniMaxM1ForCausalLM was removed from vLLM (0.23.0): attn_type_list; FullAttentionSpec; the "
                   "linear_attention_state_shape/dtype formulas it called"}


def qwen3_next(raw: dict) -> dict:
    from transformers import Qwen3NextConfig
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM

    config = Qwen3NextConfig(**{key: value for key, value in raw.items() if key != "auto_map"})
    attention = [index for index, kind in enumerate(config.layer_types) if kind == "full_attention"]
    linear = [index for index, kind in enumerate(config.layer_types) if kind == "linear_attention"]
    settings = vllm_config(config)
    per_layer = state_bytes(Qwen3NextForCausalLM.get_mamba_state_shape_from_config(settings),
                            Qwen3NextForCausalLM.get_mamba_state_dtype_from_config(settings))
    # Qwen3-Next's attention has an output gate in its q projection, not in its cache: K and V of head_dim.
    return {"attention_layers": attention, "recurrent_layers": linear,
            "kv_bytes_per_token": attention_bytes(config.num_key_value_heads, config.head_dim) * len(attention),
            "state_bytes_per_sequence": per_layer * len(linear),
            "how": "Qwen3NextConfig.layer_types; FullAttentionSpec; Qwen3NextForCausalLM classmethods"}


BY_ARCHITECTURE = {"Qwen3NextForCausalLM": qwen3_next, "KimiLinearForCausalLM": kimi_linear, "JambaForCausalLM": jamba,
                   "NemotronHForCausalLM": nemotron_h, "MiniMaxM1ForCausalLM": minimax_m1}


def probe(path: str) -> dict:
    with open(path) as handle:
        raw = json.load(handle)
    architecture = (raw.get("architectures") or [None])[0]
    if architecture not in BY_ARCHITECTURE:
        raise SystemExit(f"no vLLM probe for {architecture}")
    return BY_ARCHITECTURE[architecture](raw)


def main(paths: list[str]) -> None:
    """One JSON line: each config path's figures (vLLM is imported once for all of them)."""
    print(json.dumps({path: probe(path) for path in paths}))


if __name__ == "__main__":
    main(sys.argv[1:])
