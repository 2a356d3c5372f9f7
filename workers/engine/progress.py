"""Progress for people at a terminal: the engine's commands and ``manage.py sweep`` draw the same bar."""

from __future__ import annotations

import sys


class StderrProgress:
    """A one-line progress bar on stderr, drawn only when a person is watching (stderr is a terminal)."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.active = stream.isatty()

    def __call__(self, fraction: float, message: str) -> None:
        if self.active:
            filled = int(fraction * 30)
            # \x1b[K clears what a longer earlier message left on the line.
            self.stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {int(fraction * 100):3d}% {message}\x1b[K")
            self.stream.flush()

    def done(self) -> None:
        if self.active:
            self.stream.write("\n")
