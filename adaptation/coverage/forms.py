from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from ..models import Team, VirtualBackend
from ..teams.forms import TeamChoiceMixin


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


class ShippedBackendsForm(forms.Form):
    """Adds the virtual backends d0 ships (torch's own CUDA, MPS and CPU kernel lists) to a team, ready for jobs."""

    team = forms.TypedChoiceField(coerce=int)
    backends = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, label="Backends")

    def __init__(self, *args, user, **kwargs):
        from workers.engine.coverage.shipped_backends import shipped_backends

        super().__init__(*args, **kwargs)
        # The user's teams read once as choices (one query) rather than as a queryset field (three).
        self.teams = {team.pk: team for team in Team.objects.for_user(user).only("id", "name")}
        self.fields["team"].choices = [(pk, team.name) for pk, team in self.teams.items()]
        if len(self.teams) == 1:
            self.fields["team"].initial = next(iter(self.teams))
        choices = [(backend["name"], f"{backend['name']} ({len(backend['operators'])} operators)")
                   for backend in shipped_backends()]
        self.fields["backends"].choices = choices
        self.fields["backends"].initial = [name for name, _ in choices]

    def clean_team(self):
        return self.teams[self.cleaned_data["team"]]
