"""The engine runs on a node without Django, and so do its tests: no module of workers/engine and no module of this
folder imports Django or the web app. (The fast tier also makes them unimportable while it runs, which catches an
import through another module: conftest.py.)"""

import ast
from pathlib import Path

from .conftest import ROOT, WEB_TIER


def imported_packages(path: Path):
    """(line, top-level package) of every absolute import in a module, at any depth (imports inside functions too)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name.partition(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.lineno, node.module.partition(".")[0]


def test_no_engine_module_and_no_engine_test_imports_django_or_the_web_app():
    modules = [*sorted((ROOT / "workers" / "engine").rglob("*.py")), *sorted(Path(__file__).parent.rglob("*.py"))]
    assert len(modules) > 100
    found = [f"{path.relative_to(ROOT)}:{line} imports {package}" for path in modules
             for line, package in imported_packages(path) if package in WEB_TIER]
    assert found == []
