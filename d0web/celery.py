"""The control-plane Celery app (cookiecutter-django's form). Node workers use workers/node.py instead."""

import os

from celery import Celery, signals
from django.db import close_old_connections

from workers.remote_control import CONTROL_COMMANDS, allow_only

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "d0web.settings")

app = Celery("d0web")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Control-plane tasks live in workers/control.py (not in an app's tasks.py), so name the module directly.
app.autodiscover_tasks(lambda: ["workers"], related_name="control")
# The control-plane worker answers only the remote-control commands d0 sends (workers/remote_control.py).
allow_only(CONTROL_COMMANDS)


@signals.task_prerun.connect
def _start_like_a_request(**kwargs) -> None:
    """Each task begins as a Django request does: a connection older than CONN_MAX_AGE, or broken, is closed (the
    next query opens a new one) and a kept one is health-checked (CONN_HEALTH_CHECKS). Celery's fixup no longer
    closes every connection (CELERY_DB_REUSE_MAX in settings)."""
    close_old_connections()
