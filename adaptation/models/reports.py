from django.db import models

from ..choices import CheckVerdict
from .clusters import Node
from .jobs import AdaptationJob, StageRun
from .teams import TeamOwnedQuerySet


class EnvReportQuerySet(TeamOwnedQuerySet):
    team_path = "node__cluster__team"

    def latest_per_node(self, nodes):
        """The newest report of each node, in one query (PostgreSQL DISTINCT ON where available)."""
        from django.db import connection

        reports = self.filter(node__in=nodes)
        if connection.features.can_distinct_on_fields:
            return {report.node_id: report for report in reports.order_by("node_id", "-created").distinct("node_id")}
        latest = {}
        for report in reports.order_by("-created"):
            latest.setdefault(report.node_id, report)
        return latest


class EnvReport(models.Model):
    """One node's environment check: everything it measured and the checks' verdict. History is kept."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="env_reports")
    job = models.ForeignKey(AdaptationJob, on_delete=models.CASCADE, related_name="env_reports")
    stage_run = models.OneToOneField(StageRun, on_delete=models.CASCADE, related_name="env_report")
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    verdict = models.CharField(max_length=8, choices=CheckVerdict.choices)
    report = models.JSONField()

    objects = EnvReportQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        indexes = [models.Index(fields=["node", "-created"])]

    def __str__(self):
        return f"env check of {self.node.hostname} at {self.created:%Y-%m-%d %H:%M}: {self.verdict}"

    @property
    def findings(self) -> list[dict]:
        """The checks that did not pass, worst first."""
        checks = [check for check in self.report.get("checks", []) if check.get("status") != CheckVerdict.PASS]
        return sorted(checks, key=lambda check: check.get("status") != CheckVerdict.FAIL)

    @property
    def failed_checks(self) -> list[dict]:
        return [check for check in self.findings if check.get("status") == CheckVerdict.FAIL]
