"""Which stage messages this node has already started, so a redelivery does not run a stage twice.

Stage tasks are acknowledged late (a node that dies mid-stage leaves its message to be delivered again), so Redis
hands a killed stage's message back about an hour later, when the control plane has long failed that job. Each
started task's id (a uuid the control plane gives every stage run) is appended to a file in the node's state
folder before the stage runs; a message whose id is there is dropped. Only the newest ``KEEP`` ids are kept.
"""

from __future__ import annotations

import fcntl
from pathlib import Path

KEEP = 2000
FILE_NAME = "started-stage-tasks"


class Delivered:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / FILE_NAME

    def first_delivery(self, task_id: str) -> bool:
        """Record ``task_id`` as started; False when it was started before (a redelivery)."""
        if not task_id:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # pool processes of one node share the file
            handle.seek(0)
            seen = handle.read().split()
            if task_id in seen:
                return False
            if len(seen) >= KEEP:
                handle.seek(0)
                handle.truncate()
                handle.write("".join(f"{old}\n" for old in seen[-KEEP // 2:]))
            # Not fsynced (5 ms on every stage's path here): the mark must outlive the worker process, whose death
            # is what brings a message back. A machine crash can lose the marks of its last seconds (the file
            # system's commit interval); the stage such a mark was for died with the machine and was failed by the
            # control plane, so its redelivery an hour later runs once more and its report is dropped.
            handle.write(f"{task_id}\n")
        return True
