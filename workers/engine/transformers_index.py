"""transformers' lazy-import index, built once per process instead of twice.

``import transformers`` reads the ``__all__`` of every file under ``transformers/models`` (about 1,700 files in
560 folders) to build its lazy index, and importing ``transformers.models`` (which every model module is under)
builds the same index again: the function that scans a folder is memoised by ``functools.lru_cache`` with its
default 128 entries, so by the second scan every folder's entry has been evicted. That second scan is ~0.4 s of
CPU in every d0 process that reads a model (a cold ``analyze`` of Kimi-K2 is ~3.7 s in all).

``install()`` puts a finder first on ``sys.meta_path`` that, when ``transformers.utils.import_utils`` is loaded
(before ``transformers/__init__`` scans anything), gives the scanning function an unbounded cache. The function
recurses through its module-level name, so the replacement serves both scans; its results are the same objects
the first scan made. Nothing changes when the function is not there or not an ``lru_cache`` (another transformers
version): the finder steps aside. tests/test_speed_engine.py checks that each folder is scanned once.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys

MODULE = "transformers.utils.import_utils"
SCANNER = "create_import_structure_from_path"


class _IndexOnce(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.used = False

    def find_spec(self, name, path, target=None):
        if name != MODULE or self.used:
            return None
        self.used = True  # one module, once (left on sys.meta_path, inert: removing it mid-lookup would skip a finder)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            scanner = getattr(module, SCANNER, None)
            if callable(getattr(scanner, "__wrapped__", None)) and hasattr(scanner, "cache_info"):
                setattr(module, SCANNER, functools.cache(scanner.__wrapped__))
            if self in sys.meta_path:  # the lookup is over by now
                sys.meta_path.remove(self)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Effective only before transformers is first imported in this process; harmless (a no-op) after."""
    if MODULE not in sys.modules and not any(isinstance(finder, _IndexOnce) for finder in sys.meta_path):
        sys.meta_path.insert(0, _IndexOnce())
