import json

from django import forms
from django.core.exceptions import ValidationError

from ..choices import StageKind
from ..models import Cluster, ModelSpec
from ..teams.forms import TeamChoiceMixin


class JobForm(TeamChoiceMixin, forms.Form):
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all())
    model = forms.ModelChoiceField(queryset=ModelSpec.objects.all(), required=False,
                                   help_text="Not needed for an environment probe.")
    stages = forms.MultipleChoiceField(choices=StageKind.choices, widget=forms.CheckboxSelectMultiple,
                                       initial=[StageKind.values[0]])
    parameters = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False,
                                 help_text='Optional JSON object: {"nodes": ["gpu-01"]} limits the nodes; '
                                           'per stage, e.g. {"sharded_run": {"tp": 2}} (the table below says what '
                                           'each stage takes).')

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.scope(user)
        clusters = self.fields["cluster"].queryset
        if "cluster" not in self.initial and clusters.count() == 1:
            self.initial["cluster"] = clusters.first()

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
