"""gunicorn's settings for d0's web tier: `gunicorn --config d0web/gunicorn.conf.py d0web.wsgi` (`manage.py up` and
docker-compose.yml run it so). Chosen with benchmarks/web_load.py (README, "The web tier"); options given on the
command line or in GUNICORN_CMD_ARGS (e.g. `--workers 8` on a bigger host) override these."""

# Threads: a request mostly waits on PostgreSQL, and the live pages poll their progress JSON, so a few threads per
# process serve many clients at the memory of one process.
worker_class = "gthread"
workers = 2
threads = 4
# The app is imported once, before the workers fork, so they share its pages instead of each holding a copy.
preload_app = True
