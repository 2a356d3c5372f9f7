"""A node's outbox: the stage reports the broker did not take, kept on disk until it answers again.

A stage's "started" and "finished" reports are what move its job on; a broker restart mid-stage used to lose them
(the report raised, the task died, the job stayed running until the stage timeout). A report the broker refuses is
written here, one JSON file per message (written to a temporary name and renamed, so a reader never sees half a
file), and sent later, oldest first, by whichever comes first: the next report, the heartbeat thread, or the node's
next start. The messages are signed when made, so a late one is still the node's word; the control plane stores a
duplicate once, and drops a report about a stage run that is over.

Files are not fsynced: they must outlive the worker process (a restart), not the machine, whose crash ends the
stage anyway (the control plane then fails it: node timeout, or "restarted while stage … was running").
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger("d0.node")

# The outbox lock descriptors this process holds. The worker forks a new pool process whenever one ends (a cancelled
# stage's); a child forked while the heartbeat thread held the lock would keep it through its copy of the descriptor
# (an flock lasts while any copy is open) and then wait on itself at its first report. The child closes its copies.
_held: set[int] = set()


def _close_inherited_locks() -> None:
    for descriptor in list(_held):
        try:
            os.close(descriptor)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_close_inherited_locks)

_numbers = itertools.count()

Send = Callable[[str, list], None]  # (task name, signed message) -> None; raises when the broker refuses it


class Outbox:
    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def pending(self) -> list[Path]:
        """The messages waiting, oldest first (their names start with the time they were made)."""
        try:
            return sorted(path for path in self.folder.iterdir() if path.suffix == ".json")
        except FileNotFoundError:
            return []

    def kept(self, task: str) -> list[list]:
        """The waiting messages sent as ``task``, oldest first (an unreadable one is ``flush``'s to set aside)."""
        messages = []
        for path in self.pending():
            try:
                entry = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(entry, dict) and entry.get("task") == task:
                messages.append(entry["message"])
        return messages

    def put(self, task: str, message: list) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        # Time first, so names sort oldest first; the pid and a counter keep the names of a node's pool processes
        # (and of two messages made in one tick) apart.
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(_numbers)}"
        temporary = self.folder / f"{name}.tmp"
        temporary.write_text(json.dumps({"task": task, "message": message}))
        return temporary.rename(self.folder / f"{name}.json")

    @contextmanager
    def locked(self, wait: bool = True) -> Iterator[bool]:
        """Held while sending, so the node's pool processes and its heartbeat thread send each message once and in
        order. Yields False (without the lock) when ``wait`` is False and another sender holds it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.folder / ".lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        _held.add(descriptor)  # before it is locked: a child forked from here on closes its copy
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(descriptor, fcntl.LOCK_UN)  # released whoever else holds a copy of the descriptor
        finally:
            _held.discard(descriptor)
            os.close(descriptor)

    def flush(self, send: Send, *, wait: bool = True) -> int:
        """Send the waiting messages, oldest first, each removed once the broker has it; stops at the first the
        broker refuses. Returns how many are still waiting (-1 when another sender held the lock)."""
        with self.locked(wait) as held:
            if not held:
                return -1
            return self._flush(send)

    def deliver(self, task: str, message: list, send: Send, retry_delays: tuple[float, ...] = ()) -> int:
        """Send ``message`` behind any waiting ones; what the broker refuses is kept and tried again after each of
        ``retry_delays`` (seconds), then left for a later flush. Returns how many messages are still waiting."""
        with self.locked():
            if self.pending():
                self.put(task, message)
                left = self._flush(send)
            else:
                try:
                    send(task, message)
                    return 0
                except Exception as error:  # noqa: BLE001 - the broker refused it: keep it for later
                    logger.warning("the broker did not take %s (%s); kept in %s", task, error, self.folder)
                    self.put(task, message)
                    left = 1
        for delay in retry_delays:
            if not left:
                break
            time.sleep(delay)
            left = self.flush(send)
        return left

    def _flush(self, send: Send) -> int:
        waiting = self.pending()
        for position, path in enumerate(waiting):
            try:
                entry = json.loads(path.read_text())
            except (OSError, ValueError) as error:
                # Only a disk problem makes one of these: set aside, so it cannot block the messages behind it.
                logger.error("outbox message %s is unreadable (%s); set aside as .bad", path.name, error)
                path.rename(path.with_suffix(".bad"))
                continue
            try:
                send(entry["task"], entry["message"])
            except Exception as error:  # noqa: BLE001 - the broker refused it: keep it and the rest for later
                logger.warning("the broker did not take %s (%s); %d report(s) kept in %s", entry["task"], error,
                               len(waiting) - position, self.folder)
                return len(waiting) - position
            path.unlink()
        return 0
