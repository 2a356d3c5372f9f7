"""Operator-coverage pages: the models × backends heatmap (with virtual backends and the operator library), a
model's gap table, and the diff of what one model needs that another did not."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.shortcuts import get_object_or_404, redirect, render

from ..models import CoverageReport, ModelSpec, OperatorRecord, VirtualBackend
from . import services
from .charts import heatmap
from .forms import VirtualBackendForm


@login_required
def coverage_overview(request):
    form = VirtualBackendForm(request.POST or None, request.FILES or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        backend = form.save(commit=False)
        backend.created_by = request.user
        backend.save()
        messages.success(request, f"Virtual backend {backend.name} added with {len(backend.operators)} operators.")
        return redirect("coverage")
    library = (OperatorRecord.objects.for_user(request.user).values("backend", "status")
               .annotate(operators=Count("id")).order_by("backend", "status"))
    return render(request, "adaptation/coverage/overview.html", {
        "heatmap": heatmap(request.user), "form": form, "library": library,
        "virtual_backends": VirtualBackend.objects.for_user(request.user),
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
