import json

from django import forms
from django.core.exceptions import ValidationError

from workers.engine.parameters import ParameterError
from workers.engine.stages import check_job_parameters

from .. import stages as handlers
from ..models import Cluster, ModelSpec, Node
from ..teams.forms import TeamChoiceMixin
from .stage_fields import error_field, read_values, stage_fields


class JobForm(TeamChoiceMixin, forms.Form):
    """A job: cluster, model, stages, then each chosen stage's parameters as fields made from its declarations
    (blank = the stage's default), the nodes it may use, and, for what the fields do not cover, raw JSON."""

    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all())
    model = forms.ModelChoiceField(queryset=ModelSpec.objects.all(), required=False,
                                   help_text="Not needed for an environment probe.")
    stages = forms.MultipleChoiceField(choices=handlers.choices, widget=forms.CheckboxSelectMultiple)
    nodes = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple,
                                      help_text="The nodes the job may use (none ticked: every online node).")
    parameters = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False,
                                 label="Parameters as JSON (advanced)",
                                 help_text='Optional JSON object, merged under the fields above: per stage, e.g. '
                                           '{"sharded_run": {"tp": 2}}.')

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["stages"].initial = handlers.kinds()[:1]
        self.scope(user)
        clusters = self.fields["cluster"].queryset
        if "cluster" not in self.initial and clusters.count() == 1:
            self.initial["cluster"] = clusters.first()
        nodes = Node.objects.filter(cluster__in=clusters).select_related("cluster").order_by("cluster__name",
                                                                                             "hostname")
        self.fields["nodes"].choices = [(node.hostname, f"{node.cluster.name}: {node.hostname}") for node in nodes]
        self.stage_groups = stage_fields(user)
        for fields in self.stage_groups.values():
            self.fields.update(fields)

    def stage_fieldsets(self):
        """``[(kind, label, [bound fields])]`` for the template, one fieldset per stage that takes parameters."""
        labels = dict(handlers.choices())
        return [(kind, labels[kind], [self[name] for name in fields]) for kind, fields in self.stage_groups.items()
                if fields]

    def clean_parameters(self):
        raw = self.cleaned_data["parameters"].strip()
        if not raw:
            return {}
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ValidationError(f"Not valid JSON: {error.msg} (line {error.lineno}, column {error.colno}).") from None
        if not isinstance(value, dict):
            raise ValidationError("Parameters must be a JSON object ({...}).")
        return value

    def clean(self):
        cleaned = super().clean()
        stages = cleaned.get("stages") or []
        parameters = dict(cleaned.get("parameters") or {})
        for kind in stages:
            values = read_values(kind, cleaned, self.add_error)
            if values:
                parameters[kind] = {**(parameters.get(kind) or {}), **values}
        if cleaned.get("nodes"):
            parameters["nodes"] = list(cleaned["nodes"])
        try:
            check_job_parameters(stages, parameters)
        except ParameterError as error:
            self.add_parameter_error(error.key, error.message)
        cleaned["parameters"] = parameters
        return cleaned

    def add_parameter_error(self, key: str, message: str) -> None:
        field = error_field(key)
        if field in self.fields:
            self.add_error(field, message)
        else:
            self.add_error("parameters", f"{key}: {message}")
