"""Stage parameters, declared once: name, type, range, default and help for every key a stage takes.

Each capability declares its stage's parameters beside its stage function; ``stages.py`` keeps them with the
stage. The control plane validates a job's parameters against them at submit (an unknown key or a bad value is a
400 naming the key and what is allowed), the job form and the OpenAPI schema are made from them, and the node
checks again before it runs anything. Keys marked ``set_by="control"`` (the rendezvous of a multi-node run, the
model's config, the node's measured figures) are set only by the control plane: a job that gives one is refused.
A ``path`` parameter names a file or folder on the node and must lie under one of the roots the node's operator
configured (``python -m workers.node --data-root``); with none configured, path parameters are refused.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

KINDS = ("int", "float", "bool", "str", "choice", "list", "object", "path")
DEVICE_PATTERN = re.compile(r"(auto|cpu|cuda|xpu|npu|mps|rocm)(:\d{1,3})?")


class ParameterError(ValueError):
    """A parameter the stage does not take, or a value it does not accept; ``key`` names it (``tp``,
    ``grid.batch_size``)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


@dataclass(frozen=True)
class Parameter:
    name: str
    kind: str
    help: str
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple = ()
    item: Parameter | None = None  # a list's elements
    max_items: int | None = None
    nullable: bool = False
    set_by: str = "user"  # or "control": only the control plane gives it
    # A credential (an endpoint's API key): sealed to the node that runs the stage (workers/sealing.py), so it never
    # crosses the broker in the clear, and opened on that node just before the stage runs.
    secret: bool = False
    # A further check of the whole value (the engine's own parser of a grid or a workload); raises ValueError.
    check: Callable[[Any], Any] | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"parameter {self.name}: unknown kind {self.kind!r}")

    def describe(self) -> dict:
        """For people and for the job form: what the parameter is and what it accepts."""
        described = {"name": self.name, "type": self.kind, "help": self.help, "default": self.default}
        if self.minimum is not None:
            described["minimum"] = self.minimum
        if self.maximum is not None:
            described["maximum"] = self.maximum
        if self.choices:
            described["choices"] = list(self.choices)
        if self.item is not None:
            described["items"] = self.item.describe()
        return described

    def json_schema(self) -> dict:
        """The OpenAPI (JSON Schema) form of the declaration."""
        types = {"int": "integer", "float": "number", "bool": "boolean", "str": "string", "choice": "string",
                 "list": "array", "object": "object", "path": "string"}
        schema: dict = {"type": types[self.kind], "description": self.help}
        if self.kind == "choice":
            schema["enum"] = list(self.choices)
            schema.pop("type")
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.item is not None:
            schema["items"] = self.item.json_schema()
        if self.max_items is not None:
            schema["maxItems"] = self.max_items
        if self.default is not None:
            schema["default"] = self.default
        if self.nullable:
            schema["nullable"] = True
        return schema

    def clean(self, value, key: str, data_roots: tuple[str, ...] | None):
        """The value if it is acceptable, else ParameterError. ``data_roots`` None: not on a node (the path is
        only checked for its form)."""
        if value is None:
            if self.nullable:
                return None
            raise ParameterError(key, "must not be null")
        kind = self.kind
        if kind == "bool" and not isinstance(value, bool):
            raise ParameterError(key, f"must be true or false, not {value!r}")
        if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ParameterError(key, f"must be a whole number, not {value!r}")
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ParameterError(key, f"must be a number, not {value!r}")
            value = float(value)
        if kind in ("int", "float"):
            if self.minimum is not None and value < self.minimum:
                raise ParameterError(key, f"must be at least {self.minimum:g}, not {value:g}")
            if self.maximum is not None and value > self.maximum:
                raise ParameterError(key, f"must be at most {self.maximum:g}, not {value:g}")
        if kind in ("str", "choice", "path") and not isinstance(value, str):
            raise ParameterError(key, f"must be a string, not {value!r}")
        if kind == "str" and self.maximum is not None and len(value) > self.maximum:
            raise ParameterError(key, f"must be at most {self.maximum:g} characters")
        if kind == "choice" and value not in self.choices:
            raise ParameterError(key, f"must be one of {', '.join(map(str, self.choices))}, not {value!r}")
        if kind == "path":
            value = _node_path(value, key, data_roots)
        if kind == "list":
            if not isinstance(value, list):
                raise ParameterError(key, f"must be a list, not {type(value).__name__}")
            if self.max_items is not None and len(value) > self.max_items:
                raise ParameterError(key, f"takes at most {self.max_items} items, not {len(value)}")
            if self.item is not None:
                value = [self.item.clean(element, f"{key}[{index}]", data_roots)
                         for index, element in enumerate(value)]
        if kind == "object" and not isinstance(value, dict):
            raise ParameterError(key, f"must be an object ({{...}}), not {type(value).__name__}")
        if self.check is not None:
            try:
                self.check(value)
            except ParameterError as error:  # a check that names the key inside the value (workload.requests)
                raise ParameterError(f"{key}.{error.key}", error.message) from None
            except (ValueError, TypeError, KeyError) as error:
                raise ParameterError(key, str(error).strip("'\"")) from None
        return value


def _node_path(value: str, key: str, data_roots: tuple[str, ...] | None) -> str:
    if not os.path.isabs(value) or ".." in value.split(os.sep) or "\x00" in value:
        raise ParameterError(key, "must be an absolute path without '..'")
    if data_roots is None:
        return value
    if not data_roots:
        raise ParameterError(key, "this node takes no path parameters (its operator configured no --data-root)")
    real = os.path.realpath(value)
    for root in data_roots:
        root = os.path.realpath(root)
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return real
    raise ParameterError(key, f"must lie under this node's data roots ({', '.join(data_roots)})")


def under_roots(path: str, roots: list[str]) -> bool:
    """Whether ``path`` (absolute, normalised) lies under one of ``roots`` as a node reported them."""
    path = os.path.normpath(path)
    return any(path == os.path.normpath(root) or path.startswith(os.path.normpath(root).rstrip(os.sep) + os.sep)
               for root in roots)


def device_string(value: str) -> None:
    if not DEVICE_PATTERN.fullmatch(value):
        raise ValueError(f"{value!r} is not a device: use auto, cpu, cuda or cuda:N (xpu, npu, mps alike)")


MAX_DEPTH = 32  # far above what any real config.json or job nests; deeper is refused before anything walks it


def nesting_depth(value) -> int:
    """How deeply lists and objects nest in a JSON value, counted without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        current, depth = pending.pop()
        if isinstance(current, dict | list):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in (current.values() if isinstance(current, dict)
                                                            else current))
    return deepest


def validate(stage: str, declared: tuple[Parameter, ...], params, *, control: bool = False,
             data_roots: tuple[str, ...] | None = None) -> dict:
    """``params`` checked against ``declared``: a new dict of the keys given (defaults are the stage's own).
    ``control``: the caller is the control plane (or the node running what it sent), so control-set keys pass."""
    if not isinstance(params, dict):
        raise ParameterError(stage, f"parameters must be an object ({{...}}), not {type(params).__name__}")
    by_name = {parameter.name: parameter for parameter in declared}
    cleaned = {}
    for key, value in params.items():
        parameter = by_name.get(key)
        if parameter is None or (parameter.set_by == "control" and not control):
            allowed = ", ".join(name for name, declared_one in by_name.items() if declared_one.set_by == "user")
            if parameter is None:
                raise ParameterError(key, f"{stage} takes no such parameter; it takes: {allowed or 'none'}")
            raise ParameterError(key, f"is set by the control plane only; {stage} takes: {allowed or 'none'}")
        cleaned[key] = parameter.clean(value, key, data_roots)
    return cleaned


def user_parameters(declared: tuple[Parameter, ...]) -> list[dict]:
    return [parameter.describe() for parameter in declared if parameter.set_by == "user"]
