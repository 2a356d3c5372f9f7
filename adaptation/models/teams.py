from contextvars import ContextVar

from django.conf import settings
from django.core.signals import request_finished, request_started
from django.db import models
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver

from ..choices import TeamRole

# The team ids of each user seen in the current request, by user id: read once per request, and only inside one
# (a worker process or a shell reads them afresh each time, so nothing there can go stale).
_team_ids_this_request: ContextVar[dict[int, tuple[int, ...]] | None] = ContextVar("d0_team_ids", default=None)


def team_ids_of(user) -> tuple[int, ...]:
    """The ids of the teams ``user`` belongs to. Scoping by ``team_id IN (these ids)`` rather than through the
    membership join lets PostgreSQL read a list from its ``(team, -created)`` index instead of sorting every row
    of the team; one small query per request pays for it."""
    if not user.is_authenticated:
        return ()
    cache = _team_ids_this_request.get()
    if cache is not None and user.pk in cache:
        return cache[user.pk]
    ids = tuple(Membership.objects.filter(user_id=user.pk).order_by().values_list("team_id", flat=True))
    if cache is not None:
        cache[user.pk] = ids
    return ids


def remember_team_ids(user_id: int, ids: tuple[int, ...]) -> None:
    """``team_ids_of`` for this request, read with the user by the sign-in (adaptation/teams/auth.py)."""
    cache = _team_ids_this_request.get()
    if cache is not None:
        cache[user_id] = ids


@receiver(request_started)
def _start_request_cache(**kwargs):
    _team_ids_this_request.set({})


@receiver(request_finished)
def _end_request_cache(**kwargs):
    _team_ids_this_request.set(None)


class TeamQuerySet(models.QuerySet):
    def for_user(self, user):
        return self.filter(pk__in=team_ids_of(user))

    def administered_by(self, user):
        """The teams ``user`` is an admin of. One filter() call, so the user and the role are one membership's."""
        return self.filter(memberships__user=user, memberships__role=TeamRole.ADMIN)


class Team(models.Model):
    """Everything in d0 belongs to a team and is invisible to other teams."""

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=100, unique=True, help_text="Used in node join names: <team>/<cluster>.")
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


@receiver([post_save, post_delete, m2m_changed], sender=Membership)
def _forget_team_ids(**kwargs):
    """A membership made or removed during a request (a new team, a member removed; through ``team.members`` or
    ``user.teams`` too, which send no save signal and may name many users) counts at once: every user's ids are
    read again. Memberships change rarely; dropping all costs nothing."""
    cache = _team_ids_this_request.get()
    if cache is not None:
        cache.clear()
