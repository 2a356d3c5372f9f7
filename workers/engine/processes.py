"""Child processes that do not outlive their parent: a serving engine its stage, d0's workers ``manage.py up``."""

from __future__ import annotations

import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL):
    """A ``preexec_fn``: the child gets ``sig`` when the process that started it dies, even by SIGKILL. Linux only;
    elsewhere the parent's own clean-up remains."""

    def arm() -> None:
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
        except OSError:
            pass

    return arm
