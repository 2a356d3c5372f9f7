"""Every API error is JSON: field errors as ``{"field": ["message"]}``, others as ``{"detail": "..."}``."""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import ProtectedError
from django.http import JsonResponse
from django.views import defaults
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError, ValidationError
from rest_framework.views import exception_handler as drf_exception_handler

from ..errors import Conflict


class ConflictError(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


def as_drf_validation_error(error: DjangoValidationError) -> ValidationError:
    if hasattr(error, "error_dict"):
        detail = {("non_field_errors" if key == "__all__" else key): value for key, value in error.message_dict.items()}
        return ValidationError(detail)
    return ValidationError({"non_field_errors": error.messages})


def not_found(request, exception):
    """404 for any URL: JSON under /api/ (scripts parse it), the usual page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request):
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Server error; the administrators can find it in the logs."}, status=500)
    return defaults.server_error(request)


def exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        exc = as_drf_validation_error(exc)
    elif isinstance(exc, Conflict):
        exc = ConflictError(str(exc))
    elif isinstance(exc, TooManyFieldsSent | TooManyFilesSent):
        # Django's own 400 for these is its HTML error page; an API client gets the reason as JSON.
        exc = ParseError(str(exc))
    elif isinstance(exc, RequestDataTooBig):
        exc = ParseError(f"Request body is over the {settings.DATA_UPLOAD_MAX_MEMORY_SIZE / 2**20:.1f} MiB limit.")
    elif isinstance(exc, ProtectedError):
        exc = ConflictError(f"Still used by {len(exc.protected_objects)} job(s); it is kept as their history.")
    return drf_exception_handler(exc, context)
