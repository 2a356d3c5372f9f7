from django import forms

from ..models import Cluster, Team
from ..teams.forms import TeamChoiceMixin


class ClusterForm(TeamChoiceMixin, forms.ModelForm):
    class Meta:
        model = Cluster
        fields = ["team", "name", "description", "expected_devices_per_node", "interconnect"]

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.scope(user, teams=Team.objects.administered_by(user))


class JoinTokenForm(forms.Form):
    hours = forms.FloatField(min_value=0.1, max_value=24 * 30, initial=24, label="Valid for (hours)")
    description = forms.CharField(max_length=200, required=False, help_text="Which machines it is for.")
