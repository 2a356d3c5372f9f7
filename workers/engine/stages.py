"""The stage kinds a node can run, each a function ``(params, progress) -> result dict``.

``progress(fraction, message)`` reports how far the stage is (0..1). Later issues add stages here; the
control plane's choices and the node task both read this registry, so a kind exists in one place.
"""

from __future__ import annotations

from collections.abc import Callable

from .probe import env_probe

Progress = Callable[[float, str], None]
Stage = Callable[[dict, Progress], dict]

STAGES: dict[str, Stage] = {
    "env_probe": env_probe,
}
STAGE_KINDS = tuple(STAGES)


def run_stage(kind: str, params: dict, progress: Progress) -> dict:
    try:
        stage = STAGES[kind]
    except KeyError:
        raise ValueError(f"unknown stage kind {kind!r}; this node knows {', '.join(STAGE_KINDS)}") from None
    return stage(params, progress)
