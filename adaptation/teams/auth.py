"""Signing in reads the user and the ids of their teams in one query, written once as SQL.

Every page and API request needs both: the user (the session's or the token's) and, to scope its lists by
``team_id IN (...)``, the user's team ids (``team_ids_of``), which were a query of their own. Here one statement
reads the user (or the token and its user) with their memberships' team ids (LEFT JOIN: a user of no team is read
too), written once from the models' metadata like the control plane's hot statements (adaptation/sql.py): through
the ORM, building these statements anew cost about as much CPU as running them. Rows become instances through the
ORM's own converters (``Table.reader``), so the checks after (active user, session hash) are Django's own.

The statement reads the user table itself, as Django's stock ``User._default_manager`` does (no filtering manager,
one database, no router): a user model with a manager that hides rows (soft deletion) would need its filter here.
"""

from collections.abc import Callable
from functools import cache

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed

from .. import sql
from ..models import Membership
from ..models.teams import remember_team_ids


@cache
def _statement(by: type) -> tuple[str, int, Callable, Callable | None]:
    """The SQL reading the user (``by`` User: by their id) or the token and its user (``by`` Token: by its key),
    with one row per membership; and readers of a row's user and token."""
    users, memberships = sql.table(get_user_model()), sql.table(Membership)
    user_fields = list(users.fields)
    columns = [memberships.column("team_id"), users.columns(user_fields)]
    joins = f"LEFT JOIN {memberships.name} ON {memberships.column('user_id')} = {users.column('id')}"
    if by is Token:
        tokens = sql.table(Token)
        token_fields = list(tokens.fields)
        columns.append(tokens.columns(token_fields))
        source = f"{tokens.name} JOIN {users.name} ON {users.column('id')} = {tokens.column('user_id')}"
        where = f"{tokens.column('key')} = %s"
        read_token = tokens.reader(token_fields)
    else:
        source, where, read_token = users.name, f"{users.column('id')} = %s", None
    statement = f"SELECT {', '.join(columns)} FROM {source} {joins} WHERE {where}"
    read_user = users.reader(user_fields)
    return statement, len(user_fields), read_user, read_token


def _member(by: type, value):
    """(user, token or None), the user's team ids remembered for this request; None when nothing matches."""
    statement, width, read_user, read_token = _statement(by)
    rows = sql.send(statement, [value], lambda row: row).rows()
    if not rows:
        return None
    user = read_user(rows[0][1:1 + width])
    remember_team_ids(user.pk, tuple(row[0] for row in rows if row[0] is not None))
    return user, (read_token(rows[0][1 + width:]) if read_token else None)


class MemberBackend(ModelBackend):
    """Django's ModelBackend (sign-in by username and password), whose ``get_user`` reads the team ids too."""

    def get_user(self, user_id):
        try:
            found = _member(get_user_model(), get_user_model()._meta.pk.to_python(user_id))
        except (ValidationError, OverflowError):  # not a user id, or past SQLite's integers: no user, as the ORM says
            return None
        if found is None:
            return None
        user = found[0]  # (not ``user, _``: ``_`` is this module's gettext)
        return user if self.user_can_authenticate(user) else None


class MemberTokenAuthentication(TokenAuthentication):
    """DRF's token authentication (``Authorization: Token <key>``), reading the team ids with the token's user."""

    def authenticate_credentials(self, key):
        found = _member(Token, key)
        if found is None:
            raise AuthenticationFailed(_("Invalid token."))
        user, token = found
        if not user.is_active:
            raise AuthenticationFailed(_("User inactive or deleted."))
        token.user = user
        return user, token
