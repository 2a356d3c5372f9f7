"""The one team-choice rule every form follows."""

from django import forms


class TeamChoiceMixin:
    """Limits every team-owned choice of a form to the user's teams; the team of an existing row is fixed."""

    def scope(self, user, teams=None):
        """``teams`` narrows the team choices further (e.g. to those the user administers)."""
        for field in self.fields.values():
            if isinstance(field, forms.ModelChoiceField):
                field.queryset = field.queryset.model.objects.for_user(user)
        if "team" in self.fields:
            if getattr(getattr(self, "instance", None), "pk", None) is not None:
                # A row stays in its team: a form that edits one shows its team and takes no other.
                self.fields["team"].disabled = True
            if teams is not None:
                self.fields["team"].queryset = teams
            if self.fields["team"].queryset.count() == 1:
                self.fields["team"].initial = self.fields["team"].queryset.first()
