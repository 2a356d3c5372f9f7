"""The answer to a locked-out sign-in (django-axes' ``AXES_LOCKOUT_CALLABLE``), for the login pages and
``/api/token/`` alike: 429 Too Many Requests with ``Retry-After`` (RFC 6585, RFC 9110 10.2.3), so a client backs off
for the cool-off rather than reading the refusal as a bad password."""

from __future__ import annotations

from axes.helpers import get_cool_off, get_lockout_message
from django.http import HttpResponse, JsonResponse


def lockout_response(request, original_response=None, credentials=None) -> HttpResponse:
    message = get_lockout_message()
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": message}, status=429)
    else:
        response = HttpResponse(message, status=429, content_type="text/plain; charset=utf-8")
    cool_off = get_cool_off(request)
    if cool_off:
        # A failure during the lockout starts the cool-off again (AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT),
        # so the whole of it is what is left now.
        response["Retry-After"] = str(max(1, int(cool_off.total_seconds())))
    return response
