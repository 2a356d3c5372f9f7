"""Operator coverage on the control plane: reports per model × backend × dtype, the team's operator library per
backend (every operator ever verified there), and virtual backends described by operator lists."""

from django.conf import settings
from django.db import models

from .clusters import Node
from .jobs import AdaptationJob, StageRun
from .specs import ModelSpec
from .names import slug_name_field
from .teams import Team, TeamOwnedQuerySet


class VirtualBackend(models.Model):
    """A backend that is not here (hardware not yet delivered, a vendor stack) described by the aten operators it
    implements; coverage is computed against the list, tracing on a node's CPU."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="virtual_backends")
    name = slug_name_field(63, "Coverage names it virtual:<name>.")
    description = models.TextField(blank=True)
    operators = models.JSONField(help_text="aten operator names, e.g. aten::mm, aten::topk.default")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    objects = TeamOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="virtual_backend_name_unique_in_team")]

    def __str__(self):
        return f"virtual:{self.name}"

    @property
    def backend_name(self) -> str:
        return f"virtual:{self.name}"


class CoverageReportQuerySet(TeamOwnedQuerySet):
    team_path = "model__team"


class CoverageReport(models.Model):
    model = models.ForeignKey(ModelSpec, on_delete=models.CASCADE, related_name="coverage_reports")
    job = models.ForeignKey(AdaptationJob, on_delete=models.CASCADE, related_name="coverage_reports")
    stage_run = models.ForeignKey(StageRun, on_delete=models.CASCADE, related_name="coverage_reports")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    backend = models.CharField(max_length=200, help_text="cpu, cuda:<device name>, or virtual:<name>")
    dtype = models.CharField(max_length=16)
    coverage = models.FloatField(help_text="Share of operators native, composite or decomposable.")
    new_operators = models.JSONField(default=list, help_text="Operators this backend had never been checked on.")
    report = models.JSONField()
    created = models.DateTimeField(auto_now_add=True)

    objects = CoverageReportQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        indexes = [models.Index(fields=["model", "backend", "-created"])]

    def __str__(self):
        return f"{self.model} on {self.backend} ({self.dtype}): {self.coverage:.0%}"

    @property
    def gaps(self) -> list[dict]:
        return [op for op in self.report.get("operators", []) if op.get("status") not in ("native", "composite")]


class OperatorRecord(models.Model):
    """One operator as verified on one backend: the team's growing operator library."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="operator_records")
    backend = models.CharField(max_length=200)
    operator = models.CharField(max_length=200)
    status = models.CharField(max_length=16)
    first_seen = models.DateTimeField(auto_now_add=True)
    last_verified = models.DateTimeField()
    first_model = models.ForeignKey(ModelSpec, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    objects = TeamOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["backend", "operator"]
        constraints = [models.UniqueConstraint(fields=["team", "backend", "operator"],
                                               name="operator_once_per_backend")]

    def __str__(self):
        return f"{self.operator} on {self.backend}: {self.status}"
