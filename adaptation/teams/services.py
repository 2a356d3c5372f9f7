"""Team membership questions every capability asks: which teams a user is in, their only team, whether they
administer one; and the rotation of a user's API token."""

from __future__ import annotations

from rest_framework.authtoken.models import Token

from ..models import Team


def teams_of(user):
    return Team.objects.for_user(user)


def default_team(user) -> Team | None:
    """The user's team when there is exactly one, so forms and the API can leave it out."""
    teams = list(teams_of(user)[:2])
    return teams[0] if len(teams) == 1 else None


def is_team_admin(user, team: Team) -> bool:
    return Team.objects.administered_by(user).filter(pk=team.pk).exists()


def api_token(user) -> Token | None:
    return Token.objects.filter(user=user).first()


def rotate_api_token(user) -> Token:
    """A new token for the user; the old one stops working."""
    Token.objects.filter(user=user).delete()
    return Token.objects.create(user=user)


def may_change(user, row) -> bool:
    """Rows a member made for the team (virtual backends, serving endpoints): its creator or a team admin."""
    return row.created_by_id == user.pk or is_team_admin(user, row.team)
