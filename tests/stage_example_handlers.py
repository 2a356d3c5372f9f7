"""The control plane's side of ``tests/stage_example.py``'s stage kind: a control-set parameter, what it keeps of the
result (a line in the job's log), its outcome and its page. Control workers load it through ``D0_STAGE_HANDLERS``."""

from django.urls import reverse

from adaptation.models import AdaptationJob
from adaptation.models.jobs import log_lines
from adaptation.stages import Outcome, StageHandler, register
from tests.stage_example import KIND


@register
class NumberSum(StageHandler):
    kind = KIND

    def prepare(self, job, params: dict, nodes: list) -> dict:
        return {**params, "offset": job.cluster.expected_devices_per_node}

    def store(self, run) -> None:
        AdaptationJob.objects.filter(pk=run.job_id).update(log=log_lines(f"kept: total {run.result['total']}"))

    def outcome(self, result: dict) -> Outcome:
        return Outcome(f"{result['count']} numbers add up to {result['total']}",
                       ["the offset came from the control plane"])

    def page(self, job, run) -> str | None:
        return reverse("cluster-detail", args=[job.cluster_id]) if run.status == "succeeded" else None
