import json

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from .choices import StageKind, TeamRole
from .configs import model_name, read_config_upload
from .models import Cluster, ModelSpec, Team, VirtualBackend


class TeamChoiceMixin:
    """Limits every team-owned choice of a form to the user's teams."""

    def scope(self, user, teams=None):
        """``teams`` narrows the team choices further (e.g. to those the user administers)."""
        for field in self.fields.values():
            if isinstance(field, forms.ModelChoiceField):
                field.queryset = field.queryset.model.objects.for_user(user)
        if "team" in self.fields:
            if teams is not None:
                self.fields["team"].queryset = teams
            if self.fields["team"].queryset.count() == 1:
                self.fields["team"].initial = self.fields["team"].queryset.first()


class ClusterForm(TeamChoiceMixin, forms.ModelForm):
    class Meta:
        model = Cluster
        fields = ["team", "name", "description", "expected_devices_per_node", "interconnect"]

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.scope(user, teams=Team.objects.for_user(user).filter(memberships__role=TeamRole.ADMIN))


class ModelSpecForm(TeamChoiceMixin, forms.ModelForm):
    config_file = forms.FileField(label="config.json", help_text="The model's released config.json.")
    name = forms.CharField(max_length=200, required=False, help_text="Defaults to the config's _name_or_path.")

    class Meta:
        model = ModelSpec
        fields = ["team", "name", "config_file", "source_note"]

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.scope(user)

    def clean_config_file(self):
        upload = self.cleaned_data["config_file"]
        self.instance.config = read_config_upload(upload)
        return upload

    def clean(self):
        cleaned = super().clean()
        if self.instance.config:
            try:
                cleaned["name"] = model_name(cleaned.get("name", ""), self.instance.config,
                                             getattr(cleaned.get("config_file"), "name", ""))
            except ValidationError as error:
                self.add_error("name", error)
        return cleaned

    def _update_errors(self, errors):
        # The model's rules about ``config`` concern what this form calls ``config_file``.
        if hasattr(errors, "error_dict") and "config" in errors.error_dict:
            errors.error_dict.setdefault("config_file", []).extend(errors.error_dict.pop("config"))
        super()._update_errors(errors)


class JobForm(TeamChoiceMixin, forms.Form):
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all())
    model = forms.ModelChoiceField(queryset=ModelSpec.objects.all(), required=False,
                                   help_text="Not needed for an environment probe.")
    stages = forms.MultipleChoiceField(choices=StageKind.choices, widget=forms.CheckboxSelectMultiple,
                                       initial=[StageKind.values[0]])
    parameters = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False,
                                 help_text='Optional JSON object: {"nodes": ["gpu-01"]} limits the nodes; '
                                           'per stage, e.g. {"sharded_run": {"tp": 2}}.')

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


class VirtualBackendForm(TeamChoiceMixin, forms.ModelForm):
    """A backend described by the aten operators it implements: a CSV (one name per line or cell) or JSON list."""

    operator_file = forms.FileField(label="Operator list", help_text="CSV or JSON list of aten operator names.")

    class Meta:
        model = VirtualBackend
        fields = ["team", "name", "description", "operator_file"]

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.scope(user)

    def clean_operator_file(self):
        from workers.engine.coverage.virtual_backend import parse_operator_list

        upload = self.cleaned_data["operator_file"]
        if upload.size > settings.D0_MAX_CONFIG_BYTES:
            raise ValidationError(f"The list is {upload.size / 2**20:.1f} MiB; the limit is "
                                  f"{settings.D0_MAX_CONFIG_BYTES / 2**20:.1f} MiB.")
        try:
            operators = parse_operator_list(upload.read().decode("utf-8"),
                                            json_format=True if upload.name.endswith(".json") else None)
        except (UnicodeDecodeError, ValueError) as error:
            raise ValidationError(f"Not an operator list: {error}") from None
        if not operators:
            raise ValidationError("The list names no operator.")
        self.instance.operators = operators
        return upload
