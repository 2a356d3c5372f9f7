"""A node's (and the control plane's) secrets on disk: files made once, readable by their owner only.

Processes starting at once (a web worker and a control worker making the control key; two starts of one node)
must all end up with the same content: a new file is written whole under another name and linked into place, so
no reader ever sees it half-written, and the loser of the race keeps the winner's."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def create_private_file(path: Path, data: bytes) -> bool:
    """Writes ``data`` to ``path`` (mode 0600, its folder 0700) unless the file exists; True if this call made it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        try:
            os.link(draft, path)
        except FileExistsError:
            return False
    finally:
        draft.unlink(missing_ok=True)
    return True
