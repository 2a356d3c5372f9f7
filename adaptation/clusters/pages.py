"""Cluster pages: the list, a new cluster, a cluster with its nodes and join command, its topology and checks,
and the button that runs an env check on every online node."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from ..jobs import services as jobs
from ..models import Cluster, Device, EnvReport
from ..teams.services import is_team_admin
from . import services
from .forms import ClusterForm


def _cluster_for(request, pk):
    return get_object_or_404(Cluster.objects.for_user(request.user).select_related("team"), pk=pk)


@login_required
def cluster_list(request):
    return render(request, "adaptation/clusters/list.html",
                  {"clusters": services.clusters_with_counts(request.user)})


@login_required
def cluster_detail(request, pk):
    cluster = _cluster_for(request, pk)
    nodes = cluster.nodes.prefetch_related(Prefetch("devices", queryset=Device.objects.order_by("kind", "index")))
    return render(request, "adaptation/clusters/detail.html", {
        "cluster": cluster,
        "nodes": nodes,
        "jobs": jobs.job_rows(request.user).filter(cluster=cluster)[:10],
        "is_admin": is_team_admin(request.user, cluster.team),
        "heartbeat_timeout": settings.D0_NODE_TIMEOUT,
    })


@login_required
def cluster_topology_page(request, pk):
    cluster = _cluster_for(request, pk)
    reports = (EnvReport.objects.filter(node__cluster=cluster).select_related("node", "job")
               .order_by("-created")[:30])
    return render(request, "adaptation/clusters/topology.html", {
        "cluster": cluster, "topology": services.cluster_topology(cluster), "reports": reports,
    })


@login_required
@require_POST
def cluster_env_check(request, pk):
    cluster = _cluster_for(request, pk)
    job = jobs.submit_job(team=cluster.team, user=request.user, cluster=cluster, stages=["env_check"])
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
