"""Pages for sharded validation runs: a run's page (verdict, per-rank table, compute vs communication, expert
load) and the comparison of a model's runs."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render

from ..choices import JobStatus
from ..models import ModelSpec, StageRun
from . import services
from .charts import decode_time_chart, routing_heatmap


@login_required
def sharded_run_page(request, pk):
    run = get_object_or_404(StageRun.objects.for_user(request.user).filter(kind=services.KIND)
                            .select_related("job", "job__model", "job__cluster")
                            .defer("job__log", "job__model__config", "job__model__analysis"), pk=pk)
    # The control plane creates a multi-node run's stage runs in node_rank order (jobs.services.stage_assignments).
    node_names = list(StageRun.objects.filter(job_id=run.job_id, kind=services.KIND).order_by("id")
                      .values_list("node_name", flat=True))
    report = run.result if run.status == JobStatus.SUCCEEDED else None
    context = {"run": run, "job": run.job, "report": report, "node_names": node_names}
    if report:
        figures = services.run_figures(report, node_names)
        context.update(figures, chart_data={"ranks": figures["ranks"], "routing": routing_heatmap(report)})
    return render(request, "adaptation/sharding/run.html", context)


@login_required
def compare_runs_page(request, pk):
    spec = get_object_or_404(ModelSpec.objects.for_user(request.user).select_related("team"), pk=pk)
    runs = (StageRun.objects.for_user(request.user).filter(kind=services.KIND, job__model=spec)
            .select_related("job").defer("error_traceback", "job__log", "job__error_traceback")
            .order_by("-job__created", "job_id", "id"))
    rows = services.one_run_per_job(runs)
    return render(request, "adaptation/sharding/compare.html",
                  {"spec": spec, "rows": rows, "chart": decode_time_chart(rows)})
