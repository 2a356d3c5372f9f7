"""Filters shared by the HTML list pages and the API (NetBox's filtersets.py)."""

import django_filters
from django import forms

from .choices import CheckVerdict, DeviceKind, JobStatus, NodeStatus
from .models import AdaptationJob, Cluster, Device, EnvReport, Link, ModelSpec, Node, StageRun


class ClusterFilterSet(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Cluster
        fields = ["name", "interconnect"]


class NodeFilterSet(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=NodeStatus.choices)

    class Meta:
        model = Node
        fields = ["cluster", "status", "hostname"]


class DeviceFilterSet(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=DeviceKind.choices)
    cluster = django_filters.NumberFilter(field_name="node__cluster")

    class Meta:
        model = Device
        fields = ["node", "kind", "cluster"]


class LinkFilterSet(django_filters.FilterSet):
    class Meta:
        model = Link
        fields = ["cluster", "kind", "p2p_ok"]


class ModelSpecFilterSet(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")
    architecture = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = ModelSpec
        fields = ["name", "architecture"]


class JobFilterSet(django_filters.FilterSet):
    status = django_filters.MultipleChoiceFilter(choices=JobStatus.choices, widget=forms.CheckboxSelectMultiple)
    stage = django_filters.CharFilter(field_name="stages", lookup_expr="icontains", label="Stage")

    class Meta:
        model = AdaptationJob
        fields = ["status", "cluster", "model", "stage"]


class StageRunFilterSet(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=JobStatus.choices)

    class Meta:
        model = StageRun
        fields = ["job", "kind", "status", "node"]


class EnvReportFilterSet(django_filters.FilterSet):
    verdict = django_filters.ChoiceFilter(choices=CheckVerdict.choices)
    cluster = django_filters.NumberFilter(field_name="node__cluster")

    class Meta:
        model = EnvReport
        fields = ["node", "cluster", "job", "verdict"]
