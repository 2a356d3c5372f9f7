"""Serving endpoints someone else runs: the team's list (add, delete, benchmark) and a benchmark's report."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from ..jobs import services as jobs
from ..models import ServingEndpoint, StageRun
from ..reports import json_download, report_run
from ..teams.services import may_change
from .forms import EndpointBenchForm, ServingEndpointForm
from .services import ENDPOINT_REPORT_KIND, endpoint_report_context


@login_required
def endpoint_list(request):
    form = ServingEndpointForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        endpoint = form.save(commit=False)
        endpoint.created_by = request.user
        endpoint.save()
        with_key = " with its API key" if endpoint.has_api_key else ""
        messages.success(request, f"Endpoint {endpoint.name} added{with_key}.")
        return redirect("endpoint-list")
    endpoints = ServingEndpoint.objects.for_user(request.user).select_related("team")
    return render(request, "adaptation/serving/endpoints.html", {
        "form": form,
        "endpoints": [(endpoint, EndpointBenchForm(user=request.user, endpoint=endpoint, prefix=f"e{endpoint.pk}"))
                      for endpoint in endpoints],
        "reports": StageRun.objects.for_user(request.user).filter(kind=ENDPOINT_REPORT_KIND)
                   .select_related("job__model").order_by("-id")[:20],
    })


def _endpoint(request, pk) -> ServingEndpoint:
    return get_object_or_404(ServingEndpoint.objects.for_user(request.user), pk=pk)


@login_required
@require_POST
def endpoint_bench(request, pk):
    endpoint = _endpoint(request, pk)
    form = EndpointBenchForm(request.POST, user=request.user, endpoint=endpoint, prefix=f"e{endpoint.pk}")
    if not form.is_valid():
        errors = "; ".join(f"{field}: {' '.join(problems)}" for field, problems in form.errors.items())
        messages.error(request, f"Not submitted: {errors}")
        return redirect("endpoint-list")
    try:
        job = jobs.submit_job(team=endpoint.team, user=request.user, cluster=form.cleaned_data["cluster"],
                              model=form.cleaned_data["model"], stages=["endpoint_bench"],
                              parameters={"endpoint_bench": form.stage_parameters()})
    except ValidationError as error:
        messages.error(request, "Not submitted: " + "; ".join(error.messages))
        return redirect("endpoint-list")
    return redirect("job-detail", job.pk)


@login_required
@require_POST
def endpoint_delete(request, pk):
    endpoint = _endpoint(request, pk)
    if not may_change(request.user, endpoint):
        messages.error(request, "Only the endpoint's creator or a team admin can delete it.")
        return redirect("endpoint-list")
    endpoint.delete()
    messages.success(request, f"Endpoint {endpoint.name} deleted.")
    return redirect("endpoint-list")


def _report_run(request, pk) -> StageRun:
    return report_run(request, pk, ENDPOINT_REPORT_KIND, "endpoint benchmark")


@login_required
def report_page(request, pk):
    return render(request, "adaptation/serving/endpoint_report.html", endpoint_report_context(_report_run(request, pk)))


@login_required
def report_json(request, pk):
    return json_download(_report_run(request, pk), "d0-endpoint")
