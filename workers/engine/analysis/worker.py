"""``analyze`` in a process of its own, for callers that must not import torch or transformers (the web tier: an
upload is analysed while its request waits, and each gunicorn worker would otherwise carry ~200 MiB of torch).

``AnalysisProcess().analyze(config, timeout_s=.., idle_s=..)`` sends the config to a child, ``python -m
workers.engine.analysis.worker``, and returns its report, or raises what ``analyze`` raised there (ConfigError,
ValueError; anything else as AnalysisFailed, its traceback in the child's stderr, which is the caller's). The
child answers one JSON line per request line and stays up between requests, so only the first analysis pays for
importing torch and transformers; it exits after ``idle_s`` without a request, or when its parent goes (its stdin
closes). A request past its deadline kills the child; the next one starts a fresh child.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from ..models.config_loading import ConfigError

# The folder that holds the ``workers`` package: the child imports it from there, whatever the caller's cwd.
ROOT = Path(__file__).resolve().parents[3]


class AnalysisFailed(RuntimeError):
    """The analysis process failed for a reason other than the config (it crashed, or ran past its deadline)."""


class AnalysisProcess:
    def __init__(self):
        self._child: subprocess.Popen | None = None
        self._owner = 0
        self._buffer = b""
        # One request at a time per child (a threaded web worker may upload from two threads at once).
        self._lock = threading.Lock()

    def analyze(self, config: dict, *, timeout_s: float, idle_s: float) -> dict:
        request = json.dumps({"config": config}).encode() + b"\n"
        deadline = time.monotonic() + timeout_s
        with self._lock:
            # A child that was already running may have just exited idle: one retry with a fresh child.
            for attempt in range(2):
                fresh = self._start_if_needed(idle_s)
                try:
                    self._child.stdin.write(request)
                    self._child.stdin.flush()
                    line = self._read_line(deadline)
                except (BrokenPipeError, EOFError):
                    self.close()
                    if fresh or attempt:
                        raise AnalysisFailed("the analysis process exited before answering (see its log)") from None
                    continue
                except TimeoutError:
                    self.close()
                    raise AnalysisFailed(f"the analysis took longer than {timeout_s:g} s") from None
                return _answer(json.loads(line))
        raise AssertionError("unreachable")

    def _start_if_needed(self, idle_s: float) -> bool:
        # A child started before a fork (gunicorn --preload) belongs to the parent process, not to this one.
        if self._child is not None and self._child.poll() is None and self._owner == os.getpid():
            return False
        self._child = subprocess.Popen(
            [sys.executable, "-m", "workers.engine.analysis.worker", "--idle-s", str(idle_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
        self._owner, self._buffer = os.getpid(), b""
        return True

    def _read_line(self, deadline: float) -> bytes:
        stdout = self._child.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([stdout], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(stdout, 1 << 20)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close(self) -> None:
        if self._child is not None and self._owner == os.getpid():
            self._child.kill()
            self._child.wait()
            self._child.stdin.close()
            self._child.stdout.close()
        self._child = None


def _answer(answer: dict) -> dict:
    if "report" in answer:
        return answer["report"]
    kinds = {"ConfigError": ConfigError, "ValueError": ValueError}
    if answer["error"] in kinds:
        raise kinds[answer["error"]](answer["message"])
    raise AnalysisFailed(f"the analysis failed: {answer['error']}: {answer['message']}")


def _handle(line: bytes) -> dict:
    from . import analyze

    try:
        return {"report": analyze(json.loads(line)["config"])}
    except (ConfigError, ValueError) as error:
        return {"error": "ConfigError" if isinstance(error, ConfigError) else "ValueError", "message": str(error)}
    except Exception as error:
        traceback.print_exc()
        return {"error": type(error).__name__, "message": str(error)}


def serve(idle_s: float) -> None:
    # Answers go to the original stdout; anything torch or transformers print goes to stderr instead.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while select.select([requests], [], [], idle_s)[0]:
        line = requests.readline()
        if not line:
            return
        answers.write(json.dumps(_handle(line)).encode() + b"\n")
        answers.flush()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--idle-s", type=float, required=True, help="exit after this long without a request")
    serve(parser.parse_args().idle_s)
