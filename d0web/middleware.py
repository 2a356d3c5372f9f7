"""A request body past ``D0_MAX_REQUEST_BYTES`` is refused from its Content-Length, before any of it is read; a
query string with a NUL character is refused too (PostgreSQL cannot compare text with one: a 500 otherwise).

Django caps form fields and JSON bodies (DATA_UPLOAD_MAX_MEMORY_SIZE) but streams file uploads to disk whatever
their size, so a multipart upload was read whole before the form said "too big". WSGI servers pass the body by its
Content-Length only, so checking that one header covers every upload.
"""

from django.conf import settings
from django.http import HttpResponse, JsonResponse


class RequestBodyLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        limit = settings.D0_MAX_REQUEST_BYTES
        if "\x00" in request.META.get("QUERY_STRING", "") or "%00" in request.META.get("QUERY_STRING", ""):
            # A NUL in a filter reaches PostgreSQL, which refuses it in text: say so instead of a 500.
            message = "The query string may not contain NUL (%00) characters."
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": message}, status=400)
            return HttpResponse(message, status=400, content_type="text/plain; charset=utf-8")
        if length > limit:
            message = f"The request body is {length / 2**20:.1f} MiB; the limit is {limit / 2**20:.1f} MiB."
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": message}, status=413)
            return HttpResponse(message, status=413, content_type="text/plain; charset=utf-8")
        return self.get_response(request)
