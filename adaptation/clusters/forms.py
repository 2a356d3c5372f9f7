from django import forms

from ..choices import TeamRole
from ..models import Cluster, Team
from ..teams.forms import TeamChoiceMixin


class ClusterForm(TeamChoiceMixin, forms.ModelForm):
    class Meta:
        model = Cluster
        fields = ["team", "name", "description", "expected_devices_per_node", "interconnect"]

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.scope(user, teams=Team.objects.for_user(user).filter(memberships__role=TeamRole.ADMIN))
