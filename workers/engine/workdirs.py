"""Scratch folders of node stages (a sharded run's job file and rank logs, a serve sweep's checkpoint and engine
logs), removed on every exit path: on return and on exceptions by the context manager, and after a kill (SIGKILL
runs no clean-up) by ``remove_stale`` when the node worker starts again: each folder names the process that made
it, and a folder whose process is gone is removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIXES = ("d0-shard-", "d0-serve-")
OWNER_FILE = ".d0-owner-pid"


@contextmanager
def workdir(prefix: str) -> Iterator[str]:
    if prefix not in PREFIXES:
        raise ValueError(f"unknown work folder prefix {prefix!r}; known: {', '.join(PREFIXES)}")
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        (Path(folder) / OWNER_FILE).write_text(str(os.getpid()))
        yield folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: not ours to judge
    return True


def remove_stale(root: str | None = None) -> list[str]:
    """Remove d0's work folders whose creating process is gone; returns their paths."""
    removed = []
    base = Path(root or tempfile.gettempdir())
    for folder in base.iterdir() if base.is_dir() else []:
        if not folder.is_dir() or not folder.name.startswith(PREFIXES):
            continue
        try:
            pid = int((folder / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue  # not one this version made (or being made right now): left alone
        if not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed
