from io import BytesIO

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class LimitedJSONParser(JSONParser):
    """JSON bodies up to the upload limit; DRF reads the stream itself, so Django's limit never applies."""

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        body = stream.read(limit + 1) if stream is not None else b""
        if len(body) > limit:
            raise ParseError(f"Request body is over the {limit / 2**20:.1f} MiB limit.")
        return super().parse(BytesIO(body), media_type, parser_context)
