"""The control-plane Celery app (cookiecutter-django's form). Node workers use workers/node.py instead."""

import os

from celery import Celery, signals
from django.db import close_old_connections, connections

from workers import broker_fix  # noqa: F401 - a broker restart must not stop the control worker
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
    """Each task begins as a Django request does: a connection older than CONN_MAX_AGE, or one that had an error,
    is closed (the next query opens a new one). Celery's fixup no longer closes every connection
    (CELERY_DB_REUSE_MAX in settings); pool processes skip the per-task health check (below)."""
    close_old_connections()


@signals.worker_process_init.connect
def _no_health_check_per_task(**kwargs) -> None:
    """A control pool process does not check its kept connection with a ``SELECT 1`` before each task (a round trip
    on the path of every report, for a failure seen once per database restart): a connection that died in between
    fails its task's first query; the tasks that apply reports, registrations and dispatches are tried again on
    that error (workers/control.py), and the next task begins on a new connection (``close_old_connections``
    replaces one that had an error). Heartbeats, progress and sweeps lose that one message."""
    for alias in connections:
        connections[alias].settings_dict["CONN_HEALTH_CHECKS"] = False
