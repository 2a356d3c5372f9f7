"""Forms of serving endpoints: add one (its API key write-only), and benchmark one against a model on a cluster."""

from django import forms

from ..models import Cluster, ModelSpec, ServingEndpoint
from ..teams.forms import TeamChoiceMixin


class ServingEndpointForm(TeamChoiceMixin, forms.ModelForm):
    api_key = forms.CharField(required=False, strip=True, max_length=2000, widget=forms.PasswordInput,
                              help_text="Sent as a bearer token. Stored encrypted and never shown again.")

    class Meta:
        model = ServingEndpoint
        fields = ["team", "name", "base_url", "served_model", "api_key"]

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.scope(user)

    def save(self, commit=True):
        endpoint = super().save(commit=False)
        endpoint.set_api_key(self.cleaned_data.get("api_key"))
        if commit:
            endpoint.save()
        return endpoint


class EndpointBenchForm(TeamChoiceMixin, forms.Form):
    """Which model the endpoint serves (prompts are drawn from its vocabulary), the cluster whose node runs the
    client, and the concurrencies to try."""

    model = forms.ModelChoiceField(queryset=ModelSpec.objects.all())
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all(), help_text="One of its online nodes sends the "
                                                                               "requests: it must reach the endpoint.")
    concurrency = forms.CharField(initial="1, 4", help_text="Requests in flight, comma-separated: one trial each.")
    requests = forms.IntegerField(initial=32, min_value=1, max_value=100000)
    prompt_len = forms.IntegerField(initial=128, min_value=1, max_value=1 << 20)
    output_len = forms.IntegerField(initial=128, min_value=1, max_value=1 << 20)

    def __init__(self, *args, user, endpoint: ServingEndpoint, **kwargs):
        super().__init__(*args, **kwargs)
        self.scope(user)
        self.endpoint = endpoint
        for name in ("model", "cluster"):
            self.fields[name].queryset = self.fields[name].queryset.filter(team=endpoint.team)

    def clean_concurrency(self):
        try:
            values = [int(part) for part in self.cleaned_data["concurrency"].replace(",", " ").split()]
        except ValueError:
            raise forms.ValidationError("Whole numbers, comma-separated, e.g. 1, 4, 16.") from None
        if not values or any(value < 1 for value in values):
            raise forms.ValidationError("At least one concurrency, each at least 1.")
        return values

    def stage_parameters(self) -> dict:
        data = self.cleaned_data
        return {"endpoint": self.endpoint.pk, "concurrency": data["concurrency"],
                "workload": {"requests": data["requests"], "prompt_len": data["prompt_len"],
                             "output_len": data["output_len"]}}
