"""Which transformers architecture describes a config, and its transformers config object.

A ``model_type`` transformers knows is used as is. An unknown or missing one (``kimi_k2``, whose ``auto_map``
points at remote code) is resolved through its ``architectures`` entry to the model type whose class has that
name, provided the keys match that architecture's config: no shape-changing key may be one the architecture would
silently ignore. Remote code is never fetched nor run: ``auto_map`` is dropped and ``trust_remote_code`` is never
passed. When nothing fits, the caller falls back to the generic estimate.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import inspect
import logging
import os
import re
import warnings
from dataclasses import dataclass

from .config_loading import ConfigView

# Offline only: nothing here downloads, and any hub call a transformers code path might make must fail fast.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Keys consumed by d0 itself or meaningless to a meta build; never passed to the config class.
NOT_PASSED_TO_CONFIG = frozenset({"model_type", "auto_map", "quantization_config"})


@dataclass(frozen=True)
class Resolution:
    declared_model_type: str | None
    resolved_architecture: str | None
    note: str
    # (raw key, value, transformers' usual name for it) of shape-changing keys the architecture does not read.
    ignored_structural_keys: tuple[tuple[str, object, str], ...] = ()

    @property
    def exact(self) -> bool:
        return self.resolved_architecture is not None


@dataclass(frozen=True)
class ArchitectureKnowledge:
    """What a transformers architecture reads: its declared config fields and the names its code mentions."""

    declared: frozenset[str]
    source: str

    def interprets(self, key: str) -> bool:
        head, _, leaf = key.partition(".")
        if head in self.declared or key in self.declared:
            return True
        # Read as an attribute or looked up by name (getattr(config, "head_dim", ...), kwargs.pop("...")); a bare
        # word would match "dim" in every modeling file.
        name = re.escape(leaf or head)
        return re.search(rf"(?:config|self)\.{name}\b|[\"']{name}[\"']", self.source) is not None


def transformers_version() -> str:
    import transformers

    return transformers.__version__


@functools.lru_cache(maxsize=1)
def _causal_lm_classes() -> dict[str, str]:
    """model type -> the class AutoModelForCausalLM builds for it."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


@functools.lru_cache(maxsize=1)
def _model_types_by_class_name() -> dict[str, tuple[str, ...]]:
    """Every model class name in transformers' auto mappings -> the model types that use it."""
    from transformers.models.auto import modeling_auto

    found: dict[str, list[str]] = {}
    for name, mapping in vars(modeling_auto).items():
        if not name.endswith("_MAPPING_NAMES") or not isinstance(mapping, dict):
            continue
        for model_type, classes in mapping.items():
            for class_name in (classes,) if isinstance(classes, str) else classes:
                if model_type not in found.setdefault(class_name, []):
                    found[class_name].append(model_type)
    return {class_name: tuple(types) for class_name, types in found.items()}


def _candidates(architecture: str) -> list[str]:
    """Model types using a class of this name, best first: the one whose own causal-LM class it is and whose name
    spells the class's prefix (LlamaForCausalLM -> llama before the exaone/internlm3 aliases of the class)."""
    causal_lm = _causal_lm_classes()
    prefix = re.sub(r"[^a-z0-9]", "", architecture.split("For")[0].lower())

    def rank(model_type: str) -> tuple[bool, bool]:
        return causal_lm.get(model_type) != architecture, re.sub(r"[^a-z0-9]", "", model_type) != prefix

    return sorted((model_type for model_type in _model_types_by_class_name().get(architecture, ())
                   if model_type in causal_lm), key=rank)


def _config_class(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


@functools.lru_cache(maxsize=64)
def knowledge_of(model_type: str) -> ArchitectureKnowledge:
    config_class = _config_class(model_type)
    declared = {field.name for field in dataclasses.fields(config_class)} if dataclasses.is_dataclass(
        config_class) else set(inspect.signature(config_class.__init__).parameters)
    attribute_map = getattr(config_class, "attribute_map", {})
    declared |= set(attribute_map) | set(attribute_map.values())
    sources = []
    for module in (config_class.__module__, config_class.__module__.replace(".configuration_", ".modeling_")):
        # A build shipped without .py sources leaves only the declared fields to go by.
        with contextlib.suppress(ImportError, OSError, TypeError):
            sources.append(inspect.getsource(importlib.import_module(module)))
    return ArchitectureKnowledge(frozenset(declared), "\n".join(sources))


def _ignored_structural_keys(view: ConfigView, model_type: str) -> tuple[tuple[str, object, str], ...]:
    knowledge = knowledge_of(model_type)
    return tuple((alias, value, key.aliases[0]) for alias, value, key in view.present_structural_keys()
                 if not knowledge.interprets(alias))


def resolve(view: ConfigView) -> Resolution:
    declared = view.raw.get("model_type")
    declared = declared if isinstance(declared, str) and declared else None
    if declared in _causal_lm_classes():
        return Resolution(declared, declared, f"model_type {declared} is known to transformers "
                                              f"{transformers_version()}", _ignored_structural_keys(view, declared))
    architectures = view.raw.get("architectures")
    architectures = [name for name in architectures if isinstance(name, str)] \
        if isinstance(architectures, list) else []
    rejected = []
    for architecture in architectures:
        for model_type in _candidates(architecture):
            ignored = _ignored_structural_keys(view, model_type)
            if ignored:
                rejected.append(f"{model_type} would ignore "
                                f"{', '.join(f'{alias}={value!r}' for alias, value, _ in ignored)}")
                continue
            return Resolution(declared, model_type,
                              f"treated as {model_type} because architectures names {architecture} and the keys "
                              f"match its config")
    what = f"model_type {declared!r} is unknown to transformers {transformers_version()}" if declared \
        else "the config has no model_type"
    names = f"architectures {architectures} names no model class transformers has" if architectures \
        else "it lists no architectures"
    if rejected:
        names = f"the architectures' configs do not fit ({'; '.join(rejected)})"
    return Resolution(declared, None, f"{what} and {names}: generic decoder/MoE estimate from standard keys")


class CapturedWarnings(logging.Handler):
    """Collects what transformers logs or warns while a config is parsed and built, for the report."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage().strip()
        if message not in self.messages:
            self.messages.append(message)


@contextlib.contextmanager
def captured_warnings():
    handler = CapturedWarnings()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield handler.messages
        for warning in caught:
            message = str(warning.message).strip()
            if message not in handler.messages:
                handler.messages.append(message)
    finally:
        logger.removeHandler(handler)


def build_config(view: ConfigView, model_type: str):
    """The transformers config object for a raw config, without ``auto_map`` or ``quantization_config``."""
    # A deep copy: transformers standardises nested dicts (rope_scaling) in place, and the raw config must stay
    # as shipped for the mechanisms report.
    kwargs = copy.deepcopy({key: value for key, value in view.raw.items() if key not in NOT_PASSED_TO_CONFIG})
    return _config_class(model_type)(**kwargs)
