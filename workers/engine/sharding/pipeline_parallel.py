"""Pipeline parallelism: contiguous layers per stage, hidden states sent stage to stage with send/recv.

Explicit send/recv instead of ``torch.distributed.pipelining``: its schedules are built for training (micro-
batches of a fixed shape, a backward pass), while a validation run does one prefill of P tokens and then decode
steps of one token each with a growing KV cache, a shape and state pattern those schedules do not model. With a
single sequence there is nothing to overlap, so a plain stage-after-stage pass loses no time that matters here.

Each stage keeps the transformers model whole but replaces the layers it does not own with ``SkippedLayer``, so
the model's own forward (masks, rotary embeddings, cache handling, per-layer kinds) runs unchanged on every
stage; only the first stage embeds tokens and only the last one has the final norm and the LM head.
"""

from __future__ import annotations

from torch import nn

from ..pipeline_stages import stage_layer_ranges


class SkippedLayer(nn.Module):
    """A decoder layer that another stage runs: passes hidden states through and keeps the cache's length right.

    transformers reads the past length from the cache's first layer (and sizes attention masks from it); on a
    stage that does not own layer 0 that layer would stay empty, so a one-wide zero placeholder is recorded for
    every skipped layer. It costs one number per token per skipped layer.
    """

    def __init__(self, layer_idx: int, original: nn.Module | None = None):
        super().__init__()
        # The decoder's loop may read a layer's plain attributes (Nemotron-H picks each layer's mask by its
        # block_type, others by attention_type): the stand-in keeps them.
        for name, value in vars(original or nn.Module()).items():
            if not name.startswith("_") and isinstance(value, str | int | float | bool):
                setattr(self, name, value)
        self.layer_idx = layer_idx

    def forward(self, hidden_states, *args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        layers = getattr(cache, "layers", None)
        # A hybrid cache (Jamba, Qwen3-Next) keeps a state of fixed size for Mamba and linear-attention layers:
        # those have no length to keep, and no update(). A cache made without the config (MiniMax's own) grows its
        # layers as they are updated: a layer it has not reached yet takes the placeholder.
        if cache is not None and (layers is None or self.layer_idx >= len(layers)
                                  or hasattr(layers[self.layer_idx], "update")):
            batch, length = hidden_states.shape[:2]
            placeholder = hidden_states.new_zeros(batch, 1, length, 1)
            try:
                cache.update(placeholder, placeholder, self.layer_idx)
            except NotImplementedError:
                pass  # a layer the cache keeps nothing for (Nemotron-H's MLP-only blocks)
        return hidden_states


def keep_stage(model, stage: int, pp: int, *, corrupt: bool = False) -> dict:
    """Reduce ``model`` in place to pipeline stage ``stage`` of ``pp``; returns the stage's layer range.

    ``corrupt`` is the deliberate fault: the last stage's first layer loads the weights of the layer before it,
    a stage boundary placed one layer off.
    """
    decoder = decoder_of(model)
    layers = decoder_layers(model)
    ranges = stage_layer_ranges(len(layers), pp)
    owned = ranges[stage]
    corrupted = None
    if corrupt and stage == pp - 1 and owned.start > 0:
        previous = layers[owned.start - 1].state_dict()
        target = layers[owned.start]
        matching = {key: value for key, value in previous.items()
                    if key in target.state_dict() and target.state_dict()[key].shape == value.shape}
        target.load_state_dict(matching, strict=False)
        corrupted = f"layer {owned.start} holds layer {owned.start - 1}'s weights"
    for index in range(len(layers)):
        if index not in owned:
            layers[index] = SkippedLayer(index, layers[index])
    if stage > 0:
        setattr(decoder, _attribute_of(decoder, model.get_input_embeddings()), None)
    if stage < pp - 1:
        setattr(decoder, _final_norm_attribute(decoder), nn.Identity())
        model.lm_head = None
    return {"layers": [owned.start, owned.stop - 1], "all_stages": [[r.start, r.stop - 1] for r in ranges],
            "corrupted": corrupted}


FINAL_NORM_NAMES = ("norm", "norm_f", "final_layernorm", "ln_f", "final_norm")


def decoder_of(model):
    """The decoder inside a causal LM: ``model.model`` for most, ``model.transformer`` for DBRX and others."""
    # get_decoder() is the rule, but some causal LMs answer with themselves (Llama-4's text model) or name their
    # prefix after a multimodal wrapper they are not inside.
    candidates = [model.get_decoder() if hasattr(model, "get_decoder") else None, getattr(model, "model", None),
                  getattr(model, model.base_model_prefix, None)]
    decoder = next((candidate for candidate in candidates
                    if isinstance(candidate, nn.Module) and candidate is not model), None)
    if decoder is None:
        raise ValueError(f"{type(model).__name__}: no decoder inside it to split into stages")
    return decoder


def decoder_layers(model) -> nn.ModuleList:
    """The decoder's list of layers, whatever it is called (``layers``, DBRX's ``blocks``, ``h``)."""
    decoder = decoder_of(model)
    count = model.config.get_text_config().num_hidden_layers
    for _, module in decoder.named_children():
        if isinstance(module, nn.ModuleList) and len(module) == count:
            return module
    raise ValueError(f"{type(model).__name__}: no list of {count} decoder layers to split into stages")


def _attribute_of(owner, child) -> str:
    return next(name for name, module in owner.named_children() if module is child)


def _final_norm_attribute(decoder) -> str:
    names = dict(decoder.named_children())
    found = next((name for name in FINAL_NORM_NAMES if name in names), None)
    if found is None:
        raise ValueError(f"{type(decoder).__name__}: no final norm ({', '.join(FINAL_NORM_NAMES)}) to leave to the "
                         "last stage")
    return found


def stage_forward(model, *, first: bool, last: bool, input_ids=None, hidden_states=None, position_ids, cache):
    """One forward pass of this stage: logits on the last stage, hidden states on the others.

    The last stage calls the full causal-LM forward so any head-side step of the architecture (logit scaling or
    soft-capping) runs as in the reference.
    """
    inputs = {"input_ids": input_ids} if first else {"inputs_embeds": hidden_states}
    if last:
        return model(**inputs, position_ids=position_ids, cache=cache, use_cache=True).logits
    return decoder_of(model)(**inputs, position_ids=position_ids, cache=cache, use_cache=True).last_hidden_state
