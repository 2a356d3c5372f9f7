"""Operator-coverage pages: the models × backends heatmap (with virtual backends and the operator library), a
model's gap table, and the diff of what one model needs that another did not."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.shortcuts import get_object_or_404, redirect, render

from ..models import CoverageReport, ModelSpec, OperatorRecord, VirtualBackend
from . import services
from .charts import heatmap
from .forms import ShippedBackendsForm, VirtualBackendForm


@login_required
def coverage_overview(request):
    # Two forms post here: a list of one's own (a file) and the backends d0 ships (a button of their own).
    shipping = request.method == "POST" and "add_shipped" in request.POST
    form = VirtualBackendForm(None if shipping else request.POST or None, None if shipping else request.FILES or None,
                              user=request.user)
    shipped_form = ShippedBackendsForm(request.POST if shipping else None, user=request.user)
    if shipping and shipped_form.is_valid():
        team = shipped_form.cleaned_data["team"]
        added = services.add_shipped_backends(team, request.user, shipped_form.cleaned_data["backends"])
        messages.success(request, f"Added to {team.name}: {', '.join(backend.name for backend in added)}. "
                         "Choose them in an op_coverage job's virtual backends.")
        return redirect("coverage")
    if request.method == "POST" and not shipping and form.is_valid():
        backend = form.save(commit=False)
        backend.created_by = request.user
        backend.save()
        messages.success(request, f"Virtual backend {backend.name} added with {len(backend.operators)} operators.")
        return redirect("coverage")
    virtual_backends = list(VirtualBackend.objects.for_user(request.user).select_related("team"))
    library = (OperatorRecord.objects.for_user(request.user).values("backend", "status")
               .annotate(operators=Count("id")).order_by("backend", "status"))
    return render(request, "adaptation/coverage/overview.html", {
        "heatmap": heatmap(request.user), "form": form, "library": library,
        "virtual_backends": virtual_backends, "shipped_form": shipped_form,
        "shipped_backends": services.shipped_backend_rows(virtual_backends),
    })


@login_required
def model_coverage(request, pk):
    spec = get_object_or_404(ModelSpec.objects.for_user(request.user), pk=pk)
    latest = services.latest_reports(CoverageReport.objects.filter(model=spec).select_related("node", "job"))
    reports = sorted(latest.values(), key=lambda report: (report.backend, report.dtype))
    return render(request, "adaptation/coverage/model.html", {
        "spec": spec, "reports": [(report, services.gap_rows(report)) for report in reports],
    })


@login_required
def coverage_diff(request):
    models = ModelSpec.objects.for_user(request.user)
    model = models.filter(pk=request.GET.get("a") or 0).first()
    other = models.filter(pk=request.GET.get("b") or 0).first()
    backend = request.GET.get("backend") or None
    rows = services.diff(model, other, backend) if model and other else None
    backends = sorted(set(CoverageReport.objects.for_user(request.user).values_list("backend", flat=True)))
    return render(request, "adaptation/coverage/diff.html", {
        "models": models.only("id", "name"), "model": model, "other": other, "backend": backend, "rows": rows,
        "backends": backends,
    })
