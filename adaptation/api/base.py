"""What every capability's API is built from: team-scoped viewsets and foreign keys (another team's row is a 404,
never a 403), a team field that defaults to the user's only team and is fixed once the row exists, and serializers
that run the model's own ``full_clean()`` so the admin, the forms and the API apply the same rules (NetBox's
``ValidatedModelSerializer``)."""

import copy

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers, viewsets

from ..models import Team
from ..teams.services import default_team
from .errors import as_drf_validation_error


class TeamScopedViewSet(viewsets.GenericViewSet):
    """Rows of the requesting user's teams only: another team's row is a 404, never a 403."""

    select_related: tuple = ()
    prefetch_related: tuple = ()

    def get_queryset(self):
        queryset = self.queryset.for_user(self.request.user)
        return queryset.select_related(*self.select_related).prefetch_related(*self.prefetch_related)


class TeamScopedRelatedField(serializers.PrimaryKeyRelatedField):
    """A foreign key that only accepts rows of the requesting user's teams: others read as 'does not exist'."""

    def get_queryset(self):
        return self.queryset.model.objects.for_user(self.context["request"].user)


class TeamField(serializers.SlugRelatedField):
    def __init__(self, **kwargs):
        super().__init__(slug_field="slug", queryset=Team.objects.all(), required=False, **kwargs)

    def get_queryset(self):
        return Team.objects.for_user(self.context["request"].user)


class ValidatedModelSerializer(serializers.ModelSerializer):
    """Runs the model's own ``full_clean()`` so the admin, the forms and the API apply the same rules (NetBox).

    Subclasses set ``validators = []`` in Meta: DRF's own unique-together validator would make ``team``
    required, while here it defaults to the user's only team; full_clean checks the constraint instead.

    A row's team is fixed once it exists: moving a row between teams is not an operation (its nodes, keys and
    reports would follow it to people who were never given them), so an update naming another team is refused.
    """

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if self.instance is None:
            if "team" in self.fields and not attrs.get("team"):
                attrs["team"] = self._default_team()
            instance = self.Meta.model()
        else:
            self._keep_team(attrs)
            # Checked on a copy: the view's permission checks read the stored row (its team above all), never the
            # values a request asks for.
            instance = copy.copy(self.instance)
        for name, value in attrs.items():
            setattr(instance, name, value)
        try:
            instance.full_clean()
        except DjangoValidationError as error:
            raise as_drf_validation_error(error) from None
        # What clean() derives (a model's analysis) is kept, so save() does not derive it a second time.
        for field in self.Meta.model._meta.concrete_fields:
            if not field.editable and not field.primary_key and not field.auto_created:
                attrs.setdefault(field.name, getattr(instance, field.name))
        return attrs

    def _keep_team(self, attrs):
        team = attrs.pop("team", None)
        if team is not None and team.pk != self.instance.team_id:
            raise serializers.ValidationError({"team": [
                "A row stays in its team: the team cannot be changed (make a new one in the other team)."]})

    def _default_team(self):
        team = default_team(self.context["request"].user)
        if team is None:
            raise serializers.ValidationError({"team": ["You belong to several teams (or none): say which one."]})
        return team


class CreatorOrTeamAdminMixin:
    """Rows a member creates for the team (virtual backends, serving endpoints): ``created_by`` is the requester,
    and only the creator or a team admin changes or deletes one."""

    owner_word = "row"

    def perform_create(self, serializer):
        serializer.save(created_by=self.request.user)

    def check_owner(self, instance):
        from rest_framework.exceptions import PermissionDenied

        from ..teams.services import may_change

        if not may_change(self.request.user, instance):
            raise PermissionDenied(f"Only the {self.owner_word}'s creator or a team admin can change or delete it.")

    def perform_update(self, serializer):
        self.check_owner(serializer.instance)
        serializer.save()

    def perform_destroy(self, instance):
        self.check_owner(instance)
        instance.delete()
