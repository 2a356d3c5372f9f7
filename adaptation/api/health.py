"""``/api/status/``: database and broker health and how many workers answer a ping (open to load balancers)."""

from django.db import connection
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from ..jobs import services as jobs


class StatusView(APIView):
    """Health: database, broker, and how many workers answer a ping. Open to all (load balancers)."""

    authentication_classes = []
    permission_classes = [permissions.AllowAny]

    @extend_schema(responses={200: dict, 503: dict})
    def get(self, request):
        report = {"database": "ok", "broker": "ok", "workers": {"control": 0, "node": 0}}
        healthy = True
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except Exception as error:  # noqa: BLE001 - the point is to report it
            report["database"] = f"error: {error}"
            healthy = False
        app = jobs.celery_app()
        try:
            with app.connection_for_read() as broker:
                broker.ensure_connection(max_retries=1, timeout=2)
            replies = app.control.ping(timeout=1.0) or []
            for reply in replies:
                for worker_name in reply:
                    kind = "node" if worker_name.startswith("d0.node.") else "control"
                    report["workers"][kind] += 1
        except Exception as error:  # noqa: BLE001
            report["broker"] = f"error: {error}"
            healthy = False
        return Response(report, status=status.HTTP_200_OK if healthy else status.HTTP_503_SERVICE_UNAVAILABLE)
