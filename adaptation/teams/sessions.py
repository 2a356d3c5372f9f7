"""Django's database sessions, with the read every signed-in request makes written once as SQL (adaptation/sql.py):
through the ORM, building that one-row query cost about as much CPU as running it. Same table, same signed data:
the class keeps Django's name, which is part of the salt its session data is signed with."""

from collections.abc import Callable
from functools import cache

from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore
from django.db import connection
from django.utils import timezone

from .. import sql


@cache
def _read(model) -> tuple[str, Callable]:
    sessions = sql.table(model)
    fields = list(sessions.fields)
    return (f"SELECT {sessions.columns(fields)} FROM {sessions.name} WHERE {sessions.column('session_key')} = %s "
            f"AND {sessions.column('expire_date')} > %s", sessions.reader(fields))


class SessionStore(DatabaseSessionStore):
    def _get_session_from_db(self):
        statement, reader = _read(self.model)
        now = self.model._meta.get_field("expire_date").get_db_prep_value(timezone.now(), connection)
        session = sql.send(statement, [self.session_key, now], reader).one()
        if session is None:
            self._session_key = None  # as Django's: a key that matches nothing is dropped
        return session
