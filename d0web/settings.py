"""d0 settings: one module, driven by environment variables, that works with none set.

With no variables: SQLite under ``var/`` and, as the broker, the embedded Valkey server ``manage.py up`` starts on a
unix socket under ``var/`` (``embedded_broker``: the same Redis protocol production uses, no service to install).
``DATABASE_URL`` switches to PostgreSQL, ``REDIS_URL`` (or ``D0_BROKER_URL``) to Redis.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from workers.protocol import CHECK_LIVENESS, SYNC_BROKER_USERS, control_queue

from . import embedded_broker
from .env import database_from_url, env_bool, env_float, env_int, env_list, env_str, sqlite_database, var_dir

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = var_dir()
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    key = env_str("D0_SECRET_KEY")
    if key:
        return key
    # Zero-setup: a key made once per installation and kept beside the database, never a constant in git.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
# Production must bring its own key: `check --deploy` fails on the zero-setup one (d0web/checks.py).
D0_SECRET_KEY_FROM_ENVIRONMENT = bool(env_str("D0_SECRET_KEY"))
DEBUG = env_bool("D0_DEBUG", False)
ALLOWED_HOSTS = env_list("D0_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("D0_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "csp",
    "adaptation",
]

MIDDLEWARE = [
    # First: a body over the limit is refused from its Content-Length, before anything reads it.
    "d0web.middleware.RequestBodyLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: turns a locked-out login into a 429.
    "axes.middleware.AxesMiddleware",
]

# Failed sign-ins (the login page, the admin's, and /api/token/, which all go through authenticate()) are
# counted per username and address by django-axes; past the limit that pair is locked out for the cool-off,
# the right password included. django-axes rather than DRF throttles: it covers the HTML login too, keeps the
# attempts in the database (every web worker sees them) and has an admin page and `axes_reset` to unlock.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("D0_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("D0_LOGIN_LOCKOUT_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# 429 with Retry-After, for the API's token endpoint as for the login pages.
AXES_LOCKOUT_CALLABLE = "d0web.lockout.lockout_response"
AXES_VERBOSE = False
AXES_IPWARE_PROXY_COUNT = 1 if env_bool("D0_BEHIND_TLS_PROXY", False) else None

# Content-Security-Policy: scripts and styles from d0 itself only (plotly is vendored; chart data reaches the
# scripts through json_script). Inline styles are allowed because plotly.js writes its own <style> element.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'"],
    },
}

ROOT_URLCONF = "d0web.urls"
WSGI_APPLICATION = "d0web.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_database_url = env_str("DATABASE_URL")
DATABASES = {"default": database_from_url(_database_url) if _database_url else sqlite_database(VAR_DIR / "d0.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("D0_STATIC_ROOT", str(VAR_DIR / "staticfiles")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on every request when it is missing
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve straight from the app's folders, so the zero-setup run needs no collectstatic step.
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"
# Rows per page of the HTML lists (the API pages by REST_FRAMEWORK["PAGE_SIZE"]).
D0_PAGE_SIZE = 25

# Uploads: a config.json is a few KiB; anything past this limit is refused with a field message. A whole request
# body past D0_MAX_REQUEST_BYTES (4x that) is refused (413) before any of it is read, uploads included: between
# the two, the form or the API still says which field is too big and by how much.
D0_MAX_CONFIG_BYTES = env_int("D0_MAX_CONFIG_BYTES", 2 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = D0_MAX_CONFIG_BYTES + 256 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = D0_MAX_CONFIG_BYTES + 256 * 1024
D0_MAX_REQUEST_BYTES = env_int("D0_MAX_REQUEST_BYTES", 4 * D0_MAX_CONFIG_BYTES)
# An uploaded config is analysed in a child process of the web worker that has torch and transformers (the web
# worker itself imports neither): the request waits at most D0_ANALYSIS_TIMEOUT_S for it (the first analysis of a
# process includes the child's start, ~3-8 s), and the child exits after D0_ANALYSIS_IDLE_S without a request.
D0_ANALYSIS_TIMEOUT_S = env_float("D0_ANALYSIS_TIMEOUT_S", 60.0)
D0_ANALYSIS_IDLE_S = env_float("D0_ANALYSIS_IDLE_S", 300.0)

# Production hardening, switched on by environment (check --deploy reads these).
SECURE_SSL_REDIRECT = env_bool("D0_SECURE_SSL_REDIRECT", False)
SESSION_COOKIE_SECURE = env_bool("D0_SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = env_int("D0_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
# Preloading is a promise to browsers' HSTS lists that is slow to take back: only when asked for (and then
# Django's reminder to preload, security.W021, is not wanted either).
SECURE_HSTS_PRELOAD = env_bool("D0_HSTS_PRELOAD", False)
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("D0_BEHIND_TLS_PROXY", False) else None
SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_HTTPONLY = True
SESSION_ENGINE = "django.contrib.sessions.backends.db"
X_FRAME_OPTIONS = "DENY"

REST_FRAMEWORK = {
    # Token first: its WWW-Authenticate header makes an anonymous request a 401 rather than a 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": [
        "adaptation.api.parsers.JSONParser",
        "adaptation.api.parsers.FormParser",
        "adaptation.api.parsers.MultiPartParser",
    ],
    "DEFAULT_FILTER_BACKENDS": [
        "adaptation.filtersets.TeamScopedFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "adaptation.api.schema.D0AutoSchema",
    "EXCEPTION_HANDLER": "adaptation.api.errors.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "d0 API",
    "DESCRIPTION": "Day-zero adaptation of new LLMs to your accelerator clusters.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # Offline clusters: Swagger UI from the sidecar package, never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The job-submit example names the caller's own cluster and model (adaptation/api/schema.py).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "adaptation.api.schema.job_example_for_the_caller"],
    "ENUM_NAME_OVERRIDES": {
        "InterconnectKindEnum": "adaptation.choices.InterconnectKind",
        "DeviceKindEnum": "adaptation.choices.DeviceKind",
        "NodeStatusEnum": "adaptation.choices.NodeStatus",
        "JobStatusEnum": "adaptation.choices.JobStatus",
        "StageKindEnum": "adaptation.stages.choices",
    },
}

# Celery (read by d0web/celery.py with the CELERY_ namespace).
D0_BROKER_URL = env_str("D0_BROKER_URL") or env_str("REDIS_URL") or embedded_broker.broker_url(VAR_DIR)
# Whether this process's broker is the one `manage.py up` starts (then `up` runs the server).
D0_EMBEDDED_BROKER = D0_BROKER_URL == embedded_broker.broker_url(VAR_DIR)
# `manage.py up`: whether its local node offers vLLM's CPU build, prepared in the background on the first run by the
# script named here (it prints the engine's interpreter on its last line; adaptation/clusters/local_engine.py).
D0_LOCAL_ENGINE = env_bool("D0_LOCAL_ENGINE", True)
D0_LOCAL_ENGINE_SCRIPT = env_str("D0_LOCAL_ENGINE_SCRIPT", str(BASE_DIR / "scripts" / "vllm-env.sh"))
CELERY_BROKER_URL = D0_BROKER_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = control_queue()
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# Control-plane tasks are bookkeeping: seconds, not minutes. Node work has its own limits (workers/node.py).
CELERY_TASK_SOFT_TIME_LIMIT = 60
CELERY_TASK_TIME_LIMIT = 90
# A control-plane message whose worker died before acknowledging it (acks_late: killed mid-task, its transaction
# rolled back) is delivered again this many seconds after it was taken, not after Redis' default hour. It must
# exceed the task time limit, or a slow task would be delivered twice. The control plane keeps its own bookkeeping
# of unacknowledged messages, so this short timeout never touches a node's stage messages, which stay
# unacknowledged for hours while the stage runs.
D0_CONTROL_REDELIVER_AFTER = env_float("D0_CONTROL_REDELIVER_AFTER", 180.0)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": D0_CONTROL_REDELIVER_AFTER,
    # Looked for every few seconds (kombu's default is every 100 s): the scan is one ZRANGE on a small set.
    "unacked_restore_interval": max(1, min(10, round(D0_CONTROL_REDELIVER_AFTER / 3))),
    "unacked_restore_throttle": 1,
    **{f"unacked{part}_key": f"{control_queue()}.unacked{part}" for part in ("", "_index", "_mutex")},
}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Celery's Django fixup closes the database connection around every task unless told to reuse it: a new PostgreSQL
# connection (10-20 ms) for tasks of a few milliseconds. It is reused instead, and d0web/celery.py starts each task
# as Django starts a request (a connection past CONN_MAX_AGE or broken, a database restart say, is replaced).
CELERY_DB_REUSE_MAX = 10_000

# Node liveness: nodes send a heartbeat every interval; a node silent for the timeout is marked offline.
D0_HEARTBEAT_INTERVAL = env_float("D0_HEARTBEAT_INTERVAL", 10.0)
D0_NODE_TIMEOUT = env_float("D0_NODE_TIMEOUT", 45.0)
# How often the control plane checks liveness (adaptation/jobs/recovery.py). D0_SWEEP_INTERVAL, its old name, is
# still read when the new one is not set (deprecated).
D0_LIVENESS_INTERVAL = env_float("D0_LIVENESS_INTERVAL", env_float("D0_SWEEP_INTERVAL", 10.0))
# A stage running longer than this lost its report (the node's own limit is D0_STAGE_SOFT_TIME_LIMIT, 6 h).
D0_STAGE_TIMEOUT = env_float("D0_STAGE_TIMEOUT", 6 * 3600 + 600)
# A job queued this long, or running this long with no stage active, lost a message: the liveness check settles it.
D0_RECONCILE_AFTER = env_float("D0_RECONCILE_AFTER", 60.0)
# Node trust: how long a join token lasts unless its maker says otherwise, and how old a registration, heartbeat
# or leave may be before a stale one is counted as a replay (workers/signing.py, adaptation/clusters/trust.py).
D0_JOIN_TOKEN_HOURS = env_float("D0_JOIN_TOKEN_HOURS", 24.0)
D0_NODE_MESSAGE_MAX_AGE = env_float("D0_NODE_MESSAGE_MAX_AGE", 300.0)
# The control plane's Ed25519 key, made at first use: every message to a node is signed with it, and nodes pin its
# public half when they join (adaptation/clusters/control_messages.py). Every control-plane process (web tier,
# control workers) must read the same file. A stage message a node takes later than this is failed, not run.
D0_CONTROL_KEY_FILE = Path(env_str("D0_CONTROL_KEY_FILE") or VAR_DIR / "control-key.pem")
D0_STAGE_MESSAGE_MAX_AGE = env_float("D0_STAGE_MESSAGE_MAX_AGE", 24 * 3600.0)
# Pre-flight gate: gated stages need an env check of the node no older than this.
D0_PREFLIGHT_MAX_AGE_HOURS = env_float("D0_PREFLIGHT_MAX_AGE_HOURS", 24.0)
# Modules with stage handlers of a deployment's own (adaptation/stages.py), beside each capability's stage.py; the
# engine side of such a kind is named by D0_STAGE_MODULES on the nodes and here (workers/engine/stages.py).
D0_STAGE_HANDLERS = env_list("D0_STAGE_HANDLERS", [])
# Per-node broker users (adaptation/clusters/broker_users.py): auto (on when the control plane's broker user may
# manage ACL users and the broker's default user is not open), on, or off; and how often the users the broker lost
# (a restart) are made again and those of expired join tokens deleted.
D0_BROKER_NODE_USERS = env_str("D0_BROKER_NODE_USERS", "auto").strip().lower()
if D0_BROKER_NODE_USERS not in ("auto", "on", "off"):
    raise ImproperlyConfigured(f"D0_BROKER_NODE_USERS={D0_BROKER_NODE_USERS!r}: use auto, on or off")
D0_BROKER_USERS_SYNC_INTERVAL = env_float("D0_BROKER_USERS_SYNC_INTERVAL", 30.0)
CELERY_BEAT_SCHEDULE = {
    "check-liveness": {"task": CHECK_LIVENESS, "schedule": D0_LIVENESS_INTERVAL},
    "sync-broker-users": {"task": SYNC_BROKER_USERS, "schedule": D0_BROKER_USERS_SYNC_INTERVAL},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("D0_LOG_LEVEL", "INFO")},
    # transformers' continuous batching logs a dozen INFO lines per served batch: warnings are what matter here.
    "loggers": {"transformers": {"level": "WARNING"}, "ContinuousBatchingLogger": {"level": "WARNING"}},
}
