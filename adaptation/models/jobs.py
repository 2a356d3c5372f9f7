"""Jobs and their stage runs. The row is the source of truth for status, progress and errors.

Every status change is a conditional UPDATE (``WHERE status IN (...)``) whose row count is checked, so a late
report from a worker can never overwrite a cancel or a failure (healthchecks' ``sendalerts`` pattern).
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Concat
from django.utils import timezone

from workers.engine.parameters import ParameterError, under_roots
from workers.engine.stages import STAGES, check_job_parameters, path_parameters

from .. import stages as handlers
from ..choices import ACTIVE_STATUSES, TERMINAL_STATUSES, JobStatus
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

    def _transition(self, moved: int, fields: dict) -> bool:
        """The instance after one of the queryset's transitions (``moved``: the rows it changed, 0 or 1): it takes
        the values written, with no reload (a field written from an expression, such as an appended log, is left to
        load on first use); when it did not move, the row is read again so the caller sees the status that won."""
        if moved:
            for name, value in fields.items():
                if hasattr(value, "resolve_expression"):
                    self.__dict__.pop(name, None)
                else:
                    setattr(self, name, value)
        else:
            self.refresh_from_db()
        return moved == 1

    def _row(self):
        return type(self).objects.filter(pk=self.pk)

    def start(self, **fields) -> bool:
        fields = self.started_fields(**fields)
        return self._transition(self._row().begin(fields), fields)

    def finish(self, **fields) -> bool:
        fields = self.finished_fields(**fields)
        return self._transition(self._row().end(fields), fields)

    def fail(self, error: str, traceback: str = "", **fields) -> bool:
        fields = self.failed_fields(error, traceback, **fields)
        return self._transition(self._row().end(fields), fields)

    def cancel(self, **fields) -> bool:
        fields = self.cancelled_fields(**fields)
        return self._transition(self._row().end(fields), fields)


class StatusQuerySet(TeamOwnedQuerySet):
    """The status machine's transitions on the rows of a queryset, each a conditional UPDATE that changes only rows
    still in a status they may leave, returning how many moved. Every status change of a job or a stage run goes
    through these (or through the control plane's statements, adaptation/jobs/statements.py, which write the same
    ``*_fields``)."""

    def active(self):
        return self.filter(status__in=list(ACTIVE_STATUSES))

    def start(self, **fields) -> int:
        return self.begin(self.model.started_fields(**fields))

    def cancel(self, **fields) -> int:
        return self.end(self.model.cancelled_fields(**fields))

    def begin(self, fields: dict) -> int:
        """Queued rows start as ``fields`` say (``started_fields``' result)."""
        return self.filter(status=JobStatus.QUEUED).update(**fields)

    def end(self, fields: dict) -> int:
        """Active rows end as ``fields`` say (a ``*_fields`` result: its terminal status with its time)."""
        return self.active().update(**fields)

    def set_progress(self, fraction) -> int:
        """Running rows take the new progress (a value or an expression); an ended one keeps its own."""
        return self.filter(status=JobStatus.RUNNING).update(progress=fraction)

    def running_with_progress(self, fraction, message: str) -> int:
        """A progress report proves the stage runs: active rows become running (dated now unless their "started"
        report came first: reports travel independently, so progress can overtake it), with the new progress."""
        return self.active().update(status=JobStatus.RUNNING, started=Coalesce(F("started"), Value(timezone.now())),
                                    progress=fraction, message=message)


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

    objects = StatusQuerySet.as_manager()

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
        known = handlers.kinds()
        if not isinstance(stages, list) or not stages:
            errors["stages"] = "Choose at least one stage."
        else:
            unknown = [kind for kind in stages if kind not in known]
            if unknown:
                errors["stages"] = (f"Unknown stage kind(s): {', '.join(map(str, unknown))}. "
                                    f"Known: {', '.join(known)}.")
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
                for kind in stages:
                    handlers.handler(kind).check(self)
                self._check_paths_against_the_cluster()
            except ParameterError as error:
                errors["parameters"] = f"{error.key}: {error.message}"
        if self.cluster_id and self.team_id and self.cluster.team_id != self.team_id:
            errors["cluster"] = "That cluster belongs to another team."
        if self.model_id and self.team_id and self.model.team_id != self.team_id:
            errors["model"] = "That model belongs to another team."
        if errors:
            raise ValidationError(errors)

    def _check_paths_against_the_cluster(self) -> None:
        """A path parameter lies under a data root some node of the cluster reported (the node checks it again
        against its own roots)."""
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


class StageRunQuerySet(StatusQuerySet):
    team_path = "job__team"


class StageRun(StatusTransitions):
    """One stage of a job on one node."""

    job = models.ForeignKey(AdaptationJob, on_delete=models.CASCADE, related_name="stage_runs")
    # One of the registered stage kinds (adaptation/jobs/stages.py), checked when the job is: not database choices,
    # so a new kind needs no migration.
    kind = models.CharField(max_length=32)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="stage_runs")
    node_name = models.CharField(max_length=255, blank=True, help_text="Kept when the node row is deleted.")
    message = models.CharField(max_length=255, blank=True, help_text="The latest progress message.")
    result = models.JSONField(null=True, blank=True)
    # The node's clock when it sent the "started" report: a heartbeat the node took after it must name the run
    # (adaptation/jobs/recovery.py, runs_the_node_let_go).
    started_on_node = models.FloatField(null=True, blank=True, editable=False)

    objects = StageRunQuerySet.as_manager()

    class Meta:
        ordering = ["job_id", "id"]

    def __str__(self):
        return f"{self.kind} on {self.node_name} (job {self.job_id})"
