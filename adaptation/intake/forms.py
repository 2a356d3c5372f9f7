from django import forms
from django.core.exceptions import ValidationError

from ..models import ModelSpec
from ..teams.forms import TeamChoiceMixin
from .services import PLAN_PRECISIONS, model_name, read_config_upload


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
        """The upload read and analysed: what the model refuses about its config is this field's error."""
        upload = self.cleaned_data["config_file"]
        self.instance.config = read_config_upload(upload)
        try:
            self.instance.analyse()
        except ValidationError:
            self.instance.config = None  # refused here: the model has no config left to judge again
            raise
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


class PlanForm(forms.Form):
    """A what-if cluster and workload. Defaults: one node of 8 × H200 (141 GB), bf16, 32 sequences of 8k tokens."""

    devices_per_node = forms.IntegerField(min_value=1, max_value=256, initial=8)
    device_memory_gb = forms.FloatField(min_value=0.5, max_value=4096, initial=141, label="Device memory (GB)")
    nodes = forms.IntegerField(min_value=1, max_value=512, initial=1)
    device_name = forms.CharField(required=False, initial="H200", help_text="Picks the published bandwidth.")
    precision = forms.ChoiceField(choices=[(precision, precision) for precision in PLAN_PRECISIONS], initial="bf16")
    concurrency = forms.IntegerField(min_value=1, max_value=65536, initial=32)
    context_tokens = forms.IntegerField(min_value=1, max_value=2**22, initial=8192)

    def devices(self) -> dict:
        data = self.cleaned_data
        return {"devices_per_node": data["devices_per_node"], "nodes": data["nodes"],
                "device_memory_bytes": int(data["device_memory_gb"] * 1e9), "device_name": data["device_name"] or None}

    def workload(self) -> dict:
        return {"concurrency": self.cleaned_data["concurrency"], "context_tokens": self.cleaned_data["context_tokens"]}
