"""``/api/status/``: is d0 up (its database and broker answer)? Anonymous callers (load balancers) get only that;
a signed-in user also gets the live workers: control-plane workers seen running the liveness sweep, and the online
nodes of their own teams. Nothing here broadcasts to the workers, so the endpoint costs a few milliseconds."""

from django.db import connection
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from ..clusters.services import live_workers
from ..jobs import services as jobs


class StatusView(APIView):
    """Health: ``{"status": "up"}`` (503 with "down" when the database or the broker does not answer); signed in,
    also the database, the broker and the live workers."""

    permission_classes = [permissions.AllowAny]

    @extend_schema(responses={200: dict, 503: dict})
    def get(self, request):
        report = {"database": "ok", "broker": "ok"}
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except Exception as error:  # noqa: BLE001 - the point is to report it
            report["database"] = f"error: {error}"
        try:
            with jobs.celery_app().connection_for_read() as broker:
                broker.ensure_connection(max_retries=1, timeout=2)
        except Exception as error:  # noqa: BLE001
            report["broker"] = f"error: {error}"
        healthy = report["database"] == report["broker"] == "ok"
        answer = {"status": "up" if healthy else "down"}
        if request.user.is_authenticated:
            answer.update(report)
            if report["database"] == "ok":
                answer["workers"] = live_workers(request.user)
        return Response(answer, status=status.HTTP_200_OK if healthy else status.HTTP_503_SERVICE_UNAVAILABLE)
