"""The control plane's side of each stage kind, one handler per kind: what it checks at submit, which nodes may run
it and what it adds to their parameters, what it keeps of the result, its one-line outcome and its page.

A stage kind is declared twice, once on each side of the broker: the engine's ``StageSpec``
(``workers/engine/stages.py``: the function a node runs, its parameters, its placement) and a handler here. Each
capability keeps its handlers in its own ``adaptation/<capability>/stage.py``, found when Django starts
(``discover``); modules named in ``D0_STAGE_HANDLERS`` add more (a deployment's own stage kinds, or a test's). The
job machinery (``adaptation/jobs``) reaches a kind only through ``handler(kind)``: it names none. A kind the engine
declares and no module handles gets the plain ``StageHandler`` (its result is kept on the stage run and
summarised by its keys), so a node's new stage never breaks a job page.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from dataclasses import dataclass, field

from django.conf import settings

from workers.engine import stages as engine


@dataclass(frozen=True)
class Outcome:
    """What a stage found, for the top of the job page: one line and its warnings."""

    summary: str
    warnings: list[str] = field(default_factory=list)


class StageHandler:
    """The defaults suit a stage that needs nothing of the control plane: its parameters as the job gives them (and
    the model's config.json when the engine declares ``needs_model``), every eligible node, the result kept on the
    stage run only, no page of its own."""

    kind = ""
    # Whether ``store`` keeps anything (set for each subclass): a stage that keeps nothing costs its report no
    # savepoint.
    stores_results = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.stores_results = cls.store is not StageHandler.store

    def __init__(self, kind: str | None = None):
        if kind is not None:
            self.kind = kind

    @property
    def spec(self) -> engine.StageSpec:
        return engine.STAGES[self.kind]

    @property
    def label(self) -> str:
        return self.kind.replace("_", " ").capitalize()

    def check(self, job) -> None:
        """Checks at submit that only the control plane can make (the job's parameters name the team's own rows);
        raises ``workers.engine.parameters.ParameterError`` naming the key."""

    def eligible(self, job, params: dict, nodes: list) -> list:
        """The nodes, among the job's online ones past the pre-flight gate, that can run this stage (a ValueError
        saying why when none can)."""
        return nodes

    def prepare(self, job, params: dict, nodes: list) -> dict:
        """The stage's parameters as the node gets them, given the nodes chosen to run it: the job's own plus what
        only the control plane knows (set_by="control" parameters)."""
        return params

    def form_field(self, parameter, user):
        """The job form's field for one of the stage's parameters, where the declaration's own does not fit (rows
        of the user's teams to choose from); None for the field made from the declaration."""
        return None

    def world_size(self, params: dict) -> int:
        """For a stage placed on a group of nodes: how many ranks its torch.distributed world has."""
        raise ValueError(f"stage {self.kind} declares no world size")

    def store(self, run) -> None:
        """What the control plane keeps of a succeeded run's result besides the run's own copy (in the transaction
        that records the run's end)."""

    def outcome(self, result: dict) -> Outcome:
        return Outcome(f"result with {', '.join(sorted(map(str, result))) or 'nothing'}")

    def page(self, job, run) -> str | None:
        """The page that shows what ``run`` (a stage run of ``job``) found, when it has one."""
        return None


_handlers: dict[str, StageHandler] = {}


def register(handler_class: type[StageHandler]) -> type[StageHandler]:
    """A class decorator: ``handler_class`` handles its ``kind``, which the engine must declare."""
    kind = handler_class.kind
    if kind not in engine.STAGES:
        raise ValueError(f"{handler_class.__name__} handles stage kind {kind!r}, which the engine does not declare "
                         f"(it declares {', '.join(engine.STAGES)})")
    known = _handlers.get(kind)
    if known is not None and type(known) is not handler_class:
        raise ValueError(f"stage kind {kind!r} is handled by {type(known).__name__} already")
    _handlers[kind] = handler_class()
    return handler_class


def handler(kind: str) -> StageHandler:
    """The handler of a kind the engine declares; a KeyError for any other."""
    if kind not in engine.STAGES:
        raise KeyError(kind)
    found = _handlers.get(kind)
    return found if found is not None else StageHandler(kind)


def kinds() -> list[str]:
    """Every stage kind a job may name, in pipeline order."""
    return list(engine.STAGES)


def choices() -> list[tuple[str, str]]:
    return [(kind, handler(kind).label) for kind in kinds()]


def discover() -> None:
    """Imports each capability's ``stage`` module and the modules of ``D0_STAGE_HANDLERS`` (their handlers
    register themselves). Called once, when Django starts (``AdaptationConfig.ready``)."""
    package = importlib.import_module("adaptation")
    for module in pkgutil.iter_modules(package.__path__):
        if module.ispkg and importlib.util.find_spec(f"adaptation.{module.name}.stage") is not None:
            importlib.import_module(f"adaptation.{module.name}.stage")
    for name in settings.D0_STAGE_HANDLERS:
        importlib.import_module(name)
