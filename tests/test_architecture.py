"""The code's shape, read from its source: capability packages import each other in one direction only, and no module
branches on stage kinds outside the registries (a kind's code lives with its capability, in its ``stage.py``)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE_KINDS = {"env_probe", "env_check", "op_coverage", "sharded_run", "sweep", "serve_sweep", "endpoint_bench"}


def _modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" not in path.parts:
            yield path, ast.parse(path.read_text(), str(path))


def _imported(path: Path, tree: ast.AST) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function, as dotted names."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = [*base, *(node.module.split(".") if node.module else [])]
            names.update(".".join([*module, alias.name]) for alias in node.names)
    return names


def package_graph(top: str) -> dict[str, set[str]]:
    """``top``'s first-level packages and modules, each with those it imports (its own imports left out)."""
    graph: dict[str, set[str]] = {}
    for path, tree in _modules(top):
        parts = path.relative_to(ROOT / top).with_suffix("").parts
        if parts == ("__init__",):
            continue
        owner = parts[0]
        for name in _imported(path, tree):
            words = name.split(".")
            if words[0] == top and len(words) > 1 and words[1] != owner:
                graph.setdefault(owner, set()).add(words[1])
        graph.setdefault(owner, set())
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one node (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_walker_finds_a_cycle_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_packages_of_the_control_plane_import_each_other():
    graph = package_graph("adaptation")
    assert {"jobs", "clusters", "coverage", "intake", "serving", "sharding", "sweeps"} <= set(graph)
    assert cycles(graph) == []


def test_the_job_machinery_imports_no_capability():
    """Capabilities plug into jobs (their handlers, their pages' submits); jobs reaches them only through the
    stage registry."""
    capabilities = {"clusters", "coverage", "intake", "serving", "sharding", "sweeps"}
    assert package_graph("adaptation")["jobs"] & capabilities == set()


def _compared_stage_kinds(tree: ast.AST) -> list[int]:
    """Lines comparing something named ``kind`` with a stage kind's name (``kind == "sweep"``, ``kind in (...)``)."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named_kind = any(isinstance(side, ast.Name) and side.id == "kind" or isinstance(side, ast.Attribute)
                         and side.attr == "kind" for side in sides)
        literals = {constant.value for side in sides for constant in ast.walk(side)
                    if isinstance(constant, ast.Constant) and isinstance(constant.value, str)}
        if named_kind and literals & STAGE_KINDS:
            lines.append(node.lineno)
    return lines


def test_no_module_branches_on_stage_kinds():
    found = {str(path.relative_to(ROOT)): lines for package in ("adaptation", "workers")
             for path, tree in _modules(package) if (lines := _compared_stage_kinds(tree))}
    assert found == {}


def test_the_control_planes_hand_written_sql_is_fenced_in_the_job_machinery():
    """The measured statements on every job's path (``adaptation/jobs/sql.py``, ``statements.py``) are the one place
    with hand-written SQL; nothing outside ``adaptation/jobs`` uses them (sign-in, sessions, filters and pages use
    the ORM)."""
    fenced = ("adaptation.jobs.sql", "adaptation.jobs.statements")
    users = {str(path.relative_to(ROOT)) for package in ("adaptation", "workers", "d0web")
             for path, tree in _modules(package)
             if any(name == module or name.startswith(module + ".") for name in _imported(path, tree)
                    for module in fenced)}
    assert users and all(user.startswith("adaptation/jobs/") for user in users), users


def test_no_class_overrides_a_private_method_of_django_or_drf():
    """Stock framework paths: a subclass of a Django or DRF class may override its public hooks, never a method
    whose name says it is the framework's own business (``_get_session_from_db``, ``_update_errors``)."""
    import importlib
    import inspect
    import pkgutil

    import adaptation

    overridden = []
    for module in pkgutil.walk_packages(adaptation.__path__, "adaptation."):
        if ".migrations" in module.name:
            continue
        for _, cls in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if not cls.__module__.startswith("adaptation"):
                continue
            frameworks = [base for base in cls.__mro__[1:]
                          if base.__module__.split(".")[0] in ("django", "rest_framework")]
            for name, value in vars(cls).items():
                # Enum's _sunder_ names (what a choices class's metaclass makes) are its protocol, not private.
                private = name.startswith("_") and not name.endswith("_")
                if inspect.isfunction(value) and private and any(name in vars(base) for base in frameworks):
                    overridden.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    assert overridden == []
