"""Model pages: the list, adding a model (upload or catalog), and a model's page with its analysis, plans on the
team's clusters and on a what-if cluster, kept predictions, and the button that runs the whole adaptation."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import OuterRef, Subquery
from django.db.models.fields.json import KT
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from ..jobs import services as jobs
from ..jobs.pages import job_table_rows
from ..models import Cluster, CoverageReport, ModelSpec
from ..pagination import IndexedPaginator
from ..teams.services import teams_of
from . import catalog, services
from .adapt import submit_adaptation
from .forms import ModelSpecForm, PlanForm


@login_required
def model_list(request):
    # The figures a list needs, read in SQL from the JSON (the config and analysis themselves stay unloaded).
    latest_coverage = CoverageReport.objects.filter(model=OuterRef("pk")).order_by("-created").values("coverage")[:1]
    models = (ModelSpec.objects.for_user(request.user).select_related("team", "created_by")
              .only("name", "architecture", "created", "team__name", "created_by__username")
              .annotate(total_params=KT("analysis__total_params"), active_params=KT("analysis__active_params"),
                        shipped_quantization=KT("config__quantization_config__quant_method"),
                        shipped_dtype=KT("config__torch_dtype"), latest_coverage=Subquery(latest_coverage)))
    # The page's ids first: PostgreSQL computes the annotations of every row it sorts, and reading the JSON
    # figures of all the team's models to show 25 of them was most of this page's time (7-11 ms at 300 models).
    page = IndexedPaginator(models, settings.D0_PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "adaptation/intake/model_list.html", {"page": page})


@login_required
@require_POST
def model_adapt(request, pk):
    spec = get_object_or_404(ModelSpec.objects.for_user(request.user), pk=pk)
    cluster = get_object_or_404(Cluster.objects.for_user(request.user).filter(team=spec.team),
                                pk=request.POST.get("cluster") or 0)
    job = submit_adaptation(model=spec, cluster=cluster, user=request.user)
    return redirect("job-detail", pk=job.pk)


@login_required
def model_catalog(request):
    query = request.GET.get("q", "").strip().lower()
    entries = [entry for entry in catalog.CATALOG
               if not query or query in entry.name.lower() or query in entry.hf_id.lower()]
    # What the user's teams already added: the row links to it instead of offering to add it again.
    added = dict(ModelSpec.objects.for_user(request.user).exclude(catalog_slug="")
                 .values_list("catalog_slug", "pk"))
    return render(request, "adaptation/intake/catalog.html", {
        "catalog": [(entry, added.get(entry.slug)) for entry in entries], "query": request.GET.get("q", ""),
        "teams": teams_of(request.user)})


@login_required
@require_POST
def model_catalog_add(request, slug):
    if slug not in catalog.BY_SLUG:
        raise Http404("No such catalog entry.")
    team = get_object_or_404(teams_of(request.user), slug=request.POST.get("team", ""))
    spec, created = services.add_from_catalog(team=team, user=request.user, slug=slug)
    if not created:
        messages.info(request, f"{team} already has {spec.name}.")
    return redirect("model-detail", pk=spec.pk)


@login_required
def model_detail(request, pk):
    spec = get_object_or_404(ModelSpec.objects.for_user(request.user).select_related("team", "created_by"), pk=pk)
    services.analysed(spec)
    precision, precision_label = services.starting_precision(spec)
    form = PlanForm(request.POST or request.GET or None, initial={"precision": precision})
    what_if = None
    if form.is_bound and form.is_valid():
        try:
            if request.method == "POST":
                kept = services.record(spec, form.devices(), form.cleaned_data["precision"], form.workload(),
                                       request.user)
                messages.success(request, f"Prediction kept (plan #{kept.pk}) for comparison with measured runs.")
                # Back to the same what-if, its fields in the URL but never the CSRF token.
                fields = request.POST.copy()
                fields.pop("csrfmiddlewaretoken", None)
                return redirect(f"{request.path}?{fields.urlencode()}")
            what_if = services.plan(spec, form.devices(), form.cleaned_data["precision"], form.workload())
        except ValidationError as error:
            form.add_error(None, error)
    clusters = Cluster.objects.filter(team=spec.team).prefetch_related("nodes__devices")
    cluster_plans = []
    for cluster in clusters:
        devices = services.cluster_devices(cluster)
        if devices:
            try:
                cluster_plans.append((cluster, services.plan(spec, devices, precision)))
            except ValidationError as error:
                cluster_plans.append((cluster, {"fits": False, "reason": "; ".join(error.messages)}))
    return render(request, "adaptation/intake/model_detail.html", {
        "spec": spec, "analysis": spec.analysis,
        "jobs": job_table_rows(jobs.job_rows(request.user).filter(model=spec))[:10],
        "form": form, "what_if": what_if, "cluster_plans": cluster_plans,
        "kept_plans": spec.plans.select_related("created_by")[:10], "clusters": clusters,
        "precision_label": precision_label,
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
    return render(request, "adaptation/form.html", {"form": form, "title": "Add a model", "multipart": True,
                                                       "busy": "Uploading and analysing…"})
