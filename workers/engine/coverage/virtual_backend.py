"""Backends to check a model against: the node's own device, or a virtual one described by an operator list.

A virtual backend stands for hardware that is not here yet or a vendor stack that is not installed: its vendor
publishes (or d0 writes down) the aten operators it implements, and coverage is computed against that list
instead of the dispatcher's kernel table.

Operator lists are read from
- CSV/plain text: one name per line or per column, ``#`` starts a comment; with a header row naming an
  ``operator`` (or ``name``/``op``) column, only that column is read and other columns may hold notes;
- JSON: a list of names, an object whose keys are names (values ignored, e.g. notes), or an object with an
  ``operators`` list.
A name is ``aten::mm.default`` (one overload) or ``aten::mm`` (every overload); a bare ``mm`` means ``aten::mm``.

d0 ships torch's own backends as such lists (``backends/torch-<version>-cuda.json``, ``-mps``, ``-cpu``), generated
from the pinned torch's ``native_functions.yaml``; ``load_backend`` takes a file or one of their names.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# Reading an operator list needs no torch (the web tier's virtual-backend form parses lists); judging one does.
if TYPE_CHECKING:
    import torch

# The dispatch key of each device type's kernels. ROCm builds use the CUDA key; out-of-tree backends
# (Ascend, Gaudi via PrivateUse1, ...) register under PrivateUse1 whatever they rename it to.
DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mps": "MPS", "hpu": "HPU", "meta": "Meta",
                 "xla": "XLA", "mtia": "MTIA", "privateuseone": "PrivateUse1"}
# Headers of the column that holds the operator names in a CSV with more columns (notes, versions...).
HEADER_WORDS = {"operator", "operators", "op", "name", "aten operator"}


def dispatch_key(device: torch.device) -> str:
    import torch

    if device.type in DISPATCH_KEYS:
        return DISPATCH_KEYS[device.type]
    if device.type == torch._C._get_privateuse1_backend_name():
        return "PrivateUse1"
    raise ValueError(f"no dispatch key known for device type {device.type!r}")


# An operator as ATen's schema names it: ``namespace::name`` and an optional ``.overload``, each an identifier.
OPERATOR_NAME = re.compile(r"[A-Za-z_]\w*::[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?")


def normalise_operator(name: str) -> str:
    name = name.strip()
    return name if "::" in name else f"aten::{name}"


def _checked(names: list[str]) -> list[str]:
    """The names in ATen's schema form, or a ValueError quoting the first that are not (a file of anything else,
    a spreadsheet's notes or a log, is not an operator list, and would judge coverage against nothing)."""
    bad = [name for name in names if not OPERATOR_NAME.fullmatch(name)]
    if bad:
        shown = ", ".join(repr(name[:60]) for name in bad[:5])
        raise ValueError(f"{len(bad)} of {len(names)} entries are not operator names in ATen's form "
                         f"(aten::mm, aten::add.Tensor, or a bare mm): {shown}")
    return names


def split_operator(name: str) -> tuple[str, str | None]:
    """``aten::add.Tensor`` -> (``aten::add``, ``Tensor``); operator names themselves never contain a dot."""
    namespace, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    return f"{namespace}::{base}", overload or None


@dataclass(frozen=True)
class Backend:
    """Where coverage is judged. ``operators`` is None for a real backend (the dispatcher decides), else the
    virtual backend's list. ``device`` is where operators are run: the node's device (trace, smoke test, tracing
    decompositions), also for a virtual backend, whose operators cannot run anywhere yet."""

    name: str
    dispatch_key: str
    device: torch.device
    operators: frozenset[str] | None = None

    @property
    def virtual(self) -> bool:
        return self.operators is not None

    def lists(self, operator: str) -> bool:
        """Whether a virtual backend's list names ``operator`` (``aten::mm.default``) or its whole op."""
        return operator in self.operators or split_operator(operator)[0] in self.operators

    def as_dict(self) -> dict:
        described = {"name": self.name, "dispatch_key": self.dispatch_key, "device": str(self.device),
                     "virtual": self.virtual}
        if self.virtual:
            described["listed_operators"] = len(self.operators)
        elif self.device.type == "cuda":
            # Kernels differ between parts (an H100 and an MI300X are both "cuda" to torch).
            import torch

            described["device_name"] = torch.cuda.get_device_name(self.device)
        return described


def device_backend(device: torch.device) -> Backend:
    return Backend(name=str(device), dispatch_key=dispatch_key(device), device=device)


def virtual_backend(operators, *, name: str = "virtual", device: torch.device | None = None,
                    stands_for: str = "PrivateUse1") -> Backend:
    import torch

    names = frozenset(normalise_operator(operator) for operator in operators if operator and operator.strip())
    if not names:
        raise ValueError("a virtual backend needs at least one operator in its list")
    return Backend(name=f"virtual:{name}", dispatch_key=stands_for, device=device or torch.device("cpu"),
                   operators=names)


def parse_operator_list(text: str, *, json_format: bool | None = None) -> list[str]:
    """Operator names from the text of a CSV/plain or JSON list (see the module docstring)."""
    stripped = text.lstrip()
    if json_format or (json_format is None and stripped[:1] in "[{"):
        data = json.loads(text)
        if isinstance(data, dict):
            data = data["operators"] if isinstance(data.get("operators"), list) else list(data)
        if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
            raise ValueError("a JSON operator list must be a list of names or an object keyed by names")
        return _checked([normalise_operator(item) for item in data if item.strip()])
    lines = [line.split("#", 1)[0] for line in text.splitlines()]
    rows = [[cell.strip() for cell in row] for row in csv.reader(lines) if any(cell.strip() for cell in row)]
    if not rows:
        return []
    header = [cell.lower() for cell in rows[0]]
    column = next((index for index, cell in enumerate(header) if cell in HEADER_WORDS), None)
    if column is not None:
        cells = [row[column] for row in rows[1:] if len(row) > column]
    else:
        cells = [cell for row in rows for cell in row]
    return _checked([normalise_operator(cell) for cell in cells if cell])


def load_operator_list(path: str | Path) -> list[str]:
    path = Path(path)
    return parse_operator_list(path.read_text(), json_format=True if path.suffix == ".json" else None)


def load_backend(path_or_name: str | Path, device: torch.device | None = None) -> Backend:
    """A virtual backend from a list file, or from the name of one d0 ships (``torch-2-13-cuda``, see
    ``shipped_backends``). A shipped list says which dispatch key it stands for."""
    from .shipped_backends import shipped_backend

    path = Path(path_or_name)
    shipped = None if path.exists() else shipped_backend(str(path_or_name))
    if shipped is not None:
        path = Path(shipped["path"])
    stands_for = "PrivateUse1"
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("dispatch_key"), str):
            stands_for = data["dispatch_key"]
    return virtual_backend(load_operator_list(path), name=path.stem, device=device, stands_for=stands_for)
