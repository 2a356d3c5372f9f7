"""The control-plane Celery app (cookiecutter-django's form). Node workers use workers/node.py instead."""

import os

from celery import Celery

from workers.remote_control import CONTROL_COMMANDS, allow_only

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "d0web.settings")

app = Celery("d0web")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Control-plane tasks live in workers/control.py (not in an app's tasks.py), so name the module directly.
app.autodiscover_tasks(lambda: ["workers"], related_name="control")
# The control-plane worker answers only the remote-control commands d0 sends (workers/remote_control.py).
allow_only(CONTROL_COMMANDS)
