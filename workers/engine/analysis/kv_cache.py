"""KV-cache size per token and per sequence, by attention kind.

Elements cached per token and layer:
- MHA / GQA / MQA: K and V for every KV head, kv_heads x (head_dim + v_head_dim) (= 2 x kv_heads x head_dim);
- MLA: the compressed latent plus the shared RoPE key, kv_lora_rank + qk_rope_head_dim (DeepSeek-V2 paper,
  section 2.1.2: "(d_c + d_h^R) l" elements per token);
- sliding-window and chunked layers keep at most their window of tokens per sequence (gpt-oss 128, Llama-4 8192);
- linear attention and Mamba layers keep a fixed state per sequence, whatever its length: lightning attention a
  heads x head_dim x head_dim KV state (MiniMax-01 report, section 2.2); Mamba the SSM state (d_inner x d_state,
  or heads x head_dim x d_state for Mamba-2) plus the last d_conv - 1 convolution inputs; Kimi Delta Attention a
  heads x head_dim x head_dim state plus the last kernel - 1 inputs of its q, k and v convolutions
  (``MambaStateShapeCalculator.kda_state_shape``); Gated DeltaNet a v_heads x v_dim x k_dim state plus the last
  kernel - 1 inputs of its convolution over 2 x k_heads x k_dim + v_heads x v_dim channels
  (``gated_delta_net_state_shape``). The shapes are vLLM's (``model_executor/layers/mamba/mamba_utils.py``).

Caches kept in their own dtype, whatever the KV precision:
- DeepSeek-V3.2's indexer keys (DeepSeek-V3.2-Exp report, section 2.1): vLLM stores them as uint8, index_head_dim
  fp8 values and one fp32 scale per 128 of them, 128 + 4 = 132 bytes per token and layer
  (``model_executor/models/deepseek_v2.py``: ``DeepseekV32IndexerCache(head_dim=head_dim + head_dim //
  quant_block_size * 4, dtype=torch.uint8)``, quant_block_size 128);
- recurrent state, in the dtypes vLLM gives it by default (the engine d0 serves with), stated in the report:
  ``MambaStateDtypeCalculator`` (``model_executor/layers/mamba/mamba_utils.py``) keeps the conv state and the
  linear-attention state in ``mamba_cache_dtype`` "auto" = the model dtype, and the SSM state in
  ``mamba_ssm_cache_dtype`` "auto" = the conv state's dtype, except for Nemotron-H, whose
  ``NemotronHForCausalLMConfig`` (``model_executor/models/config.py``) sets it to the config's
  ``mamba_ssm_cache_dtype``, else float32 ("Only float32 is known to have no accuracy issues by default");
  ``kda_state_dtype`` keeps the KDA recurrent state in float32 whatever the model dtype, its convolution inputs in
  the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..models.config_loading import ConfigView
from .estimate import gdn_dims, kda_dims, mamba_inner_size
from ..models.layers import Layout

KV_PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
DTYPE_NAMES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
               "float32": "fp32", "fp32": "fp32", "float": "fp32"}
# vLLM's fp8 indexer cache: per token, index_head_dim fp8 values and one fp32 scale per block of this many.
INDEXER_QUANT_BLOCK = 128
NEMOTRON_H_ARCHITECTURES = ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM")


def kv_bytes_per_element(precision: str) -> int:
    try:
        return KV_PRECISION_BYTES[precision]
    except KeyError:
        raise ValueError(f"unknown KV-cache precision {precision!r}; known: {', '.join(KV_PRECISION_BYTES)}") \
            from None


@dataclass(frozen=True)
class KvLayer:
    kind: str
    elements_per_token: int
    window: int | None
    state_bytes: int
    # How many ways tensor parallelism can split this layer's cache: its KV heads (a TP degree above that
    # replicates heads), 1 for MLA, whose latent every TP rank keeps whole.
    shards: int
    # Bytes per token cached in their own dtype whatever the KV precision (DeepSeek-V3.2's indexer keys), split
    # like the layer's cache.
    own_dtype_bytes_per_token: int = 0

    def token_bytes(self, element_bytes: int) -> int:
        return self.elements_per_token * element_bytes + self.own_dtype_bytes_per_token


@dataclass(frozen=True)
class KvCache:
    layers: tuple[KvLayer, ...]
    # The dtype of each part of the recurrent state ({"mamba_conv": "bf16", "mamba_ssm": "fp32"}) and why.
    state_dtypes: dict = field(default_factory=dict, compare=False)

    def bytes_per_token(self, precision: str, *, windowed: bool | None = None, tensor_parallel: int = 1,
                        layers: slice = slice(None)) -> int:
        """Bytes one more token of context adds, over all layers that cache tokens (windowed ones until full).

        ``windowed`` True/False restricts the sum to the windowed / the unbounded layers; ``tensor_parallel`` and
        ``layers`` give one device's share (see ``KvLayer.shards``).
        """
        size = kv_bytes_per_element(precision)
        return sum(layer.token_bytes(size) // min(tensor_parallel, layer.shards)
                   for layer in self.layers[layers] if windowed is None or (layer.window is not None) == windowed)

    def state_bytes_per_sequence(self) -> int:
        return sum(layer.state_bytes for layer in self.layers)

    def bytes_per_sequence(self, tokens: int, precision: str, tensor_parallel: int = 1,
                           layers: slice = slice(None)) -> float:
        """Cache of one sequence of ``tokens`` tokens on one device of a ``tensor_parallel`` group."""
        size = kv_bytes_per_element(precision)
        total = 0.0
        for layer in self.layers[layers]:
            kept = tokens if layer.window is None else min(tokens, layer.window)
            split = min(tensor_parallel, layer.shards)
            total += (layer.token_bytes(size) * kept + layer.state_bytes) / split
        return total

    def kv_tokens_that_fit(self, memory_budget_bytes: int, precision: str = "bf16",
                           sequence_length: int | None = None) -> int:
        """Tokens of KV cache that fit in ``memory_budget_bytes`` (the memory left after weights and overheads).

        Without ``sequence_length`` this is vLLM's "GPU KV cache size: N tokens": the budget over the bytes per
        token of all caching layers. With it, whole sequences are packed: windowed layers stop at their window
        and each sequence adds its fixed state, and the result counts the tokens of the sequences that fit.
        """
        if memory_budget_bytes <= 0:
            return 0
        if sequence_length is None:
            per_token = self.bytes_per_token(precision)
            if not per_token:
                raise ValueError("this model's cache does not grow with tokens (state only); pass sequence_length")
            return memory_budget_bytes // per_token
        per_sequence = self.bytes_per_sequence(sequence_length, precision)
        return int(memory_budget_bytes // per_sequence) * sequence_length

    def summary(self) -> dict:
        counts: dict[str, int] = {}
        windows: dict[int, dict] = {}
        for layer in self.layers:
            label = layer.kind if layer.window is None else f"{layer.kind} (window {layer.window})"
            counts[label] = counts.get(label, 0) + 1
            if layer.window is not None:
                entry = windows.setdefault(layer.window, {"window_tokens": layer.window, "layers": 0,
                                                          "elements_per_token": 0, "own_dtype_bytes_per_token": 0})
                entry["layers"] += 1
                entry["elements_per_token"] += layer.elements_per_token
                entry["own_dtype_bytes_per_token"] += layer.own_dtype_bytes_per_token
        for entry in windows.values():
            own = entry.pop("own_dtype_bytes_per_token")
            entry["cap_bytes_per_sequence"] = {precision: (entry["elements_per_token"] * size + own)
                                               * entry["window_tokens"]
                                               for precision, size in KV_PRECISION_BYTES.items()}
        return {
            "layers": counts,
            "bytes_per_token": {precision: {"all_caching_layers": self.bytes_per_token(precision),
                                            "full_layers": self.bytes_per_token(precision, windowed=False),
                                            "windowed_layers": self.bytes_per_token(precision, windowed=True)}
                                for precision in KV_PRECISION_BYTES},
            "windowed_layers": list(windows.values()),
            "state_bytes_per_sequence": self.state_bytes_per_sequence(),
            "recurrent_state": self.state_dtypes or None,
            "indexer": self._indexer_summary(),
            "tensor_parallel": "GQA/MHA caches split across TP ranks by KV head (replicated once TP exceeds the KV "
                               "heads); an MLA latent is kept whole on every TP rank; states split by head",
        }


    def _indexer_summary(self) -> dict | None:
        indexed = [layer for layer in self.layers if layer.own_dtype_bytes_per_token]
        if not indexed:
            return None
        per_layer = indexed[0].own_dtype_bytes_per_token
        return {"layers": len(indexed), "bytes_per_token_per_layer": per_layer,
                "bytes_per_token": sum(layer.own_dtype_bytes_per_token for layer in indexed),
                "dtype": f"uint8: fp8 keys + one fp32 scale per {INDEXER_QUANT_BLOCK} (vLLM's indexer cache), "
                         "whatever the KV precision",
                "note": "the MLA latent itself follows the KV precision; vLLM's default for DeepSeek-V3.2 is "
                        "fp8_ds_mla (656 bytes per token and layer: 512 fp8, 4 fp32 scales, 64 bf16 RoPE), "
                        "d0's fp8 the plain 576"}


def _dtype_name(value, default: str) -> str:
    return DTYPE_NAMES.get(value, default) if isinstance(value, str) else default


def recurrent_state_dtypes(view: ConfigView) -> dict:
    """The dtype vLLM keeps each part of the recurrent state in by default (see the module docstring), and why."""
    # vLLM serves a float32 checkpoint in 16 bits (dtype "auto"), so the model dtype is bf16 or fp16.
    model = _dtype_name(view.get("torch_dtype", "dtype"), "bf16")
    model = model if model != "fp32" else "bf16"
    architectures = view.raw.get("architectures") or []
    nemotron_h = view.get("model_type") == "nemotron_h" or any(name in NEMOTRON_H_ARCHITECTURES
                                                              for name in architectures)
    declared = view.get("mamba_ssm_cache_dtype")
    ssm = _dtype_name(declared, "fp32" if nemotron_h else model)
    auto = "vLLM's default: mamba_cache_dtype auto, the model dtype"
    ssm_source = ("the config's mamba_ssm_cache_dtype, which vLLM follows" if isinstance(declared, str) else
                  "vLLM's default for Nemotron-H: float32 (NemotronHForCausalLMConfig)" if nemotron_h else
                  "vLLM's default: mamba_ssm_cache_dtype auto, the conv state's dtype")
    return {"linear_attention": (model, auto), "mamba_conv": (model, auto), "mamba_ssm": (ssm, ssm_source),
            "kda_conv": (model, auto), "kda_recurrent": ("fp32", "vLLM's kda_state_dtype: float32 always"),
            "gdn_conv": (model, auto),
            "gdn_recurrent": (_dtype_name(declared, model), "the config's mamba_ssm_cache_dtype, which vLLM follows"
                              if isinstance(declared, str) else "vLLM's default: the conv state's dtype")}


# Which parts of the recurrent state each mixer keeps, for the report.
STATE_PARTS = {"linear_attention": ("linear_attention",), "mamba": ("mamba_conv", "mamba_ssm"),
               "mamba2": ("mamba_conv", "mamba_ssm"), "kda": ("kda_conv", "kda_recurrent"),
               "gated_delta_net": ("gdn_conv", "gdn_recurrent")}


def _stated(dtypes: dict, layers: list[KvLayer]) -> dict:
    """The state dtypes of the layers this model has, with their reasons, for the report."""
    kinds = {layer.kind for layer in layers if layer.state_bytes}
    parts = dict.fromkeys(part for kind in STATE_PARTS if kind in kinds for part in STATE_PARTS[kind])
    return {part: {"dtype": dtypes[part][0], "source": dtypes[part][1]} for part in parts}


def recurrent_state_bytes(view: ConfigView, mixer: str, dtypes: dict | None = None) -> tuple[int, int]:
    """(bytes of one sequence's state in one layer of this recurrent ``mixer``, ways TP splits it); vLLM's shapes
    and default dtypes (see the module docstring). (0, 1) for a mixer that keeps no state."""
    dtypes = dtypes or recurrent_state_dtypes(view)
    size = {part: DTYPE_BYTES[dtype] for part, (dtype, _) in dtypes.items()}
    if mixer == "linear_attention":
        heads = view.dim("num_heads", 1)
        head_dim = view.dim("head_dim") or view.dim("hidden_size") // heads
        return heads * head_dim * head_dim * size["linear_attention"], heads
    if mixer == "kda":
        heads, head_dim, kernel = kda_dims(view)
        conv = 3 * heads * head_dim * (kernel - 1) * size["kda_conv"]
        return conv + heads * head_dim * head_dim * size["kda_recurrent"], heads
    if mixer == "gated_delta_net":
        k_heads, v_heads, k_dim, v_dim, kernel = gdn_dims(view)
        conv = (2 * k_heads * k_dim + v_heads * v_dim) * (kernel - 1) * size["gdn_conv"]
        return conv + v_heads * v_dim * k_dim * size["gdn_recurrent"], k_heads
    if mixer == "mamba":
        inner = mamba_inner_size(view)
        return inner * (view.dim("mamba_d_state", 16) * size["mamba_ssm"]
                        + (view.dim("mamba_d_conv", 4) - 1) * size["mamba_conv"]), inner
    if mixer == "mamba2":
        state_size = view.dim("mamba_d_state", 128)
        inner = mamba_inner_size(view)
        conv_dim = inner + 2 * view.dim("mamba_n_groups", 1) * state_size
        return (inner * state_size * size["mamba_ssm"] + conv_dim * (view.dim("mamba_d_conv", 4) - 1)
                * size["mamba_conv"]), view.dim("mamba_num_heads", 1)
    return 0, 1


def kv_cache_of(view: ConfigView, layout: Layout) -> KvCache:
    hidden, heads = view.dim("hidden_size"), view.dim("num_heads", 1)
    kv_heads = view.dim("num_kv_heads", heads)
    head_dim = view.dim("head_dim") or hidden // heads
    windows = {"full": None, "sliding": view.dim("sliding_window"), "chunked": view.dim("attention_chunk_size")}
    dtypes = recurrent_state_dtypes(view)
    index_dim = view.dim("index_head_dim", 0)
    # fp8 values plus one fp32 scale per block of 128 (vLLM's DeepseekV32IndexerCache).
    indexer = index_dim + -(-index_dim // INDEXER_QUANT_BLOCK) * 4 if index_dim and view.dim("index_n_heads") else 0
    layers = []
    for kind in layout.layers:
        if kind.mixer == "attention":
            elements = kv_heads * (head_dim + view.dim("v_head_dim", head_dim))
            layers.append(KvLayer("attention", elements, windows[kind.window], 0, kv_heads))
        elif kind.mixer == "mla":
            # MLA caches its latent and the shared RoPE key (vLLM's MLAAttentionSpec head size), also where the
            # release applies no RoPE (Kimi-Linear's mla_use_nope still caches qk_rope_head_dim).
            elements = view.dim("kv_lora_rank") + view.dim("qk_rope_head_dim", 64)
            layers.append(KvLayer("mla", elements, windows[kind.window], 0, 1, indexer if kind.sparse else 0))
        elif kind.mixer in STATE_PARTS:
            state, shards = recurrent_state_bytes(view, kind.mixer, dtypes)
            layers.append(KvLayer(kind.mixer, 0, None, state, shards))
    return KvCache(tuple(layers), _stated(dtypes, layers))
