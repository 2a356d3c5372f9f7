from django.conf import settings
from django.db import models

from .clusters import Cluster
from .specs import ModelSpec
from .teams import TeamOwnedQuerySet


class ModelPlanQuerySet(TeamOwnedQuerySet):
    team_path = "model__team"


class ModelPlan(models.Model):
    """A planner prediction kept for later comparison with what runs measure (decode tokens/s, memory)."""

    model = models.ForeignKey(ModelSpec, on_delete=models.CASCADE, related_name="plans")
    cluster = models.ForeignKey(Cluster, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                help_text="The cluster planned for; empty for a what-if cluster.")
    request = models.JSONField(help_text="Devices, precision and workload the plan was made for.")
    result = models.JSONField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    objects = ModelPlanQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]

    def __str__(self):
        return f"plan for {self.model} ({self.request.get('precision')})"
