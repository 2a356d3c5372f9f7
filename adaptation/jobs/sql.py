"""SQL written once for the control plane's hottest statements, sent to PostgreSQL in batches.

Every stage of every job passes through two transactions on the control worker: its dispatch (lock the job, read
the cluster's nodes, insert the stage run, update the job) and its end (lock the job, end the run, read the job's
runs, update the job). Through the ORM each statement is built anew (0.4-0.7 ms of CPU on a 2-core VM) and waited
on alone (a round trip, 0.1-0.9 ms): 6-8 statements each, most of the control plane's part of a short job
(docs/benchmarks/dispatch-vs-floor.md). Here those statements are written once, from the models' own metadata:
tables and columns by their Django names, values prepared by each field as the ORM prepares them, rows made into
instances by ``Model.from_db`` through the ORM's own converters, so the code that decides a job's next step sees
ordinary instances. On PostgreSQL with psycopg 3 they go out in psycopg's pipeline mode: a batch of statements in
one round trip, a transaction's COMMIT included (``ending_in_one_batch``). Elsewhere (SQLite, the zero-setup
default) the same statements run one after another. Statements are sent through Django's cursors, so they are
logged and counted like the ORM's (``CaptureQueriesContext``).

Pipeline mode has one trap: after an error, the server ignores everything up to the batch's end, a ``ROLLBACK TO
SAVEPOINT`` included, so code that recovers from a database error inside a savepoint (``get_or_create``, a nested
``atomic`` in a ``try``) must not run inside a batch. Batches here hold only the statements written in this module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from functools import cache, cached_property

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import Model


@cache
def _pipelines() -> bool:
    """True on PostgreSQL through psycopg 3 (whose connections have pipeline mode)."""
    return connection.vendor == "postgresql" and connection.Database.__name__ == "psycopg"


def batch():
    """Statements sent in this block go together; leaving it (or reading any answer) waits for their answers."""
    connection.ensure_connection()
    return connection.connection.pipeline() if _pipelines() else nullcontext()


class _Tail:
    pipeline = None


_tail: ContextVar[_Tail | None] = ContextVar("d0_sql_tail", default=None)


@contextmanager
def ending_in_one_batch():
    """``transaction.atomic()``, whose statements from ``batch_to_commit()`` on go out with its COMMIT (and the
    messages ``transaction.on_commit`` holds go once that batch is answered). Outside it, ``batch_to_commit`` does
    nothing, so the code that writes works inside any transaction."""
    tail = _Tail()
    token = _tail.set(tail)
    try:
        with transaction.atomic():
            yield
    finally:
        _tail.reset(token)
        if tail.pipeline is not None:
            tail.pipeline.__exit__(*sys.exc_info())


def batch_to_commit() -> None:
    """From here to the COMMIT of the enclosing ``ending_in_one_batch()``, statements are sent together: call it
    before a transaction's last writes, once nothing that may recover from a database error is left to run."""
    tail = _tail.get()
    if tail is None or tail.pipeline is not None or not _pipelines() or not connection.in_atomic_block:
        return
    tail.pipeline = connection.connection.pipeline()
    tail.pipeline.__enter__()


class Pending:
    """A statement sent; its answer is read (and, in a batch, waited for) when asked."""

    def __init__(self, cursor, read: Callable[[tuple], object] | None = None):
        self.cursor, self.read = cursor, read
        # Without pipelines the answer is there now: read before a COMMIT can reset the cursor (sqlite3).
        self.fetched = None if _pipelines() else (cursor.fetchall() if cursor.description else [])

    def _rows(self) -> list:
        if self.fetched is None:
            self.fetched = self.cursor.fetchall()
        return self.fetched

    def rows(self) -> list:
        return [self.read(row) for row in self._rows()]

    def one(self):
        rows = self._rows()
        return self.read(rows[0]) if rows else None


def send(sql: str, params: Iterable = (), read: Callable[[tuple], object] | None = None) -> Pending:
    """Run (or, in a batch, queue) one statement through Django's cursor."""
    cursor = connection.cursor()
    cursor.execute(sql, list(params))
    return Pending(cursor, read)


class Table:
    """A model's table as the SQL here names it: its columns, its values as its fields prepare them, and its rows
    as instances (fields not read are deferred, as with ``.only()``). Column lists and readers are made once per
    set of fields: statements here run on every report, and building them anew cost as much as a round trip."""

    def __init__(self, model: type[Model]):
        quote = connection.ops.quote_name
        self.model = model
        self.name = quote(model._meta.db_table)
        self.fields = {field.attname: field for field in model._meta.concrete_fields}
        self.bare = {name: quote(field.column) for name, field in self.fields.items()}
        self._columns, self._readers = {}, {}

    def ordered(self, attnames: Iterable[str]) -> list[str]:
        """``attnames`` in the model's field order, the order ``Model.from_db`` takes a row's values in."""
        wanted = set(attnames)
        return [name for name in self.fields if name in wanted]

    def column(self, attname: str) -> str:
        return f"{self.name}.{self.bare[attname]}"

    def columns(self, attnames: Iterable[str], *, qualified: bool = True) -> str:
        """The columns of ``attnames``, in the model's field order (``reader``'s)."""
        key = (tuple(attnames), qualified)
        if key not in self._columns:
            self._columns[key] = ", ".join(self.column(name) if qualified else self.bare[name]
                                           for name in self.ordered(attnames))
        return self._columns[key]

    def reader(self, attnames: Iterable[str]) -> Callable[[tuple], Model]:
        """A row of ``columns(attnames)`` (or a slice of one) → an instance, converted as the ORM would."""
        key = tuple(attnames)
        if key not in self._readers:
            self._readers[key] = self._reader(self.ordered(key))
        return self._readers[key]

    def _reader(self, attnames: list[str]) -> Callable[[tuple], Model]:
        converters = []
        for position, name in enumerate(attnames):
            column = self.fields[name].get_col(self.model._meta.db_table)
            found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            if found:
                converters.append((position, found, column))
        from_db = self.model.from_db

        def instance(values) -> Model:
            if converters:
                values = list(values)
                db = connections[DEFAULT_DB_ALIAS]
                for position, functions, column in converters:
                    for function in functions:
                        values[position] = function(values[position], column, db)
            return from_db(DEFAULT_DB_ALIAS, attnames, values)

        return instance

    @cached_property
    def _inserted_fields(self) -> list:
        return [field for field in self.model._meta.concrete_fields if not field.primary_key]

    @cached_property
    def _insert_sql(self) -> str:
        fields = self._inserted_fields
        return (f"INSERT INTO {self.name} ({', '.join(self.bare[f.attname] for f in fields)}) "
                f"VALUES ({placeholders(fields)}) RETURNING {self.bare[self.model._meta.pk.attname]}")

    def insert(self, obj: Model) -> Pending:
        """INSERT ``obj`` (its pk is set once the answer is read: ``.one()``), field defaults and ``auto_now_add``
        applied as ``save()`` applies them."""
        db = connections[DEFAULT_DB_ALIAS]
        values = [field.get_db_prep_save(field.pre_save(obj, True), db) for field in self._inserted_fields]

        def answered(row):
            obj.pk = row[0]
            obj._state.adding = False
            return obj

        return send(self._insert_sql, values, answered)

    def assignments(self, fields: dict) -> tuple[str, list]:
        """``SET`` clauses for ``fields``: a value, or ``Appended(text)`` / ``IfUnset(value)``."""
        clauses, params = [], []
        db = connections[DEFAULT_DB_ALIAS]
        for name, value in fields.items():
            column = self.bare[name]
            if isinstance(value, Appended):
                clauses.append(f"{column} = {column} || %s")
                params.append(value.text)
            elif isinstance(value, IfUnset):
                clauses.append(f"{column} = COALESCE({column}, %s)")
                params.append(self.fields[name].get_db_prep_save(value.value, db))
            else:
                clauses.append(f"{column} = %s")
                params.append(self.fields[name].get_db_prep_save(value, db))
        return ", ".join(clauses), params


@cache
def table(model: type[Model]) -> Table:
    return Table(model)


class Appended:
    """A text column with ``text`` appended by the UPDATE itself (concurrent appends never lose each other's)."""

    def __init__(self, text: str):
        self.text = text


class IfUnset:
    """A column set to ``value`` only if it is NULL."""

    def __init__(self, value):
        self.value = value


def placeholders(values: Iterable) -> str:
    return ", ".join("%s" for _ in values)
