"""Which dispatch keys have a kernel for each aten operator, read from torch's own ``native_functions.yaml``.

The torch wheel ships the file inside ``torchgen`` (``torchgen/packaged/ATen/native/native_functions.yaml``), so the
kernel table of every backend torch builds (CUDA, MPS, CPU...) can be read on a machine that has none of them.
``scripts/generate-virtual-backends.py`` turns it into the operator lists shipped in ``backends/``; the tests
check the classifier's answers against it.

How an entry's kernels are registered (torchgen's rules, checked against this build's dispatcher for CPU and the
composite keys in ``tests/test_coverage_backends.py``):

- ``dispatch:`` names the keys (``CPU, CUDA: add_out``); an explicit empty ``dispatch: {}`` registers none here;
- no ``dispatch:`` and no ``structured_delegate:`` means CompositeImplicitAutograd;
- ``structured_delegate: add.out`` gives the functional and in-place variants the out variant's backend kernels, plus
  a CompositeExplicitAutogradNonFunctional kernel that calls the out variant;
- ``ufunc_inner_loop:`` generates CPU and CUDA kernels;
- ``autogen: foo.out`` generates a CompositeExplicitAutograd kernel, unless the operator is CompositeImplicitAutograd
  only (nothing is generated then).

Names are ``aten::name.overload`` with ``default`` for the overload-less one, as the dispatcher spells them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

COMPOSITE_KEYS = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional", "CompositeImplicitAutograd")
# Dense device keys whose kernels this file declares in full. XPU and MTIA are listed too, but most of their kernels
# are registered from their own out-of-tree yaml (intel/torch-xpu-ops, the MTIA plugin): a list read from here would
# show 40 XPU operators and report gaps that are not there. ``--keys XPU`` still generates one on request.
GENERATED_KEYS = ("CUDA", "MPS", "CPU")


def yaml_path() -> Path:
    """``native_functions.yaml`` of the installed torch (torchgen ships with the torch wheel)."""
    spec = importlib.util.find_spec("torchgen")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("torchgen is not installed (it ships with torch)")
    path = Path(next(iter(spec.submodule_search_locations))) / "packaged/ATen/native/native_functions.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no native_functions.yaml at {path}")
    return path


def operator_key(signature: str) -> str:
    """``add.Tensor(Tensor self, ...) -> Tensor`` or ``add.out`` -> ``aten::add.Tensor`` / ``aten::add.out``."""
    name = signature.split("(", 1)[0].strip()
    base, _, overload = name.partition(".")
    return f"aten::{base}.{overload or 'default'}"


def dispatch_keys(entry: dict) -> set[str]:
    keys = set()
    for spec in entry.get("dispatch") or {}:
        keys.update(key.strip() for key in spec.split(","))
    if "ufunc_inner_loop" in entry:
        keys |= {"CPU", "CUDA"}
    return keys


def kernel_table(path: str | Path | None = None) -> dict[str, frozenset[str]]:
    """``{aten::name.overload: the dispatch keys with a kernel for it}`` for every operator the file declares."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    entries = yaml.load(Path(path or yaml_path()).read_text(), Loader=loader)
    table: dict[str, set[str]] = {}
    delegates: dict[str, str] = {}
    generated: dict[str, str] = {}
    for entry in entries:
        name = operator_key(entry["func"])
        keys = dispatch_keys(entry)
        if "structured_delegate" in entry:
            delegates[name] = operator_key(entry["structured_delegate"])
            keys.add("CompositeExplicitAutogradNonFunctional")
        elif "dispatch" not in entry:
            keys.add("CompositeImplicitAutograd")
        table[name] = keys
        for autogen in str(entry.get("autogen") or "").split(","):
            if autogen.strip():
                generated[operator_key(autogen)] = name
    for name, delegate in delegates.items():
        table[name] |= table[delegate] - set(COMPOSITE_KEYS)
    for name, source in generated.items():
        if table[source] != {"CompositeImplicitAutograd"}:
            table.setdefault(name, set()).add("CompositeExplicitAutograd")
    return {name: frozenset(keys) for name, keys in table.items()}


def operators_with(table: dict[str, frozenset[str]], key: str) -> list[str]:
    return sorted(name for name, keys in table.items() if key in keys)


def composite_operators(table: dict[str, frozenset[str]]) -> dict[str, list[str]]:
    """Per composite key, the operators with a kernel for it (a backend inherits these unless it overrides them)."""
    return {key: operators_with(table, key) for key in COMPOSITE_KEYS}
