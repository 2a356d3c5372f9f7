"""Job pages: the dashboard (clusters, running and recent jobs), the job list with its filters, the job form, a
job's live page (with the small JSON endpoint it polls), and cancel and retry."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST


from .. import stages as handlers
from ..choices import ACTIVE_STATUSES, STATUS_COLOURS, JobStatus
from ..filtersets import JobFilterSet
from ..models import AdaptationJob, Cluster, StageRun
from ..pagination import IndexedPaginator
from . import services
from .forms import JobForm
from .outcomes import live_outcomes, outcome


def job_table_rows(jobs):
    """``jobs`` as the job table (templates/adaptation/jobs/_table.html) reads them: the job's columns it shows and
    the names of its cluster, model and submitter (the rest of their rows, a model's config and analysis JSON
    among them, stays unread)."""
    return jobs.select_related("cluster", "model", "submitted_by").only(
        "stages", "status", "progress", "created", "cluster__name", "model__name", "submitted_by__username")


@login_required
def dashboard(request):
    jobs = job_table_rows(services.job_rows(request.user))
    return render(request, "adaptation/jobs/dashboard.html", {
        "clusters": Cluster.objects.for_user(request.user).select_related("team").with_node_counts(),
        "running_jobs": jobs.filter(status__in=list(ACTIVE_STATUSES))[:20],
        "recent_jobs": jobs.exclude(status__in=list(ACTIVE_STATUSES))[:10],
    })


@login_required
def job_list(request):
    jobs = services.job_rows(request.user)
    filterset = JobFilterSet(request.GET or None, queryset=jobs, request=request)
    page = IndexedPaginator(job_table_rows(filterset.qs), settings.D0_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "adaptation/jobs/list.html", {"filter": filterset, "page": page,
                                                         "query": query.urlencode()})


@login_required
def job_create(request):
    # The cluster and model pages link here with ?cluster= / ?model= to preselect them.
    initial = request.GET.dict()
    if request.GET.getlist("stages"):  # the model page's buttons preselect a stage
        initial["stages"] = request.GET.getlist("stages")
    form = JobForm(request.POST or None, user=request.user, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            job = services.submit_job(team=data["cluster"].team, user=request.user, cluster=data["cluster"],
                                      model=data["model"], stages=data["stages"], parameters=data["parameters"])
        except ValidationError as error:
            for field, problems in error.message_dict.items():
                for problem in problems:
                    key, _, message = problem.partition(": ")
                    if field == "parameters" and message:
                        form.add_parameter_error(key, message)  # "sharded_run.weights_path: lies under ..."
                    else:
                        form.add_error(field if field in form.fields else None, problem)
        else:
            return redirect("job-detail", pk=job.pk)
    return render(request, "adaptation/jobs/form.html", {"form": form, "title": "Submit a job"})


def _job_for(request, pk, jobs=AdaptationJob.objects):
    """The user's job ``pk`` among ``jobs`` (a 404 for another team's)."""
    return get_object_or_404(jobs.for_user(request.user), pk=pk)


def stage_page(job: AdaptationJob, run: StageRun) -> str | None:
    """The page that shows what a stage run found, as its stage's handler says."""
    try:
        return handlers.handler(run.kind).page(job, run)
    except KeyError:  # a kind no longer registered
        return None


def job_progress_payload(job: AdaptationJob, runs: list[StageRun] | None = None) -> dict:
    """What the job's page shows and polls. ``runs``: the job's stage runs in order, with their results, where the
    caller has read them already (the page); else they are read here without their results, which can be large
    (an outcome line reads its run's result once: ``live_outcomes``)."""
    if runs is None:
        runs = list(StageRun.objects.filter(job=job).order_by("id").defer("result"))
        outcomes = live_outcomes(runs)
    else:
        outcomes = [outcome(run) for run in runs]
    return {
        "id": job.pk,
        "status": job.status,
        "status_label": job.get_status_display(),
        "colour": STATUS_COLOURS[job.status],
        "terminal": job.is_terminal,
        "progress": job.progress,
        "error": job.error,
        "log": job.log,
        "stage_runs": [
            {"id": run.pk, "kind": run.kind, "node": run.node_name, "status": run.status,
             "progress": run.progress, "message": run.message, "error": run.error, "page": stage_page(job, run),
             "started": _iso(run.started), "finished": _iso(run.finished), "elapsed_s": run.duration_seconds}
            for run in runs
        ],
        # The job's stages no node has started yet (dispatched one after another), so the page lists what is left.
        "pending_stages": pending_stages(job, runs),
        # While the job runs, its page leads with what it is doing now and what each stage found so far: a stage
        # that ended has its outcome line as soon as it ends, not when the whole job does.
        "headline": headline(job, runs),
        "outcomes": outcomes,
    }


def headline(job: AdaptationJob, runs: list[StageRun]) -> str:
    """One line for the top of a job's page: the stages running now, how far along each is and its latest message;
    while no stage runs, what the job waits for; none once it has ended (its status and outcome lines say it)."""
    if job.is_terminal:
        return ""
    running = [run for run in runs if run.status == JobStatus.RUNNING]
    if running:
        return "; ".join(
            f"Running {run.kind} on {run.node_name or 'a node'}: {round(run.progress * 100)}%"
            + (f" ({run.message})" if run.message else "") for run in running)
    queued = [run for run in runs if run.status == JobStatus.QUEUED]
    if queued:
        return "; ".join(f"{run.kind} queued on {run.node_name or 'a node'}" for run in queued)
    waiting = pending_stages(job, runs)
    return f"Waiting to start {waiting[0]}" if waiting else job.get_status_display()


def _iso(moment) -> str | None:
    return moment.isoformat() if moment else None


def pending_stages(job: AdaptationJob, runs) -> list[str]:
    if job.is_terminal:
        return []
    dispatched = {run.kind for run in runs}
    return [kind for kind in job.stages if kind not in dispatched]


@login_required
def job_detail(request, pk):
    # Of the model the page shows its name: not its config and analysis JSON, kilobytes to decode.
    job = _job_for(request, pk, AdaptationJob.objects.select_related("cluster", "model", "submitted_by")
                   .defer("model__config", "model__analysis"))
    stage_runs = list(job.stage_runs.order_by("id"))
    return render(request, "adaptation/jobs/detail.html", {
        "job": job,
        "stage_runs": stage_runs,
        "outcomes": [outcome(run) for run in stage_runs],
        "progress_payload": job_progress_payload(job, stage_runs),
    })


@login_required
def job_progress(request, pk):
    return JsonResponse(job_progress_payload(_job_for(request, pk)))


@login_required
@require_POST
def job_cancel(request, pk):
    job = _job_for(request, pk)
    try:
        services.cancel_job(job, request.user)
        messages.success(request, f"Job {job.pk} cancelled.")
    except services.Conflict as conflict:
        messages.error(request, str(conflict))
    return redirect("job-detail", pk=job.pk)


@login_required
@require_POST
def job_retry(request, pk):
    job = _job_for(request, pk)
    try:
        new_job = services.retry_job(job, request.user)
    except services.Conflict as conflict:
        messages.error(request, str(conflict))
        return redirect("job-detail", pk=job.pk)
    messages.success(request, f"Job {new_job.pk} submitted as a retry of job {job.pk}.")
    return redirect("job-detail", pk=new_job.pk)
