"""Filters shared by the HTML list pages and the API (NetBox's filtersets.py)."""

import copy
from functools import cache, lru_cache
from html import escape

import django_filters
from django import forms
from django.forms.utils import flatatt
from django.utils.safestring import mark_safe
from django_filters.rest_framework import DjangoFilterBackend

from . import sql
from .choices import CheckVerdict, DeviceKind, JobStatus, NodeStatus
from .models import AdaptationJob, Cluster, Device, EnvReport, Link, ModelSpec, Node, StageRun
from .models.teams import team_ids_of


class IntegerFilter(django_filters.NumberFilter):
    """A whole number or a 400 (django-filter's NumberFilter takes decimals: ``?cluster=0.5`` matched nothing)."""

    field_class = forms.IntegerField


class StrictBooleanFilter(django_filters.TypedChoiceFilter):
    """true/false (or 1/0) or a 400: django-filter's BooleanFilter reads any other value as "not given" and answers
    every row, so ``?p2p_ok=no`` would look like a filter that found them all."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, choices=[(value, value) for value in ("true", "false", "1", "0")],
                         coerce=lambda value: value in ("true", "1"), **kwargs)


class FiltersOfOneRequest(dict):
    """A filter set's class-level filters, copied for each request as django-filter does (``deepcopy``), but one level
    deep: a filter's per-request state (its model, parent, row queryset and form field) is set on the copy, and a
    deep copy also cloned every queryset in every filter's arguments (0.4 ms of each list request)."""

    def __deepcopy__(self, memo):
        copies = {}
        for name, row_filter in self.items():
            duplicate = copy.copy(row_filter)
            duplicate.extra = dict(row_filter.extra)  # changed per request (the widget) below
            duplicate.__dict__.pop("_field", None)  # made on first use, from this request's queryset
            copies[name] = duplicate
        return copies


class FieldsOfOneForm(dict):
    """The fields of a filter form's class, which django-filter makes anew for each filter set (``get_form_class``)
    from that filter set's own fields: the form need not deep-copy them (Django's forms copy their class's fields,
    querysets and widgets and all, because a class usually serves every request)."""

    def __deepcopy__(self, memo):
        return dict(self)


class TeamScopedFilterSet(django_filters.FilterSet):
    """Every row choice (``?cluster=``, ``?model=``, ``?job=``…) limited to the requesting user's teams: another
    team's id is "not one of the available choices", exactly like an id that does not exist."""

    @classmethod
    def get_filters(cls):
        return FiltersOfOneRequest(super().get_filters())

    def __init__(self, data=None, queryset=None, *, request=None, prefix=None):
        super().__init__(data, queryset, request=request, prefix=prefix)
        user = getattr(request, "user", None)
        for row_filter in self.filters.values():
            if isinstance(row_filter, django_filters.ModelChoiceFilter | django_filters.ModelMultipleChoiceFilter):
                row_filter.queryset = row_choices(row_filter.queryset.model, user)
            if type(row_filter) is django_filters.ModelChoiceFilter and row_filter.queryset.model in CHOICE_LABELS:
                row_filter.extra["widget"] = RowSelect(user=user)

    def get_form_class(self):
        form_class = super().get_form_class()
        form_class.base_fields = FieldsOfOneForm(form_class.base_fields)
        return form_class


# The column a row choice is labelled with (its __str__), for the choices the HTML filter forms list: every model
# and cluster of the team, read as (id, label) pairs.
CHOICE_LABELS = {Cluster: "name", ModelSpec: "name"}


class RowSelect(forms.Select):
    """A select of a team's rows (its models, its clusters), written in one pass from their ids and labels: Django
    renders every option through a template, and its model choices made a model instance of every row, read
    through a server-side cursor (6 ms of the job list's page at 300 models)."""

    def __init__(self, attrs=None, choices=(), *, user=None):
        super().__init__(attrs, choices)
        self.user = user

    def render(self, name, value, attrs=None, renderer=None):
        field = self.choices.field
        choices = (("", str(field.empty_label)),) if field.empty_label is not None else ()
        choices += row_labels(self.choices.queryset.model, team_ids_of(self.user) if self.user else ())
        chosen = '<option value="{}"'.format(escape("" if value is None else str(value)))
        options = options_html(choices).replace(f"{chosen}>", f"{chosen} selected>", 1)
        return mark_safe(f'<select name="{escape(name)}"{flatatt(self.build_attrs(self.attrs, attrs))}>{options}'
                         "</select>")


@lru_cache(maxsize=128)
def options_html(choices: tuple[tuple[str, str], ...]) -> str:
    """A select's options, none selected, written once per process for each list of (value, label) pairs: a team's
    models change rarely and its list pages are read all the time (escaping 300 labels was a tenth of a job list
    page). The standard library's escape: Django's gives the same text, marked safe, at a few times the cost."""
    return "".join(f'<option value="{escape(key)}">{escape(label)}</option>' for key, label in choices)


@cache
def _labels_statement(model, teams: int) -> str:
    rows = sql.table(model)
    order = ", ".join(f"{rows.column(name.lstrip('-'))} {'DESC' if name.startswith('-') else 'ASC'}"
                      for name in model._meta.ordering)
    # CHOICE_LABELS' models belong to a team directly (``team_id``), as their ``for_user`` scopes them.
    return (f"SELECT {rows.column(model._meta.pk.attname)}, {rows.column(CHOICE_LABELS[model])} FROM {rows.name} "
            f"WHERE {rows.column('team_id')} IN ({', '.join(['%s'] * teams)}) ORDER BY {order}")


def row_labels(model, team_ids: tuple[int, ...]) -> tuple[tuple[str, str], ...]:
    """The (id, label) pairs of ``model``'s rows of these teams, in the model's order: written once as SQL per
    number of teams (adaptation/sql.py), as the sign-in is; through the ORM, building the query cost more than
    running it."""
    if not team_ids:
        return ()
    return tuple(sql.send(_labels_statement(model, len(team_ids)), team_ids,
                          lambda row: (str(row[0]), row[1])).rows())


def row_choices(model, user):
    """The rows of ``model`` a user may pick in a filter: their teams' own, with only what their labels need (a
    model's config and analysis JSON are kilobytes each)."""
    if user is None or not hasattr(model.objects, "for_user"):
        return model.objects.none()
    rows = model.objects.for_user(user)
    return rows.only("pk", CHOICE_LABELS[model]) if model in CHOICE_LABELS else rows


class TeamScopedFilterBackend(DjangoFilterBackend):
    """The API's filter backend: the filters DRF makes from a viewset's ``filterset_fields`` are scoped too."""

    filterset_base = TeamScopedFilterSet


class ClusterFilterSet(TeamScopedFilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Cluster
        fields = ["name", "interconnect"]


class NodeFilterSet(TeamScopedFilterSet):
    status = django_filters.ChoiceFilter(choices=NodeStatus.choices)

    class Meta:
        model = Node
        fields = ["cluster", "status", "hostname"]


class DeviceFilterSet(TeamScopedFilterSet):
    kind = django_filters.ChoiceFilter(choices=DeviceKind.choices)
    cluster = IntegerFilter(field_name="node__cluster")

    class Meta:
        model = Device
        fields = ["node", "kind", "cluster"]


class LinkFilterSet(TeamScopedFilterSet):
    p2p_ok = StrictBooleanFilter()

    class Meta:
        model = Link
        fields = ["cluster", "kind", "p2p_ok"]


class ModelSpecFilterSet(TeamScopedFilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")
    architecture = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = ModelSpec
        fields = ["name", "architecture"]


class JobFilterSet(TeamScopedFilterSet):
    # Not DISTINCT (django-filter's default for a multiple choice): ``status IN (...)`` on the job's own column
    # cannot repeat a row, and DISTINCT over every selected column made PostgreSQL sort the whole team's jobs.
    status = django_filters.MultipleChoiceFilter(choices=JobStatus.choices, widget=forms.CheckboxSelectMultiple,
                                                 distinct=False)
    stage = django_filters.CharFilter(field_name="stages", lookup_expr="icontains", label="Stage")

    class Meta:
        model = AdaptationJob
        fields = ["status", "cluster", "model", "stage"]


class StageRunFilterSet(TeamScopedFilterSet):
    status = django_filters.ChoiceFilter(choices=JobStatus.choices)

    class Meta:
        model = StageRun
        fields = ["job", "kind", "status", "node"]


class EnvReportFilterSet(TeamScopedFilterSet):
    verdict = django_filters.ChoiceFilter(choices=CheckVerdict.choices)
    cluster = IntegerFilter(field_name="node__cluster")

    class Meta:
        model = EnvReport
        fields = ["node", "cluster", "job", "verdict"]
