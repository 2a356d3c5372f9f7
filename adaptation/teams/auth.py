"""Signing in reads the user and the ids of their teams in one query.

Every page and API request needs both: the user (the session's or the token's) and, to scope its lists by
``team_id IN (...)``, the user's team ids (``team_ids_of``), which were a query of their own (a twentieth of a
list request's CPU). Here they come from one query over the user's memberships with the user joined; a user of no
team (no membership row) is read as Django and DRF read it.
"""

from django.contrib.auth.backends import ModelBackend
from django.utils.translation import gettext_lazy as _
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from ..models import Membership
from ..models.teams import remember_team_ids


def _member(joined: tuple[str, ...], **user_lookup):
    """The user matching ``user_lookup`` (Membership's lookups), their team ids remembered for this request; None
    when no membership matches (a user of no team, or no such user)."""
    memberships = list(Membership.objects.filter(**user_lookup).select_related(*joined).order_by())
    if not memberships:
        return None
    user = memberships[0].user
    remember_team_ids(user.pk, tuple(membership.team_id for membership in memberships))
    return user


class MemberBackend(ModelBackend):
    """Django's ModelBackend (sign-in by username and password), whose ``get_user`` reads the team ids too."""

    def get_user(self, user_id):
        try:
            user = _member(("user",), user_id=user_id)
        except (ValueError, TypeError):  # not a user id (Django's get_user answers None too)
            return None
        if user is None:
            return super().get_user(user_id)
        return user if self.user_can_authenticate(user) else None


class MemberTokenAuthentication(TokenAuthentication):
    """DRF's token authentication (``Authorization: Token <key>``), reading the team ids with the token's user."""

    def authenticate_credentials(self, key):
        user = _member(("user", "user__auth_token"), user__auth_token__key=key)
        if user is None:
            return super().authenticate_credentials(key)
        if not user.is_active:
            raise AuthenticationFailed(_("User inactive or deleted."))
        return user, user.auth_token
