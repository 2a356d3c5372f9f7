"""Server-rendered pages. Every view needs a login; every query is scoped to the user's teams (404 otherwise)."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Count, Prefetch, Q
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from rest_framework.authtoken.models import Token

from . import catalog, planning, services
from .choices import ACTIVE_STATUSES, STATUS_COLOURS, NodeStatus
from .filtersets import JobFilterSet
from .forms import ClusterForm, JobForm, ModelSpecForm
from .models import AdaptationJob, Cluster, Device, EnvReport, ModelSpec, StageRun
from .topology import cluster_topology

PAGE_SIZE = 25


def _clusters_with_counts(user):
    return Cluster.objects.for_user(user).select_related("team").annotate(
        node_count=Count("nodes", distinct=True),
        nodes_online=Count("nodes", filter=Q(nodes__status=NodeStatus.ONLINE), distinct=True),
    )


def _job_rows(user):
    return (AdaptationJob.objects.for_user(user)
            .select_related("cluster", "model", "submitted_by")
            .defer("log", "error_traceback", "model__config", "model__analysis"))


@login_required
def dashboard(request):
    jobs = _job_rows(request.user)
    return render(request, "adaptation/dashboard.html", {
        "clusters": _clusters_with_counts(request.user),
        "running_jobs": jobs.filter(status__in=list(ACTIVE_STATUSES))[:20],
        "recent_jobs": jobs.exclude(status__in=list(ACTIVE_STATUSES))[:10],
    })


@login_required
def cluster_list(request):
    return render(request, "adaptation/cluster_list.html", {"clusters": _clusters_with_counts(request.user)})


@login_required
def cluster_detail(request, pk):
    cluster = get_object_or_404(Cluster.objects.for_user(request.user).select_related("team"), pk=pk)
    nodes = cluster.nodes.prefetch_related(Prefetch("devices", queryset=Device.objects.order_by("kind", "index")))
    return render(request, "adaptation/cluster_detail.html", {
        "cluster": cluster,
        "nodes": nodes,
        "jobs": _job_rows(request.user).filter(cluster=cluster)[:10],
        "is_admin": services.is_team_admin(request.user, cluster.team),
        "heartbeat_timeout": settings.D0_NODE_TIMEOUT,
    })


@login_required
def cluster_topology_page(request, pk):
    cluster = get_object_or_404(Cluster.objects.for_user(request.user).select_related("team"), pk=pk)
    reports = (EnvReport.objects.filter(node__cluster=cluster).select_related("node", "job")
               .order_by("-created")[:30])
    return render(request, "adaptation/cluster_topology.html", {
        "cluster": cluster, "topology": cluster_topology(cluster), "reports": reports,
    })


@login_required
@require_POST
def cluster_env_check(request, pk):
    cluster = get_object_or_404(Cluster.objects.for_user(request.user).select_related("team"), pk=pk)
    job = services.submit_job(team=cluster.team, user=request.user, cluster=cluster, stages=["env_check"])
    return redirect("job-detail", pk=job.pk)


@login_required
def cluster_create(request):
    form = ClusterForm(request.POST or None, user=request.user)
    if not form.fields["team"].queryset.exists():
        raise PermissionDenied("Only a team admin can add clusters.")
    if request.method == "POST" and form.is_valid():
        cluster = form.save()
        messages.success(request, f"Cluster {cluster.name} created. Join nodes with the command below.")
        return redirect("cluster-detail", pk=cluster.pk)
    return render(request, "adaptation/form.html", {"form": form, "title": "New cluster"})


@login_required
def model_list(request):
    models = ModelSpec.objects.for_user(request.user).select_related("team", "created_by").defer("config", "analysis")
    page = Paginator(models, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "adaptation/model_list.html", {"page": page})


@login_required
@require_POST
def model_adapt(request, pk):
    spec = get_object_or_404(ModelSpec.objects.for_user(request.user), pk=pk)
    cluster = get_object_or_404(Cluster.objects.for_user(request.user).filter(team=spec.team),
                                pk=request.POST.get("cluster") or 0)
    job = services.submit_adaptation(model=spec, cluster=cluster, user=request.user)
    return redirect("job-detail", pk=job.pk)


@login_required
def model_catalog(request):
    teams = services.teams_of(request.user)
    return render(request, "adaptation/model_catalog.html", {"catalog": catalog.CATALOG, "teams": teams})


@login_required
@require_POST
def model_catalog_add(request, slug):
    if slug not in catalog.BY_SLUG:
        raise Http404("No such catalog entry.")
    team = get_object_or_404(services.teams_of(request.user), slug=request.POST.get("team", ""))
    spec, created = services.add_from_catalog(team=team, user=request.user, slug=slug)
    if not created:
        messages.info(request, f"{team} already has {spec.name}.")
    return redirect("model-detail", pk=spec.pk)


@login_required
def model_detail(request, pk):
    spec = get_object_or_404(ModelSpec.objects.for_user(request.user).select_related("team", "created_by"), pk=pk)
    if spec.analysis is None:  # a row from before analyses were stored
        spec.full_clean()
        spec.save(update_fields=["analysis"])
    form = planning.PlanForm(request.POST or request.GET or None)
    what_if = None
    if form.is_bound and form.is_valid():
        try:
            if request.method == "POST":
                kept = planning.record(spec, form.devices(), form.cleaned_data["precision"], form.workload(),
                                       request.user)
                messages.success(request, f"Prediction kept (plan #{kept.pk}) for comparison with measured runs.")
                return redirect(f"{request.path}?{request.POST.urlencode()}")
            what_if = planning.plan(spec, form.devices(), form.cleaned_data["precision"], form.workload())
        except ValidationError as error:
            form.add_error(None, error)
    clusters = Cluster.objects.filter(team=spec.team).prefetch_related("nodes__devices")
    cluster_plans = []
    for cluster in clusters:
        devices = planning.cluster_devices(cluster)
        if devices:
            try:
                cluster_plans.append((cluster, planning.plan(spec, devices, "bf16")))
            except ValidationError as error:
                cluster_plans.append((cluster, {"fits": False, "reason": "; ".join(error.messages)}))
    return render(request, "adaptation/model_detail.html", {
        "spec": spec, "analysis": spec.analysis, "jobs": _job_rows(request.user).filter(model=spec)[:10],
        "form": form, "what_if": what_if, "cluster_plans": cluster_plans,
        "kept_plans": spec.plans.select_related("created_by")[:10], "clusters": clusters,
    })


@login_required
def model_create(request):
    form = ModelSpecForm(request.POST or None, request.FILES or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        spec = form.save(commit=False)
        spec.created_by = request.user
        spec.save()
        messages.success(request, f"Model {spec.name} added ({spec.architecture or 'architecture not declared'}).")
        return redirect("model-detail", pk=spec.pk)
    return render(request, "adaptation/form.html", {"form": form, "title": "Add a model", "multipart": True})


@login_required
def job_list(request):
    jobs = _job_rows(request.user)
    filterset = JobFilterSet(request.GET or None, queryset=jobs, request=request)
    for name in ("cluster", "model"):
        field = filterset.form.fields[name]
        field.queryset = field.queryset.model.objects.for_user(request.user)
    page = Paginator(filterset.qs, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "adaptation/job_list.html", {"filter": filterset, "page": page,
                                                        "query": query.urlencode()})


@login_required
def job_create(request):
    # The cluster and model pages link here with ?cluster= / ?model= to preselect them.
    form = JobForm(request.POST or None, user=request.user, initial=request.GET.dict())
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            job = services.submit_job(team=data["cluster"].team, user=request.user, cluster=data["cluster"],
                                      model=data["model"], stages=data["stages"], parameters=data["parameters"])
        except ValidationError as error:
            for field, problems in error.message_dict.items():
                form.add_error(field if field in form.fields else None, problems)
        else:
            return redirect("job-detail", pk=job.pk)
    return render(request, "adaptation/form.html", {"form": form, "title": "Submit a job"})


def _job_for(request, pk):
    return get_object_or_404(
        AdaptationJob.objects.for_user(request.user).select_related("cluster", "model", "submitted_by", "retry_of"),
        pk=pk,
    )


def stage_page(job: AdaptationJob, run: StageRun) -> str | None:
    """The page that shows what a stage run found, once it has a result."""
    if run.status != "succeeded" and run.kind != "sharded_run":
        return None
    if run.kind == "env_check":
        return reverse("cluster-topology", args=[job.cluster_id])
    if run.kind == "op_coverage":
        return reverse("model-coverage", args=[job.model_id])
    if run.kind == "sharded_run" and run.status in ("succeeded", "failed"):
        return reverse("sharded-run", args=[run.pk])
    if run.kind == "sweep":
        return reverse("sweep-report", args=[run.pk])
    return None


def job_progress_payload(job: AdaptationJob) -> dict:
    runs = StageRun.objects.filter(job=job).defer("result").order_by("id")
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
             "progress": run.progress, "message": run.message, "error": run.error, "page": stage_page(job, run)}
            for run in runs
        ],
    }


@login_required
def job_detail(request, pk):
    job = _job_for(request, pk)
    return render(request, "adaptation/job_detail.html", {
        "job": job,
        "stage_runs": job.stage_runs.select_related("node").order_by("id"),
        "progress_payload": job_progress_payload(job),
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


@login_required
def api_token(request):
    if request.method == "POST":
        Token.objects.filter(user=request.user).delete()
        Token.objects.create(user=request.user)
        messages.success(request, "A new API token was made; the old one no longer works.")
        return redirect("api-token-page")
    token = Token.objects.filter(user=request.user).first()
    return render(request, "adaptation/api_token.html", {"token": token})


