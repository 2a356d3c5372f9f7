"""Each stage runs under a memory limit the node's operator sets, so a stage that asks for too much (a sweep with a
huge batch, a workload of long prompts) fails alone with "out of memory" and the node keeps working; without it the
kernel's OOM killer picks a process of the machine, often the node worker's, and the job waited for the stage
timeout.

The limit (``--stage-memory`` or ``D0_NODE_STAGE_MEMORY``): bytes, with a K/M/G/T suffix (powers of 1024) or a
share of the machine's RAM (``60%``); ``0`` or ``off``: none. Default: ``DEFAULT_SHARE`` of the RAM.

It is ``RLIMIT_DATA`` on the pool process while it runs the stage, lifted again after (and inherited by what the
stage starts: a serving engine, the ranks of a sharded run). ``RLIMIT_DATA`` counts a process's private writable
memory (heap, anonymous mappings, thread stacks), which is what a stage's tensors and lists take; an allocation past
it fails (Python's MemoryError, torch's "not enough memory") instead of the kernel killing a process. Not
``RLIMIT_AS``: it counts every address reserved, and CUDA (and ROCm) reserve tens to hundreds of GiB of address space
at their start with no memory behind it, so every accelerator stage would fail; ``RLIMIT_DATA`` leaves those
``PROT_NONE`` reservations, shared libraries and device memory out. It limits each process, not the stage's processes
together, and not the page cache: for a hard limit over everything the node runs, run the node worker under a
cgroup of its own (systemd's ``MemoryMax=``, a container's memory limit); a stage killed there is reported by the
heartbeat (``workers/stage_runs.py``: "killed by signal 9 — likely out of memory"). Imports nothing from Django.
"""

from __future__ import annotations

import os
import re
import resource

VARIABLE = "D0_NODE_STAGE_MEMORY"
DEFAULT_SHARE = 0.75
SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# Below this a stage cannot even import what it runs: a typo ("8" for 8G) is refused rather than failing every job.
MINIMUM = 256 << 20
LIMITED = resource.RLIMIT_DATA

_limit: int | None = None  # bytes; set once in the node's main process, inherited by the pool it forks
_lifted: tuple[int, int] | None = None  # the pool process's limits before its stage


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_limit(text: str | None, total: int | None = None) -> int | None:
    """The limit in bytes from ``--stage-memory``'s text; None for no limit. ValueError for what is not a size."""
    total = physical_memory() if total is None else total
    text = (text or "").strip()
    if not text:
        return int(total * DEFAULT_SHARE)
    if text.lower() in ("0", "off", "none"):
        return None
    if (share := re.fullmatch(r"(\d+(?:\.\d+)?)%", text)) is not None:
        fraction = float(share.group(1)) / 100
        if not 0 < fraction <= 1:
            raise ValueError(f"a share of the RAM is above 0% and at most 100%, not {text}")
        limit = int(total * fraction)
    elif (size := re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", text, re.IGNORECASE)) is not None:
        limit = int(float(size.group(1)) * SUFFIXES[size.group(2).upper()])
    else:
        raise ValueError(f"{text!r} is not a size: give bytes, e.g. 8G, 512M, a share of the RAM such as 60%, or off")
    if limit < MINIMUM:
        raise ValueError(f"{text} is less than {MINIMUM >> 20} MiB, too little for any stage (off: no limit)")
    return limit


def configure(limit: int | None) -> None:
    global _limit
    _limit = limit


def configured() -> int | None:
    return _limit


def enter() -> None:
    """In the pool process, before its stage: the soft limit lowered to the configured one (never above the hard
    limit the operator's own ulimit set)."""
    global _lifted
    if _limit is None:
        return
    soft, hard = resource.getrlimit(LIMITED)
    ceiling = _limit if hard == resource.RLIM_INFINITY else min(_limit, hard)
    resource.setrlimit(LIMITED, (ceiling, hard))
    _lifted = (soft, hard)


def leave() -> None:
    """After the stage: the pool process's own limit again, for the node's next stage."""
    global _lifted
    if _lifted is not None:
        resource.setrlimit(LIMITED, _lifted)
        _lifted = None


def describe(limit: int | None) -> str:
    return "no limit" if limit is None else f"{limit / (1 << 30):.1f} GiB"
