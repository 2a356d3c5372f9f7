"""``/api/status/``: is d0 up (its database and broker answer)? Anonymous callers (load balancers) get only that;
a signed-in user also gets the live workers: control-plane workers seen running the liveness check, and the online
nodes of their own teams, from the rows their beats and heartbeats keep. Nothing here broadcasts to the workers.

The broker is not asked per request: under load, a broker connection per request made this endpoint's p95 a second.
Each process asks at most once per ``BROKER_CHECK_TTL_S``, on a fresh connection (never a pooled one a broker
restart left dead) with a short timeout and one retry, and only one request per process waits for it: the others
answer from the last check meanwhile."""

import threading
import time

from django.db import connection
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from . import services as jobs
from .recovery import live_workers

BROKER_CHECK_TTL_S = 5.0
# Per attempt, connect and PING each; two attempts keep the worst case (a broker that accepts and never answers)
# at about a second, paid by one request per process per TTL.
BROKER_TIMEOUT_S = 0.25
BROKER_ATTEMPTS = 2


class BrokerCheck:
    """This process's latest answer to "does the broker answer?" (``None``: yes; else the error)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._checked_at: float | None = None
        self._error: str | None = None

    def error(self) -> str | None:
        if self._fresh():
            return self._error
        # The first check ever waits; after that a request that finds another one checking answers from the last
        # result rather than queue behind it.
        if not self._lock.acquire(blocking=self._checked_at is None):
            return self._error
        try:
            if not self._fresh():
                self._error = self._ask()
                self._checked_at = time.monotonic()
            return self._error
        finally:
            self._lock.release()

    def forget(self) -> None:
        """The next call asks the broker again (tests; a process that knows the broker changed)."""
        self._checked_at = None

    def _fresh(self) -> bool:
        return self._checked_at is not None and time.monotonic() - self._checked_at < BROKER_CHECK_TTL_S

    @staticmethod
    def _ask() -> str | None:
        error = None
        for _ in range(BROKER_ATTEMPTS):
            try:
                # A new connection each time (the Redis transport PINGs as it opens its channel).
                with jobs.celery_app().connection_for_read(
                        connect_timeout=BROKER_TIMEOUT_S,
                        transport_options={"socket_timeout": BROKER_TIMEOUT_S}) as broker:
                    broker.ensure_connection(max_retries=0)  # retried here, without kombu's 2 s back-off
                return None
            except Exception as failure:  # noqa: BLE001 - the point is to report it
                error = f"error: {failure}"
        return error


broker_check = BrokerCheck()


class StatusView(APIView):
    """Health: ``{"status": "up"}`` (503 with "down" when the database or the broker does not answer); signed in,
    also the database, the broker and the live workers."""

    permission_classes = [permissions.AllowAny]

    @extend_schema(responses={200: dict, 503: dict})
    def get(self, request):
        report = {"database": "ok", "broker": broker_check.error() or "ok"}
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except Exception as error:  # noqa: BLE001 - the point is to report it
            report["database"] = f"error: {error}"
        healthy = report["database"] == report["broker"] == "ok"
        answer = {"status": "up" if healthy else "down"}
        if request.user.is_authenticated:
            answer.update(report)
            if report["database"] == "ok":
                answer["workers"] = live_workers(request.user)
        return Response(answer, status=status.HTTP_200_OK if healthy else status.HTTP_503_SERVICE_UNAVAILABLE)
