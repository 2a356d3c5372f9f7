from django.db import models


class ControlWorker(models.Model):
    """A control-plane worker, as last seen running the liveness sweep (its beat's periodic task): what
    ``/api/status/`` counts, so health needs no broadcast to every worker on the broker."""

    name = models.CharField(max_length=255, unique=True)
    last_seen = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name
