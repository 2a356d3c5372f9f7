"""Reading a released ``config.json`` into a validated view, before anything is built from it.

Vendors spell the same dimension differently (``hidden_size`` / ``d_model`` / ``dim``, ``n_routed_experts`` /
``num_local_experts`` / ``ffn_config.moe_num_experts`` ...). ``ConfigView`` answers by the canonical name, checks
every value against sane bounds first (so an absurd ``num_hidden_layers = 10**9`` is refused before torch sees it)
and remembers which raw keys it read, so the report can list the keys nobody interpreted.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

# Released config.json files are a few kB; anything this big is not a config and is refused before parsing.
MAX_CONFIG_FILE_BYTES = 8 * 1024 * 1024
MAX_EXPERT_MLPS = 2**18  # layers x routed experts: 11x the largest release, built on the meta device in ~1 s

# Multimodal wrappers keep the language model's dimensions in one of these (Llama-4: text_config).
LANGUAGE_CONFIG_KEYS = ("text_config", "language_config", "llm_config")


class ConfigError(ValueError):
    """The config cannot be analysed; the message says which key is missing or wrong."""


@dataclass(frozen=True)
class Key:
    """One dimension-like setting, its spellings across vendors, and the values it may take.

    ``neutral`` is the value with which an architecture that ignores the key still builds the released shapes
    (``moe_layer_freq`` 1, ``shared_expert_intermediate_size`` 0); ``structural`` keys change parameter shapes.
    ``per_layer`` keys may also be given as one value per layer (Hunyuan's ``moe_topk`` and ``num_experts``).
    """

    name: str
    aliases: tuple[str, ...]
    low: int = 1
    high: int = 2**20
    structural: bool = True
    neutral: object = None
    per_layer: bool = False


# Upper bounds sit far above any released model (largest today: hidden 18432, 200 layers, 384 experts, vocab
# 262144) and far below what would make a meta-device build or the arithmetic misbehave.
KEYS = (
    Key("hidden_size", ("hidden_size", "d_model", "dim", "n_embd", "model_dim"), high=2**17),
    # 512: 2.5x the deepest release; the meta-device build grows faster than linearly with depth (Jamba at 2048
    # layers took 59 s, at 512 4 s).
    Key("num_layers", ("num_hidden_layers", "n_layers", "num_layers", "n_layer"), high=512),
    Key("vocab_size", ("vocab_size", "padded_vocab_size", "n_vocab"), high=2**22),
    Key("num_heads", ("num_attention_heads", "n_heads", "n_head", "num_heads"), high=2**14),
    Key("num_kv_heads", ("num_key_value_heads", "attn_config.kv_n_heads", "n_kv_heads", "num_kv_heads",
                         "multi_query_group_num"), high=2**14),
    Key("head_dim", ("head_dim", "attention_head_dim", "kv_channels"), high=2**14),
    Key("v_head_dim", ("v_head_dim",), high=2**14),
    # Dense MLP width. Llama-4 names its dense width intermediate_size_mlp and uses intermediate_size for experts.
    Key("dense_intermediate_size", ("intermediate_size_mlp",), high=2**21),
    Key("intermediate_size", ("intermediate_size", "inter_dim", "ffn_hidden_size", "n_inner",
                              "ffn_config.ffn_hidden_size"), high=2**21, per_layer=True),
    Key("moe_intermediate_size", ("moe_intermediate_size", "moe_inter_dim", "expert_intermediate_size"), high=2**21,
        per_layer=True),
    Key("shared_expert_intermediate_size", ("shared_expert_intermediate_size", "shared_intermediate_size"),
        low=0, high=2**21, neutral=0, per_layer=True),
    Key("num_experts", ("n_routed_experts", "num_experts", "num_local_experts", "ffn_config.moe_num_experts",
                        "moe_num_experts"), low=0, high=2**14, per_layer=True),
    Key("experts_per_token", ("num_experts_per_tok", "experts_per_token", "n_activated_experts",
                              "ffn_config.moe_top_k", "moe_top_k", "moe_topk"), low=0, high=2**14, structural=False,
        per_layer=True),
    # Hunyuan spells it num_shared_expert, one value per layer (its shared MLP: intermediate_size x that count).
    Key("num_shared_experts", ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "num_shared_expert"),
        low=0, high=2**10,
        neutral=0,
        per_layer=True),
    # Which layers are dense and which MoE: DeepSeek (first_k_dense_replace, moe_layer_freq), Qwen
    # (decoder_sparse_step), Llama-4 (interleave_moe_layer_step), Jamba (expert_layer_period/offset), Arctic
    # (moe_layer_frequency).
    Key("first_dense_layers", ("first_k_dense_replace", "n_dense_layers", "first_k_dense", "moe_layer_num_skipped"),
        low=0, high=2048,
        neutral=0),
    Key("moe_layer_freq", ("moe_layer_freq",), high=2048, neutral=1),
    Key("decoder_sparse_step", ("decoder_sparse_step",), high=2048, neutral=1),
    Key("interleave_moe_layer_step", ("interleave_moe_layer_step",), high=2048, neutral=1),
    Key("expert_layer_period", ("expert_layer_period",), high=2048, neutral=1),
    Key("expert_layer_offset", ("expert_layer_offset",), low=0, high=2048, neutral=0),
    Key("moe_layer_frequency", ("moe_layer_frequency",), high=2048, neutral=1),
    # Multi-head latent attention (DeepSeek-V2 paper, section 2.1) and DeepSeek Sparse Attention's indexer.
    Key("kv_lora_rank", ("kv_lora_rank",), high=2**16),
    Key("q_lora_rank", ("q_lora_rank",), high=2**16),
    Key("qk_nope_head_dim", ("qk_nope_head_dim",), high=2**14),
    Key("qk_rope_head_dim", ("qk_rope_head_dim",), high=2**14),
    Key("index_n_heads", ("index_n_heads",), high=2**14),
    Key("index_head_dim", ("index_head_dim",), high=2**14),
    # Hybrid layouts: Jamba (attn_layer_period/offset), Mamba 1 and 2 state sizes.
    Key("attn_layer_period", ("attn_layer_period",), high=2048),
    Key("attn_layer_offset", ("attn_layer_offset",), low=0, high=2048),
    Key("mamba_d_state", ("mamba_d_state", "ssm_state_size", "state_size"), high=2**14),
    Key("mamba_d_conv", ("mamba_d_conv", "conv_kernel", "d_conv"), high=2**10),
    Key("mamba_expand", ("mamba_expand", "expand"), high=64),
    Key("mamba_dt_rank", ("mamba_dt_rank",), high=2**16),
    Key("mamba_num_heads", ("mamba_num_heads",), high=2**16),
    Key("mamba_head_dim", ("mamba_head_dim",), high=2**14),
    Key("mamba_n_groups", ("n_groups", "mamba_n_groups"), high=2**14),
    Key("mtp_layers", ("num_nextn_predict_layers", "num_mtp_layers"), low=0, high=64, structural=False),
    Key("mtp_modules_other", ("num_mtp_modules",), low=0, high=64, structural=False),
    # Bounded because some older modeling code precomputes per-position tables; 2**32 is far beyond 10M-token models.
    Key("max_position_embeddings", ("max_position_embeddings", "max_seq_len", "n_positions", "max_sequence_length",
                                    "seq_length"), high=2**32, structural=False),
    # 0 is how some configs (transformers' Qwen2-MoE default) say "no window".
    Key("sliding_window", ("sliding_window",), low=0, high=2**32, structural=False),
    Key("attention_chunk_size", ("attention_chunk_size",), high=2**32, structural=False),
    Key("max_window_layers", ("max_window_layers",), low=0, high=2048, structural=False),
)
KEYS_BY_NAME = {key.name: key for key in KEYS}

# Per-layer lists and patterns whose length must equal the layer count.
LAYER_LISTS = ("layer_types", "attn_type_list", "layers_block_type", "mlp_layer_types", "no_rope_layers")

# Keys that say nothing about serving a model (training knobs, token ids, provenance); never reported as
# "uninterpreted".
IGNORABLE_KEYS = frozenset({
    "_name_or_path", "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype",
    "initializer_range", "use_cache", "attention_dropout", "hidden_dropout", "emb_pdrop", "resid_pdrop",
    "embd_pdrop", "attn_pdrop", "output_router_logits", "router_aux_loss_coef", "aux_loss_alpha", "seq_aux",
    "moe_loss_weight", "moe_jitter_eps", "router_jitter_noise", "bos_token_id", "eos_token_id", "pad_token_id",
    "pretraining_tp", "num_logits_to_keep", "use_mamba_kernels", "tokenizer_class", "return_dict",
    "output_hidden_states", "output_attentions", "moe_train_capacity_factor", "moe_eval_capacity_factor",
    "moe_min_capacity", "enable_expert_tensor_parallelism", "rescale_prenorm_residual", "residual_in_fp32",
    "ep_size", "quantization_config",
})


def load_config_file(path: str | Path) -> dict:
    """Parse a config.json. Python's json accepts the bare ``Infinity`` some vendors write (Nemotron-H)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    if size > MAX_CONFIG_FILE_BYTES:
        raise ConfigError(f"{path} is {size} bytes; a config.json is a few kB (limit {MAX_CONFIG_FILE_BYTES})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ConfigError(f"{path} is not valid JSON: {error}") from None


# Keys whose spelling an architecture may choose for itself (ERNIE 4.5 says moe_k for top-k, Hunyuan moe_topk,
# LongCat expert_ffn_hidden_size): transformers' config class of that model_type maps the usual name to its own
# in ``attribute_map``, and d0 reads those spellings too. Only routing keys: a shape key mapped onto another
# (DeepSeek-V4 reads intermediate_size as moe_intermediate_size) would merge two widths d0 keeps apart.
ARCHITECTURE_ALIASED = ("num_experts", "experts_per_token", "num_shared_experts", "moe_intermediate_size")


@functools.lru_cache(maxsize=256)
def architecture_aliases(model_type) -> dict[str, tuple[str, ...]]:
    """Extra spellings of the routing keys that transformers' config class for ``model_type`` declares."""
    if not isinstance(model_type, str):
        return {}
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        attribute_map = getattr(CONFIG_MAPPING[model_type], "attribute_map", None) or {}
    except (KeyError, ImportError, AttributeError, ValueError):
        return {}
    aliases = {}
    for name in ARCHITECTURE_ALIASED:
        own = tuple(dict.fromkeys(attribute_map[usual] for usual in KEYS_BY_NAME[name].aliases
                                  if isinstance(attribute_map.get(usual), str)))
        own = tuple(spelling for spelling in own if spelling not in KEYS_BY_NAME[name].aliases)
        if own:
            aliases[name] = own
    return aliases


class ConfigView:
    """Validated, alias-aware read access to a raw config dict (and its language sub-config, if any)."""

    def __init__(self, raw: object):
        if not isinstance(raw, dict):
            raise ConfigError(f"a config must be a JSON object, got {type(raw).__name__}")
        self.raw = raw
        self.language_key = next((key for key in LANGUAGE_CONFIG_KEYS if isinstance(raw.get(key), dict)
                                  and not self._has_hidden_size(raw)), None)
        # Where the language model's keys live; the top level is the fallback (Llama-4 keeps token ids there).
        self.scopes = ([raw[self.language_key]] if self.language_key else []) + [raw]
        self.read_keys: set[str] = set()
        self.architecture_aliases = architecture_aliases(self.get("model_type"))
        self._values: dict[str, int | None] = {}
        self._per_layer: dict[str, list[int]] = {}  # keys given as one value per layer, where the values differ
        self._listed: dict[str, tuple[str, list[int]]] = {}  # every key given as a list: (its spelling, values)
        for key in KEYS:  # in order: the layer count is read before any per-layer list is checked against it
            self._values[key.name] = self._checked(key)
            if key.name == "num_layers" and self._values["num_layers"] is None:
                self._values["num_layers"] = self._layers_from_pattern()
        for name in ("hidden_size", "num_layers", "vocab_size"):
            if self._values[name] is None:
                spellings = ", ".join(KEYS_BY_NAME[name].aliases)
                raise ConfigError(f"the config has no {name.replace('_', ' ')} (looked for {spellings})")
        self._check_layer_lists()
        self._check_heads()

    @staticmethod
    def _has_hidden_size(raw: dict) -> bool:
        return any(alias in raw for alias in KEYS_BY_NAME["hidden_size"].aliases)

    def _lookup(self, dotted: str) -> tuple[bool, object]:
        for scope in self.scopes:
            value = scope
            for part in dotted.split("."):
                if not isinstance(value, dict) or part not in value:
                    break
                value = value[part]
            else:
                return True, value
        return False, None

    def _checked(self, key: Key) -> int | None:
        """The key's value from its first spelling present; every spelling present is validated and marked read,
        and two spellings of a shape-changing key must agree (gpt-oss writes experts_per_token twice)."""
        chosen = None
        for alias in (*key.aliases, *self.architecture_aliases.get(key.name, ())):
            found, value = self._lookup(alias)
            if not found or value is None:
                continue
            self.read_keys.add(alias)
            if key.per_layer and isinstance(value, list):
                value = self._per_layer_value(key, alias, value)
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{alias} must be an integer, got {value!r}")
            if not key.low <= value <= key.high:
                raise ConfigError(f"{alias} = {value} is outside the plausible range {key.low}..{key.high}")
            if chosen is None:
                chosen = (alias, value)
            elif key.structural and value != chosen[1]:
                raise ConfigError(f"{chosen[0]} = {chosen[1]} and {alias} = {value} disagree")
        return None if chosen is None else chosen[1]

    def _layers_from_pattern(self) -> int | None:
        """The layer count of a config that gives only its per-layer pattern (Nemotron-H's layers_block_type)."""
        for name in (*LAYER_LISTS, "hybrid_override_pattern"):
            value = self.get(name)
            if isinstance(value, list | str) and 0 < len(value) <= KEYS_BY_NAME["num_layers"].high:
                return len(value)
        return None

    def _per_layer_value(self, key: Key, alias: str, values: list) -> int:
        """A per-layer list: each entry checked like a single value; the largest stands for the key, and
        ``layer_dim`` gives each layer its own."""
        layers = self._values.get("num_layers")
        if layers is None or len(values) != layers:
            raise ConfigError(f"{alias} must be an integer or list one value per layer ({layers}), got {len(values)}")
        checked = []
        for value in values:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int) or not key.low <= value <= key.high:
                raise ConfigError(f"{alias} lists {value!r}, outside the plausible range {key.low}..{key.high}")
            checked.append(value)
        if len(set(checked)) > 1:
            self._per_layer[key.name] = checked
        self._listed.setdefault(key.name, (alias, checked))
        return max(checked)

    def layer_dim(self, name: str, layer: int | None, default: int | None = None) -> int | None:
        """The dimension in one layer: its own entry where the config lists one value per layer, else ``dim``."""
        if layer is not None and name in self._per_layer:
            return self._per_layer[name][layer]
        return self.dim(name, default)

    def per_layer_values(self, name: str) -> list[int] | None:
        """The values of a key the config gives as a list, one per layer (uniform or not), else None."""
        listed = self._listed.get(name)
        return None if listed is None else list(listed[1])

    def per_layer_values_of_alias(self, alias: str) -> list[int] | None:
        """Like ``per_layer_values``, by the spelling the config uses (``moe_topk``)."""
        for spelling, values in self._listed.values():
            if spelling == alias:
                return list(values)
        return None

    @property
    def per_layer_keys(self) -> list[str]:
        return sorted(self._per_layer)

    def _check_layer_lists(self) -> None:
        layers = self._values["num_layers"]
        for name in LAYER_LISTS:
            value = self.get(name)
            if value is not None and (not isinstance(value, list) or len(value) != layers):
                length = len(value) if isinstance(value, list) else type(value).__name__
                raise ConfigError(f"{name} must list one entry per layer ({layers}), got {length}")
        pattern = self.get("hybrid_override_pattern")
        if pattern is not None and (not isinstance(pattern, str) or len(pattern) != layers):
            raise ConfigError(f"hybrid_override_pattern must have one character per layer ({layers})")
        for name in ("mlp_only_layers", "moe_layers"):
            value = self.get(name)
            if value is not None and (not isinstance(value, list) or len(value) > layers
                                      or not all(isinstance(i, int) and 0 <= i < layers for i in value)):
                raise ConfigError(f"{name} must list layer indices below {layers}")

    def _check_heads(self) -> None:
        heads, kv_heads = self.dim("num_heads"), self.dim("num_kv_heads")
        if heads and kv_heads and heads % kv_heads:
            raise ConfigError(f"{heads} attention heads cannot be shared by {kv_heads} key/value heads")
        if heads and not self.dim("head_dim") and not self.dim("kv_lora_rank") and self.dim("hidden_size") % heads:
            raise ConfigError(f"hidden size {self.dim('hidden_size')} is not divisible by {heads} heads "
                              "and no head_dim is given")
        experts, top_k = self.dim("num_experts") or 0, self.dim("experts_per_token") or 0
        if top_k > experts > 0:
            raise ConfigError(f"{top_k} experts per token but only {experts} experts")
        # Each key alone is plausible up to its bound, but the meta-device build grows with layers x experts.
        expert_mlps = self.dim("num_layers") * max(experts, 1)
        if expert_mlps > MAX_EXPERT_MLPS:
            raise ConfigError(f"{self.dim('num_layers')} layers x {experts} experts make {expert_mlps:,} expert MLPs; "
                              f"d0 analyses up to {MAX_EXPERT_MLPS:,} (the largest release has 23,424: Kimi-K2's "
                              "61 x 384)")

    def dim(self, name: str, default: int | None = None) -> int | None:
        """A validated integer dimension by canonical name (see KEYS)."""
        value = self._values[name]
        return default if value is None else value

    def get(self, *keys: str, default=None):
        """The first of ``keys`` present (dotted paths reach into nested dicts); records it as read."""
        chosen = default
        for key in reversed(keys):  # every spelling present counts as read; the first one wins
            found, value = self._lookup(key)
            if found:
                self.read_keys.add(key)
                if value is not None:
                    chosen = value
        return chosen

    def flag(self, *keys: str, default: bool = False) -> bool:
        value = self.get(*keys)
        return default if value is None else bool(value)

    def number(self, *keys: str) -> float | None:
        value = self.get(*keys)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return None
        return value

    def present_structural_keys(self) -> list[tuple[str, object, Key]]:
        """(raw key, value, Key) for every structural key the config sets to a non-neutral value."""
        found = []
        for key in KEYS:
            if not key.structural:
                continue
            for alias in key.aliases:
                present, value = self._lookup(alias)
                if present and value is not None and value != key.neutral:
                    found.append((alias, value, key))
                    break
        return found

    def all_keys(self) -> list[str]:
        """Every key of the config (dotted inside nested sections), as the view's lookups name them."""
        keys: dict[str, None] = {}
        for scope in self.scopes:
            for key, value in scope.items():
                # A null says nothing, so it is never "uninterpreted".
                if key == self.language_key or value is None:
                    continue
                if isinstance(value, dict) and key.endswith("_config") and key != "quantization_config":
                    keys.update((f"{key}.{inner}", None) for inner, nested in value.items()
                                if inner != "model_type" and nested is not None)
                else:
                    keys[key] = None
        return list(keys)
