"""Strict parsing of environment variables: a typo is an error at start-up, never a silent default."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def var_dir() -> Path:
    """The instance's own folder (its secret key, SQLite database, embedded broker's and gunicorn's sockets): two
    instances on one host differ in it. An empty D0_VAR_DIR is unset, not the working directory (where the
    zero-setup secret key would then be written)."""
    return Path(env_str("D0_VAR_DIR") or BASE_DIR / "var")


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use one of {sorted(_TRUE | _FALSE)}")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(url: str) -> dict:
    """A Django DATABASES entry from ``postgres://user:pass@host:port/name`` or ``sqlite:///path``."""
    parsed = urlparse(url)
    if parsed.scheme in ("postgres", "postgresql", "pgsql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parsed.path.lstrip("/")),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
            "CONN_MAX_AGE": env_int("D0_DB_CONN_MAX_AGE", 60),
            "CONN_HEALTH_CHECKS": True,
        }
    if parsed.scheme == "sqlite":
        return sqlite_database(parsed.path)
    raise ImproperlyConfigured(f"DATABASE_URL scheme {parsed.scheme!r} is not supported (use postgres:// or sqlite:///)")


def sqlite_database(path) -> dict:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        # The web server and the control-plane worker write concurrently: WAL lets readers go on during a
        # write, IMMEDIATE takes the write lock up front so a transaction never fails mid-way on upgrade.
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
