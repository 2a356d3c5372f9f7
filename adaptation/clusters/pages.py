"""Cluster pages: the list, a new cluster, a cluster with its nodes and join command, its topology and checks,
and the button that runs an env check on every online node."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Prefetch, Q
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from .. import control_messages
from ..choices import JobStatus
from ..jobs import services as jobs
from ..jobs.pages import job_table_rows
from ..models import Cluster, Device, EnvReport
from ..teams.services import is_team_admin
from ..serving import ledger
from . import local_engine, services, trust
from .forms import ClusterForm, JoinTokenForm


def _cluster_for(request, pk):
    return get_object_or_404(Cluster.objects.for_user(request.user).select_related("team"), pk=pk)


def _admin_cluster_for(request, pk):
    cluster = _cluster_for(request, pk)
    if not is_team_admin(request.user, cluster.team):
        raise PermissionDenied(f"Only an admin of team {cluster.team} can manage its join tokens.")
    return cluster


def _detail(request, cluster, **extra):
    is_admin = is_team_admin(request.user, cluster.team)
    # Busyness: stage runs a node is running, and those dispatched to its queue that it has not started yet.
    nodes = cluster.nodes.prefetch_related(Prefetch("devices", queryset=Device.objects.order_by("kind", "index"))) \
        .annotate(running_stages=Count("stage_runs", filter=Q(stage_runs__status=JobStatus.RUNNING)),
                  queued_stages=Count("stage_runs", filter=Q(stage_runs__status=JobStatus.QUEUED)))
    return render(request, "adaptation/clusters/detail.html", {
        "cluster": cluster,
        "nodes": nodes,
        "jobs": job_table_rows(jobs.job_rows(request.user).filter(cluster=cluster))[:10],
        "is_admin": is_admin,
        "heartbeat_timeout": settings.D0_NODE_TIMEOUT,
        "join_tokens": cluster.join_tokens.select_related("created_by")[:20] if is_admin else [],
        "token_form": extra.pop("token_form", None) or JoinTokenForm(),
        "rejected": services.rejected_messages(cluster),
        "broker": services.node_broker_hint(),
        "control_key": control_messages.public_key(),
        # Under `manage.py up`: the local node's engine while it is prepared (or why it could not be).
        "local_engine": local_engine.read_status(settings.VAR_DIR, cluster.join_name),
        # How far d0's predictions were from what this cluster's serve sweeps measured, and its calibration.
        "ledger": ledger.error_distribution(cluster),
        **extra,
    })


@login_required
def cluster_list(request):
    return render(request, "adaptation/clusters/list.html",
                  {"clusters": Cluster.objects.for_user(request.user).select_related("team").with_node_counts()})


@login_required
def cluster_detail(request, pk):
    return _detail(request, _cluster_for(request, pk))


@login_required
@require_POST
def join_token_create(request, pk):
    """Make a join token and show the join command with it, this once: the page is not kept by any cache, and the
    token is not put in a redirect's session message."""
    cluster = _admin_cluster_for(request, pk)
    form = JoinTokenForm(request.POST)
    if not form.is_valid():
        return _detail(request, cluster, token_form=form)
    token, whole = trust.create_join_token(cluster, request.user, hours=form.cleaned_data["hours"],
                                           description=form.cleaned_data["description"])
    response = _detail(request, cluster, new_token=token, new_token_value=whole)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def join_token_revoke(request, pk, token_pk):
    cluster = _admin_cluster_for(request, pk)
    token = get_object_or_404(cluster.join_tokens, pk=token_pk)
    if trust.revoke_join_token(token):
        messages.success(request, f"Join token {token.token_id} revoked: no new node can join with it.")
    return redirect("cluster-detail", pk=cluster.pk)


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
