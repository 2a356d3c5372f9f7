from django.conf import settings
from django.db import models

from ..choices import TeamRole
from .names import slug_name_field


def team_ids_of(user) -> tuple[int, ...]:
    """The ids of the teams ``user`` belongs to. Scoping by ``team_id IN (these ids)`` rather than through the
    membership join lets PostgreSQL read a list from its ``(team, -created)`` index instead of sorting every row
    of the team; one small query per request pays for it.

    Read once per user instance and kept on it, as Django's ModelBackend keeps a user's permissions
    (``_perm_cache``): a session or a token reads its user afresh for every request, so a membership added or
    removed counts from the next request on."""
    if not user.is_authenticated:
        return ()
    if not hasattr(user, "_team_ids_cache"):
        user._team_ids_cache = tuple(Membership.objects.filter(user_id=user.pk).order_by()
                                     .values_list("team_id", flat=True))
    return user._team_ids_cache


class TeamQuerySet(models.QuerySet):
    def for_user(self, user):
        return self.filter(pk__in=team_ids_of(user))

    def administered_by(self, user):
        """The teams ``user`` is an admin of. One filter() call, so the user and the role are one membership's."""
        return self.filter(memberships__user=user, memberships__role=TeamRole.ADMIN)


class Team(models.Model):
    """Everything in d0 belongs to a team and is invisible to other teams."""

    name = models.CharField(max_length=100, unique=True)
    slug = slug_name_field(100, "Used in node join names: <team>/<cluster>.", unique=True)
    created = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams")

    objects = TeamQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=TeamRole.choices, default=TeamRole.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team")]
        ordering = ["team__name", "user__username"]

    def __str__(self):
        return f"{self.user} in {self.team} ({self.role})"


class TeamOwnedQuerySet(models.QuerySet):
    """Scopes rows to the teams a user belongs to; ``team_path`` says how a model reaches its team."""

    team_path = "team"

    def for_user(self, user):
        if not user.is_authenticated:
            return self.none()
        return self.filter(**{f"{self.team_path}__in": team_ids_of(user)})
