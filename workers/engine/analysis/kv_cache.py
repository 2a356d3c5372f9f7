"""KV-cache size per token and per sequence, by attention kind.

Elements cached per token and layer:
- MHA / GQA / MQA: K and V for every KV head, kv_heads x (head_dim + v_head_dim) (= 2 x kv_heads x head_dim);
- MLA: the compressed latent plus the shared RoPE key, kv_lora_rank + qk_rope_head_dim (DeepSeek-V2 paper,
  section 2.1.2: "(d_c + d_h^R) l" elements per token); DeepSeek-V3.2's indexer also keeps index_head_dim
  per token (DeepSeek-V3.2-Exp report, section 2.1);
- sliding-window and chunked layers keep at most their window of tokens per sequence (gpt-oss 128, Llama-4 8192);
- linear attention and Mamba layers keep a fixed state per sequence, whatever its length: lightning attention a
  heads x head_dim x head_dim fp32 KV state (MiniMax-01 report, section 2.2); Mamba the SSM state
  (d_inner x d_state, or heads x head_dim x d_state for Mamba-2) plus the last d_conv - 1 convolution inputs, in
  bf16 (vLLM's default Mamba cache dtype is the model dtype; fp8 applies to the attention KV only).
"""

from __future__ import annotations

from dataclasses import dataclass

from .config_loading import ConfigView
from .generic import mamba_inner_size
from .layers import Layout

KV_PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}
LINEAR_ATTENTION_STATE_BYTES = 4
MAMBA_STATE_BYTES = 2


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


@dataclass(frozen=True)
class KvCache:
    layers: tuple[KvLayer, ...]

    def bytes_per_token(self, precision: str, *, windowed: bool | None = None, tensor_parallel: int = 1,
                        layers: slice = slice(None)) -> int:
        """Bytes one more token of context adds, over all layers that cache tokens (windowed ones until full).

        ``windowed`` True/False restricts the sum to the windowed / the unbounded layers; ``tensor_parallel`` and
        ``layers`` give one device's share (see ``KvLayer.shards``).
        """
        size = kv_bytes_per_element(precision)
        return sum(layer.elements_per_token * size // min(tensor_parallel, layer.shards)
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
            total += (layer.elements_per_token * size * kept + layer.state_bytes) / split
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
                                                          "elements_per_token": 0})
                entry["layers"] += 1
                entry["elements_per_token"] += layer.elements_per_token
        for entry in windows.values():
            entry["cap_bytes_per_sequence"] = {precision: entry["elements_per_token"] * size * entry["window_tokens"]
                                               for precision, size in KV_PRECISION_BYTES.items()}
        return {
            "layers": counts,
            "bytes_per_token": {precision: {"all_caching_layers": self.bytes_per_token(precision),
                                            "full_layers": self.bytes_per_token(precision, windowed=False),
                                            "windowed_layers": self.bytes_per_token(precision, windowed=True)}
                                for precision in KV_PRECISION_BYTES},
            "windowed_layers": list(windows.values()),
            "state_bytes_per_sequence": self.state_bytes_per_sequence(),
            "tensor_parallel": "GQA/MHA caches split across TP ranks by KV head (replicated once TP exceeds the KV "
                               "heads); an MLA latent is kept whole on every TP rank; states split by head",
        }


def kv_cache_of(view: ConfigView, layout: Layout) -> KvCache:
    hidden, heads = view.dim("hidden_size"), view.dim("num_heads", 1)
    kv_heads = view.dim("num_kv_heads", heads)
    head_dim = view.dim("head_dim") or hidden // heads
    windows = {"full": None, "sliding": view.dim("sliding_window"), "chunked": view.dim("attention_chunk_size")}
    layers = []
    for kind in layout.layers:
        if kind.mixer == "attention":
            elements = kv_heads * (head_dim + view.dim("v_head_dim", head_dim))
            layers.append(KvLayer("attention", elements, windows[kind.window], 0, kv_heads))
        elif kind.mixer == "mla":
            elements = view.dim("kv_lora_rank") + view.dim("qk_rope_head_dim", 64) + view.dim("index_head_dim", 0)
            layers.append(KvLayer("mla", elements, windows[kind.window], 0, 1))
        elif kind.mixer == "linear_attention":
            state = heads * head_dim * head_dim * LINEAR_ATTENTION_STATE_BYTES
            layers.append(KvLayer("linear_attention", 0, None, state, heads))
        elif kind.mixer == "mamba":
            inner = mamba_inner_size(view)
            state = inner * (view.dim("mamba_d_state", 16) + view.dim("mamba_d_conv", 4) - 1) * MAMBA_STATE_BYTES
            layers.append(KvLayer("mamba", 0, None, state, inner))
        elif kind.mixer == "mamba2":
            mamba_heads, state_size = view.dim("mamba_num_heads", 1), view.dim("mamba_d_state", 128)
            inner = mamba_inner_size(view)
            conv_dim = inner + 2 * view.dim("mamba_n_groups", 1) * state_size
            state = (inner * state_size + conv_dim * (view.dim("mamba_d_conv", 4) - 1)) * MAMBA_STATE_BYTES
            layers.append(KvLayer("mamba2", 0, None, state, mamba_heads))
    return KvCache(tuple(layers))
