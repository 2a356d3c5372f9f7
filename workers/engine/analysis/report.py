"""``analyze(config)``: the whole intake report for one released config.json, as plain JSON-ready data."""

from __future__ import annotations

import contextlib

from ..models.config_loading import IGNORABLE_KEYS, ConfigError, ConfigView
from .estimate import estimate_records
from .kv_cache import KV_PRECISION_BYTES, KvCache, kv_cache_of
from ..models.layers import Layout, layer_layout
from .mechanisms import mechanisms_of
from .memory import precision_named, weights_report
from .parameter_counts import active_count, inventory_from_model, mtp_records, summarise
from .planner import plan_from_analysis, planner_inputs, workload_from
from .shipped import shipped_format
from ..models.resolution import (Resolution, build_config, captured_warnings, knowledge_of, resolve,
                                 transformers_version)

# Far above the largest released model (~2T) and far below what would overflow any arithmetic here: a config
# beyond it is a typo or an attack, refused before anything is built.
MAX_PARAMS = 10**15

CONVENTIONS = {
    "total_params": "every parameter of the main model, tied embeddings counted once, MTP modules excluded "
                    "(see mtp); exact counts come from transformers' model built on the meta device",
    "active_params": "parameters one token uses: everything except the routed experts it is not sent to "
                     "(top-k of E per MoE layer), shared experts, the input embedding and lm_head included: "
                     "DeepSeek's convention (README_WEIGHTS.md: 36.7B activated incl. 0.9B embedding and 0.9B "
                     "output head)",
    "components": "parameters per component; all but mtp sum to total_params, mtp is the MTP modules' own "
                  "weights (see mtp), which total_params excludes",
    "active_params_by_convention": "excluding_input_embedding matches OpenAI's gpt-oss figures (an embedding "
                                   "lookup reads one row); excluding_embeddings_and_lm_head matches MiniMax's",
}


def _scope(view: ConfigView) -> str:
    architectures = view.raw.get("architectures") or []
    multimodal = view.language_key or "vision_config" in view.raw or any(
        isinstance(name, str) and "ConditionalGeneration" in name for name in architectures)
    if multimodal:
        return "language model only: the vision/audio towers of this multimodal config are not counted"
    return "language model"


def _exact_layout(view: ConfigView, hf_config) -> Layout:
    text_config = hf_config.get_text_config()
    return layer_layout(view, getattr(text_config, "layer_types", None))


def _uninterpreted(view: ConfigView, model_type: str | None) -> list[str]:
    knowledge = knowledge_of(model_type) if model_type else None
    return sorted(key for key in view.all_keys()
                  if key not in view.read_keys and key not in IGNORABLE_KEYS
                  and key.split(".")[0] not in IGNORABLE_KEYS
                  and not (knowledge and knowledge.interprets(key)))


def _checked_size(view: ConfigView, layout: Layout) -> tuple[list, list[str]]:
    records, notes = estimate_records(view, layout)
    estimate = sum(record.numel for record in records)
    if estimate > MAX_PARAMS:
        raise ConfigError(f"these dimensions describe about {estimate:.3g} parameters, beyond the {MAX_PARAMS:.0e} "
                          "that any real model could have")
    return records, notes


ESTIMATE_TOLERANCE = 0.05


def _estimate_disagreements(summary: dict, estimated: list, view: ConfigView) -> list[str]:
    """The exact count (the model transformers builds) checked against d0's own estimate from the config keys: a
    gap past 5% in total or active parameters means one of them misreads the config, and the report says so."""
    figures = {"total": (summary["total_params"], sum(record.numel for record in estimated)),
               "active": (summary["active_params"], active_count(estimated, view))}
    return [f"the exact {name} count ({exact / 1e9:.3g} B) and d0's estimate from the config keys "
            f"({estimate / 1e9:.3g} B) differ by {abs(exact - estimate) / exact:.0%}: one of them misreads the config"
            for name, (exact, estimate) in figures.items()
            if exact and abs(exact - estimate) / exact > ESTIMATE_TOLERANCE]


def _ignored_key_warnings(resolution: Resolution, hf_config) -> list[str]:
    """Shape-changing keys the architecture does not read, unless its config arrived at the same value anyway
    (Nemotron-H's attention_head_dim 128 equals the head_dim transformers derives)."""
    if hf_config is None:
        return []
    text_config = hf_config.get_text_config()
    return [f"{alias}={value!r} is not read by transformers' {resolution.resolved_architecture}; the exact count "
            "may differ from the released weights"
            for alias, value, usual_name in resolution.ignored_structural_keys
            if getattr(text_config, usual_name, None) != value]


def _build(view: ConfigView, resolution: Resolution):
    """(resolution, hf_config, model, warnings); on a transformers failure the resolution says so, model None."""
    import torch

    from ..models.loading import build_meta_model

    with captured_warnings() as messages:
        try:
            hf_config = build_config(view, resolution.resolved_architecture)
            model = build_meta_model(hf_config, torch.bfloat16)
        except Exception as error:  # whatever transformers rejects, the generic estimate can still answer
            note = (f"{resolution.note}, but transformers could not build it ({type(error).__name__}: {error}): "
                    "generic decoder/MoE estimate from standard keys")
            return Resolution(resolution.declared_model_type, None, note), None, None, messages
    return resolution, hf_config, model, messages


def analyze(config: dict, *, devices=None, precision: str = "bf16", workload: dict | None = None) -> dict:
    """Analyse a config.json dict offline: parameters, weights and KV-cache memory, mechanisms and, given
    ``devices`` (a probe-style device list or {devices_per_node, nodes, device_memory_bytes[,
    memory_bandwidth_bytes_per_s, device_name]}), the parallel layouts that fit at ``precision``.

    ``workload`` overrides the planner's {concurrency, context_tokens, kv_precision}. The report's ``planner`` is
    what later plans are made from (``plan_from_analysis``), without building the model again. Raises ConfigError when
    the config cannot be analysed, ValueError for an unknown precision or a malformed cluster.
    """
    view = ConfigView(config)
    precision_named(precision)
    workload_from(workload)  # a bad workload is refused before anything is built
    config_layout = layer_layout(view)
    estimated, estimate_notes = _checked_size(view, config_layout)
    resolution = resolve(view)
    warnings: list[str] = []
    hf_config = model = None
    if resolution.exact:
        resolution, hf_config, model, messages = _build(view, resolution)
        warnings += _ignored_key_warnings(resolution, hf_config) + messages
    if model is not None:
        records = inventory_from_model(model)
        layout = _exact_layout(view, hf_config)
        output, inputs = model.get_output_embeddings(), model.get_input_embeddings()
        tied = output is not None and output.weight is inputs.weight
        norm_classes = sorted({type(module).__name__ for module in model.modules() if "Norm" in type(module).__name__})
        qk_norm = any(name.endswith(("q_norm", "k_norm")) for name, _ in model.named_modules())
        built_moe = {record.layer for record in records if record.component == "routed_experts"}
        if len(built_moe) != layout.moe_layers:
            warnings.append(f"transformers built {len(built_moe)} MoE layers where the config reads as "
                            f"{layout.moe_layers}; KV-cache and planner figures follow the config")
        notes: list[str] = []
    else:
        records, layout, notes = estimated, config_layout, estimate_notes
        tied, norm_classes, qk_norm = view.flag("tie_word_embeddings", "tie_embeddings"), None, None
    shipped = shipped_format(view)
    # Every tensor carries the precision the release stores it in: the "as_shipped" precision of memory and planner.
    mtp = shipped.apply(mtp_records(records, view, len(layout.layers)))
    records = shipped.apply(records)
    if shipped.method is not None and shipped.precision is None:
        warnings.append(shipped.note)
    summary = summarise(records, mtp, view, layout, tied)
    if model is not None:
        warnings += _estimate_disagreements(summary, estimated, view)
    kv = kv_cache_of(view, layout)
    # Layer-pattern keys the layout could not read: its figures rest on defaults for those layers.
    warnings += [note for note in layout.notes if "d0 cannot" in note or "fit neither" in note]
    weights, weights_details = weights_report(records, mtp, shipped.describe(), view.dim("mtp_layers", 0))
    mechanisms = mechanisms_of(view, layout, tied=tied, norm_classes=norm_classes, qk_norm=qk_norm)
    report = {
        "model_type": resolution.declared_model_type,
        "architectures": view.raw.get("architectures"),
        "resolved_architecture": resolution.resolved_architecture,
        "resolution": resolution.note,
        "method": "exact" if model is not None else "estimate",
        "transformers_version": transformers_version(),
        "scope": _scope(view),
        **summary,
        "conventions": CONVENTIONS,
        "weights_bytes": weights,
        "weights_memory": weights_details,
        "kv_cache_bytes_per_token": {name: kv.bytes_per_token(name) for name in KV_PRECISION_BYTES},
        "kv_cache": kv.summary(),
        # What a sequence keeps whatever its length: the state of its linear-attention / state-space layers.
        "recurrent_state_bytes_per_sequence": kv.state_bytes_per_sequence(),
        "layers": layout.describe(),
        "mechanisms": mechanisms,
        "uninterpreted_keys": _uninterpreted(view, resolution.resolved_architecture),
        "assumptions": notes,
        "warnings": warnings,
        "planner": planner_inputs(records, view, layout, kv),
    }
    if devices is not None:
        report["plans"] = plan_from_analysis(report, devices, precision, workload)
    return report


def kv_cache_model(config: dict) -> KvCache:
    """The KV-cache model of a config, without building the model (transformers' config fills layer_types)."""
    view = ConfigView(config)
    _checked_size(view, layer_layout(view))
    resolution = resolve(view)
    layout = layer_layout(view)
    # If transformers refuses the config, the layout read from the config alone stands.
    with contextlib.suppress(Exception), captured_warnings():
        if resolution.exact:
            layout = _exact_layout(view, build_config(view, resolution.resolved_architecture))
    return kv_cache_of(view, layout)


def kv_tokens_that_fit(config: dict, memory_budget_bytes: int, precision: str = "bf16",
                       sequence_length: int | None = None) -> int:
    """Tokens of KV cache that fit in ``memory_budget_bytes`` (see KvCache.kv_tokens_that_fit)."""
    return kv_cache_model(config).kv_tokens_that_fit(memory_budget_bytes, precision, sequence_length)
