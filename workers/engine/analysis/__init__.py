"""Model intake: analyse a released ``config.json`` offline and exactly, without Django.

``analyze(config)`` resolves the config to a transformers architecture (or a generic decoder/MoE estimate), counts
parameters on the meta device, sizes weights and KV cache per precision, lists the mechanisms the config declares
and, given a cluster, plans parallel layouts. Nothing is downloaded and no code named by ``auto_map`` runs.
"""

from ..models.config_loading import ConfigError, load_config_file
from .planner import plan_from_analysis
from .report import analyze, kv_cache_model, kv_tokens_that_fit

__all__ = ["ConfigError", "analyze", "kv_cache_model", "kv_tokens_that_fit", "load_config_file",
           "plan_from_analysis"]
