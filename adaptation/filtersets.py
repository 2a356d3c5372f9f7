"""Filters shared by the HTML list pages and the API (NetBox's filtersets.py)."""

import django_filters
from django import forms
from django.db import models
from django.forms.utils import flatatt
from django.utils.html import format_html, format_html_join
from django_filters.filterset import FILTER_FOR_DBFIELD_DEFAULTS
from django_filters.rest_framework import DjangoFilterBackend

from .choices import CheckVerdict, DeviceKind, JobStatus, NodeStatus
from .models import AdaptationJob, Cluster, Device, EnvReport, Link, ModelSpec, Node, StageRun


class IntegerFilter(django_filters.NumberFilter):
    """A whole number or a 400 (django-filter's NumberFilter takes decimals: ``?cluster=0.5`` matched nothing)."""

    field_class = forms.IntegerField


class StrictBooleanFilter(django_filters.TypedChoiceFilter):
    """true/false (or 1/0) or a 400: django-filter's BooleanFilter reads any other value as "not given" and answers
    every row, so ``?p2p_ok=no`` would look like a filter that found them all."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, choices=[(value, value) for value in ("true", "false", "1", "0")],
                         coerce=lambda value: value in ("true", "1"), **kwargs)


def team_rows(model, *label_fields):
    """The rows of ``model`` a filter offers, as django-filter asks for them (a callable given the request): the
    requesting user's teams' own. Another team's id is then "not one of the available choices", exactly like an id
    that does not exist; a model that belongs to no team offers nothing. ``label_fields``: the only columns read,
    where a form lists every row by its label (a model's config and analysis JSON are kilobytes each)."""

    def rows(request):
        user = getattr(request, "user", None)
        if user is None or not hasattr(model.objects, "for_user"):
            return model.objects.none()
        rows = model.objects.for_user(user)
        return rows.only(*label_fields) if label_fields else rows

    return rows


def _team_row_filter(field_class):
    """django-filter's filter for a relation of ``field_class``, its choices scoped by ``team_rows``."""
    default = FILTER_FOR_DBFIELD_DEFAULTS[field_class]
    return {"filter_class": default["filter_class"],
            "extra": lambda field: {**default["extra"](field), "queryset": team_rows(field.related_model)}}


class RowSelect(forms.Select):
    """A select of a team's rows by name (its clusters, its models): its options are read as (id, name) pairs in one
    query and written by ``format_html_join``. Django's ModelChoiceIterator makes a model instance of each row,
    through a server-side cursor on PostgreSQL, and its select renders each option through templates of its own:
    most of the job list's CPU at a few hundred models."""

    def render(self, name, value, attrs=None, renderer=None):
        field, chosen = self.choices.field, "" if value is None else str(value)
        choices = [("", field.empty_label)] if field.empty_label is not None else []
        choices += self.choices.queryset.values_list("pk", "name")
        options = format_html_join("", '<option value="{}"{}>{}</option>', (
            (key, " selected" if str(key) == chosen else "", label) for key, label in choices))
        return format_html('<select name="{}"{}>{}</select>', name, flatatt(self.build_attrs(self.attrs, attrs)),
                           options)


class TeamScopedFilterSet(django_filters.FilterSet):
    """Every row choice (``?cluster=``, ``?model=``, ``?job=``…) limited to the requesting user's teams, the
    filters a viewset's ``filterset_fields`` makes included (their Meta extends this one's)."""

    class Meta:
        filter_overrides = {models.ForeignKey: _team_row_filter(models.ForeignKey),
                            models.OneToOneField: _team_row_filter(models.OneToOneField)}


class TeamScopedFilterBackend(DjangoFilterBackend):
    """The API's filter backend: the filters DRF makes from a viewset's ``filterset_fields`` are scoped too."""

    filterset_base = TeamScopedFilterSet


class ClusterFilterSet(TeamScopedFilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta(TeamScopedFilterSet.Meta):
        model = Cluster
        fields = ["name", "interconnect"]


class NodeFilterSet(TeamScopedFilterSet):
    status = django_filters.ChoiceFilter(choices=NodeStatus.choices)

    class Meta(TeamScopedFilterSet.Meta):
        model = Node
        fields = ["cluster", "status", "hostname"]


class DeviceFilterSet(TeamScopedFilterSet):
    kind = django_filters.ChoiceFilter(choices=DeviceKind.choices)
    cluster = IntegerFilter(field_name="node__cluster")

    class Meta(TeamScopedFilterSet.Meta):
        model = Device
        fields = ["node", "kind", "cluster"]


class LinkFilterSet(TeamScopedFilterSet):
    p2p_ok = StrictBooleanFilter()

    class Meta(TeamScopedFilterSet.Meta):
        model = Link
        fields = ["cluster", "kind", "p2p_ok"]


class ModelSpecFilterSet(TeamScopedFilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")
    architecture = django_filters.CharFilter(lookup_expr="icontains")

    class Meta(TeamScopedFilterSet.Meta):
        model = ModelSpec
        fields = ["name", "architecture"]


class JobFilterSet(TeamScopedFilterSet):
    # The job list's form lists every cluster and model of the team: only their names are read.
    cluster = django_filters.ModelChoiceFilter(queryset=team_rows(Cluster, "name"), widget=RowSelect)
    model = django_filters.ModelChoiceFilter(queryset=team_rows(ModelSpec, "name"), widget=RowSelect)
    # Not DISTINCT (django-filter's default for a multiple choice): ``status IN (...)`` on the job's own column
    # cannot repeat a row, and DISTINCT over every selected column made PostgreSQL sort the whole team's jobs.
    status = django_filters.MultipleChoiceFilter(choices=JobStatus.choices, widget=forms.CheckboxSelectMultiple,
                                                 distinct=False)
    stage = django_filters.CharFilter(field_name="stages", lookup_expr="icontains", label="Stage")

    class Meta(TeamScopedFilterSet.Meta):
        model = AdaptationJob
        fields = ["status", "cluster", "model", "stage"]


class StageRunFilterSet(TeamScopedFilterSet):
    status = django_filters.ChoiceFilter(choices=JobStatus.choices)

    class Meta(TeamScopedFilterSet.Meta):
        model = StageRun
        fields = ["job", "kind", "status", "node"]


class EnvReportFilterSet(TeamScopedFilterSet):
    verdict = django_filters.ChoiceFilter(choices=CheckVerdict.choices)
    cluster = IntegerFilter(field_name="node__cluster")

    class Meta(TeamScopedFilterSet.Meta):
        model = EnvReport
        fields = ["node", "cluster", "job", "verdict"]
