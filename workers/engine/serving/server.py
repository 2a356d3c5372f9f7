"""An engine's server as a process d0 starts, watches and always stops: its own process group, a free loopback
port, a kept log, ``/health`` polled against a deadline, and every process of the group gone at the end.

Engines are external programs (their own interpreter and packages); d0 only runs their command line and speaks
HTTP to them. A server that exits, or is not healthy by its deadline, raises ``EngineFailed`` with the cause read
from its log (``log_cause``) rather than leaving the caller waiting.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from ..processes import die_with_parent

# The lines of an engine's log that say why it stopped, most specific first: (label, pattern). A match's whole
# line is the reason shown with the label.
CAUSES = (
    ("out of memory", re.compile(r"out of memory|OutOfMemoryError|not enough memory|Insufficient memory|"
                                 r"is less than requested memory|"
                                 r"No available memory for the cache blocks|exceeds the available|"
                                 r"larger than the available KV cache|cannot allocate memory", re.IGNORECASE)),
    ("unsupported architecture", re.compile(r"are not supported for now|is not supported|not supported by|"
                                            r"Model architectures? .* (?:are|is) not supported|"
                                            r"Cannot find model module", re.IGNORECASE)),
    ("missing kernel", re.compile(r"no kernel image|NotImplementedError|undefined symbol|could not find a kernel|"
                                  r"not implemented for", re.IGNORECASE)),
    ("bad weights", re.compile(r"KeyError: .*(?:weight|bias|scale)|size mismatch|shape mismatch|"
                               r"does not match the shape", re.IGNORECASE)),
    ("unsupported setting", re.compile(r"No common block size|MultipleOf\(|is not supported on this platform",
                                       re.IGNORECASE)),
    ("invalid setting", re.compile(r"ValueError:|ValidationError|argument .*: invalid|error: argument",
                                   re.IGNORECASE)),
)
ERROR_LINE = re.compile(r"(?:Error|Exception)\b[:(]|\bERROR\b|Traceback")
HEALTH_POLL_S = 0.5
STOP_GRACE_S = 10.0
# Servers of this process that are running, so a SIGTERM (Celery's revoke with terminate) stops them first.
_RUNNING: set[EngineServer] = set()


class EngineFailed(RuntimeError):
    """The engine did not serve: ``cause`` (out of memory, unsupported architecture, ..., exited, timed out,
    cancelled) and ``reason`` (the log line or what happened)."""

    def __init__(self, cause: str, reason: str):
        super().__init__(f"{cause}: {reason}")
        self.cause, self.reason = cause, reason


# What an engine's processes get of the node worker's environment: what any program needs, and the settings of the
# engines and of what they run on (vLLM, SGLang, CUDA/ROCm, NCCL, torch, Triton, Hugging Face, OpenMP); plus the names
# an operator lists in D0_ENGINE_ENV. Nothing else: the worker's environment holds its join token and the broker's
# URL with its password, which an engine (third-party code, loading a model's files) has no use for.
ENGINE_ENV_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR",
                              "LD_LIBRARY_PATH", "LD_PRELOAD", "XDG_CACHE_HOME", "CC", "CXX"})
ENGINE_ENV_PREFIXES = ("LC_", "VLLM_", "SGLANG_", "SGL_", "CUDA_", "CUDNN_", "NVIDIA_", "NCCL_", "ROCM_", "HIP_",
                       "HSA_", "ROCR_", "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "TRITON_", "HF_", "HUGGING_FACE_",
                       "TRANSFORMERS_", "TOKENIZERS_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GLOO_", "UCX_")
# Never passed, even when listed: d0's own variables (D0_*: the join token among them), the broker's and the
# database's URLs, and d0's PYTHONPATH (the engine's interpreter would import d0's torch, not its own).
NEVER_TO_ENGINES = ("D0_", "CELERY_")
NEVER_NAMES = frozenset({"REDIS_URL", "BROKER_URL", "DATABASE_URL", "PYTHONPATH", "PYTHONHOME"})
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def declared_engine_env(declared: str) -> list[str]:
    """The extra variable names an operator lets engines see (``D0_ENGINE_ENV``: names, space- or comma-separated);
    a ValueError for a name that is no variable name or is one engines never get."""
    names = declared.replace(",", " ").split()
    for name in names:
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"D0_ENGINE_ENV lists {name!r}, which is not a variable name (A-Z, 0-9, _)")
        if name.startswith(NEVER_TO_ENGINES) or name in NEVER_NAMES:
            raise ValueError(f"D0_ENGINE_ENV lists {name}, which engines never get (d0's own variables, the broker's "
                             "and database's URLs, PYTHONPATH)")
    return names


def engine_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment an engine starts with: the node worker's, reduced to what engines need and the operator
    declared (``ENGINE_ENV_NAMES``, ``ENGINE_ENV_PREFIXES``, ``D0_ENGINE_ENV``)."""
    environ = os.environ if environ is None else environ
    declared = set(declared_engine_env(environ.get("D0_ENGINE_ENV", "")))
    return {key: value for key, value in environ.items()
            if (key in declared or key in ENGINE_ENV_NAMES or key.startswith(ENGINE_ENV_PREFIXES))
            and not key.startswith(NEVER_TO_ENGINES) and key not in NEVER_NAMES}


def stop_running_servers() -> None:
    for server in list(_RUNNING):
        server.stop()


def stop_servers_on_sigterm() -> None:
    """Stop this process's engines when it is sent SIGTERM (a cancelled job's stage), then end it as the previous
    handler would have."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        stop_running_servers()
        if callable(previous):
            previous(signum, frame)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    if getattr(previous, "_d0_stops_servers", False):
        return
    handler._d0_stops_servers = True
    signal.signal(signal.SIGTERM, handler)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def log_cause(text: str) -> tuple[str, str] | None:
    """Why an engine stopped, from its log: the most specific known cause and its line (the last such line, as the
    root cause comes last in a traceback), else the last error-looking line, else None."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for label, pattern in CAUSES:
        matching = [line for line in lines if pattern.search(line)]
        if matching:
            return label, _clean(matching[-1])
    errors = [line for line in lines if ERROR_LINE.search(line) and "Traceback" not in line]
    return ("error", _clean(errors[-1])) if errors else None


def _clean(line: str) -> str:
    # vLLM prefixes each line with its process and logger: "(EngineCore pid=12) ERROR 12-01 12:31:13 [core.py:1] "
    line = re.sub(r"^\([^)]*\)\s*", "", line)
    line = re.sub(r"^(?:ERROR|WARNING|INFO)\s+\d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\]\s*", "", line)
    return line[:500]


class EngineServer:
    """One server process group. ``start()``, ``wait_healthy()``, ``stop()``; usable as a context manager (stopped
    on every exit, exceptions included)."""

    def __init__(self, command: list[str], *, env: dict[str, str], log_path: Path, port: int,
                 health_path: str = "/health"):
        self.command, self.env, self.log_path, self.port = command, env, log_path, port
        self.health_url = f"http://127.0.0.1:{port}{health_path}"
        self.process: subprocess.Popen | None = None
        # Every process of the engine inherits this, so an operator (or a test) finds what d0 started.
        self.run_id = uuid.uuid4().hex[:12]
        self.started_at: float | None = None
        self.healthy_after_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # A session (and so a process group) of its own: stop() ends the engine's children with it.
            self.process = subprocess.Popen(self.command, env={**engine_environment(), **self.env,
                                                                             "D0_ENGINE_RUN": self.run_id}, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True,
                                            # no engine outlives its stage, even one killed by a hard limit
                                            preexec_fn=die_with_parent(signal.SIGKILL))
        self.started_at = time.perf_counter()
        _RUNNING.add(self)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def failure(self, cause: str, reason: str) -> EngineFailed:
        found = log_cause(self.log_text())
        if found:
            return EngineFailed(found[0], f"{reason}; the log says: {found[1]}")
        return EngineFailed(cause, reason)

    def wait_healthy(self, timeout_s: float, cancelled: Callable[[], bool] | None = None) -> float:
        """Seconds from start to a 200 on the health endpoint. Raises EngineFailed when the server exits, when
        ``cancelled()`` turns true, or at the deadline."""
        deadline = self.started_at + timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise self.failure("exited", f"the server exited with code {code} before it was healthy")
            if cancelled is not None and cancelled():
                raise EngineFailed("cancelled", "the trial was cancelled while the server was starting")
            try:
                with urllib.request.urlopen(self.health_url, timeout=2) as response:
                    if response.status == 200:
                        self.healthy_after_s = time.perf_counter() - self.started_at
                        return self.healthy_after_s
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.perf_counter() > deadline:
                raise self.failure("timed out", f"not healthy {timeout_s:.0f} s after start")
            time.sleep(HEALTH_POLL_S)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def settle(self) -> None:
        """After failed requests: wait for what the server's other nodes report (one node: nothing to wait for;
        ``deployment.DeployedServer``)."""

    def group_alive(self) -> bool:
        """Whether any process of the server's group is left (the leader's children outlive it otherwise)."""
        if self.process is None:
            return False
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop(self) -> None:
        """SIGTERM to the whole group, SIGKILL to what is left after a grace period; returns once none is left."""
        if self.process is None:
            return
        for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.perf_counter() + wait_s
            while time.perf_counter() < deadline:
                try:
                    self.process.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    continue
                if not self.group_alive():
                    break
                time.sleep(0.1)
            if not self.group_alive():
                break
        if self.process.poll() is None:
            self.process.wait(timeout=5)
        _RUNNING.discard(self)

    def __enter__(self) -> EngineServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
