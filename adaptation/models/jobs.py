"""Jobs and their stage runs. The row is the source of truth for status, progress and errors.

Every status change is a conditional UPDATE (``WHERE status IN (...)``) whose row count is checked, so a late
report from a worker can never overwrite a cancel or a failure (healthchecks' ``sendalerts`` pattern).
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Value
from django.db.models.functions import Concat
from django.utils import timezone

from workers.engine.parameters import ParameterError, under_roots
from workers.engine.stages import STAGES, check_job_parameters, path_parameters

from ..choices import ACTIVE_STATUSES, TERMINAL_STATUSES, JobStatus, StageKind
from .clusters import Cluster, Node
from .specs import ModelSpec
from .teams import Team, TeamOwnedQuerySet


class StatusTransitions(models.Model):
    """Shared status machine: queued → running → succeeded | failed | cancelled."""

    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED, db_index=True)
    progress = models.FloatField(default=0.0)
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    error_traceback = models.TextField(blank=True)
    celery_task_id = models.CharField(max_length=64, blank=True)

    class Meta:
        abstract = True

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def duration_seconds(self) -> float | None:
        if not self.started:
            return None
        return ((self.finished or timezone.now()) - self.started).total_seconds()

    # What each transition writes, as column values: the model methods below apply them through the ORM, and the
    # control plane's hot path (adaptation/jobs/statements.py) applies the same ones in its SQL.
    @staticmethod
    def started_fields(**fields) -> dict:
        return {"status": JobStatus.RUNNING, "started": timezone.now(), **fields}

    @staticmethod
    def finished_fields(**fields) -> dict:
        return {"status": JobStatus.SUCCEEDED, "finished": timezone.now(), "progress": 1.0, **fields}

    @staticmethod
    def failed_fields(error: str, traceback: str = "", **fields) -> dict:
        return {"status": JobStatus.FAILED, "finished": timezone.now(), "error": error, "error_traceback": traceback,
                **fields}

    @staticmethod
    def cancelled_fields(**fields) -> dict:
        return {"status": JobStatus.CANCELLED, "finished": timezone.now(), **fields}

    def _transition(self, from_statuses, fields: dict) -> bool:
        """Write ``fields`` (a new status among them) only if the row is still in one of ``from_statuses``; True if
        it moved.

        One UPDATE and no reload when it moved: the instance takes the values it wrote (a field written from an
        expression, such as an appended log, is left to load on first use). When it did not move, the row is read
        again so the caller sees the status that won."""
        moved = type(self).objects.filter(pk=self.pk, status__in=list(from_statuses)).update(**fields)
        if moved:
            for name, value in fields.items():
                if hasattr(value, "resolve_expression"):
                    self.__dict__.pop(name, None)
                else:
                    setattr(self, name, value)
        else:
            self.refresh_from_db()
        return moved == 1

    def start(self, **fields) -> bool:
        return self._transition([JobStatus.QUEUED], self.started_fields(**fields))

    def finish(self, **fields) -> bool:
        return self._transition(ACTIVE_STATUSES, self.finished_fields(**fields))

    def fail(self, error: str, traceback: str = "", **fields) -> bool:
        return self._transition(ACTIVE_STATUSES, self.failed_fields(error, traceback, **fields))

    def cancel(self, **fields) -> bool:
        return self._transition(ACTIVE_STATUSES, self.cancelled_fields(**fields))

    def set_progress(self, fraction: float) -> bool:
        fraction = min(max(float(fraction), 0.0), 1.0)
        return type(self).objects.filter(pk=self.pk, status=JobStatus.RUNNING).update(progress=fraction) == 1


class AdaptationJobQuerySet(TeamOwnedQuerySet):
    def active(self):
        return self.filter(status__in=list(ACTIVE_STATUSES))


class AdaptationJob(StatusTransitions):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="jobs")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="jobs")
    model = models.ForeignKey(ModelSpec, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")
    stages = models.JSONField(help_text="Stage kinds, run in this order.")
    parameters = models.JSONField(default=dict, blank=True)
    log = models.TextField(blank=True)
    submitted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    retry_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries")

    objects = AdaptationJobQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        # The lists' orders (-finished: the API's ?ordering=-finished). The ids are included so that a deep page
        # finds its ids from the index alone (adaptation/pagination.py).
        indexes = [models.Index(fields=["team", "-created"], include=["id"], name="job_team_created"),
                   models.Index(fields=["team", "-finished"], include=["id"], name="job_team_finished")]

    def __str__(self):
        return f"Job {self.pk} ({', '.join(self.stages)} on {self.cluster})"

    def clean(self):
        errors = {}
        stages = self.stages
        if not isinstance(stages, list) or not stages:
            errors["stages"] = "Choose at least one stage."
        else:
            unknown = [kind for kind in stages if kind not in StageKind.values]
            if unknown:
                errors["stages"] = (f"Unknown stage kind(s): {', '.join(map(str, unknown))}. "
                                    f"Known: {', '.join(StageKind.values)}.")
            elif len(set(stages)) != len(stages):
                errors["stages"] = "Each stage can appear only once."
            else:
                needing = [kind for kind in stages if STAGES[kind].needs_model]
                if needing and not self.model_id:
                    errors["model"] = f"Stage(s) {', '.join(needing)} need a model: choose one."
        if not isinstance(self.parameters, dict):
            errors["parameters"] = "Parameters must be a JSON object."
        elif isinstance(stages, list) and "stages" not in errors:
            try:
                self.parameters = check_job_parameters(stages, self.parameters)
                self._check_parameters_against_the_cluster()
            except ParameterError as error:
                errors["parameters"] = f"{error.key}: {error.message}"
        if self.cluster_id and self.team_id and self.cluster.team_id != self.team_id:
            errors["cluster"] = "That cluster belongs to another team."
        if self.model_id and self.team_id and self.model.team_id != self.team_id:
            errors["model"] = "That model belongs to another team."
        if errors:
            raise ValidationError(errors)

    def _check_parameters_against_the_cluster(self) -> None:
        """What only the control plane can check: virtual backends are the team's own, and a path parameter lies
        under a data root some node of the cluster reported (the node checks it again against its own roots)."""
        from .coverage import VirtualBackend

        ids = (self.parameters.get("op_coverage") or {}).get("virtual_backends") or []
        if ids and self.team_id:
            known = set(VirtualBackend.objects.filter(team_id=self.team_id, pk__in=ids).values_list("pk", flat=True))
            missing = [backend for backend in ids if backend not in known]
            if missing:
                raise ParameterError("op_coverage.virtual_backends", f"no virtual backend {missing[0]} in this team")
        if "endpoint_bench" in (self.stages or []) and self.team_id:
            from .serving import ServingEndpoint

            endpoint = (self.parameters.get("endpoint_bench") or {}).get("endpoint")
            if endpoint is None:
                raise ParameterError("endpoint_bench.endpoint", "required: the id of one of the team's serving "
                                                                "endpoints (/endpoints/)")
            if not ServingEndpoint.objects.filter(team_id=self.team_id, pk=endpoint).exists():
                raise ParameterError("endpoint_bench.endpoint", f"no serving endpoint {endpoint} in this team")
        for kind in self.stages:
            for name in path_parameters(kind):
                path = (self.parameters.get(kind) or {}).get(name)
                if path is None or not self.cluster_id:
                    continue
                roots = [root for node in self.cluster.nodes.all() for root in node.host_facts.get("data_roots", [])]
                if not under_roots(path, roots):
                    raise ParameterError(f"{kind}.{name}", "lies under no data root of this cluster's nodes (" + (
                        ", ".join(sorted(set(roots))) or "none configured: start node workers with --data-root")
                        + ")")


def stamped(*lines: str) -> str:
    stamp = timezone.now().strftime("%H:%M:%S")
    return "".join(f"{stamp} {line}\n" for line in lines)


def log_lines(*lines: str):
    """The job log with ``lines`` appended, as an expression for an UPDATE: appended in SQL, so concurrent reports
    from several nodes never lose each other's lines, and in the same statement as the change they describe."""
    return Concat(F("log"), Value(stamped(*lines)))


class StageRunQuerySet(TeamOwnedQuerySet):
    team_path = "job__team"


class StageRun(StatusTransitions):
    """One stage of a job on one node."""

    job = models.ForeignKey(AdaptationJob, on_delete=models.CASCADE, related_name="stage_runs")
    kind = models.CharField(max_length=32, choices=StageKind.choices)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="stage_runs")
    node_name = models.CharField(max_length=255, blank=True, help_text="Kept when the node row is deleted.")
    message = models.CharField(max_length=255, blank=True, help_text="The latest progress message.")
    result = models.JSONField(null=True, blank=True)

    objects = StageRunQuerySet.as_manager()

    class Meta:
        ordering = ["job_id", "id"]

    def __str__(self):
        return f"{self.kind} on {self.node_name} (job {self.job_id})"
