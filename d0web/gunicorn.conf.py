"""gunicorn's settings for d0's web tier: `gunicorn --config d0web/gunicorn.conf.py d0web.wsgi` (`manage.py up` and
docker-compose.yml run it so). Chosen with benchmarks/web_load.py (docs/deployment.md, "The web tier"); options
given on the command line or in GUNICORN_CMD_ARGS (e.g. `--workers 8` on a bigger host) override these."""

from d0web.env import var_dir

# Sync workers: every request is short (the live pages poll their progress JSON; nothing streams), and on a quiet
# 2-core machine with 20 clients sync processes kept every endpoint's p95 at 90-130 ms where gthread (2 x 4 or
# 4 x 4) let single requests wait 200-260 ms behind the other threads of their process (docs/benchmarks/web-load.md).
# Four, so that two slow requests (a config upload waiting on its analysis) still leave two serving.
worker_class = "sync"
workers = 4
# A request may wait on a config's analysis for D0_ANALYSIS_TIMEOUT_S (60 s by default); a sync worker that takes
# longer than `timeout` to answer is killed, so the limit stays above that deadline.
timeout = 90
# The app is imported once, before the workers fork, so they share its pages instead of each holding a copy.
preload_app = True

# gunicorn's control socket (for gunicornc) defaults to one path per user ($XDG_RUNTIME_DIR/gunicorn.ctl), so a second
# d0 instance on the host took it over and, stopping, removed the first one's. Each instance keeps its own under its
# var/ folder (D0_VAR_DIR), as the embedded broker's socket is; only its owner may connect (mode 0600, the default).
control_socket = str(var_dir() / "gunicorn.ctl")
