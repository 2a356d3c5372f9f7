from django.db import models
from django.utils import timezone


class ControlWorker(models.Model):
    """A control-plane worker, as last seen running the liveness check (its beat's periodic task): what
    ``/api/status/`` counts, so health needs no broadcast to every worker on the broker.

    ``listening_since``: since when the control plane has run the liveness check without a gap, as this worker saw it
    at its last check (``jobs.recovery.control_worker_seen``). Heartbeats sent while nobody listened were never heard,
    so the check blames no node for silence until the control plane has listened for the whole node timeout."""

    name = models.CharField(max_length=255, unique=True)
    last_seen = models.DateTimeField()
    listening_since = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name
